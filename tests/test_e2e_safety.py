"""End-to-end duplicate-ID hunts across the lease keeper, the SQL registry and the generator.

Each test drives real generators against a real database (PostgreSQL/MariaDB/SQLite);
ManualClock stands in for a node clock where one must be controlled exactly.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from flakekit.builtin.layouts import SNOWFLAKE
from flakekit.errors import LeaseExpiredError
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.leases.lease import LeaseRequest
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import ManualClock, age_rows
from flakekit.testing.engines import threaded_engine
from flakekit.testing.threads import Call
from flakekit.values.events import Events

NS = 1_000_000_000


@pytest.fixture
def engine(db_url) -> Any:
    made = threaded_engine(db_url)
    yield made
    made.dispose()


def alloc(engine: Engine, clock: Any, host: str, **kw: Any) -> SqlWorkerAllocator:
    kw.setdefault("tiers_ns", (60 * NS,))
    kw.setdefault("safety_window_ns", 5 * NS)
    kw.setdefault("heartbeat_ns", 10 * NS)
    return SqlWorkerAllocator(engine=engine, service="e2e", clock=clock, host=host, port=1,
                              create_schema=True, events=Events(None), **kw)


def gen(engine: Engine, clock: Any, host: str, max_id: int = 0, **kw: Any) -> SnowflakeGenerator:
    """A generator leasing from worker ids ``0..max_id`` (one id by default: every
    newcomer must take over the previous holder's)."""
    made = SnowflakeGenerator(SNOWFLAKE, clock, alloc(engine, clock, host, **kw),
                              name="e2e", max_start_wait_s=120)
    made.keeper.request = attrs.evolve(made.keeper.request, max_worker_id=max_id)
    return made


def crash(made: SnowflakeGenerator) -> None:
    """kill -9, as far as the registry can tell: renewals stop, nothing is released (and no
    renewal thread outlives the test's database)."""
    made.keeper.close(release=False)


class TestHighWaterMark:
    def test_id_at_the_deadline_instant_is_not_reissued_after_a_crash(self, engine):
        """The holder may issue up to and including its deadline instant, which is the
        stored mark on its wall clock; a reclaimer that waits only until its clock reads
        the mark must still not stamp the tick holding the mark (off by one)."""
        a_clock = ManualClock()
        a = gen(engine, a_clock, "10.0.0.1").start()
        lease = a.lease
        assert lease is not None and lease.deadline_ns is not None
        a_clock.advance(ns=lease.deadline_ns - a_clock.monotonic_ns())  # the last instant
        last = a.next_id()  # allowed: deadline is inclusive
        with pytest.raises(LeaseExpiredError):
            a_clock.advance(ns=1)
            a.next_id()
        worker = a.worker_id
        crash(a)  # the row lapses; b reclaims it
        age_rows(engine, 61)
        b_clock = ManualClock(wall_ns=a_clock.time_ns() - 2 * NS)  # 2 s behind a
        b = gen(engine, b_clock, "10.0.0.2").start()
        assert b.worker_id == worker
        first = b.next_id()
        assert first > last, (SNOWFLAKE.decompose(first), SNOWFLAKE.decompose(last))
        b.close()

    def test_clean_release_then_next_holder_crashes_before_heartbeat(self, engine):
        """A releases (exact mark); B takes the id, issues to its deadline and dies
        before its first heartbeat; C must start past B's bound, not A's exact mark."""
        a_clock = ManualClock()
        a = gen(engine, a_clock, "10.0.0.1").start()
        a.next_id()
        a.close()
        b_clock = ManualClock(wall_ns=a_clock.time_ns() + NS, mono_ns=7 * NS)
        b = gen(engine, b_clock, "10.0.0.2").start()
        lease = b.lease
        assert lease is not None and lease.deadline_ns is not None
        b_clock.advance(ns=lease.deadline_ns - b_clock.monotonic_ns())
        last = b.next_id()
        worker = b.worker_id
        crash(b)
        age_rows(engine, 61)
        c_clock = ManualClock(wall_ns=b_clock.time_ns() - 3 * NS)
        c = gen(engine, c_clock, "10.0.0.3").start()
        assert c.worker_id == worker
        assert c.next_id() > last
        c.close()


@pytest.mark.parametrize("db_url", [
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
], indirect=True)
def test_heartbeat_blocked_behind_a_reclaim_is_lost(engine):
    """A heartbeat that waits on the row lock of a reclaiming transaction must find the
    new version once it gets the lock (not succeed with a stale last_seen)."""
    from flakekit.errors import LeaseLostError

    clock = ManualClock()
    holder = alloc(engine, clock, "10.0.0.1")
    lease = holder.acquire(LeaseRequest("e2e", 0, "10.0.0.1", 1))
    with engine.begin() as conn:  # the reclaimer's transaction, holding the row lock
        conn.execute(text("SELECT version FROM system_nodes WHERE machine_id = :m FOR UPDATE"),
                     {"m": lease.worker_id})
        conn.execute(text("UPDATE system_nodes SET version = version + 1, holder = 'other' "
                          "WHERE machine_id = :m"), {"m": lease.worker_id})
        beat = Call(lambda: holder.renew(lease, 0))
        beat.thread.join(0.5)
        assert beat.thread.is_alive()  # blocked on the lock
    error = beat.error_after(10)
    assert isinstance(error, LeaseLostError), (beat.result, error)
