"""Worker-id leases over HTTP: the ``http`` allocator against a real `flakekit serve`
whose registry is PostgreSQL; the allocator contract, the endpoints' refusals, and the
drills (path cut, client kill -9, server kill -9 and restart)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from server_testing import Server, fresh_pg, run_cli

from flakekit.builtin.http_lease import HttpAllocator, HttpAllocatorSettings
from flakekit.errors import ConfigError, FlakekitError, LeaseError, LeaseLostError
from flakekit.leases.lease import LeaseRequest
from flakekit.testing.allocator_contract import AllocatorContract
from flakekit.testing.proxy import TcpProxy
from flakekit.testing.pytest_plugin import cleaned_up
from flakekit.testing.threads import assert_unique
from flakekit.values.clock import MonotonicClock

TOKEN = "lease-token-0123456789abcdef"
#: short leases with their margins kept: reclaim after 3 s, safety window 1 s (the
#: registry's lease is 2 s), heartbeat 0.5 s
SHORT = 'heartbeat = "500ms", reclaim_after = ["3s"], safety_window = "1s"'
CONTRACT_GENERATORS = 16

#: every test here talks to a `flakekit serve` over PostgreSQL (not the fast lane)
pytestmark = pytest.mark.postgresql


def lease_config(path: Path, url: str, names: list[str], *, allocator: str = SHORT,
                 worker_bits: int = 10) -> Path:
    """A server config: one snowflake generator per name (sql allocator, service = name)."""
    text = (f'[backends.main]\nurl = "{url}"\n\n[layouts.small]\n'
            f'fields = [["time", {51 - worker_bits}], ["worker", {worker_bits}], ["sequence", '
            f'12]]\n'
            'unit = "1ms"\nepoch = "2024-01-01T00:00:00Z"\n\n')
    for name in names:
        text += (f'[generators.{name}]\nstrategy = "snowflake"\nlayout = "small"\n'
                 f'allocator = {{ type = "sql", backend = "main"{", " if allocator else ""}'
                 f'{allocator} }}\n\n')
    path.write_text(text)
    return path


def client_config(path: Path, base: str, name: str, *, worker_bits: int = 10,
                  window: str = '"300ms"', lost: str = "stop") -> Path:
    """A library process's config: generator ``name`` leasing over HTTP from ``base``."""
    path.write_text(
        '[layouts.small]\n'
        f'fields = [["time", {51 - worker_bits}], ["worker", {worker_bits}], ["sequence", 12]]\n'
        'unit = "1ms"\nepoch = "2024-01-01T00:00:00Z"\n\n'
        f'[generators.{name}]\nstrategy = "snowflake"\nlayout = "small"\n'
        f'on_lease_lost = "{lost}"\n'
        f'allocator = {{ type = "http", url = "{base}", token = "{TOKEN}"'
        + (f', safety_window = {window}' if window else "") + " }\n")
    return path


def serve(tmp: Path, config: Path, *args: str) -> Server:
    tokens = tmp / "tokens"
    tokens.write_text(f"* {TOKEN}\n")
    return Server(config, "--token-file", str(tokens), *args, tmp=tmp)


def free_own_ids(url: str, names: list[str]) -> None:
    """Release the rows the server's own generators hold (operator release), so a client
    asking for a one-id range can get id 0."""
    from sqlalchemy import create_engine

    from flakekit.sql.workers import list_records, release_worker

    engine = create_engine(url)
    try:
        for name in names:
            for rec in list_records(engine, name, (3_000_000_000,), 1_000_000_000):
                release_worker(engine, name, rec.worker_id, force=True)
    finally:
        engine.dispose()


def allocator(base: str, name: str, token: str | None = TOKEN,
              window: str = "300ms") -> HttpAllocator:
    settings = HttpAllocatorSettings(url=base, token=token, safety_window=window)
    return HttpAllocator(settings, MonotonicClock(), name)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    """One server for the contract: generators c0..c15, each its own service, none held."""
    tmp = tmp_path_factory.mktemp("leases")
    names = [f"c{i}" for i in range(CONTRACT_GENERATORS)]
    for url in fresh_pg():
        config = lease_config(tmp / "server.toml", url, names)
        assert run_cli("db", "init", "--config", str(config)).returncode == 0
        server = serve(tmp, config)
        try:
            free_own_ids(url, names)
            yield server, iter(names[:-2]), url   # c14 and c15: TestEndpoints
        finally:
            server.stop()


class TestHttpAllocatorContract(AllocatorContract):
    """The allocator contract, through a real server to a real PostgreSQL registry."""

    @pytest.fixture
    def service(self, served) -> str:
        """This test's generator on the server (its own registry service)."""
        return next(served[1])

    @pytest.fixture
    def expire(self, served, service):
        """Age the row's heartbeat in the registry past the reclaim tier, as if its holder
        had died: the server still thinks it holds the lease."""
        from sqlalchemy import create_engine, text

        engine = create_engine(served[2])

        def expire(lease) -> None:
            with engine.begin() as conn:
                conn.execute(text("UPDATE system_nodes SET last_seen = last_seen - "
                                  "interval '1 hour' WHERE service = :s AND machine_id = :w"),
                             {"s": service, "w": lease.worker_id})

        yield expire
        engine.dispose()

    @pytest.fixture
    def make_allocator(self, served, service):
        url = f"http://127.0.0.1:{served[0].port}"
        with cleaned_up(lambda: allocator(url, service), HttpAllocator.close) as make:
            yield make


class TestEndpoints:
    """What the lease endpoints refuse."""

    def test_refusals(self, served):
        """No token: 401 at grant, as a ConfigError naming the token; an unknown
        generator: the generator; a forged or stale lease: LeaseLostError; GET on
        renew: 405."""
        server = served[0]
        base = f"http://127.0.0.1:{server.port}"
        with pytest.raises(ConfigError, match=r"allocator\.token.*needs a token"):
            allocator(base, "c15", token=None).acquire(LeaseRequest("x", 1023, ""))
        with pytest.raises(ConfigError, match=r"allocator\.generator.*no generator 'nope'"):
            allocator(base, "nope").acquire(LeaseRequest("x", 1023, ""))
        alloc = allocator(base, "c15")
        lease = alloc.acquire(LeaseRequest("x", 1023, ""))
        lease_id = alloc._leases[lease.worker_id, lease.epoch]
        alloc._leases[lease.worker_id, lease.epoch] = "forged"
        with pytest.raises(LeaseLostError, match="holds no lease"):
            alloc.renew(lease, time.time_ns())
        alloc._leases[lease.worker_id, lease.epoch] = lease_id
        stale = type(lease)(worker_id=lease.worker_id, epoch=lease.epoch + 1)
        alloc._leases[stale.worker_id, stale.epoch] = lease_id
        with pytest.raises(LeaseLostError, match="is at epoch"):
            alloc.renew(stale, time.time_ns())
        status, _, _ = server.get(f"/api/v1/leases/c15/{lease_id}/renew?epoch=1&mark=1")
        assert status == 405
        alloc.release(lease, time.time_ns())

    def test_a_safety_window_of_half_the_validity_is_refused(self, served):
        """A client window that would leave less than half the granted validity fails the
        acquire with one line naming allocator.safety_window, and the grant goes back."""
        server = served[0]
        base = f"http://127.0.0.1:{server.port}"
        with pytest.raises(ConfigError, match=r"allocator\.safety_window.*less than half"):
            allocator(base, "c15", window="1s").acquire(LeaseRequest("x", 0, ""))
        assert allocator(base, "c15").acquire(LeaseRequest("x", 0, "")).worker_id == 0

    def test_rate_limited_per_token(self, served):
        """A token that asks too often gets 429 with Retry-After; the limit is per token."""
        server = served[0]
        seen = set()
        for _ in range(80):
            status, headers, _ = server.get("/api/v1/leases/c14",
                                            {"Authorization": f"Bearer {TOKEN}"})
            seen.add(status)
            if status == 429:
                assert int(headers["retry-after"]) >= 1
                break
        assert 429 in seen, seen


# -- drills -----------------------------------------------------------------------------------
class Issuer:
    """A thread drawing IDs from a kit's generator until it refuses; keeps (monotonic ns
    before the call, id)."""

    def __init__(self, kit: Any, name: str) -> None:
        self.gen = kit[name]
        self.ids: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            before = time.monotonic_ns()
            try:
                value = self.gen.next_id()
            except LeaseError as exc:
                self.error = exc
                return
            self.ids.append((before, value))
            time.sleep(0.0005)

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)


def poll(predicate, timeout: float = 30.0, every: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not true within {timeout} s: {predicate}")


def _worker(value: int) -> int:
    return (value >> 12) & 1


@pytest.mark.slow
class TestDrills:
    """No duplicate ID, no two holders of a worker id, no ID after the client's deadline."""

    def _server(self, tmp_path: Path, url: str, bits: int = 1, *args: str) -> tuple[Path, Server]:
        config = lease_config(tmp_path / "server.toml", url, ["orders"], worker_bits=bits)
        assert run_cli("db", "init", "--config", str(config)).returncode == 0
        return config, serve(tmp_path, config, *args)

    def test_cut_path_client_stops_before_its_id_is_reassigned(self, tmp_path, pg_url):
        """Layout of two worker ids: the server holds one, client A (behind a proxy) the
        other. Cut the path: A stops at its deadline; B gets A's id only after that, and
        their IDs never repeat."""
        import flakekit

        _, server = self._server(tmp_path, pg_url)
        proxy = TcpProxy(server.port).start()
        try:
            a_kit = flakekit.load(client_config(tmp_path / "a.toml",
                                                f"http://127.0.0.1:{proxy.port}",
                                                "orders", worker_bits=1))
            b_config = client_config(tmp_path / "b.toml", f"http://127.0.0.1:{server.port}",
                                     "orders", worker_bits=1)
            with a_kit:
                a = Issuer(a_kit, "orders")
                poll(lambda: len(a.ids) > 50)
                proxy.cut()
                cut_at = time.monotonic_ns()
                a.thread.join(30)
                assert isinstance(a.error, LeaseError), a.error
                last_a = a.ids[-1][0]   # taken before the call that issued it
                deadline = a.gen.keeper.lease.deadline_ns   # no renewal got through since
                assert last_a < deadline, "an ID after the client's deadline"
                b_kit = poll(lambda: started(b_config, "orders"), timeout=30, every=0.1)
                b_at = time.monotonic_ns()   # B holds the id from here on
                with b_kit:
                    b_ids = [b_kit["orders"].next_id() for _ in range(200)]
                assert last_a < deadline < b_at, "B held A's id while A could issue"
                print(f"\ncut: A's last ID {(last_a - cut_at) / 1e9:.2f} s after the cut, its "
                      f"deadline {(deadline - cut_at) / 1e9:.2f} s after; B held the id "
                      f"{(b_at - deadline) / 1e9:.2f} s after that deadline")
                assert {_worker(i) for _, i in a.ids} == {_worker(i) for i in b_ids}, \
                    "B must have had to wait for A's id"
                assert_unique([i for _, i in a.ids] + b_ids)
        finally:
            proxy.stop()
            server.stop()

    def test_kill_the_server_then_restart_it(self, tmp_path, pg_url):
        """kill -9 the server: the client stops at its deadline (no renewal reached);
        restart it: the new server refuses the old lease (410), the client takes a new
        id and goes on; no ID repeats and no ID of the old lease is after its deadline."""
        import flakekit

        config, server = self._server(tmp_path, pg_url, 2)
        port = server.port
        kit = flakekit.load(client_config(tmp_path / "a.toml", f"http://127.0.0.1:{port}",
                                          "orders", worker_bits=2, lost="restart"))
        with kit:
            gen = kit["orders"]
            before = [gen.next_id() for _ in range(100)]
            server.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic_ns()
            server.proc.wait()

            def refused() -> bool:
                try:
                    gen.next_id()
                except LeaseError:
                    return True
                return False

            poll(refused, timeout=30, every=0.01)
            refused_at = time.monotonic_ns()
            again = serve(tmp_path, config, "--port", str(port))
            up_at = time.monotonic_ns()
            try:
                after = poll(lambda: _draw(gen), timeout=30, every=0.05)
            finally:
                again.stop()
            print(f"\nserver kill -9: IDs refused {(refused_at - killed_at) / 1e9:.2f} s after; "
                  f"restarted: IDs again (a new id) {(time.monotonic_ns() - up_at) / 1e9:.2f} s "
                  "after it served")
            assert_unique(before + after)
            old = {((i >> 12) & 3) for i in before}
            new = {((i >> 12) & 3) for i in after}
            assert old.isdisjoint(new), (old, new)


def started(config: Path, name: str) -> Any:
    """A kit whose generator ``name`` holds its lease, or None while none is free."""
    import flakekit

    kit = flakekit.load(config)
    try:
        kit[name]
    except FlakekitError:
        kit.close()
        return None
    return kit


def _draw(gen: Any) -> list[int] | None:
    try:
        return [gen.next_id() for _ in range(100)]
    except FlakekitError:
        return None


@pytest.mark.slow
def test_kill_9_the_client_at_the_defaults(tmp_path, pg_url):
    """At the default lease settings (1 h registry lease): a client killed with -9 keeps
    its id out of anyone's hands -- the next client gets another id, and no ID repeats."""
    config = lease_config(tmp_path / "server.toml", pg_url, ["orders"], allocator="")
    assert run_cli("db", "init", "--config", str(config)).returncode == 0
    server = serve(tmp_path, config)
    try:
        client = client_config(tmp_path / "c.toml", f"http://127.0.0.1:{server.port}", "orders",
                               window="")
        proc = subprocess.Popen([sys.executable, "-m", "flakekit.testing.drill_worker",
                                 str(client), "orders"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        lines = list(itertools.islice(proc.stdout, 300))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        lease = next(line.split() for line in lines if line.startswith("LEASE"))
        killed = [int(line.split()[1]) for line in lines if line.startswith("ID")]
        import flakekit

        with flakekit.load(client) as kit:
            gen = kit["orders"]
            mine = [gen.next_id() for _ in range(1000)]
        assert_unique(killed + mine)
        assert killed, lines[:5]
        assert int(lease[1]) not in {(i >> 12) & 1023 for i in mine}, "the id was reassigned"
    finally:
        server.stop()
