"""Cluster mode over HTTP: what routing a strict key costs, and how long a hand-off takes.

    .venv/bin/python benchmarks/bench_cluster.py            # ~5.5 minutes
    .venv/bin/python benchmarks/bench_cluster.py --quick    # ~70-95 s
    .venv/bin/python benchmarks/bench_cluster.py --json     # the same numbers as JSON

Starts real ``flakekit serve`` nodes on loopback (2, then a third joins), with the SQL
membership (``--membership zk`` or ``etcd``: the test services' ``$ZK_HOSTS`` /
``$ETCD_ENDPOINTS``) and a strict segment key (``order = "strict"``) on a fresh PostgreSQL database
(``$FLAKEKIT_TEST_PG``, default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``,
dropped afterwards), every cluster setting at its default (lease 10 s, handoff_wait 2 s).
For single IDs and batches of 100 and 1,000 it measures requests/s and p50/p99 latency:

* ``owner``: ``GET /api/v1/next/orders?count=N&format=ranges`` straight to the key's owner;
* ``forwarded``: the same request to a node that does not own the key (it forwards once);
* ``client``: ``flakekit.client.Client`` given every node, ``next_id``/``next_ids`` (it
  reads the view and sends the key to the owner itself, with ``X-Flakekit-View-Epoch``);
* ``node key``: an ``order = "node"`` key (Leaf's behaviour) on the owner node, same path.

Load: ``--procs`` client processes (default 2) with ``--threads`` threads each (default
4), each thread a closed loop on its own keep-alive connection (raw ``http.client`` plus
``json.loads`` of the answer for the first two rows; one shared ``Client`` per process for
the third). Several processes, because one CPython process is GIL-bound below what a node
serves; the output gives the client processes' CPU use so a client-bound row shows.

Then, with three nodes and clients hammering the key (raw HTTP through the other nodes,
as a Leaf client behind a load balancer, plus ``flakekit.client``): the longest gap
between successful answers and the count of 503s during a planned hand-off
(``flakekit cluster drain OWNER``) and during a crash hand-off (``kill -9`` the owner;
expected: about 0.88 x lease after the dead owner's last renewal; docs/cluster.md,
"Hand-off windows").
Every answer of the drills is checked: no ID twice.

``--wrk`` measures the request path alone with wrk (a C client, so no client process is
the bottleneck) on two nodes, each row a Leaf URL at full speed, best of ``--repeats``
rounds interleaved, and prints the ratios issue 24 asks for: a strict key on its owner
against a plain (``order = "node"``) key on the same node, and a strict key forwarded by
the other node against the same key asked at its owner; then the last pair again at four
times the connections (``--connections``, default 16), where a forwarding node's batches
are fuller::

    .venv/bin/python benchmarks/bench_cluster.py --wrk [--duration 5] [--repeats 3]

``--handoffs-only`` runs the hand-off drills alone (three nodes, planned then crash): what
``run_all.py`` repeats for the crash hand-off's five runs per membership.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import fmt_ms, load_average, percentile_ms, run_threads

from flakekit.testing.command import run_flakekit as cli
from flakekit.testing.requests import http_get

PY = sys.executable
FLAKEKIT = str(Path(PY).with_name("flakekit"))
PG_ADMIN = os.environ.get("FLAKEKIT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
STRICT_GEN, STRICT_KEY = "orders", "order"
NODE_GEN, NODE_KEY = "invoices", "invoice"
STEP = 10_000
COUNTS = (1, 100, 1000)
#: a raw (Leaf-style) client waits this long after a 503 before it asks again
RETRY_503_S = 0.02


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the cluster -------------------------------------------------------------------------------
def write_config(path: Path, url: str,
                 membership: str = '{ type = "sql", backend = "main" }') -> None:
    path.write_text(
        f'[backends.main]\nurl = "{url}"\n\n'
        f'[cluster]\nname = "bench"\nmembership = {membership}\n\n'
        f'[generators.{STRICT_GEN}]\nstrategy = "segment"\norder = "strict"\n'
        f'store = {{ type = "sql", backend = "main" }}\nkey = "{STRICT_KEY}"\n\n'
        f'[generators.{NODE_GEN}]\nstrategy = "segment"\n'
        f'store = {{ type = "sql", backend = "main" }}\nkey = "{NODE_KEY}"\n')


def membership_config(store: str) -> dict[str, str]:
    """``write_config``'s membership for ``store`` (a fresh root on ZooKeeper and etcd)."""
    root = f"/fk-bench-{os.getpid()}-{int(time.time())}"
    if store == "zk":
        return {"membership": f'{{ type = "zookeeper", hosts = "{os.environ["ZK_HOSTS"]}", '
                              f'root = "{root}" }}'}
    if store == "etcd":
        return {"membership": f'{{ type = "etcd", endpoints = '
                              f'"{os.environ["ETCD_ENDPOINTS"]}", root = "{root}" }}'}
    return {}


def free_port() -> int:
    from flakekit.testing.databases import free_port as free

    return free()


def answers(port: int, path: str, timeout: float = 5) -> bool:
    """``GET path`` answered 200 (a refused or dropped connection: False)."""
    try:
        return http_get(port, path, timeout)[0] == 200
    except OSError:
        return False


class Node:
    """One ``flakekit serve`` process with ``--node`` and ``--advertise``."""

    def __init__(self, name: str, config: Path, tmp: Path) -> None:
        self.name, self.config, self.tmp = name, config, tmp
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def advertise(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if k != "FLAKEKIT_CONFIG"}
        out = open(self.tmp / f"{self.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [FLAKEKIT, "serve", "--config", str(self.config), "--port", str(self.port),
             "--node", self.name, "--advertise", self.advertise],
            stdout=out, stderr=out, env=env, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"node {self.name} exited with {self.proc.returncode}:\n"
                                 + self.log())
            if answers(self.port, "/api/v1/cluster", 1):
                return
            time.sleep(0.1)
        raise SystemExit(f"node {self.name} did not come up in {timeout} s:\n" + self.log())

    def log(self) -> str:
        return (self.tmp / f"{self.name}.log").read_text(errors="replace")[-3000:]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def view(self) -> dict[str, Any] | None:
        try:
            status, _, body = http_get(self.port, "/api/v1/cluster", 2)
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def cpu_s(self) -> float:
        """utime + stime of the process so far (seconds)."""
        if not self.running():
            return 0.0
        assert self.proc is not None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_agreed(nodes: list[Node], members: int, timeout: float = 90) -> dict[str, Any]:
    """Every running node on one epoch, ``members`` alive members, one owner map."""
    deadline = time.monotonic() + timeout
    views: dict[str, Any] = {}
    while time.monotonic() < deadline:
        views = {n.name: n.view() for n in nodes if n.running()}
        got = [v for v in views.values() if v]
        if len(got) == len(views) and len({v["epoch"] for v in got}) == 1:
            view = got[0]
            alive = [m for m in view["members"] if m["state"] == "alive"]
            owners = {json.dumps(v["owners"], sort_keys=True) for v in got}
            if len(alive) == members and len(owners) == 1 and view["owners"].get(STRICT_KEY):
                return view
        time.sleep(0.2)
    raise SystemExit(f"no agreed view of {members} members in {timeout} s: {views}")


def wait_serving(node: Node, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(node.port, f"/api/v1/next/{STRICT_GEN}?count=1"):
            return
        time.sleep(0.1)
    raise SystemExit(f"owner {node.name} did not serve {STRICT_KEY!r} in {timeout} s")


# -- load: client processes, threads in each ---------------------------------------------------
def _raw_thread(port: int, path: str, start_at: float, end_at: float,
                lat: list[float], statuses: Counter[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while (t0 := time.monotonic()) < end_at:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        t1 = time.monotonic()
        if resp.status == 200:
            json.loads(body)
        if t0 >= start_at:
            lat.append(t1 - t0)
            statuses[resp.status] += 1
    conn.close()


def _client_thread(client: Any, count: int, start_at: float, end_at: float,
                   lat: list[float], statuses: Counter[int]) -> None:
    while (t0 := time.monotonic()) < end_at:
        if count == 1:
            client.next_id(STRICT_GEN)
        else:
            client.next_ids(STRICT_GEN, count)
        t1 = time.monotonic()
        if t0 >= start_at:
            lat.append(t1 - t0)
            statuses[200] += 1


def _load_proc(spec: dict[str, Any], queue: Any) -> None:
    lats: list[list[float]] = [[] for _ in range(spec["threads"])]
    statuses: list[Counter[int]] = [Counter() for _ in range(spec["threads"])]
    client = None
    if spec["mode"] == "client":
        from flakekit.client import Client

        client = Client(spec["urls"], retry_budget=10.0)
        client.next_id(STRICT_GEN)   # reads the view
        args = [(client, spec["count"], spec["start_at"], spec["end_at"], lats[i], statuses[i])
                for i in range(spec["threads"])]
        target: Any = _client_thread
    else:
        args = [(spec["port"], spec["path"], spec["start_at"], spec["end_at"], lats[i],
                 statuses[i]) for i in range(spec["threads"])]
        target = _raw_thread
    threads = [threading.Thread(target=target, args=a, daemon=True) for a in args]
    def started() -> float:
        while time.monotonic() < spec["start_at"]:
            time.sleep(0.005)
        return time.process_time()

    cpu0 = run_threads(threads, started)   # returns once the threads are done
    cpu = time.process_time() - cpu0
    if client is not None:
        client.close()
    total: Counter[int] = Counter()
    for s in statuses:
        total.update(s)
    queue.put({"lat": [x for lst in lats for x in lst], "statuses": dict(total), "cpu": cpu})


def measure(mode: str, count: int, args: argparse.Namespace, nodes: list[Node],
            target: Node) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    now = time.monotonic()
    start_at = now + 0.3 + args.warmup
    end_at = start_at + args.duration
    gen = NODE_GEN if mode == "node key" else STRICT_GEN
    spec = {"mode": "client" if mode == "client" else "raw", "threads": args.threads,
            "count": count, "start_at": start_at, "end_at": end_at,
            "port": target.port, "path": f"/api/v1/next/{gen}?count={count}&format=ranges",
            "urls": [n.advertise for n in nodes if n.running()]}
    procs = [ctx.Process(target=_load_proc, args=(spec, queue)) for _ in range(args.procs)]
    for p in procs:
        p.start()
    while time.monotonic() < start_at:
        time.sleep(0.005)
    cpu0 = {n.name: n.cpu_s() for n in nodes if n.running()}
    while time.monotonic() < end_at:
        time.sleep(0.01)
    cpu1 = {n.name: n.cpu_s() for n in nodes if n.running()}
    outs = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    lat = [x for o in outs for x in o["lat"]]
    statuses: Counter[int] = Counter()
    for o in outs:
        statuses.update({int(k): v for k, v in o["statuses"].items()})
    ok = statuses.get(200, 0)
    return {"mode": mode, "count": count, "requests": len(lat), "ok": ok,
            "non_200": {str(k): v for k, v in statuses.items() if k != 200},
            "rps": ok / args.duration, "ids_per_s": ok * count / args.duration,
            "p50_ms": percentile_ms(lat, 0.50), "p99_ms": percentile_ms(lat, 0.99),
            "client_cpu": sum(o["cpu"] for o in outs) / args.duration,
            "server_cpu": {k: (cpu1.get(k, 0.0) - v) / args.duration for k, v in cpu0.items()}}


def throughput(args: argparse.Namespace, nodes: list[Node], view: dict[str, Any]
               ) -> list[dict[str, Any]]:
    """Every (count, path) row, ``--repeats`` rounds interleaved; the best round by req/s."""
    owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])
    other = next(n for n in nodes if n.running() and n is not owner)
    members = len([n for n in nodes if n.running()])
    best: dict[tuple[int, str], dict[str, Any]] = {}
    for _ in range(args.repeats):
        for count in args.counts:
            for mode, target in (("owner", owner), ("forwarded", other), ("client", owner),
                                 ("node key", owner)):
                row = measure(mode, count, args, nodes, target)
                row["target"] = "(routes itself)" if mode == "client" else target.name
                row["members"] = members
                log(f"  {members} nodes, {mode:<9} count={count:<5} {row['rps']:>8,.0f} req/s "
                    f"p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms client cpu "
                    f"{row['client_cpu']:.2f} nodes cpu {sum(row['server_cpu'].values()):.2f} "
                    f"{row['non_200'] or ''}")
                if (count, mode) not in best or row["rps"] > best[count, mode]["rps"]:
                    best[count, mode] = row
    return list(best.values())


# -- --wrk: the request path alone, ratios ----------------------------------------------------
WRK_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("FKSTAT %d %d %d %d %d %d\\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50),
    latency:percentile(99)))
end
"""


def wrk_row(url: str, args: argparse.Namespace, script: Path,
            connections: int | None = None) -> dict[str, Any]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections or args.connections}",
                          f"-d{args.duration:g}s",
                          "-s", str(script), url], capture_output=True, text=True,
                         timeout=args.duration + 60).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("FKSTAT"))
    requests, duration_us, errors, non2xx, p50, p99 = map(int, line.split()[1:])
    return {"rps": requests / (duration_us / 1e6), "errors": errors + non2xx,
            "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3}


def wrk_rows(args: argparse.Namespace, nodes: list[Node], view: dict[str, Any],
             tmp: Path) -> dict[str, Any]:
    """Strict on its owner, plain on the same node, strict forwarded by the other node."""
    owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])
    other = next(n for n in nodes if n.running() and n is not owner)
    script = tmp / "stats.lua"
    script.write_text(WRK_LUA)
    direct = f"{owner.advertise}/api/segment/get/{STRICT_KEY}"
    forwarded = f"{other.advertise}/api/segment/get/{STRICT_KEY}"
    wide = args.connections * 4
    # name -> (URL, wrk connections); the last two: the same pair with more concurrency
    # (a forwarding node's batches fill up; its wake-ups are shared by more requests)
    rows = {"strict, owner": (direct, args.connections),
            "plain, owner": (f"{owner.advertise}/api/segment/get/{NODE_KEY}",
                             args.connections),
            "strict, forwarded": (forwarded, args.connections),
            f"strict, owner, c{wide}": (direct, wide),
            f"strict, forwarded, c{wide}": (forwarded, wide)}
    for url, _ in list(rows.values())[:3]:   # warm-up: connections, segments, the pool
        wrk_row(url, argparse.Namespace(connections=args.connections, duration=1), script)
    best: dict[str, dict[str, Any]] = {}
    running = [n for n in nodes if n.running()]
    for _ in range(args.repeats):
        for name, (url, connections) in rows.items():
            cpu0 = sum(n.cpu_s() for n in running)
            row = wrk_row(url, args, script, connections)
            # CPU of both nodes per request: steadier than req/s on a shared machine
            row["node_cpu_us"] = (sum(n.cpu_s() for n in running) - cpu0) / max(
                1, row["rps"] * args.duration) * 1e6
            log(f"  {name:<22} {row['rps']:>9,.0f} req/s p50 {row['p50_ms']:.2f} ms "
                f"p99 {row['p99_ms']:.2f} ms nodes' CPU {row['node_cpu_us']:.1f} us/request "
                f"errors {row['errors']}")
            if name not in best or row["rps"] > best[name]["rps"]:
                best[name] = row
    return best


def wrk_table(best: dict[str, Any], args: argparse.Namespace, load: str) -> str:
    lines = [f"cluster request path, wrk -t1 -c{args.connections}, {args.duration:g} s rows, best "
             f"of {args.repeats}, 2 nodes on {len(os.sched_getaffinity(0))} cores; load "
             f"average {load}",
             f"{'row':<22} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU us/req':>10} "
             f"{'errors':>6}"]
    for name, row in best.items():
        lines.append(f"{name:<22} {row['rps']:>9,.0f} {row['p50_ms']:>7.2f} "
                     f"{row['p99_ms']:>7.2f} {row['node_cpu_us']:>10.1f} {row['errors']:>6}")
    owner, plain = best["strict, owner"], best["plain, owner"]
    fwd = best["strict, forwarded"]
    wide = args.connections * 4
    wide_owner, wide_fwd = best[f"strict, owner, c{wide}"], best[f"strict, forwarded, c{wide}"]
    lines.append(f"strict on its owner / plain key: {owner['rps'] / plain['rps']:.2f} req/s, "
                 f"{plain['node_cpu_us'] / owner['node_cpu_us']:.2f} per CPU (target >= 0.80); "
                 f"forwarded / direct: {fwd['rps'] / owner['rps']:.2f} req/s, "
                 f"{owner['node_cpu_us'] / fwd['node_cpu_us']:.2f} per CPU (target >= 0.50); "
                 f"at {wide} connections: {wide_fwd['rps'] / wide_owner['rps']:.2f} req/s, "
                 f"{wide_owner['node_cpu_us'] / wide_fwd['node_cpu_us']:.2f} per CPU")
    lines.append("(CPU us/req: both nodes' CPU time during the row per request answered; "
                 "best round by req/s)")
    return "\n".join(lines)


# -- hand-off drills ---------------------------------------------------------------------------
def _hammer_raw(port: int, stop: Any, out: Any) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ok: list[tuple[float, int, int]] = []
    refused: Counter[str] = Counter()
    while not stop.is_set():
        try:
            conn.request("GET", f"/api/v1/next/{STRICT_GEN}?count=1&format=ranges")
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            refused["connection"] += 1
            time.sleep(RETRY_503_S)
            continue
        end = time.monotonic()
        if resp.status == 200:
            start = json.loads(body)["ranges"][0]["start"]
            ok.append((end, int(start), int(resp.getheader("X-Flakekit-Owner-Epoch") or 0)))
        else:
            try:
                code = json.loads(body).get("error", "")
            except ValueError:
                code = ""
            refused[f"{resp.status} {code}".strip()] += 1
            time.sleep(RETRY_503_S)
    conn.close()
    out.put({"kind": "raw", "ok": ok, "refused": dict(refused)})


def _hammer_client(urls: list[str], threads: int, stop: Any, out: Any) -> None:
    from flakekit.client import Client

    client = Client(urls, retry_budget=60.0)
    oks: list[list[tuple[float, int, int]]] = [[] for _ in range(threads)]
    errors: Counter[str] = Counter()
    messages: dict[str, str] = {}

    def run(ok: list[tuple[float, int, int]]) -> None:
        while not stop.is_set():
            try:
                value = client.next_id(STRICT_GEN)
            except Exception as exc:  # noqa: BLE001 - counted, the drill goes on
                errors[type(exc).__name__] += 1
                messages.setdefault(type(exc).__name__, str(exc)[:300])
                continue
            ok.append((time.monotonic(), value, 0))

    ts = [threading.Thread(target=run, args=(o,), daemon=True) for o in oks]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    client.close()
    out.put({"kind": "client", "ok": [x for o in oks for x in o], "refused": dict(errors),
             "messages": messages})


def gap_after(times: list[float], event: float) -> tuple[float, float | None]:
    """(longest gap between consecutive answers from the last one before ``event`` on,
    the time from ``event`` to the answer that ended it), in ms; no answer after
    ``event``: (time from the last answer to now, None)."""
    times = sorted(times)
    before = [t for t in times if t <= event]
    after = [t for t in times if t > event]
    if not after:
        return (time.monotonic() - (before[-1] if before else event)) * 1e3, None
    series = ([before[-1]] if before else [event]) + after
    best, end = 0.0, event
    for a, b in zip(series, series[1:], strict=False):
        if b - a > best:
            best, end = b - a, b
    return best * 1e3, (end - event) * 1e3


def drill(name: str, nodes: list[Node], owner: Node, action: Any, alive: int,
          args: argparse.Namespace) -> dict[str, Any]:
    """Hammer the key, run ``action`` (the hand-off), wait until ``alive`` members agree
    on a view with another owner and it serves, then ``args.settle`` s more."""
    ctx = multiprocessing.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    raw_nodes = [n for n in nodes if n.running() and n is not owner]
    if name == "planned":
        raw_nodes = [n for n in nodes if n.running()]   # the drained node keeps forwarding
    procs = [ctx.Process(target=_hammer_raw, args=(n.port, stop, out))
             for n in raw_nodes for _ in range(2)]
    urls = [n.advertise for n in nodes if n.running()]
    procs.append(ctx.Process(target=_hammer_client, args=(urls, 2, stop, out)))
    for p in procs:
        p.start()
    time.sleep(1.5)
    event = time.monotonic()
    detail = action()
    action_ms = (time.monotonic() - event) * 1e3
    serving_at = None
    try:
        deadline = time.monotonic() + args.max_wait
        while True:   # a view the running nodes agree on, with another owner
            view = wait_agreed(nodes, alive, args.max_wait)
            if view["owners"][STRICT_KEY] != owner.name or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        new_owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])
        wait_serving(new_owner, args.max_wait)
        serving_at = (time.monotonic() - event) * 1e3
    finally:
        time.sleep(args.settle)
        stop.set()
    outs = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    raw = [x for o in outs if o["kind"] == "raw" for x in o["ok"]]
    lib = [x for o in outs if o["kind"] == "client" for x in o["ok"]]
    ids = [x[1] for x in raw + lib]
    dupes = len(ids) - len(set(ids))
    refused: Counter[str] = Counter()
    lib_errors: Counter[str] = Counter()
    for o in outs:
        (refused if o["kind"] == "raw" else lib_errors).update(o["refused"])
    raw_gap, raw_first = gap_after([x[0] for x in raw], event)
    lib_gap, lib_first = gap_after([x[0] for x in lib], event)
    all_gap, _ = gap_after([x[0] for x in raw + lib], event)
    old_epoch = max((x[2] for x in raw if x[0] <= event), default=0)
    new_first = min((x[0] for x in raw if x[0] > event and x[2] > old_epoch), default=None)
    old_last = max((x[0] for x in raw if x[0] > event and x[2] == old_epoch), default=None)
    n503 = sum(v for k, v in refused.items() if k.startswith("503"))
    messages = {k: v for o in outs for k, v in o.get("messages", {}).items()}
    return {"drill": name, "owner": owner.name, "detail": detail,
            "raw_clients": len(raw_nodes) * 2, "raw_nodes": [n.name for n in raw_nodes],
            "answers": len(ids), "duplicates": dupes, "gap_ms": all_gap,
            "raw_gap_ms": raw_gap, "raw_first_ms": raw_first,
            "client_gap_ms": lib_gap, "client_first_ms": lib_first,
            "503s": n503, "refused": dict(refused), "client_errors": dict(lib_errors),
            "client_error_messages": messages, "agreed_and_serving_ms": serving_at,
            "action_ms": action_ms,
            "old_epoch": old_epoch,
            "old_owner_last_ms": None if old_last is None else (old_last - event) * 1e3,
            "new_owner_first_ms": None if new_first is None else (new_first - event) * 1e3}


def handoffs(args: argparse.Namespace, nodes: list[Node], config: Path) -> list[dict[str, Any]]:
    out = []
    view = wait_agreed(nodes, len(nodes))
    owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])

    def drain() -> str:
        done = cli("cluster", "drain", owner.name, "--config", str(config))
        if done.returncode != 0:
            raise SystemExit(f"drain failed: {done.stdout}{done.stderr}")
        return done.stdout.strip().splitlines()[0]

    log(f"  planned hand-off: draining {owner.name}")
    out.append(drill("planned", nodes, owner, drain, len(nodes) - 1, args))
    view = wait_agreed(nodes, len(nodes) - 1)
    owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])
    wait_serving(owner)

    def crash() -> str:
        owner.stop(signal.SIGKILL)
        return f"kill -9 {owner.name}"

    log(f"  crash hand-off: kill -9 {owner.name} (default lease 10 s: ~9 s)")
    out.append(drill("crash", nodes, owner, crash, len(nodes) - 2, args))
    return out


# -- output ------------------------------------------------------------------------------------
def per_cpu(row: dict[str, Any]) -> float:
    """Requests per CPU second of the clients and the nodes together: on a shared machine
    this moves less with the load than req/s does."""
    cpu = row["client_cpu"] + sum(row["server_cpu"].values())
    return row["rps"] / cpu if cpu else 0.0


def tables(data: dict[str, Any]) -> str:
    rows = data["throughput"]
    lines = [] if not rows else throughput_tables(data)
    lines += handoff_table(data)
    return "\n".join(lines)


def throughput_tables(data: dict[str, Any]) -> list[str]:
    rows = data["throughput"]
    lines = [f"Membership: {data.get('membership', 'sql')}. "
             f"{data['procs']} client processes x {data['threads']} threads (closed loop, "
             f"keep-alive), best of {data['repeats']} x {data['duration']:g} s per row; "
             f"{data['cores']} cores, load average {data['load_before']} before, "
             f"{data['load_after']} after. CPU columns: CPU seconds per second (1.00 = one "
             "core) of the client processes and of all nodes.", ""]
    lines += ["| nodes | IDs/request | path | req/s | IDs/s | p50 ms | p99 ms | vs owner req/s "
              "| vs owner p50 | client CPU | nodes' CPU | req per CPU-s |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = next(x for x in rows if x["members"] == r["members"] and x["count"] == r["count"]
                    and x["mode"] == "owner")
        ratio = r["rps"] / base["rps"] if base["rps"] else 0.0
        p50 = r["p50_ms"] / base["p50_ms"] if base["p50_ms"] else 0.0
        errs = f" ({r['non_200']})" if r["non_200"] else ""
        lines.append(f"| {r['members']} | {r['count']:,} | {r['mode']}{errs} | {r['rps']:,.0f} | "
                     f"{r['ids_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{ratio:.2f}x | {p50:.2f}x | {r['client_cpu']:.2f} | "
                     f"{sum(r['server_cpu'].values()):.2f} | {per_cpu(r):,.0f} |")
    lines += ["", "Overhead against the owner: req/s of the owner / req/s of the row (1.25 = "
              "25 % more time per request), and the same per CPU second of clients and nodes "
              "together (steadier on a loaded machine):", "",
              "| nodes | IDs/request | forwarded | client library | node key | forwarded, "
              "per CPU-s | client library, per CPU-s | node key, per CPU-s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    modes = ("forwarded", "client", "node key")
    for members in sorted({r["members"] for r in rows}):
        for count in sorted({r["count"] for r in rows}):
            got = {r["mode"]: r for r in rows if r["members"] == members and r["count"] == count}
            base, base_cpu = got["owner"]["rps"], per_cpu(got["owner"])
            lines.append(f"| {members} | {count:,} | " + " | ".join(
                f"{base / got[m]['rps']:.2f}" if got[m]["rps"] else "-" for m in modes) + " | "
                + " | ".join(f"{base_cpu / per_cpu(got[m]):.2f}" if per_cpu(got[m]) else "-"
                             for m in modes) + " |")
    return lines + [""]


def handoff_table(data: dict[str, Any]) -> list[str]:
    lines = [f"Hand-off with clients hammering the key (membership "
             f"{data.get('membership', 'sql')}, default lease 10 s, handoff_wait 2 s; load "
             f"average {data['load_before']} before, {data['load_after']} after):", "",
             "| hand-off | action | old owner's last / new owner's first answer | longest gap, "
             "all clients | raw HTTP: longest gap | raw HTTP 503s | flakekit.client: longest "
             "gap | flakekit.client errors | answers | duplicates |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]

    for d in data["handoffs"]:
        lines.append(f"| {d['drill']} | {d['detail']} (took {fmt_ms(d['action_ms'])}) | "
                     f"{fmt_ms(d['old_owner_last_ms'])} / "
                     f"{fmt_ms(d['new_owner_first_ms'])} | "
                     f"{fmt_ms(d['gap_ms'])} | {fmt_ms(d['raw_gap_ms'])} | {d['503s']:,} | "
                     f"{fmt_ms(d['client_gap_ms'])} | {d['client_errors'] or 'none'} | "
                     f"{d['answers']:,} | {d['duplicates']} |")
    lines += ["", "Raw HTTP clients ask the non-owner nodes (crash: the survivors) and wait "
              f"{RETRY_503_S * 1e3:.0f} ms after a refusal; refusals by code: "
              + "; ".join(f"{d['drill']}: {d['refused'] or 'none'}" for d in data["handoffs"])
              + ". The flakekit.client threads (2, retry_budget 60 s) are given every node. "
              "Old owner's last / new owner's first answer: after the start of the action, by "
              "the X-Flakekit-Owner-Epoch of the raw answers (the old owner stops when it sees "
              "the new epoch: SQL membership has no notification, so at a renewal, every third "
              "of the lease)."]
    for d in data["handoffs"]:
        for kind, msg in d["client_error_messages"].items():
            lines.append(f"\n{d['drill']}: flakekit.client {kind}, e.g.: `{msg}`")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (~90 s in all)")
    parser.add_argument("--json", action="store_true", help="print JSON only (with the tables "
                        "under 'table')")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per throughput row (default 4; --quick 0.8)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds of every row, the best kept (default 2; --quick 1)")
    parser.add_argument("--procs", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process")
    parser.add_argument("--keep", action="store_true", help="keep the node logs (a temp dir)")
    parser.add_argument("--pg", default=PG_ADMIN, help="PostgreSQL URL that may create databases")
    parser.add_argument("--membership", choices=("sql", "zk", "etcd"), default="sql",
                        help="where the members live (zk: $ZK_HOSTS, etcd: $ETCD_ENDPOINTS; "
                        "default sql, the segments' database)")
    parser.add_argument("--wrk", action="store_true", help="only the request path, with wrk: "
                        "strict vs plain key on the owner, forwarded vs direct (ratios)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (--wrk)")
    parser.add_argument("--handoffs-only", action="store_true", help="only the hand-off drills "
                        "(3 nodes, planned then crash), no throughput rows")
    args = parser.parse_args()
    if args.wrk and shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    args.duration = args.duration or (0.6 if args.quick else 4.0)
    args.repeats = args.repeats or (1 if args.quick else 3 if args.wrk else 2)
    args.warmup = 0.2 if args.quick else 1.0
    args.settle = 1.0 if args.quick else 3.0
    args.max_wait = 60.0
    args.counts = (1, 1000) if args.quick else COUNTS

    from sqlalchemy.engine import make_url

    from flakekit.testing.databases import fresh_database, listening

    pg = make_url(args.pg)
    if not listening(pg.port or 5432, pg.host or "127.0.0.1"):
        raise SystemExit(f"PostgreSQL is not listening at {pg.host}:{pg.port} (--pg)")
    tmp = Path(tempfile.mkdtemp(prefix="fk-bench-cluster-"))
    load_before = load_average()
    started = time.monotonic()
    nodes: list[Node] = []
    try:
        with fresh_database(args.pg) as url:
            config = tmp / "cluster.toml"
            write_config(config, url, **membership_config(args.membership))
            for args_ in (("db", "init"), ("segments", "create", STRICT_KEY, "--step", str(STEP)),
                          ("segments", "create", NODE_KEY, "--step", str(STEP))):
                done = cli(*args_, "--config", str(config))
                if done.returncode != 0:
                    raise SystemExit(f"flakekit {' '.join(args_)}: {done.stdout}{done.stderr}")
            nodes = [Node(f"n{i}", config, tmp) for i in range(3)]
            if args.wrk:
                for node in nodes[:2]:
                    node.start()
                view = wait_agreed(nodes, 2)
                wait_serving(next(n for n in nodes if n.name == view["owners"][STRICT_KEY]))
                best = wrk_rows(args, nodes, view, tmp)
                load = load_average()
                for node in nodes:
                    node.stop()
                table = wrk_table(best, args, load)
                owner, fwd = best["strict, owner"], best["strict, forwarded"]
                print(json.dumps({
                    "wrk": best, "load": load, "load_before": load_before,
                    "duration": args.duration, "repeats": args.repeats,
                    "connections": args.connections, "table": table,
                    "strict_over_plain": owner["rps"] / best["plain, owner"]["rps"],
                    "forwarded_over_direct": fwd["rps"] / owner["rps"],
                    "forwarded_over_direct_wide": (
                        best[f"strict, forwarded, c{args.connections * 4}"]["rps"]
                        / best[f"strict, owner, c{args.connections * 4}"]["rps"])}, indent=2)
                      if args.json else table)
                return
            rows: list[dict[str, Any]] = []
            for members in (3,) if args.handoffs_only else (2, 3):
                for node in nodes[:members]:
                    if not node.running():
                        node.start()
                view = wait_agreed(nodes, members)
                owner = next(n for n in nodes if n.name == view["owners"][STRICT_KEY])
                wait_serving(owner)
                log(f"{members} nodes up, view epoch {view['epoch']}, owner of "
                    f"{STRICT_KEY!r}: {owner.name}")
                if not args.handoffs_only:
                    rows += throughput(args, nodes, view)
            drills = handoffs(args, nodes, config)
            for node in nodes:
                node.stop()
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)
        if args.keep:
            log(f"node logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    data = {"throughput": rows, "handoffs": drills, "procs": args.procs,
            "membership": args.membership,
            "repeats": args.repeats,
            "threads": args.threads, "duration": args.duration, "quick": args.quick,
            "cores": len(os.sched_getaffinity(0)), "load_before": load_before,
            "load_after": load_average(),
            "seconds": time.monotonic() - started,
            "concurrency": f"{args.procs} client processes x {args.threads} threads"}
    data["table"] = tables(data)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(data["table"])
        print(f"\n({data['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
