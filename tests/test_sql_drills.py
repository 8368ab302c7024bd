"""Fault drills for the ``sql`` allocator with real processes (seed 002's drill list).

Each drill runs ``tests/drills/sql_node.py`` processes with short leases (heartbeat
0.3 s, one reclaim tier of 3 s, safety window 1 s) so a drill takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from flakekit.sql.schema import init_schema
from flakekit.testing import proxied
from flakekit.testing.drills import stop

pytestmark = pytest.mark.slow

DRILLS = Path(__file__).parent / "drills"
NS = 1_000_000_000


def node(url: str, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(DRILLS / "sql_node.py"), url, *args],
        stdout=out.open("wb"), stderr=subprocess.DEVNULL,
    )


def lines(out: Path) -> list[list[str]]:
    return [line.split() for line in out.read_text().splitlines() if line.strip()]


def ids(out: Path) -> list[int]:
    return [int(parts[1]) for parts in lines(out) if parts[0] == "ID"]


def lease_of(out: Path, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for parts in lines(out) if out.exists() else []:
            if parts[0] == "LEASE":
                return [int(x) for x in parts[1:]]
        time.sleep(0.05)
    raise AssertionError(f"no lease in {out}: {out.read_text()!r}")


def wait_ids(out: Path, n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(ids(out)) < n:
        assert time.monotonic() < deadline, out.read_text()[-500:]
        time.sleep(0.05)


def prepare(url: str) -> None:
    engine = create_engine(url)
    init_schema(engine, "workers")
    engine.dispose()


def pause_outside_a_transaction(proc: subprocess.Popen, url: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no transaction open (this drill's subject is a
    paused holder whose row can be reclaimed; one stopped inside its heartbeat holds the
    row lock, which tests/test_stuck_peer.py covers). Stopped inside one (a session of
    the drill's database idle in a transaction for 0.3 s: the other nodes' transactions
    last milliseconds), it is resumed and stopped again."""
    engine = create_engine(url)
    try:
        for _ in range(50):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            with engine.connect() as conn:
                held = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
                    " AND state_change < now() - interval '0.25 seconds'").scalar()
            if not held:
                return
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.1)
        raise AssertionError("the holder was inside a transaction at every SIGSTOP")
    finally:
        engine.dispose()


def acquire_many(url: str, threads: int, start_in: float,
                 identities: list[list[str]]) -> list[dict[str, Any]]:
    """One ``drills/acquire_many.py`` process per identity (host, or host and port) with
    ``threads`` threads, all acquiring at one instant ``start_in`` s from now; their JSON
    results, once each exited 0."""
    start_at = f"{time.time() + start_in:.3f}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(DRILLS / "acquire_many.py"), url, str(threads), start_at,
             *identity], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for identity in identities
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-2000:]
        results.append(json.loads(stdout))
    return results


class TestPausedHolder:
    def test_sigstop_past_lease_then_reclaim(self, pg_url, tmp_path):
        """A paused holder whose id was reclaimed issues nothing after SIGCONT; no duplicates."""
        prepare(pg_url)
        a_out, b_out = tmp_path / "a.txt", tmp_path / "b.txt"
        a = node(pg_url, a_out, "--run", "--worker-bits", "1",
                 "--host", "10.0.0.1")
        blocker = None
        try:
            assert lease_of(a_out)[0] == 0
            wait_ids(a_out, 50)
            # a second, live holder on id 1, so the newcomer must reclaim A's id 0
            blocker = node(pg_url, tmp_path / "c.txt", "--run", "--host", "10.0.0.3",
                           "--interval", "0.05")
            assert lease_of(tmp_path / "c.txt")[0] == 1
            pause_outside_a_transaction(a, pg_url)
            before = len(ids(a_out))
            time.sleep(3.5)  # past the 3 s tier: A's row is reclaimable
            b = node(pg_url, b_out, "--count", "200", "--host", "10.0.0.2")
            worker, epoch, not_before = lease_of(b_out)
            assert (worker, epoch) == (0, 2)
            assert not_before > 0  # A's heartbeats stored its high-water mark
            a.send_signal(signal.SIGCONT)
            assert b.wait(30) == 0
            deadline = time.monotonic() + 15  # A's heartbeat thread finds the version changed
            while time.monotonic() < deadline and not any(
                    p[0] == "ERR" for p in lines(a_out)[-3:]):
                time.sleep(0.1)
            after = len(ids(a_out))
            assert after == before, "the paused holder issued IDs after resuming"
            assert not set(ids(a_out)) & set(ids(b_out))
            assert any(p[0] == "ERR" for p in lines(a_out)[-3:])
        finally:
            stop(a)
            if blocker is not None:
                stop(blocker)


class TestDatabaseOutage:
    @pytest.mark.parametrize("which",
                             ["postgresql", pytest.param("mariadb", marks=pytest.mark.mariadb)])
    def test_ids_until_deadline_then_errors_then_recovery(self, which, request, tcp_proxy,
                                                          tmp_path):
        """Cut the database off: IDs flow until the lease deadline, then errors; they
        resume once it is back (the row was not reclaimed meanwhile)."""
        url = request.getfixturevalue("pg_url" if which == "postgresql" else "mariadb_url")
        prepare(url)
        port = 5432 if which == "postgresql" else 3306
        proxy = tcp_proxy(port)
        out = tmp_path / "a.txt"
        a = node(proxied(url, proxy), out, "--run", "--tier", "4", "--safety", "1")
        try:
            lease_of(out)
            wait_ids(out, 20)
            time.sleep(0.5)
            cut_at = time.monotonic_ns()
            proxy.cut()
            time.sleep(5.0)  # lease 3 s after the last heartbeat sent before the cut
            restored_at = time.monotonic_ns()
            proxy.restore()
            deadline = time.monotonic() + 15
            while not [t for t in self.id_times(out) if t > restored_at]:
                assert time.monotonic() < deadline, "no IDs after the database came back"
                time.sleep(0.1)
            during = [t for t in self.id_times(out) if cut_at < t < restored_at]
            errors = [int(p[2]) for p in lines(out) if p[0] == "ERR"
                      and cut_at < int(p[2]) < restored_at]
            assert during, "IDs must keep flowing until the lease deadline"
            assert errors, "IDs must stop at the lease deadline"
            last_ok = max(during)
            assert last_ok <= cut_at + 3 * NS + NS // 5  # never past the lease deadline
            assert min(errors) > last_ok - NS // 5
            assert not [t for t in self.id_times(out) if min(errors) < t < restored_at]
        finally:
            stop(a)

    @staticmethod
    def id_times(out: Path) -> list[int]:
        return [int(p[2]) for p in lines(out) if p[0] == "ID"]


class TestRestarts:
    def test_kill9_then_restart(self, db_url, tmp_path):
        """kill -9 leaves the row held: a restart takes another id until the old lease
        lapsed, then gets the old id back and starts after its last issued time."""
        prepare(db_url)
        a_out = tmp_path / "a.txt"
        a = node(db_url, a_out, "--run", "--worker-bits", "4")
        first = lease_of(a_out)[0]
        wait_ids(a_out, 30)
        time.sleep(0.7)  # at least one heartbeat stored A's high-water mark
        a.kill()
        a.wait()
        b_out = tmp_path / "b.txt"
        b = node(db_url, b_out, "--count", "10", "--worker-bits", "4", "--no-release")
        assert b.wait(30) == 0
        assert lease_of(b_out)[0] != first
        time.sleep(3.2)  # A's (and B's) rows lapse after the 3 s tier
        c_out = tmp_path / "c.txt"
        c = node(db_url, c_out, "--count", "10", "--worker-bits", "4")
        assert c.wait(30) == 0
        worker, epoch, not_before = lease_of(c_out)
        assert worker == first and epoch == 2 and not_before > 0
        assert not set(ids(a_out)) & set(ids(c_out))
        assert min(ids(c_out)) > max(ids(a_out))

    def test_clean_shutdown_then_immediate_reuse(self, db_url, tmp_path):
        """A cleanly closed process's id goes straight back to the same host:port."""
        prepare(db_url)
        outs = [tmp_path / f"{i}.txt" for i in range(2)]
        for out in outs:
            proc = node(db_url, out, "--count", "50", "--worker-bits", "4", "--interval", "0")
            assert proc.wait(30) == 0
        assert [lease_of(o)[:2] for o in outs] == [[0, 1], [0, 2]]
        assert min(ids(outs[1])) > max(ids(outs[0]))
        assert all(["CLOSED", "0"] in lines(o) for o in outs)  # no connection leaked

    def test_same_host_port_processes_get_distinct_ids(self, db_url, tmp_path):
        """Two live processes claiming one host:port never share a worker id."""
        prepare(db_url)
        outs = [tmp_path / f"{i}.txt" for i in range(2)]
        procs = [node(db_url, o, "--run", "--worker-bits", "4", "--interval", "0.01") for o in outs]
        try:
            workers = {lease_of(o)[0] for o in outs}
            assert len(workers) == 2
            for o in outs:
                wait_ids(o, 20)
        finally:
            for p in procs:
                stop(p)
        assert not set(ids(outs[0])) & set(ids(outs[1]))


class TestManyProcesses:
    def test_200_acquirers_in_8_processes(self, db_url, tmp_path):
        """8 processes x 25 threads acquire at one instant: 200 distinct ids."""
        prepare(db_url)
        got: list[int] = []
        for result in acquire_many(db_url, 25, 3.0, [[f"10.{i}.0"] for i in range(8)]):
            assert not result["errors"], result["errors"][:3]
            got += result["ids"]
        assert sorted(got) == list(range(200))

    def test_same_identity_in_4_processes(self, db_url):
        """40 acquirers in 4 processes, all claiming one host:port: 40 distinct ids."""
        prepare(db_url)
        got: list[int] = []
        for result in acquire_many(db_url, 10, 2.5, [["10.0.0.1", "8080"]] * 4):
            got += result["ids"]
        assert sorted(got) == list(range(40))


def test_drill_scripts_exist():
    """The drill helpers ship with the tests."""
    assert os.path.exists(DRILLS / "sql_node.py")
