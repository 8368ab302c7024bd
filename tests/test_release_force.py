"""Restart after ``workers release ID --force`` works; bad rows never lock a node out
(issue 9, item 4). On PostgreSQL, MariaDB and SQLite, with the default lease settings.

A killed holder's last heartbeat stored a high-water mark a lease (about an hour) ahead;
``release --force`` frees the row but must keep that mark (the dead holder may have
stamped IDs up to it). A restart therefore takes the next usable id instead of failing
for an hour, and when no other id exists it says what really blocks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, text
from test_sql_drills import DRILLS, ids, lease_of, wait_ids
from test_sql_workers import NODES_CLOCK, make, req, row

from flakekit.errors import WaitTooLongError
from flakekit.sql.schema import init_schema
from flakekit.sql.workers import VERSION_MAX, list_records, release_worker
from flakekit.testing import EventRecorder, ManualClock

NS = 1_000_000_000


@pytest.fixture
def engine(db_url):
    engine = create_engine(db_url)
    init_schema(engine, "workers")
    yield engine
    engine.dispose()


class TestForcedRelease:
    def test_restart_takes_the_next_usable_id(self, engine):
        """kill -9 (no release), `release --force`, restart on the same host:port: the
        restart gets another id at once, and the row keeps the dead holder's mark."""
        dead = make(engine).acquire(req())  # never released: the process was killed
        mark = row(engine, dead.worker_id)["issued_until"]
        assert mark > NODES_CLOCK.time_ns() + 3000 * NS  # a lease (~1 h) reserved
        assert "released" in release_worker(engine, "orders", dead.worker_id, force=True)
        restarted = make(engine).acquire(req())
        assert restarted.worker_id != dead.worker_id
        assert row(engine, dead.worker_id)["issued_until"] == mark
        assert row(engine, dead.worker_id)["holder"] is None

    def test_no_other_id_says_what_blocks(self, engine):
        """With a single id there is nothing else to take: the error names the id, the
        time it becomes usable and the real cause (an unclean stop), not the clock."""
        clock = ManualClock(wall_ns=time.time_ns())  # the nodes' clocks agree with the db's
        dead = make(engine, clock).acquire(req(0))
        release_worker(engine, "orders", dead.worker_id, force=True)
        clock.advance(5)
        with pytest.raises(WaitTooLongError) as info:
            make(engine, clock).acquire(req(0))
        message = str(info.value)
        assert "worker 0 (released)" in message and "without a clean shutdown" in message
        assert "NTP" not in message and "fix the clock" not in message
        assert "\n" not in message


def flakekit_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flakekit.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_kill9_release_force_then_every_restart_works(db_url, engine, tmp_path):
    """The documented recovery, for real: a holder with the default lease settings is
    killed with SIGKILL, the operator runs `flakekit workers release 0 --force`, and every
    restart of that host:port (`flakekit next`) works and issues new IDs."""
    cfg = tmp_path / "flakekit.toml"
    cfg.write_text(
        f'[backends.default]\nurl = "{db_url}"\n\n[generators.drill]\n'
        'allocator = { type = "sql", service = "drill", host = "10.0.0.1", port = 8080 }\n'
    )
    out = tmp_path / "a.txt"
    holder = subprocess.Popen(  # the default lease: tier 1 h, heartbeat 10 s, window 5 s
        [sys.executable, str(DRILLS / "sql_node.py"), db_url, "--run", "--worker-bits", "10",
         "--tier", "3600", "--heartbeat", "10", "--safety", "5"],
        stdout=out.open("wb"), stderr=subprocess.DEVNULL)
    try:
        assert lease_of(out)[0] == 0
        wait_ids(out, 20)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    released = flakekit_cli("workers", "release", "0", "--force", "-c", str(cfg))
    assert released.returncode == 0, released.stderr
    issued = set(ids(out))
    for _ in range(3):
        started = flakekit_cli("next", "-n", "5", "-c", str(cfg))
        assert started.returncode == 0, started.stderr
        new = [int(x) for x in started.stdout.split()]
        assert len(new) == 5 and not issued & set(new)
        issued |= set(new)
        assert "NTP" not in started.stderr
    assert [r.worker_id for r in list_records(engine, "drill") if r.holder] == []


#: bad values of the row this host:port would reuse (holder NULL, slot 0), per kind
def _bad(engine, kind: str) -> None:
    values = dict(service="orders", host="10.0.0.1", port=8080, slot=0, version=1)
    machine_id = {"negative": -1, "out-of-layout": 5000}.get(kind, 0)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO system_nodes (service, machine_id, host, port, slot, version, "
            "holder, issued_until) VALUES (:service, :m, :host, :port, :slot, :version, "
            "NULL, 0)"), {**values, "m": machine_id})
        if kind == "version-max":
            conn.execute(text("UPDATE system_nodes SET version = :v"), {"v": VERSION_MAX})
        elif kind == "mark-a-day-ahead":
            conn.execute(text("UPDATE system_nodes SET issued_until = :u"),
                         {"u": NODES_CLOCK.time_ns() + 86400 * NS})
        elif kind == "mark-at-the-column-maximum":
            conn.execute(text("UPDATE system_nodes SET issued_until = :u"), {"u": 2**63 - 1})
        elif kind == "unreadable-last-seen":
            bad = {"postgresql": "'infinity'", "sqlite": "'garbage'"}.get(
                engine.dialect.name, "'0000-00-00 00:00:00'")
            conn.execute(text(f"UPDATE system_nodes SET holder = 'someone', last_seen = {bad}"))


@pytest.mark.parametrize("kind", ["negative", "out-of-layout", "version-max",
                                  "mark-a-day-ahead", "mark-at-the-column-maximum",
                                  "unreadable-last-seen"])
def test_bad_row_is_skipped_with_an_alert(engine, kind):
    """A bad system_nodes row of this host:port is never taken: acquire leases a sound
    id of the layout, raises an alert naming the row, and the row stays listable and
    releasable (so an operator can fix it)."""
    _bad(engine, kind)
    hook = EventRecorder()
    for _ in range(2):  # not once by luck: every restart works
        lease = make(engine, hook=hook).acquire(req())
        assert 0 <= lease.worker_id <= 1023
        make(engine).release(lease, 0)
    alerts = [kw for name, kw in hook.calls if name == "flakekit_alert"
              and kw["kind"] == "worker-bad-row"]
    assert alerts, hook.calls
    bad_id = {"negative": -1, "out-of-layout": 5000}.get(kind, 0)
    assert f"machine_id {bad_id}, host 10.0.0.1:8080, slot 0" in alerts[0]["message"]
    records = {r.worker_id: r for r in list_records(engine, "orders")}
    assert bad_id in records
    if kind == "unreadable-last-seen":
        assert records[bad_id].last_seen is None
    assert "released" in release_worker(engine, "orders", bad_id, force=True)
