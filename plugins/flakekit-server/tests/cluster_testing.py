"""A real cluster for drills: N `flakekit serve` processes on loopback, one PostgreSQL
database (per test) holding the membership, the key fence and the segments.

Each node reaches the database through its own :class:`~flakekit.testing.proxy.TcpProxy`
(``cluster.proxies[i].cut()`` / ``stall()`` partitions that node from the store alone),
listens on a fixed port of its own (so a restarted node keeps its advertise URL), and is
started with ``--node`` / ``--advertise``. ``Cluster(..., workers=2)`` runs every node as
``serve --workers 2``: each process is member ``NODE.i`` on port ``port + 1 + i``
(docs/server.md); :meth:`Cluster.node` maps a member back to its node, and
:meth:`Node.process_pid` names the process behind a member. :class:`Recorder` fires
concurrent requests
and keeps ``(start, end, id, node)`` of each, for the invariants of docs/cluster.md:
no ID twice (I1) and, per key, an ID answered to a request that started after another
ended is larger (I2).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from server_testing import Server, create_keys, fresh_pg, run_cli

from flakekit.testing.databases import proxied
from flakekit.testing.proxy import TcpProxy
from flakekit.testing.requests import http_get

__all__ = ["Cluster", "Node", "Process", "Record", "Recorder", "check_i1", "check_i2",
           "check_ids", "cluster_config",
           "cluster_db", "metric", "start_cluster", "trio", "unavailable_ms"]

STRICT_KEY = "order"
T = TypeVar("T")


def cluster_config(path: Path, url: str, *, name: str = "drill",
                   strict: dict[str, str] | None = None, node_keys: dict[str, str] | None = None,
                   cluster_extra: str = "", membership: str | None = None,
                   backend_extra: str = "") -> Path:
    """``[cluster]`` on the SQL membership of backend ``main`` (or ``membership``, the
    TOML inline table of another store), strict segment
    generators (generator -> key, default ``orders`` -> ``order``) and plain (per-node)
    ones (default ``invoices`` -> ``invoice``). Default lease and hand-off settings
    (``cluster_extra`` and ``backend_extra``: more lines of ``[cluster]`` and of the
    backend)."""
    membership = membership or '{ type = "sql", backend = "main" }'
    text = (f'[backends.main]\nurl = "{url}"\n{backend_extra}\n[cluster]\nname = "{name}"\n'
            f'membership = {membership}\n{cluster_extra}\n')
    for gen, key in (strict if strict is not None else {"orders": STRICT_KEY}).items():
        text += (f'[generators.{gen}]\nstrategy = "segment"\norder = "strict"\n'
                 f'store = {{ type = "sql", backend = "main" }}\nkey = "{key}"\n\n')
    for gen, key in (node_keys if node_keys is not None else {"invoices": "invoice"}).items():
        text += (f'[generators.{gen}]\nstrategy = "segment"\n'
                 f'store = {{ type = "sql", backend = "main" }}\nkey = "{key}"\n\n')
    path.write_text(text)
    return path


def _cluster_tables(url: str) -> None:
    """The cluster component's tables (``db init`` creates them from the config's
    ``[cluster]``; this makes sure, idempotently, whatever that step covers)."""
    from sqlalchemy import create_engine

    from flakekit.sql.schema import CLUSTER_COMPONENT, upgrade_schema

    engine = create_engine(url)
    try:
        upgrade_schema(engine, CLUSTER_COMPONENT)
    finally:
        engine.dispose()


#: lock files of the ports this test process handed out: held (``flock``) until it exits,
#: so no other lane or node of this session gets them while a node is down or starting
_RESERVED: dict[int, Any] = {}
_RESERVATIONS = Path("/tmp/flakekit-test-ports")


def _reserve(port: int) -> bool:
    """Whether ``port`` is now this process's: nobody else reserved it, nothing is bound."""
    import fcntl
    import socket

    if port in _RESERVED:
        return False
    _RESERVATIONS.mkdir(exist_ok=True)
    lock = (_RESERVATIONS / str(port)).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        lock.close()
        return False
    _RESERVED[port] = lock
    return True


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive loopback ports nothing listens on, kept for this test
    process (a lock file per port: two nodes, or two CI lanes at once, never pick the same
    one), and below the kernel's ephemeral range: a port there may be taken by an outgoing
    connection while its node is down, and a restarted node must get its ports back."""
    import random

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        first = random.randrange(max(1024, low - 12000), low - n)
        taken = []
        for port in range(first, first + n):
            if not _reserve(port):
                break
            taken.append(port)
        else:
            return first
        for port in taken:   # a partial run: give it back
            _RESERVED.pop(port).close()


@attrs.frozen
class Process:
    """One process of a node, at its private port (``serve --workers N``)."""

    port: int

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return http_get(self.port, path, timeout=10)


@attrs.define
class Node:
    """One node: its id, port, proxy to the database, config, and the running server;
    with ``workers`` > 1, processes ``NODE.0`` ... each a member on ``port + 1 + i``."""

    name: str
    port: int
    proxy: TcpProxy
    config: Path
    server: Server | None = None
    workers: int = 1

    @property
    def members(self) -> list[str]:
        """The member ids of this node's processes."""
        if self.workers == 1:
            return [self.name]
        from flakekit.cluster.processes import process_node

        return [process_node(self.name, i) for i in range(self.workers)]

    def member_port(self, member: str) -> int:
        """The port a member of this node advertises (its private one)."""
        return self.port if self.workers == 1 else self.port + 1 + self.members.index(member)

    def process(self, member: str) -> Process:
        """The one process that is ``member``, asked at its private port."""
        return Process(self.member_port(member))

    def process_pid(self, member: str) -> int:
        """The pid of the process that is ``member`` now (its /health says)."""
        return int(json.loads(self.process(member).get("/health")[2])["pid"])

    def pids(self) -> list[int]:
        """The supervisor's pid and its worker processes' (just the one with 1 worker)."""
        if self.server is None:
            return []
        pid = self.server.proc.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        return [pid, *map(int, children)]

    @property
    def advertise(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server is not None else None

    def get(self, path: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        assert self.server is not None, f"node {self.name} is not running"
        return self.server.get(path, headers, method)

    def json(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, _, body = self.get(path, headers)
        return status, json.loads(body)


class Cluster:
    """N nodes of one cluster (see the module docstring); ``stop()`` ends them all."""

    def __init__(self, tmp: Path, url: str, n: int = 3, workers: int = 1, *,
                 lease_s: float | None = None, statement_timeout_s: float | None = None,
                 **config: Any) -> None:
        self.tmp = tmp
        #: the nodes' membership lease and reply limit (statement_timeout + 5 s), in s: the
        #: defaults (10 s, 35 s) unless ``lease_s``/``statement_timeout_s`` set them; drills
        #: scale their waits by these
        self.lease_s = 10.0 if lease_s is None else lease_s
        self.reply_s = (30.0 if statement_timeout_s is None else statement_timeout_s) + 5.0
        if lease_s is not None:
            config["cluster_extra"] = f'lease = "{lease_s:g}s"\n' + config.get(
                "cluster_extra", "")
        if statement_timeout_s is not None:
            config["backend_extra"] = (f'statement_timeout = "{statement_timeout_s:g}s"\n'
                                       + config.get("backend_extra", ""))
        self.url = url
        #: ``serve --workers`` of every node (each process a member of its own)
        self.workers = workers
        self.nodes: list[Node] = []
        #: names of the nodes SIGSTOPped now (never asked anything: they would not answer)
        self.paused: set[str] = set()
        self._config = config
        self._db_port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        for i in range(n):
            self.add_node(f"n{i}")
        #: the same cluster config on the database directly (for the operator's CLI)
        self.operator_config = cluster_config(tmp / "operator.toml", url, **config)
        init = run_cli("db", "init", "--config", str(self.nodes[0].config))
        assert init.returncode == 0, init.stdout + init.stderr
        _cluster_tables(url)

    def add_node(self, name: str) -> Node:
        """A new (not started) member ``name`` with a proxy and config of its own."""
        proxy = TcpProxy(self._db_port).start()
        path = cluster_config(self.tmp / f"node-{name}.toml", proxied(self.url, proxy),
                              **self._config)
        node = Node(name, free_ports(1 + self.workers if self.workers > 1 else 1),
                    proxy, path, workers=self.workers)
        self.nodes.append(node)
        return node

    # -- processes --------------------------------------------------------------------------
    def start(self, i: int | None = None, *args: str, wait: bool = True) -> None:
        """Start node ``i`` (every node when None), each with ``--node`` and ``--advertise``."""
        for node in self.nodes if i is None else [self.nodes[i]]:
            workers = ("--workers", str(node.workers)) if node.workers > 1 else ()
            node.server = Server(node.config, "--port", str(node.port), "--node", node.name,
                                 "--advertise", node.advertise, *workers, *args, tmp=self.tmp,
                                 env={"FLAKEKIT_SERVER_LOG_LEVEL": "info"}, wait=wait)

    def restart(self, i: int, *args: str) -> None:
        self.stop(i)
        self.start(i, *args)

    def stop(self, i: int | None = None, sig: int = signal.SIGTERM) -> None:
        for node in self.nodes if i is None else [self.nodes[i]]:
            if node.server is not None:
                if sig == signal.SIGKILL:   # the supervisor first: it restarts nothing
                    for pid in node.pids():
                        os.kill(pid, signal.SIGKILL)
                node.server.stop(sig)
                node.server = None
                self.paused.discard(node.name)

    def kill9(self, i: int) -> None:
        """``kill -9`` node ``i``, every process of it (no release, no leave: its leases
        must lapse)."""
        self.stop(i, signal.SIGKILL)

    def kill9_member(self, member: str) -> int:
        """``kill -9`` the one process that is ``member`` (its node's supervisor restarts
        it); its pid."""
        pid = self.node(member).process_pid(member)
        os.kill(pid, signal.SIGKILL)
        return pid

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``, every process of it (a paused process: it believes it
        still owns its keys)."""
        self._signal(i, signal.SIGSTOP)
        self.paused.add(self.nodes[i].name)

    def resume(self, i: int) -> None:
        self._signal(i, signal.SIGCONT)
        self.paused.discard(self.nodes[i].name)

    def _signal(self, i: int, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of node ``i`` (it has some)."""
        pids = self.nodes[i].pids()
        assert pids
        for pid in pids:
            os.kill(pid, sig)

    def index(self, node: Node) -> int:
        return self.nodes.index(node)

    def close(self) -> None:
        for node in self.nodes:
            if node.server is not None and node.server.proc.poll() is None:
                for pid in node.pids():
                    try:
                        os.kill(pid, signal.SIGCONT)   # a paused one stops too
                    except ProcessLookupError:
                        pass
        self.stop()
        for node in self.nodes:
            node.proxy.stop()

    # -- the view ---------------------------------------------------------------------------
    def running(self) -> list[Node]:
        """The started nodes (paused ones included)."""
        return [n for n in self.nodes if n.server is not None]

    def reachable(self) -> list[Node]:
        """The started nodes that are not paused."""
        return [n for n in self.running() if n.name not in self.paused]

    def views(self) -> dict[str, dict[str, Any]]:
        out = {}
        for node in self.reachable():
            try:
                status, body = node.json("/api/v1/cluster")
            except (OSError, ValueError):
                continue
            if status == 200:
                out[node.name] = body
        return out

    def wait_agreed(self, timeout: float = 60.0, members: int | None = None,
                    among: list[Node] | None = None) -> dict[str, Any]:
        """Wait until every running node (or every node of ``among``) reports the same
        view epoch with the processes of ``members`` nodes serving (default: the running
        nodes) and one owner per strict key; returns that view. Paused nodes are not
        asked."""
        want = (len(self.running()) if members is None else members) * self.workers
        asked = {n.name for n in (self.reachable() if among is None else among)}
        views: dict[str, dict[str, Any]] = {}

        def agreed() -> dict[str, Any] | None:
            nonlocal views
            views = {k: v for k, v in self.views().items() if k in asked}
            epochs = {v["epoch"] for v in views.values()}
            if len(views) == len(asked) and len(epochs) == 1:
                view = next(iter(views.values()))
                alive = [m for m in view["members"] if m["state"] == "alive"]
                owners = {json.dumps(v["owners"], sort_keys=True) for v in views.values()}
                if len(view["members"]) == want and len(alive) == want and len(owners) == 1 \
                        and view["owners"]:
                    return view
            return None

        return self.poll(agreed, timeout, 0.2, lambda: (
            f"the nodes did not agree on a view of {want} members in {timeout} s: "
            f"{json.dumps(views, indent=1)}"))

    def wait_serving(self, key: str = STRICT_KEY, timeout: float = 60.0,
                     members: int | None = None, among: list[Node] | None = None) -> Node:
        """Wait until the key's owner in the agreed view answers it (after a crash the
        new owner waits out the old one's lease first); returns the owner."""
        owner = self.node(self.wait_agreed(timeout, members, among)["owners"][key])
        status, body = 0, b""

        def serving() -> Node | None:
            nonlocal status, body
            status, _, body = owner.get(f"/api/segment/get/{key}")
            return owner if status == 200 else None

        return self.poll(serving, timeout, 0.1, lambda: (
            f"owner {owner.name} did not serve {key!r} within {timeout} s: "
            f"{status} {body[:300]!r}"))

    def poll(self, check: Callable[[], T | None], timeout: float, interval: float,
             failure: Callable[[], str]) -> T:
        """``check()`` every ``interval`` s until it gives something other than None;
        after ``timeout`` s an AssertionError with ``failure()`` and every node's log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got is not None:
                return got
            time.sleep(interval)
        raise AssertionError(failure() + "\n" + self.logs())

    def node(self, name: str) -> Node:
        """The node called ``name``, or whose process is member ``name``."""
        return next(n for n in self.nodes if n.name == name or name in n.members)

    def owner_of(self, key: str = STRICT_KEY) -> Node:
        return self.node(self.wait_agreed()["owners"][key])

    def others(self, node: Node) -> list[Node]:
        return [n for n in self.reachable() if n is not node]

    # -- the database ------------------------------------------------------------------------
    def sql(self, query: str, **params: Any) -> list[tuple[Any, ...]]:
        """Rows of ``query`` on the database itself (not through any node's proxy)."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(query), params)]
        finally:
            engine.dispose()

    def max_id(self, key: str = STRICT_KEY) -> int:
        """``leaf_alloc.max_id`` of ``key`` as stored now."""
        return int(self.sql("SELECT max_id FROM leaf_alloc WHERE biz_tag = :k", k=key)[0][0])

    def key_owner(self, key: str = STRICT_KEY) -> tuple[str, int, bool]:
        """(owner_node, owner_epoch, released) of ``key`` in the fence."""
        node, epoch, released = self.sql(
            "SELECT owner_node, owner_epoch, released FROM flakekit_key_owner "
            "WHERE biz_tag = :k", k=key)[0]
        return str(node), int(epoch), bool(released)

    def logs(self) -> str:
        return "\n".join(f"--- {n.name} ---\n{n.server.log()[-3000:]}"
                         for n in self.nodes if n.server is not None)


@pytest.fixture
def cluster_db() -> Iterator[str]:
    """A fresh PostgreSQL database with segment keys ``order`` and ``invoice``."""
    for url in fresh_pg():
        create_keys(url, {STRICT_KEY: 100, "invoice": 100})
        yield url


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three running nodes shared by a module's read-mostly tests (a fresh database)."""
    for url in fresh_pg():
        create_keys(url, {STRICT_KEY: 100, "invoice": 100})
        cluster = Cluster(tmp_path_factory.mktemp("trio"), url, 3)
        try:
            cluster.start()
            cluster.wait_agreed()
            yield cluster
        finally:
            cluster.close()


def metric(node: Node | Process, name: str, /, **labels: str) -> float:
    """One sample of ``node``'s /metrics (0 when the series is absent)."""
    want = {k: str(v) for k, v in labels.items()}
    for line in node.get("/metrics")[2].decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(part.split("=", 1) for part in head[len(name) + 1:-1].split(",")
                     if "=" in part) if "{" in head else {}
        if {k: v.strip('"') for k, v in found.items() if k in want} == want:
            return float(value)
    return 0.0


@pytest.fixture
def start_cluster(tmp_path: Path, cluster_db: str) -> Iterator[Callable[..., Cluster]]:
    """``start_cluster(n=3, workers=1, **config)``: N running nodes (each ``serve
    --workers``) that agree on a view."""
    made: list[Cluster] = []

    def start(n: int = 3, *args: str, workers: int = 1, **config: Any) -> Cluster:
        cluster = Cluster(tmp_path, cluster_db, n, workers, **config)
        made.append(cluster)
        cluster.start(None, *args)
        cluster.wait_agreed()
        return cluster

    yield start
    for cluster in made:
        cluster.close()


# -- clients ---------------------------------------------------------------------------------
@attrs.frozen
class Record:
    """One request as a client saw it (``id`` None: refused, ``status`` says how)."""

    start: int     # monotonic ns when the request was sent
    end: int       # when the answer was read
    id: int | None
    node: str      # the node the client asked
    status: int
    epoch: int | None = None   # X-Flakekit-Owner-Epoch of the answer
    retry_after: str | None = None   # Retry-After of a refusal
    code: str | None = None          # the refusal's "error" (JSON body)


def _error_code(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return str(data.get("error")) if isinstance(data, dict) else None


class Recorder:
    """Clients in threads, each on its own keep-alive connection to one node (round
    robin over ``nodes``), asking ``path`` until ``stop()`` or ``count`` requests each."""

    def __init__(self, nodes: list[Node], path: str = f"/api/segment/get/{STRICT_KEY}",
                 clients: int = 6, headers: dict[str, str] | None = None) -> None:
        self.nodes = nodes
        self.path = path
        self.clients = clients
        self.headers = headers or {}
        self.records: list[Record] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _client(self, node: Node, count: int | None) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
        done = 0
        while not self._stop.is_set() and (count is None or done < count):
            start = time.monotonic_ns()
            try:
                conn.request("GET", self.path, headers=self.headers)
                resp = conn.getresponse()
                body = resp.read()
                end = time.monotonic_ns()
                epoch = resp.getheader("X-Flakekit-Owner-Epoch")
                value = int(body) if resp.status == 200 and body.isdigit() else None
                record = Record(start, end, value, node.name, resp.status,
                                int(epoch) if epoch else None, resp.getheader("Retry-After"),
                                None if value is not None else _error_code(body))
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
                record = Record(start, time.monotonic_ns(), None, node.name, 0)
                with self._lock:
                    self.errors.append(f"{node.name}: {exc!r}")
                time.sleep(0.05)
            with self._lock:
                self.records.append(record)
            done += 1
        conn.close()

    def start(self, count: int | None = None) -> Recorder:
        for i in range(self.clients):
            node = self.nodes[i % len(self.nodes)]
            thread = threading.Thread(target=self._client, args=(node, count), daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self) -> list[Record]:
        self._stop.set()
        return self.join()

    def join(self, timeout: float = 120) -> list[Record]:
        for thread in self._threads:
            thread.join(timeout)
        return list(self.records)

    def run(self, count: int) -> list[Record]:
        return self.start(count).join()


def check_i1(records: list[Record]) -> None:
    """No ID answered twice."""
    counts = Counter(r.id for r in records if r.id is not None)
    dupes = {i for i, n in counts.items() if n > 1}
    assert not dupes, f"IDs answered twice: {sorted(dupes)[:10]}"


def check_i2(records: list[Record]) -> None:
    """Per-key real-time order: an answer to a request that started after another one
    ended is larger than it (sorted by start; a running max over the ends)."""
    served = sorted((r for r in records if r.id is not None), key=lambda r: r.start)
    by_end = sorted(served, key=lambda r: r.end)
    best = -1           # the largest ID of the requests that ended so far
    best_rec: Record | None = None
    j = 0
    for rec in served:
        while j < len(by_end) and by_end[j].end < rec.start:
            if by_end[j].id is not None and by_end[j].id > best:   # type: ignore[operator]
                best, best_rec = by_end[j].id, by_end[j]   # type: ignore[assignment]
            j += 1
        assert rec.id is not None and rec.id > best, (
            f"I2 broken: {rec} started after {best_rec} ended, but its ID is not larger")


def check_ids(records: list[Record]) -> None:
    """I1 and I2, the two properties every drill asserts over what its clients saw."""
    check_i1(records)
    check_i2(records)


def unavailable_ms(records: list[Record], since: int | None = None) -> float:
    """The longest stretch (ms) in which no client got an ID: the largest gap between
    the ends of consecutive answered requests (from ``since``, monotonic ns)."""
    ends = sorted(r.end for r in records if r.id is not None)
    if since is not None:
        before = [e for e in ends if e <= since]
        ends = before[-1:] + [e for e in ends if e > since]
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return max(gaps, default=0) / 1e6
