"""flakekit.testing itself: the shared helpers fail when they should, the contract suites
catch a broken allocator or store, and the pytest plugin is the only home of its fixtures."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flakekit.errors import UnknownKeyError
from flakekit.leases.lease import WorkerLease, WorkerRecord
from flakekit.testing import (
    AllocatorContract,
    EventRecorder,
    SegmentStoreContract,
    TcpProxy,
    assert_disjoint,
    assert_unique,
    free_port,
    in_threads,
    listening,
)
from flakekit.testing import pytest_plugin as plugin
from flakekit.testing.threads import Loops
from flakekit.testing.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_FIXTURES = {"manual_clock", "event_recorder", "tcp_proxy", "closing", "pg_url",
                   "mariadb_url", "sqlite_url", "db_url"}


class TestThreads:
    def test_in_threads_returns_results_in_order(self):
        """Each index's result lands at its index."""
        assert in_threads(lambda i: i * i, 8) == [i * i for i in range(8)]

    def test_in_threads_reraises_a_thread_failure(self):
        """An exception in one thread fails the caller (not a printed warning)."""
        def work(i: int) -> int:
            if i == 3:
                raise ValueError("boom in 3")
            return i

        with pytest.raises(ValueError, match="boom in 3"):
            in_threads(work, 5)

    def test_loops_run_until_stopped(self):
        """Each loop runs with its own argument until stop(); stop() before start() waits
        for nothing."""
        rounds = {"a": 0, "b": 0}

        def spin(name: str) -> None:
            while not loops.stopping.is_set():
                rounds[name] += 1
                time.sleep(0.001)

        loops = Loops(spin, ["a", "b"])
        loops.start()
        wait_until(lambda: min(rounds.values()) > 3)
        loops.stop(5)
        assert not any(thread.is_alive() for thread in loops._threads)
        Loops(spin, ["a"]).stop(5)

    def test_assert_unique_names_duplicates(self):
        """A repeated value fails, naming it."""
        assert_unique([1, 2, 3])
        with pytest.raises(AssertionError, match=r"\[2\]"):
            assert_unique([1, 2, 2, 3])

    def test_assert_disjoint_catches_overlap(self):
        """Adjacent ranges pass; overlapping ones fail."""
        assert_disjoint([range(0, 5), range(5, 9)])
        with pytest.raises(AssertionError, match="overlap"):
            assert_disjoint([range(5, 9), range(0, 6)])


class TestEventRecorder:
    def test_records_events(self):
        """Events sent through ``recorder.events`` are recorded with their arguments."""
        rec = EventRecorder()
        rec.events.alert("kind-a", "message", {"x": 1})
        assert rec.names() == ["flakekit_alert"] and rec.alerts() == ["kind-a"]
        assert rec.calls[0][1]["details"] == {"x": 1}

    def test_only_hook_names(self):
        """Other attribute names are not hooks (so hasattr probes stay honest)."""
        assert not hasattr(EventRecorder(), "watch")


class TestTcpProxy:
    def test_forwards_then_cut_refuses(self):
        """Bytes pass through in_front_of's proxy; after cut() nothing does."""
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def echo() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(100))

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        proxy = TcpProxy.in_front_of(f"127.0.0.1:{port}")
        try:
            host, _, pport = proxy.address.rpartition(":")
            with socket.create_connection((host, int(pport)), timeout=5) as client:
                client.sendall(b"ping")
                assert client.recv(100) == b"ping"
            proxy.cut()
            with socket.create_connection((host, int(pport)), timeout=5) as client:
                client.settimeout(5)
                assert client.recv(100) == b""  # closed at once
        finally:
            proxy.stop()
            server.close()
            thread.join(5)

    def test_free_port_is_free(self):
        """free_port() names a port nothing listens on."""
        assert not listening(free_port())


# -- the contract suites catch what they promise to ------------------------------------------
class _SharingAllocator:
    """Broken on purpose: every acquirer gets worker 0, renewals never fail."""

    renew_interval = 1.0

    def acquire(self, request):
        return WorkerLease(0, holder="me", deadline_ns=time.monotonic_ns() + 10**10)

    def renew(self, lease, issued_until_ns):
        return lease

    def release(self, lease, issued_until_ns):
        pass

    def records(self):
        return [WorkerRecord(0, "me", 1, None, "held", mine=True)]

    def close(self):
        pass


class _OverlappingStore:
    """Broken on purpose: every fetch returns the same range; unknown keys are KeyError."""

    def fetch(self, key, step=None):
        if key != "k":
            raise KeyError(key)

        class A:
            max_id, step, db_step = 10, 10, 10

        return A()

    def give_back(self, key, expected_max_id, new_max_id):
        return True


class TestContractsCatchBrokenImplementations:
    def test_allocator_contract_catches_a_shared_id(self):
        """Two acquirers holding the same id fail the exclusivity test."""
        with pytest.raises(AssertionError):
            AllocatorContract().test_two_acquirers_never_share_an_id(_SharingAllocator)

    def test_allocator_contract_catches_a_renewal_that_does_not_extend(self):
        """A renewal that keeps the old deadline fails the renew test."""
        with pytest.raises(AssertionError):
            AllocatorContract().test_renew_keeps_the_id_and_extends(
                _SharingAllocator, time.sleep)

    def test_allocator_contract_catches_a_stale_renewal_that_succeeds(self):
        """A renewal of a released-and-retaken id that succeeds fails the contract."""
        with pytest.raises(pytest.fail.Exception):
            AllocatorContract().test_renew_after_the_id_was_taken_elsewhere_raises(
                _SharingAllocator)

    def test_store_contract_catches_overlap_and_the_wrong_error(self):
        """Overlapping ranges and a plain KeyError for an unknown key both fail."""
        suite = SegmentStoreContract()
        with pytest.raises(AssertionError):
            suite.test_concurrent_fetches_never_overlap(lambda keys: _OverlappingStore())
        with pytest.raises(KeyError) as info:
            suite.test_unknown_key_raises(lambda keys: _OverlappingStore())
        assert not isinstance(info.value, UnknownKeyError)


# -- the pytest plugin ------------------------------------------------------------------------
class TestPytestPlugin:
    def test_not_registered_as_pytest11(self):
        """No distribution here names the plugin module in the pytest11 group: an
        application that installs flakekit gets no fixtures (they are opt-in)."""
        eps = importlib.metadata.entry_points(group="pytest11")
        assert not [ep for ep in eps if ep.value.startswith("flakekit")]

    def test_an_application_gets_the_fixtures_only_when_it_opts_in(self, tmp_path):
        """An application's pytest run, in an interpreter with flakekit (and its plugins)
        installed, lists none of the plugin's fixtures; ``-p flakekit.testing.pytest_plugin``
        adds them. (The wheels carry no pytest11 entry point: tests/test_packaging.py.)"""
        (tmp_path / "test_app.py").write_text("def test_app():\n    pass\n", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

        def listed(*opts: str) -> set[str]:
            run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                  "--fixtures", *opts], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stdout + run.stderr
            return {n for n in PLUGIN_FIXTURES if re.search(rf"^{n}\b", run.stdout, re.M)}

        assert listed() == set()
        assert listed("-p", "flakekit.testing.pytest_plugin") == PLUGIN_FIXTURES

    def test_no_conftest_defines_the_plugin_fixtures_again(self):
        """tests/ and the plugins' conftests leave the plugin's fixtures to it."""
        names = {n for n, v in vars(plugin).items() if hasattr(v, "_fixture_function_marker")
                 or type(v).__name__ == "FixtureFunctionDefinition"}
        assert {"manual_clock", "event_recorder", "tcp_proxy", "pg_url", "db_url"} <= names
        for conftest in [ROOT / "tests" / "conftest.py", *ROOT.glob("plugins/*/tests/conftest.py")]:
            defined = {node.name for node in ast.walk(ast.parse(conftest.read_text()))
                       if isinstance(node, ast.FunctionDef)}
            assert not defined & names, f"{conftest} defines {defined & names} again"

    def test_fixtures_come_from_the_plugin(self, request, manual_clock, event_recorder):
        """The fixtures this test uses are the plugin's (not a conftest's copy)."""
        for name in ("manual_clock", "event_recorder", "tcp_proxy", "db_url"):
            defs = request._fixturemanager.getfixturedefs(name, request.node)
            assert defs and defs[-1].func.__module__ == "flakekit.testing.pytest_plugin"


@pytest.mark.parametrize("kind", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                  pytest.param("mariadb", marks=pytest.mark.mariadb)])
def test_databases_made_ahead_are_new_empty_and_dropped(kind):
    """The server databases the fixtures hand out are made ahead on a thread: each one is
    new (never handed out twice), empty and usable; every one is gone once the pools close
    (the drops of used ones, the spares never taken)."""
    from sqlalchemy import create_engine, inspect, text

    from flakekit.testing import databases

    names = []
    for _ in range(databases._Spares.DEPTH + 2):   # more than the spares made ahead
        with databases.fresh_server_database(kind) as url:
            engine = create_engine(url)
            try:
                assert inspect(engine).get_table_names() == []
                with engine.begin() as conn:
                    conn.execute(text("CREATE TABLE t (x INT)"))
                names.append(engine.url.database)
            finally:
                engine.dispose()
    assert len(set(names)) == len(names)
    admin = databases.PG_ADMIN_URL if kind == "postgresql" else databases.MARIADB_ADMIN_URL
    pool = databases._spares_for(admin)
    spares = list(pool._ready)
    databases._close_spares()
    engine = create_engine(admin)
    try:
        with engine.connect() as conn:
            if kind == "postgresql":
                present = {r[0] for r in conn.execute(text("SELECT datname FROM pg_database"))}
            else:
                present = {r[0] for r in conn.execute(text("SHOW DATABASES"))}
    finally:
        engine.dispose()
    assert not present & set(names + spares), present & set(names + spares)


class TestToolkit:
    """wait_until, lease_request and the drill helpers (flakekit.testing)."""

    def test_wait_until_returns_the_first_truthy_value(self) -> None:
        from flakekit.testing import wait_until

        calls = iter([0, None, "", 7, 8])
        assert wait_until(lambda: next(calls), 5, interval=0) == 7

    def test_wait_until_names_what_it_waited_for(self) -> None:
        from flakekit.testing import wait_until

        with pytest.raises(AssertionError, match="not within 0.01 s: the thing"):
            wait_until(lambda: False, 0.01, what="the thing")

    def test_lease_request_defaults(self) -> None:
        from flakekit.testing import lease_request

        r = lease_request(7)
        assert (r.generator, r.max_worker_id, r.host, r.port) == ("t", 7, "10.9.8.7", 8080)

    def test_a_drill_worker_prints_ids_of_the_tiny_layout(self, tmp_path) -> None:
        from flakekit.testing.drills import parse_ids, read_until, spawn, stop, write_config

        config = write_config(tmp_path, "g", '{ type = "static", worker_id = 1 }', "tiny")
        proc = spawn(config, "g", "--seconds", "0.2", "--pace", "20")
        try:
            assert read_until(proc, "LEASE ").split()[1] == "1"
            out, err = proc.communicate(timeout=60)
        finally:
            stop(proc)
        ids = parse_ids(out)
        assert ids and len({i for i, _ in ids}) == len(ids), err
        assert all((i >> 12) & 1 == 1 for i, _ in ids)   # the tiny layout's worker bit
