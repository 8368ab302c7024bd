"""The ``sql`` worker allocator on real PostgreSQL, MariaDB and SQLite (seed 000 + 002)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from flakekit.errors import (
    ConfigError,
    LeaseLostError,
    SchemaError,
    WaitTooLongError,
    WorkerExhaustedError,
)
from flakekit.leases.keeper import LeaseKeeper
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.sql.schema import check_schema, init_schema, system_nodes
from flakekit.sql.workers import SqlWorkerAllocator, list_records, release_worker
from flakekit.testing import EventRecorder, ManualClock, in_threads
from flakekit.testing import age_rows as shared_age_rows
from flakekit.testing.engines import threaded_engine
from flakekit.testing.requests import lease_request
from flakekit.values.events import Events

NS = 1_000_000_000


class Target:
    """The generator side of a lease, minimal: remembers what the keeper told it."""

    def __init__(self) -> None:
        self.lease: WorkerLease | None = None
        self.deadline: int | None = None
        self.revoked: str | None = None
        self.issued = 0

    def bind(self, lease: WorkerLease) -> None:
        self.lease, self.deadline = lease, lease.deadline_ns

    def extend(self, deadline_ns: int | None) -> None:
        self.deadline = deadline_ns

    def revoke(self, reason: str) -> None:
        self.revoked = reason

    def issued_until_ns(self) -> int:
        return self.issued


@pytest.fixture
def engines() -> Iterator[Any]:
    """``engines(url)`` gives a shared engine per URL; all are disposed afterwards."""
    made: dict[str, Engine] = {}

    def get(url: str) -> Engine:
        if url not in made:
            made[url] = threaded_engine(url, pool_size=5, max_overflow=30, pool_timeout=120)
        return made[url]

    yield get
    for engine in made.values():
        assert engine.pool.checkedout() == 0, engine.pool.status()
        engine.dispose()


#: the nodes' clock unless a test brings its own; age_rows() moves it with the database,
#: so "an hour later" is an hour later for the nodes too (high-water marks are node time)
NODES_CLOCK = ManualClock()


def make(engine: Engine, clock: Any = None, hook: EventRecorder | None = None,
         **kwargs: Any) -> SqlWorkerAllocator:
    kwargs.setdefault("service", "orders")
    kwargs.setdefault("host", "10.0.0.1")
    kwargs.setdefault("port", 8080)
    kwargs.setdefault("create_schema", True)
    return SqlWorkerAllocator(engine=engine, clock=clock or NODES_CLOCK,
                              events=Events(hook), **kwargs)


#: ``req(max_id=1023)``: a LeaseRequest of ``orders`` from no host
req = functools.partial(lease_request, service="orders", host="", port=0)


def age_rows(engine: Engine, seconds: float, where: str = "1=1", **params: Any) -> None:
    """Move ``last_seen`` back by ``seconds`` on the database's own clock (and the nodes'
    shared clock forward by as much)."""
    NODES_CLOCK.advance(seconds)
    shared_age_rows(engine, seconds, where, **params)


def row(engine: Engine, worker_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(
            text("SELECT * FROM system_nodes WHERE machine_id = :m"), {"m": worker_id}
        ).mappings().one())


def reclaimed(engine: Engine) -> tuple[SqlWorkerAllocator, WorkerLease, WorkerLease]:
    """10.0.0.1 leases worker 0, goes quiet for an hour and 10.0.0.2 reclaims the row:
    (the old allocator, its lease, the new holder's lease)."""
    old_alloc = make(engine, host="10.0.0.1")
    old = old_alloc.acquire(req(0))
    age_rows(engine, 3601)
    return old_alloc, old, make(engine, host="10.0.0.2").acquire(req(0))


def refused_after(engine: Engine, statement: str, *, match: str) -> None:
    """A current workers schema changed by ``statement``: check_schema raises, matching."""
    init_schema(engine, "workers")
    with engine.begin() as conn:
        conn.execute(text(statement))
    with pytest.raises(SchemaError, match=match):
        check_schema(engine, "workers")


class TestAcquire:
    def test_lowest_free_ids_in_order(self, db_url, engines):
        """Fresh acquirers get 0, 1, 2 ... with version 1 and the database's now()."""
        engine = engines(db_url)
        leases = [make(engine, host=f"10.0.0.{i}").acquire(req()) for i in range(1, 4)]
        assert [lease.worker_id for lease in leases] == [0, 1, 2]
        assert {lease.epoch for lease in leases} == {1}
        assert row(engine, 1)["host"] is not None and str(row(engine, 1)["host"]) == "10.0.0.2"

    def test_whole_sonyflake_range_fits(self, db_url, engines):
        """machine_id holds 16-bit ids: the range is the layout's, not 0..255."""
        engine = engines(db_url)
        alloc = make(engine)
        init_schema(engine, "workers")
        with engine.begin() as conn:  # fill 0..299 so the next free id is 300
            conn.execute(system_nodes.insert(), [
                {"service": "orders", "machine_id": i, "host": f"10.1.{i // 256}.{i % 256}",
                 "port": 1, "version": 1, "holder": "x"} for i in range(300)])
        assert alloc.acquire(req(65535)).worker_id == 300

    def test_restart_after_release_reuses_at_once(self, db_url, engines):
        """Clean shutdown releases the row; the same host:port gets its id back at once,
        with a higher epoch and the stored high-water mark."""
        engine = engines(db_url)
        make(engine, host="10.0.0.9").acquire(req())
        first = make(engine).acquire(req())
        make(engine).release(first, 1_234_567)
        again = make(engine).acquire(req())
        assert again.worker_id == first.worker_id == 1
        assert again.epoch == first.epoch + 1
        assert again.not_before_ns == 1_234_567
        assert row(engine, 1)["holder"] == again.holder

    def test_held_row_is_never_shared(self, db_url, engines):
        """A second live process with the same host:port (a clone) takes another id."""
        engine = engines(db_url)
        a = make(engine).acquire(req())
        b = make(engine).acquire(req())
        assert a.worker_id != b.worker_id
        assert row(engine, b.worker_id)["slot"] == 1

    def test_sibling_instances_take_their_own_slots_quietly(self, db_url, engines, caplog):
        """A server's worker processes share host:port: instance N takes slot N without
        the clone warning, and gets its own row back after a clean restart."""
        engine = engines(db_url)
        sibling = LeaseRequest("orders", 1023, "", 0, instance=2)
        first = make(engine).acquire(req())
        alloc = make(engine)
        with caplog.at_level("WARNING", logger="flakekit.sql.workers"):
            second = alloc.acquire(sibling)
        assert first.worker_id != second.worker_id
        assert row(engine, second.worker_id)["slot"] == 2
        assert not [r for r in caplog.records if "clone" in r.getMessage()]
        alloc.release(second, 0)
        assert make(engine).acquire(sibling).worker_id == second.worker_id

    def test_kill9_then_restart(self, db_url, engines):
        """A crashed holder's row (never released) is not reused until its lease lapsed."""
        engine = engines(db_url)
        crashed = make(engine).acquire(req())
        restarted = make(engine).acquire(req())
        assert restarted.worker_id != crashed.worker_id
        make(engine).release(restarted, 0)
        age_rows(engine, 3601, "machine_id = :m", m=crashed.worker_id)
        later = make(engine).acquire(req())
        assert later.worker_id == crashed.worker_id  # slot 0 comes first
        assert later.epoch == crashed.epoch + 1

    def test_lease_deadline_math(self, db_url, engines):
        """deadline = monotonic send time + shortest tier - safety window."""
        engine = engines(db_url)
        clock = ManualClock()
        lease = make(engine, clock, tiers_ns=(60 * NS, 20 * NS), safety_window_ns=3 * NS,
                     heartbeat_ns=NS).acquire(req())
        assert lease.deadline_ns == clock.monotonic_ns() + 17 * NS

    def test_wait_too_long_takes_nothing(self, db_url, engines):
        """A high-water mark beyond max_start_wait leaves the row alone: another id is
        taken, and with no other id start-up fails naming the clock (a clean release's
        mark is the last ID's time) and leaves the row free."""
        engine = engines(db_url)
        clock = ManualClock()
        lease = make(engine, clock).acquire(req(0))
        make(engine, clock).release(lease, clock.time_ns() + 60 * NS)
        with pytest.raises(WaitTooLongError, match="max_start_wait.*NTP"):
            make(engine, clock).acquire(req(0))
        assert row(engine, 0)["holder"] is None
        assert make(engine, clock).acquire(req()).worker_id == 1
        clock.advance(55)
        assert make(engine, clock).acquire(req(0)).worker_id == 0

    def test_capacity_alert_over_80_percent(self, db_url, engines):
        """The alert hook fires once more than 80% of the range is allocated."""
        engine = engines(db_url)
        hook = EventRecorder()
        for i in range(5):
            make(engine, hook=hook, host=f"10.0.0.{i + 1}").acquire(req(4))
        assert hook.alerts() == ["worker-capacity"]  # the 5th of 5; 4 of 5 is exactly 80%


class TestReclaim:
    def fill(self, engine: Engine, size: int, **kwargs: Any) -> list[WorkerLease]:
        return [make(engine, host=f"10.9.0.{i + 1}", **kwargs).acquire(req(size - 1))
                for i in range(size)]

    def test_tiers_in_order_then_exhaustion(self, db_url, engines):
        """7 d before 1 d before 1 h (alert), each bumping the version; then failure."""
        engine = engines(db_url)
        self.fill(engine, 4)
        age_rows(engine, 2 * 3600, "machine_id = 0")
        age_rows(engine, 2 * 86400, "machine_id = 1")
        age_rows(engine, 8 * 86400, "machine_id = 2")
        hook = EventRecorder()
        newcomer = make(engine, hook=hook, host="10.0.0.50")
        got = [newcomer.acquire(req(3)) for _ in range(3)]
        assert [(g.worker_id, g.epoch) for g in got] == [(2, 2), (1, 2), (0, 2)]
        assert hook.alerts().count("worker-reclaim") == 1
        assert str(row(engine, 2)["host"]) == "10.0.0.50"
        with pytest.raises(WorkerExhaustedError, match="workers release"):
            newcomer.acquire(req(3))

    def test_custom_tiers(self, db_url, engines):
        """Tiers are configurable; rows younger than the last one are never taken."""
        engine = engines(db_url)
        tiers = dict(tiers_ns=(120 * NS, 20 * NS), safety_window_ns=2 * NS, heartbeat_ns=NS)
        self.fill(engine, 2, **tiers)  # every node of a service shares its tiers
        age_rows(engine, 30, "machine_id = 1")
        alloc = make(engine, host="10.0.0.60", **tiers)
        assert alloc.acquire(req(1)).worker_id == 1
        with pytest.raises(WorkerExhaustedError):
            alloc.acquire(req(1))

    def test_released_rows_before_failing(self, db_url, engines):
        """With every id allocated, a cleanly released row is taken instead of failing."""
        engine = engines(db_url)
        leases = self.fill(engine, 2)
        make(engine, host="10.9.0.2").release(leases[1], 0)
        assert make(engine, host="10.0.0.70").acquire(req(1)).worker_id == 1


class TestHeartbeat:
    def test_renew_moves_deadline_and_stores_high_water(self, db_url, engines):
        """A heartbeat sets last_seen from the database, and as the high-water mark the
        latest time this holder may stamp an ID before its next heartbeat: node time plus
        the lease (or the node's own mark, if later)."""
        engine = engines(db_url)
        clock = ManualClock()
        alloc = make(engine, clock)
        lease = alloc.acquire(req())
        age_rows(engine, 100)
        clock.advance(50)
        renewed = alloc.renew(lease, 987_654_321)
        assert renewed.deadline_ns == clock.monotonic_ns() + alloc.lease_ns
        assert row(engine, 0)["issued_until"] == clock.time_ns() + alloc.lease_ns
        far = clock.time_ns() + 2 * alloc.lease_ns
        alloc.renew(lease, far)
        assert row(engine, 0)["issued_until"] == far
        assert list_records(engine, "orders")[0].extra["age_s"] < 50

    def test_crashed_holders_bound_is_waited_for(self, db_url, engines):
        """A holder that crashed may have stamped IDs up to its last heartbeat's bound
        (its clock + the lease); a reclaimer whose clock runs further behind than the
        safety window must start past that bound, and a clean release lowers the mark to
        the exact last ID so that an ordinary restart does not wait."""
        engine = engines(db_url)
        ahead = ManualClock()
        ahead.advance(8)  # the crashed holder's clock is 8 s ahead of the reclaimer's
        dead = make(engine, ahead)
        crashed = dead.acquire(req(0))
        bound = ahead.time_ns() + dead.lease_ns
        assert row(engine, 0)["issued_until"] == bound
        age_rows(engine, 3601)
        ahead.advance(3601)
        behind = ManualClock(wall_ns=ahead.time_ns() - 8 * NS)
        newcomer = make(engine, behind)
        taken = newcomer.acquire(req(0))
        assert taken.worker_id == crashed.worker_id
        assert taken.not_before_ns == bound
        assert bound - behind.time_ns() == 2 * NS   # 8 s skew - (1 h tier - 3595 s lease) - 1 s
        newcomer.release(taken, bound + NS)
        assert row(engine, 0)["issued_until"] == bound + NS

    def test_version_conflict_stops_the_generator(self, db_url, engines):
        """A heartbeat that finds the version changed revokes, logs and fires the hook."""
        engine = engines(db_url)
        hook = EventRecorder()
        alloc = make(engine)
        keeper = LeaseKeeper(alloc, req(), ManualClock(), Events(hook))
        target = Target()
        keeper.start(target)
        with engine.begin() as conn:
            conn.execute(text("UPDATE system_nodes SET version = version + 1"))
        assert keeper.renew_once() is False
        assert target.revoked and "no longer ours" in target.revoked
        assert "version 2" in target.revoked
        assert any(name == "flakekit_lease_lost" for name, _ in hook.calls)
        keeper.close()

    def test_reclaimed_holder_cannot_renew(self, db_url, engines):
        """After someone reclaims the row, the old holder's heartbeat raises LeaseLostError."""
        old_alloc, old, new = reclaimed(engines(db_url))
        assert new.worker_id == old.worker_id and new.epoch == old.epoch + 1
        with pytest.raises(LeaseLostError, match="10.0.0.2"):
            old_alloc.renew(old, 0)

    def test_lapsed_lease_is_regained_if_not_reclaimed(self, db_url, engines):
        """A lease that lapsed while the database was away renews fine afterwards."""
        engine = engines(db_url)
        alloc = make(engine)
        lease = alloc.acquire(req())
        age_rows(engine, 7200)
        assert alloc.renew(lease, 0).worker_id == lease.worker_id

    def test_release_after_loss_is_harmless(self, db_url, engines):
        """Releasing a row someone else holds now changes nothing."""
        engine = engines(db_url)
        alloc, lease, other = reclaimed(engine)
        alloc.release(lease, 0)
        assert row(engine, 0)["holder"] == other.holder


class TestRecordsAndOperators:
    def test_states_and_mine(self, db_url, engines):
        """records() says held / lapsed / released and which rows this allocator holds."""
        engine = engines(db_url)
        alloc = make(engine)
        mine = alloc.acquire(req())
        other = make(engine, host="10.0.0.2")
        lapsed = other.acquire(req())
        released = make(engine, host="10.0.0.3").acquire(req())
        make(engine, host="10.0.0.3").release(released, 0)
        age_rows(engine, 3600, "machine_id = :m", m=lapsed.worker_id)
        records = {r.worker_id: r for r in alloc.records()}
        assert records[mine.worker_id].state == "held" and records[mine.worker_id].mine
        assert records[lapsed.worker_id].state == "lapsed" and not records[lapsed.worker_id].mine
        assert records[released.worker_id].state == "released"

    def test_operator_release(self, db_url, engines):
        """`workers release` refuses a live lease unless forced, and fences the holder."""
        engine = engines(db_url)
        alloc = make(engine)
        lease = alloc.acquire(req())
        with pytest.raises(RuntimeError, match="--force"):
            release_worker(engine, "orders", lease.worker_id)
        assert "released worker" in release_worker(engine, "orders", lease.worker_id, force=True)
        with pytest.raises(LeaseLostError):
            alloc.renew(lease, 0)
        with pytest.raises(LookupError):
            release_worker(engine, "orders", 99)


    def test_release_refuses_a_row_renewed_meanwhile(self, db_url, engines, monkeypatch):
        """A heartbeat between the listing and the UPDATE keeps the row: without --force,
        `workers release` must not free a lease that was just renewed (two holders)."""
        import flakekit.sql.workers as workers

        engine = engines(db_url)
        alloc = make(engine)
        lease = alloc.acquire(req(0))
        age_rows(engine, 3601)  # looks dead to the operator ...
        listed = workers.list_records

        def list_then_heartbeat(*args: Any, **kwargs: Any) -> Any:
            records = listed(*args, **kwargs)
            alloc.renew(lease, 0)  # ... but it comes back right after the listing
            return records

        monkeypatch.setattr(workers, "list_records", list_then_heartbeat)
        with pytest.raises(RuntimeError):
            release_worker(engine, "orders", lease.worker_id)
        monkeypatch.setattr(workers, "list_records", listed)
        alloc.renew(lease, 0)  # still ours
        with pytest.raises(WorkerExhaustedError):
            make(engine, host="10.0.0.2").acquire(req(0))

    def test_release_keeps_the_safety_window(self, db_url, engines):
        """Without --force, a row is freed only once acquire could reclaim it too
        (silent for longer than the shortest tier), not as soon as the lease ended."""
        engine = engines(db_url)
        tiers = dict(tiers_ns=(20 * NS,), safety_window_ns=5 * NS, heartbeat_ns=NS)
        lease = make(engine, **tiers).acquire(req(0))
        age_rows(engine, 17)  # past the 15 s lease, inside the 5 s safety window
        with pytest.raises(RuntimeError, match="wait"):
            release_worker(engine, "orders", lease.worker_id, tiers_ns=(20 * NS,),
                           safety_window_ns=5 * NS)
        assert row(engine, 0)["holder"] == lease.holder
        age_rows(engine, 21)
        assert "released worker" in release_worker(
            engine, "orders", lease.worker_id, tiers_ns=(20 * NS,), safety_window_ns=5 * NS)


class TestSchema:
    def test_missing_table_is_a_clear_error(self, db_url, engines):
        """Without create_schema, a missing table says to run `flakekit db init`."""
        engine = engines(db_url)
        with pytest.raises(SchemaError, match="flakekit db init"):
            make(engine, create_schema=False).acquire(req())
        init_schema(engine, "workers")
        init_schema(engine, "workers")  # idempotent
        assert make(engine, create_schema=False).acquire(req()).worker_id == 0

    def test_seed_table_without_lease_columns_is_older(self, db_url, engines):
        """A table made from seed 000's DDL alone is reported as older, naming the columns."""
        engine = engines(db_url)
        host_type = "INET" if engine.dialect.name == "postgresql" else "VARCHAR(45)"
        with engine.begin() as conn:
            conn.execute(text(
                f"CREATE TABLE system_nodes (service VARCHAR(64) NOT NULL, machine_id SMALLINT "
                f"NOT NULL, host {host_type} NOT NULL, port INTEGER NOT NULL, version INTEGER "
                "NOT NULL, last_seen TIMESTAMP, created_at TIMESTAMP, "
                "PRIMARY KEY (service, machine_id))"))
            conn.execute(text("CREATE TABLE flakekit_schema (component VARCHAR(64) PRIMARY KEY, "
                              "version INTEGER NOT NULL)"))
        with pytest.raises(SchemaError, match="holder"):
            check_schema(engine, "workers")

    def test_newer_schema_is_refused(self, db_url, engines):
        """A schema version from a newer flakekit fails with 'upgrade flakekit'."""
        refused_after(engines(db_url), "UPDATE flakekit_schema SET version = 99",
                      match="upgrade flakekit")


    def test_timestamp_type_that_depends_on_the_session_zone_is_refused(self, db_url, engines):
        """last_seen as PostgreSQL TIMESTAMP (no time zone) or MariaDB TIMESTAMP is read
        through each session's time zone: a node in another zone would see a live row as
        hours old and reclaim it. check_schema refuses such a table."""
        engine = engines(db_url)
        if engine.dialect.name == "sqlite":
            pytest.skip("SQLite stores UTC text")
        if engine.dialect.name == "postgresql":
            alter = "ALTER TABLE system_nodes ALTER COLUMN last_seen TYPE TIMESTAMP"
        else:
            alter = ("ALTER TABLE system_nodes MODIFY last_seen TIMESTAMP(6) "
                     "NOT NULL DEFAULT CURRENT_TIMESTAMP(6)")
        refused_after(engine, alter, match="last_seen")

    def test_sessions_in_other_time_zones(self, db_url, engines):
        """Nodes whose sessions use different time zones agree on lease ages."""
        from sqlalchemy import event

        engine = engines(db_url)
        name = engine.dialect.name
        if name == "sqlite":
            pytest.skip("SQLite has no session time zone")
        zones = {"postgresql": ("America/New_York", "Asia/Kolkata"),
                 "mysql": ("-05:00", "+05:00")}[name]
        made = []
        for zone in zones:
            other = create_engine(db_url)
            stmt = (f"SET TIME ZONE '{zone}'" if name == "postgresql"
                    else f"SET time_zone = '{zone}'")

            @event.listens_for(other, "connect")
            def set_zone(dbapi_conn: Any, _record: Any, stmt: str = stmt) -> None:
                cur = dbapi_conn.cursor()
                cur.execute(stmt)
                cur.close()
                dbapi_conn.commit()

            made.append(other)
        try:
            west, east = made
            lease = make(west).acquire(req(0))
            with pytest.raises(WorkerExhaustedError):
                make(east, host="10.0.0.2").acquire(req(0))
            for e in made:
                (record,) = list_records(e, "orders")
                assert record.state == "held" and abs(record.extra["age_s"]) < 60
            make(east).renew(lease, 0)
        finally:
            for e in made:
                e.dispose()


class TestConcurrency:
    def test_200_threads_get_distinct_ids(self, db_url, engines):
        """200 acquirers started together, each with its own allocator, never collide."""
        engine = engines(db_url)
        init_schema(engine, "workers")
        allocs = [make(engine, host=f"10.{i // 250}.{i % 250}.1") for i in range(200)]
        got = in_threads(lambda i: allocs[i].acquire(req()).worker_id, 200)
        assert sorted(got) == list(range(200))

    def test_same_host_port_threads_distinct(self, db_url, engines):
        """20 racing acquirers that all claim the same host:port still get 20 ids."""
        engine = engines(db_url)
        init_schema(engine, "workers")
        allocs = [make(engine) for _ in range(20)]
        got = in_threads(lambda i: allocs[i].acquire(req()).worker_id, 20)
        assert sorted(got) == list(range(20))

    def test_an_acquire_outlasts_a_long_run_of_deadlocks(self, db_url, engines):
        """A starter that loses 80 rounds in a row (deadlock victims, as under a crowd of
        starters on a loaded host) still gets its id: retries are bounded by time
        (lock_retry_s), not by a count (50 ran out in CI)."""
        from sqlalchemy import event
        from sqlalchemy.exc import OperationalError

        engine = engines(db_url)
        init_schema(engine, "workers")
        alloc = make(engine)
        left = [80]

        def deadlock(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if left[0] and statement.lstrip().upper().startswith("UPDATE FLAKEKIT_SCHEMA"):
                left[0] -= 1
                raise OperationalError(statement, None, Exception(
                    "(1213, 'Deadlock found when trying to get lock; try restarting "
                    "transaction')"))

        event.listen(engine, "before_cursor_execute", deadlock)
        try:
            assert alloc.acquire(req()).worker_id == 0
        finally:
            event.remove(engine, "before_cursor_execute", deadlock)
        assert left == [0]

    def test_first_acquire_beside_a_session_holding_the_gap_is_no_deadlock(
            self, mariadb_url, engines, caplog):
        """MariaDB: the service's lock row does not exist yet and another session holds
        the gap where it goes (as a concurrent first acquire did: UPDATE of the missing
        row, then INSERT). The acquire must not take that gap too and insert into it:
        two gap holders inserting is a deadlock, a victim on one side or the other."""
        import logging
        import threading

        from flakekit.sql.workers import lock_component

        engine = engines(mariadb_url)
        init_schema(engine, "workers")
        got: list[Any] = []
        with engine.connect() as other:
            other.begin()
            other.execute(text("UPDATE flakekit_schema SET version = version "
                               "WHERE component = :c"), {"c": lock_component("orders")})
            caplog.set_level(logging.DEBUG, logger="flakekit.sql.workers")
            thread = threading.Thread(target=lambda: got.append(make(engine).acquire(req())))
            thread.start()
            thread.join(0.5)  # the acquire now waits for the other session's gap
            other.execute(text("INSERT INTO flakekit_schema (component, version) "
                               "VALUES (:c, 0)"), {"c": lock_component("orders")})
            other.commit()
        thread.join(30)
        assert [lease.worker_id for lease in got] == [0]
        assert not [r for r in caplog.records if "Deadlock" in r.getMessage()]


class TestErrors:
    def test_pool_timeout_is_a_backend_error(self, db_url):
        """No free connection within pool_timeout: acquire, renew and release raise one
        BackendError line, not a raw SQLAlchemy exception."""
        from flakekit.errors import BackendError

        options: dict[str, Any] = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 0.2}
        if db_url.startswith("sqlite"):
            from sqlalchemy.pool import QueuePool

            options["poolclass"] = QueuePool
        engine = create_engine(db_url, **options)
        try:
            alloc = make(engine)
            lease = alloc.acquire(req())
            with engine.connect():  # the only connection is busy
                for call in (lambda: make(engine).acquire(req()),
                             lambda: alloc.renew(lease, 0),
                             lambda: alloc.release(lease, 0)):
                    with pytest.raises(BackendError) as info:
                        call()
                    assert "\n" not in str(info.value)
            assert engine.pool.checkedout() == 0
        finally:
            engine.dispose()

    def test_driver_error_without_text_is_still_one_line(self):
        """`workers release` / `db init` turn a driver error with an empty message into
        one line instead of an IndexError traceback."""
        from sqlalchemy import create_engine

        from flakekit.builtin.sql import _db_error

        engine = create_engine("postgresql+psycopg://u:hunter2@db.example:5433/ids")
        assert str(_db_error(Exception(""), engine)) == \
            "database postgresql+psycopg://u:***@db.example:5433/ids: Exception"


class TestSettings:
    @pytest.mark.parametrize(
        ("table", "field", "message"),
        [
            ({"heartbeat": "soon"}, "heartbeat", "expected a duration"),
            ({"heartbeat": 0}, "heartbeat", "positive"),
            ({"reclaim_after": []}, "reclaim_after", "list of ages"),
            ({"reclaim_after": ["1h", "1d"]}, "reclaim_after", "longest"),
            ({"heartbeat": "1h"}, "", "must be shorter"),
            ({"port": 70000}, "port", "0..65535"),
            ({"port": "80"}, "port", "integer"),
            ({"create_schema": "yes"}, "create_schema", "true or false"),
            ({"servce": "x"}, "servce", "did you mean 'service'"),
        ],
        ids=["bad-duration", "zero-heartbeat", "no-tiers", "tier-order", "heartbeat-too-long",
             "port-range", "port-type", "create-schema-type", "typo"],
    )
    def test_bad_values(self, table, field, message):
        """Each wrong value names its field and the fix."""
        from flakekit.assembly.settings import build_settings
        from flakekit.builtin.sql import SqlAllocatorSettings

        path = "generators.orders.allocator"
        with pytest.raises(ConfigError) as info:
            build_settings(SqlAllocatorSettings, table, path)
        assert str(info.value).startswith(f"{path}.{field}" if field else path)
        assert message in str(info.value)

    def test_seed_heartbeat_works_with_default_tiers(self):
        """Seed 000's 5-minute heartbeat is accepted with 7 d / 1 d / 1 h."""
        from flakekit.builtin.sql import SqlAllocatorSettings

        s = SqlAllocatorSettings(heartbeat="5m")
        assert s.heartbeat == 300 * NS and s.reclaim_after[-1] == 3600 * NS


class TestCommands:
    def run(self, *args: str, catch: bool = False) -> Any:
        from click.testing import CliRunner

        from flakekit.builtin.sql import register_commands
        from flakekit.cli import cli

        register_commands(cli)
        return CliRunner().invoke(cli, list(args), catch_exceptions=catch)

    def config(self, tmp_path, url: str) -> str:
        path = tmp_path / "flakekit.toml"
        path.write_text(
            f'[backends.main]\nurl = "{url}"\n\n[generators.orders]\nlayout = "snowflake"\n'
            'allocator = { type = "sql", backend = "main", service = "orders", '
            'heartbeat = "5m" }\n'
        )
        return str(path)

    def test_db_init_workers_release(self, db_url, engines, tmp_path):
        """`db init` creates the schema; `workers` lists rows; `workers release` frees one."""
        cfg = self.config(tmp_path, db_url)
        result = self.run("db", "init", "--config", cfg)
        assert result.exit_code == 0 and "workers schema ready" in result.output
        engine = engines(db_url)
        lease = make(engine, create_schema=False).acquire(req())
        result = self.run("workers", "--config", cfg, "--json")
        rows = __import__("json").loads(result.output)
        assert [(r["worker_id"], r["state"], r["host"], r["port"]) for r in rows] == [
            (0, "held", "10.0.0.1", 8080)]
        listing = self.run("workers", "--config", cfg).output
        assert "10.0.0.1:8080" in listing and "held" in listing
        refused = self.run("workers", "release", "0", "--config", cfg, catch=True)
        assert refused.exit_code != 0 and "--force" in str(refused.exception)
        ok = self.run("workers", "release", "0", "--config", cfg, "--force")
        assert ok.exit_code == 0 and "released worker 0" in ok.output
        assert row(engine, 0)["holder"] is None and row(engine, 0)["version"] == lease.epoch + 1

    def test_workers_without_schema_is_one_line(self, pg_url, tmp_path):
        """Listing before `db init` on a server fails with the fix, not a traceback."""
        from flakekit.cli import main

        cfg = self.config(tmp_path, pg_url)
        with pytest.raises(SystemExit) as info:
            main(["workers", "--config", cfg])
        assert info.value.code == 1


class TestEmbeddedDefault:
    def test_load_without_config_uses_sqlite_in_the_state_dir(self, tmp_path, monkeypatch):
        """No config: the sql allocator on $FLAKEKIT_STATE_DIR/flakekit.db (not the working
        directory); two kits get distinct ids."""
        import flakekit

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("FLAKEKIT_STATE_DIR", str(tmp_path / "state"))
        with flakekit.load() as one, flakekit.load() as two:
            a, b = one["default"], two["default"]
            assert a.worker_id != b.worker_id
            assert a.next_id() != b.next_id()
        assert (tmp_path / "state" / "flakekit.db").exists()
        assert not (tmp_path / "flakekit.db").exists()
