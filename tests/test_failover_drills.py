"""Fail-over drills on a real PostgreSQL primary and streaming standby (asynchronous;
the segment drill also on a MariaDB primary and GTID replica): replication cut, writes the
standby never gets, kill -9 of the primary, promotion, the clients re-pointed. With
``FLAKEKIT_DRILL_UNPROTECTED=1`` each also runs with detection off, and must then find the
duplicates it is about (the "before" of docs/replicated-databases.md)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from flakekit.errors import BackendError, FenceError, LeaseLostError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql import failover
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.schema import WORKERS_COMPONENT, init_schema
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import EventRecorder, wait_until
from flakekit.testing.replicas import (
    MariaReplicaSet,
    PgReplicaSet,
    mariadb_binaries_missing,
    pg_binaries_missing,
)
from flakekit.testing.threads import Loops
from flakekit.values.clock import MonotonicClock

pytestmark = [pytest.mark.slow]

_SETS = {"postgresql": (PgReplicaSet, pg_binaries_missing),
         "mariadb": (MariaReplicaSet, mariadb_binaries_missing)}
BOTH = [pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb)]


@pytest.fixture
def replicas(request):
    """A primary and an asynchronous replica (PostgreSQL unless parametrized)."""
    kind = getattr(request, "param", "postgresql")
    make, missing = _SETS[kind]
    if missing():
        pytest.skip(missing())
    rs = make().start()
    yield rs
    rs.stop()


#: FLAKEKIT_DRILL_UNPROTECTED=1 also runs each drill with detection off (the "before")
UNPROTECTED = os.environ.get("FLAKEKIT_DRILL_UNPROTECTED") == "1"


@pytest.fixture(params=[True, False] if UNPROTECTED else [True],
                ids=["protected", "unprotected"] if UNPROTECTED else ["protected"])
def protected(request, monkeypatch) -> bool:
    if not request.param:
        monkeypatch.setattr(failover, "detection_ready", lambda engine: False)
    return request.param


def _replicated(rs: PgReplicaSet, sql: str, want: Any) -> None:
    """Poll the standby until ``sql`` answers ``want`` (it caught up)."""
    engine = create_engine(rs.standby.url)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with engine.connect() as conn:
                    if conn.execute(text(sql)).scalar() == want:
                        return
            except Exception:  # noqa: BLE001  # the table may not be there yet
                pass
            assert time.monotonic() < deadline, f"the standby never caught up: {sql}"
            time.sleep(0.05)
    finally:
        engine.dispose()


def _retrying(fn: Callable[[], Any], seconds: float = 30) -> Any:
    """The first success of ``fn`` (the first requests after a fail-over may meet
    connections to the dead primary)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except BackendError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class _Forgetful(dict):
    """A store's high-water memory that keeps nothing."""

    def __setitem__(self, key: str, value: int) -> None:
        pass


def _duplicates(ranges: list[tuple[int, int]]) -> int:
    seen: set[int] = set()
    twice = 0
    for start, end in ranges:
        ids = set(range(start, end))
        twice += len(ids & seen)
        seen |= ids
    return twice


def _fetched(store: SqlSegmentStore, times: int) -> list[tuple[int, int]]:
    """``times`` fetches of key ``orders``, as (start, max_id) ranges."""
    return [(a.start, a.max_id) for a in (store.fetch("orders") for _ in range(times))]


def _orders_fetched(url: str, recorder: EventRecorder) -> tuple[SqlSegmentStore,
                                                                 list[tuple[int, int]]]:
    """A store on ``url`` (a pre-pinging engine, its events to ``recorder``) that created
    key ``orders`` (step 100) and fetched it five times; the five ranges."""
    store = SqlSegmentStore(create_engine(url, pool_pre_ping=True), events=recorder.events)
    store.create("orders", step=100)
    return store, _fetched(store, 5)


@pytest.mark.parametrize("replicas", BOTH, indirect=True)
def test_segments_async_cut_kill_promote(replicas, protected):
    recorder = EventRecorder()
    old, ranges = _orders_fetched(replicas.url, recorder)
    engine_a = old.engine
    _replicated(replicas, "SELECT max_id FROM leaf_alloc", ranges[-1][1])
    replicas.cut_replication()
    ranges += _fetched(old, 20)
    killed = time.monotonic()
    replicas.fail_over()

    engine_b = create_engine(replicas.url, pool_pre_ping=True)
    fresh = SqlSegmentStore(engine_b, events=recorder.events)   # a process started after
    if not protected:  # nor the high-water floor: flakekit before issue 19
        old._high = _Forgetful()
        fresh._high = _Forgetful()
    served = 0.0
    for store in (fresh, old, fresh, old):
        got = _retrying(lambda s=store: s.fetch("orders"))
        ranges.append((got.start, got.max_id))
        served = served or time.monotonic()
    first = _duplicates(ranges)

    # a second fail-over in a row: a new standby of the promoted one, cut, lost, promoted
    replicas.new_standby()
    _replicated(replicas, "SELECT max_id FROM leaf_alloc", ranges[-1][1])
    replicas.cut_replication()
    ranges += _fetched(fresh, 10)
    replicas.fail_over()
    for store in (old, fresh):
        got = _retrying(lambda s=store: s.fetch("orders"))
        ranges.append((got.start, got.max_id))
    twice = _duplicates(ranges)
    print(f"protected={protected}: {first} IDs issued twice after the first fail-over, "
          f"{twice} of {sum(e - s for s, e in ranges)} after the second; the first range "
          f"{served - killed:.1f} s after kill -9 (promotion included)")
    engine_a.dispose()
    engine_b.dispose()
    if protected:
        assert twice == 0
        assert recorder.alerts() == ["database-failover", "database-failover"]
    else:
        assert first > 0 and twice > first  # the drill does reproduce the loss, twice


def _allocator(url: str, port: int, events: Any = None) -> SqlWorkerAllocator:
    return SqlWorkerAllocator(
        engine=create_engine(url, pool_pre_ping=True), service="orders",
        clock=MonotonicClock(), host="10.0.0.1", port=port, heartbeat_ns=300_000_000,
        tiers_ns=(2_000_000_000,), safety_window_ns=500_000_000,
        events=events or EventRecorder().events)


@pytest.mark.postgresql
def test_workers_async_cut_kill_promote(replicas, protected):
    request = LeaseRequest("orders", 7, "10.0.0.1")
    setup = create_engine(replicas.url)
    init_schema(setup, WORKERS_COMPONENT)
    setup.dispose()
    first = _allocator(replicas.url, 1)
    first.acquire(request)          # the service's rows and marker reach the standby
    _replicated(replicas, "SELECT count(*) FROM system_nodes", 1)
    replicas.cut_replication()
    recorder = EventRecorder()
    holder = _allocator(replicas.url, 2, recorder.events)
    lease = holder.acquire(request)  # the standby never receives this row
    killed = time.monotonic()
    replicas.fail_over()

    newcomer = _allocator(replicas.url, 3, recorder.events)
    clock = MonotonicClock()
    deadline = time.monotonic() + 15
    granted = None
    while granted is None and time.monotonic() < deadline:
        try:
            granted = newcomer.acquire(request)
            break
        except BackendError as exc:
            assert "no worker id is granted until" in str(exc) or "connection" in str(
                exc).lower(), exc
        try:
            lease = holder.renew(lease, 0)  # the holder's heartbeats go on meanwhile
        except BackendError:
            pass                     # a connection to the dead primary: the next one works
        time.sleep(0.1)
    assert granted is not None
    # two holders: the newcomer got the id while the holder's lease was still valid
    shared = ([granted.worker_id] if granted.worker_id == lease.worker_id
              and lease.deadline_ns > clock.monotonic_ns() else [])
    print(f"protected={protected}: worker ids held twice: {shared}; a new id granted "
          f"{time.monotonic() - killed:.1f} s after kill -9 (reclaim age 2 s)")
    for allocator in (first, holder, newcomer):
        allocator.engine.dispose()
    if protected:
        assert shared == []
        assert "database-failover" in recorder.alerts()
    else:
        assert shared == [lease.worker_id]


@pytest.mark.postgresql
def test_cluster_async_cut_kill_promote(replicas, protected):
    """A member that joined and a key claimed during the cut (the standby never gets
    them): after the fail-over no second process joins as that member and no second
    owner claims that key while the first ones live."""
    from flakekit.cluster.store_contracts import JoinRequest, KeyClaim
    from flakekit.sql.membership import SqlMembership
    from flakekit.values.cluster import Member

    engine = create_engine(replicas.url, pool_pre_ping=True)
    recorder = EventRecorder()
    old = SqlMembership(engine, MonotonicClock(), create_schema=True,
                        events=recorder.events)

    def join(membership: SqlMembership, node: str):
        return membership.acquire(JoinRequest("ids", Member(node, f"http://{node}:1"),
                                              lease_s=1.0))
    a = join(old, "a")
    view = old.propose("ids", 0, [a.member])
    store = SqlSegmentStore(engine, events=recorder.events)
    store.create("k", step=10)
    assert store.claim_key(KeyClaim("warm", "a", view.epoch), False)  # claims were made
    _replicated(replicas, "SELECT count(*) FROM flakekit_key_owner", 1)
    replicas.cut_replication()
    b = join(old, "b")                                    # never reaches the standby
    claim = KeyClaim("k", "b", view.epoch)
    assert store.claim_key(claim, False)
    replicas.fail_over()

    other = create_engine(replicas.url, pool_pre_ping=True)
    fresh = SqlMembership(other, MonotonicClock(), events=recorder.events)
    fresh_store = SqlSegmentStore(other, events=recorder.events)
    second_b = second_owner = None
    live = {"a": a, "b": b}
    deadline = time.monotonic() + 4                       # quarantine 1.25 s, then more
    while time.monotonic() < deadline:
        for node, lease in list(live.items()):
            try:
                old.renew(lease, 0)   # the live members' renewals go on meanwhile
            except LeaseLostError:
                del live[node]        # before issue 19: the row the standby lacked
            except BackendError:
                pass                  # a connection to the dead primary
        try:
            store.fetch("k", claim=claim)                 # the owner serves on
        except (BackendError, FenceError):
            pass
        try:
            second_b = second_b or join(fresh, "b")
        except BackendError as exc:
            assert "fail-over" in str(exc) or "held by a live process" in str(exc) or (
                "connection" in str(exc).lower()), exc
        try:
            if fresh_store.claim_key(KeyClaim("k", "c", view.epoch + 1), False):
                second_owner = "c"
        except BackendError:
            pass
        time.sleep(0.1)
    print(f"protected={protected}: second holder of member b: {second_b is not None}, "
          f"second owner of key k: {second_owner}, members lost: {sorted({'a', 'b'} - set(live))}")
    engine.dispose()
    other.dispose()
    if protected:
        assert second_b is None and second_owner is None
        assert set(live) == {"a", "b"}                    # re-asserted, not lost
        assert "database-failover" in recorder.alerts()
    else:
        assert second_b is not None and second_owner == "c"


@pytest.mark.postgresql
def test_planned_switch_over(replicas, protected):
    """Stop the primary cleanly, promote, re-point: nothing lost, nothing issued twice;
    what detection costs then is the skip-ahead and the quarantine (measured, printed)."""
    recorder = EventRecorder()
    old, ranges = _orders_fetched(replicas.url, recorder)
    engine = old.engine
    init_schema(engine, WORKERS_COMPONENT)
    request = LeaseRequest("orders", 7, "10.0.0.1")
    holder = _allocator(replicas.url, 1, recorder.events)
    lease = holder.acquire(request)
    _replicated(replicas, "SELECT count(*) FROM system_nodes", 1)
    started = time.monotonic()
    replicas.switch_over()

    got = _retrying(lambda: old.fetch("orders"))
    fetch_gap = time.monotonic() - started
    ranges.append((got.start, got.max_id))
    skipped = got.start - ranges[-2][1]
    newcomer = _allocator(replicas.url, 2, recorder.events)
    granted = None
    deadline = time.monotonic() + 15
    while granted is None and time.monotonic() < deadline:
        try:
            lease = holder.renew(lease, 0)
        except BackendError:
            pass                          # a connection to the stopped primary
        try:
            granted = newcomer.acquire(request)
        except BackendError as exc:
            assert "no worker id is granted until" in str(exc) or "connection" in str(
                exc).lower(), exc
            time.sleep(0.1)
    grant_gap = time.monotonic() - started
    print(f"protected={protected}: {_duplicates(ranges)} IDs issued twice; fetches "
          f"resumed after {fetch_gap:.1f} s, {skipped} IDs skipped; a new worker id "
          f"granted after {grant_gap:.1f} s (reclaim age 2 s)")
    for allocator in (holder, newcomer):
        allocator.engine.dispose()
    engine.dispose()
    assert _duplicates(ranges) == 0
    assert granted is not None and granted.worker_id != lease.worker_id
    if protected:
        assert skipped == old.failover_skip       # detected: a timeline change
        assert recorder.alerts().count("database-failover") == 2  # store and registry


class _Drawers:
    """``n`` processes (a store, an engine and a generator each, with the backend's
    default time limits) whose threads draw IDs until stopped; every ID and every
    caller error kept, with when it came."""

    def __init__(self, url: str, n: int = 3, replication: str = "any",
                 recorder: EventRecorder | None = None) -> None:
        from flakekit.generators.segment import SegmentGenerator
        from flakekit.sql.backends import BackendPool, BackendSettings
        from flakekit.sql.durability import watch_for

        self.pools = [BackendPool({"db": BackendSettings(url, replication=replication)})
                      for _ in range(n)]
        self.recorder = recorder or EventRecorder()
        self.stores = []
        for pool in self.pools:
            engine = pool.engine("db")
            watch_for(engine, "db").listen(self.recorder.events)
            self.stores.append(SqlSegmentStore(engine, events=self.recorder.events))
        self.gens = [SegmentGenerator(s, "orders") for s in self.stores]
        self.ids: list[list[int]] = [[] for _ in self.gens]
        self.errors: list[tuple[float, str]] = []
        self._loops = Loops(self._draw, range(len(self.gens)))

    def start(self) -> _Drawers:
        for gen in self.gens:
            gen.start()
        self._loops.start()
        return self

    def _draw(self, i: int) -> None:
        from flakekit.errors import FlakekitError

        gen, out = self.gens[i], self.ids[i]
        while not self._loops.stopping.is_set():
            try:
                out.append(gen.next_id())
            except FlakekitError as exc:
                self.errors.append((time.monotonic(), str(exc)))
                time.sleep(0.05)
            if len(out) % 50 == 0:
                time.sleep(0.001)  # a caller's pace, not a spin

    def stop(self) -> None:
        self._loops.stop(60)
        for gen in self.gens:
            gen.close()
        for pool in self.pools:
            pool.dispose()

    def duplicates(self) -> int:
        every = [i for ids in self.ids for i in ids]
        return len(every) - len(set(every))

    def count(self) -> int:
        return sum(len(ids) for ids in self.ids)

    def outage(self) -> float:
        """Seconds from the first caller error to the last (0: none)."""
        return self.errors[-1][0] - self.errors[0][0] if self.errors else 0.0


def _served_again(drawers: _Drawers, seconds: float = 120) -> None:
    """Wait until every process issues IDs again."""
    counts = [len(ids) for ids in drawers.ids]
    deadline = time.monotonic() + seconds
    while any(len(ids) <= c for ids, c in zip(drawers.ids, counts, strict=True)):
        assert time.monotonic() < deadline, "the processes never served again"
        time.sleep(0.1)


@contextlib.contextmanager
def _sync_drawers() -> Iterator[tuple[PgReplicaSet, _Drawers]]:
    """A PostgreSQL primary whose commits wait for its streaming standby
    (``synchronous_standby_names``), key ``orders`` and three processes drawing from it."""
    if pg_binaries_missing():
        pytest.skip(pg_binaries_missing())
    rs = PgReplicaSet(("synchronous_standby_names=walreceiver",)).start()
    try:
        setup = create_engine(rs.url)
        SqlSegmentStore(setup).create("orders", step=1000)
        setup.dispose()
        drawers = _Drawers(rs.url).start()
        _served_again(drawers)
        yield rs, drawers
    finally:
        rs.stop()


def _fetched_again(drawers: _Drawers, fetches: int = 2, seconds: float = 120) -> None:
    """Wait until every process fetched ``fetches`` more segments and served from them."""
    counts = [gen._stats.fetches for gen in drawers.gens]
    deadline = time.monotonic() + seconds
    while any(gen._stats.fetches < c + fetches
              for gen, c in zip(drawers.gens, counts, strict=True)):
        assert time.monotonic() < deadline, "the processes never fetched again"
        time.sleep(0.1)
    _served_again(drawers, seconds)


def _duplicates_once_fetched_again(drawers: _Drawers) -> int:
    """After a fail-over: :func:`_fetched_again`, a second more of drawing, the drawers
    stopped; how many IDs they were issued twice."""
    _fetched_again(drawers)
    time.sleep(1)
    drawers.stop()
    return drawers.duplicates()


@pytest.mark.postgresql
def test_sync_cut_longer_than_the_reply_limit(protected):
    """PostgreSQL synchronous replication, the standby cut off for longer than the reply
    limit (statement_timeout 30 s + 5 s, the defaults): callers fail while it is away,
    with messages that name the standby; then kill -9 and promotion of the standby (it
    has every acknowledged commit): no ID issued twice."""
    with _sync_drawers() as (rs, drawers):
        time.sleep(1)
        cut = time.monotonic()
        rs.cut_replication()
        time.sleep(40)                               # longer than the 35 s reply limit
        rs.replication.restore()                      # the standby comes back
        back = time.monotonic()
        _served_again(drawers)
        first = next((t for t, _ in drawers.errors if t > cut), back)
        during = [e for t, e in drawers.errors if first + 3 < t < back]  # (the first
        # error starts the check of what the database waits for)
        rs.fail_over()                                # it has every acknowledged commit
        twice = _duplicates_once_fetched_again(drawers)
        print(f"protected={protected}: {twice} of {drawers.count()} IDs issued twice; "
              f"callers failed for {drawers.outage():.1f} s ({len(drawers.errors)} errors); "
              f"while away, e.g.: {during[-1]}")
        assert twice == 0
        assert during, "no caller failed while the standby was away"
        unnamed = [e for e in during if "synchronous_standby_names = 'walreceiver'" not in e]
        assert not unnamed, unnamed[:3]


@pytest.mark.mariadb
def test_mariadb_semi_sync_falls_back_then_fails_over(protected):
    """A real MariaDB primary and semi-sync replica, the default 10 s
    rpl_semi_sync_master_timeout (the default-settings drill of the fall-back),
    replication cut past it (until every process saw the fall-back) while three draw:
    the primary falls back (flakekit says ``fallen-back``, one ``database-durability``
    alert; a backend with replication = "synchronous" refuses with one line), then
    kill -9, promotion, re-pointing: with the defaults no ID is issued twice."""
    if mariadb_binaries_missing():
        pytest.skip(mariadb_binaries_missing())
    from flakekit.sql.durability import watch_for

    rs = MariaReplicaSet(("--rpl-semi-sync-master-enabled=ON",
                          "--rpl-semi-sync-slave-enabled=ON")).start()
    try:
        setup = create_engine(rs.url)
        SqlSegmentStore(setup).create("orders", step=1000)
        deadline = time.monotonic() + 30
        while True:                                   # the replica acknowledges
            with setup.connect() as conn:
                status = dict(conn.execute(text(
                    "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'")).all())
            if status.get("Rpl_semi_sync_master_clients") == "1":
                break
            assert time.monotonic() < deadline, "semi-sync never came up"
            time.sleep(0.1)
        rs.standby.sql("SET GLOBAL rpl_semi_sync_master_enabled = OFF")  # a replica
        recorder = EventRecorder()
        drawers = _Drawers(rs.url, recorder=recorder).start()
        strict = _Drawers(rs.url, n=1, replication="synchronous")
        for store in drawers.stores:  # re-read often: the drill is shorter than 30 s
            watch_for(store.engine).recheck_s = 1.0
        _served_again(drawers)
        verdicts = {watch_for(s.engine).last.verdict for s in drawers.stores}
        assert verdicts == {"synchronous"}, verdicts
        rs.cut_replication()
        # past the 10 s timeout the primary gives up waiting; polled: every process has
        # seen it fall back (and alerted) when its watch says so
        wait_until(lambda: all(getattr(watch_for(s.engine).last, "verdict", None)
                               == "fallen-back" for s in drawers.stores),
                   60, what="every process saw the primary fall back", interval=0.1)
        _served_again(drawers)
        verdicts = {watch_for(s.engine).read(s.engine).verdict for s in drawers.stores}
        with pytest.raises(BackendError) as refused:
            strict.stores[0].fetch("orders")
        strict.stop()
        rs.fail_over()
        rs.primary.sql("SET GLOBAL rpl_semi_sync_master_enabled = OFF")  # no replica yet
        twice = _duplicates_once_fetched_again(drawers)
        setup.dispose()
        alerts = recorder.alerts()
        print(f"protected={protected}: {twice} of {drawers.count()} IDs issued twice; "
              f"callers failed for {drawers.outage():.1f} s; alerts {alerts}; "
              f"strict: {refused.value}")
        assert verdicts == {"fallen-back"}, verdicts
        assert alerts.count("database-durability") == len(drawers.stores)  # one each
        assert "rpl_semi_sync_master_timeout" in str(refused.value)
        assert "\n" not in str(refused.value)
        if protected:
            assert twice == 0
            assert "database-failover" in alerts
        else:
            assert twice > 0
    finally:
        rs.stop()


@pytest.mark.postgresql
def test_sync_cancelled_commits_then_fail_over(protected, monkeypatch):
    """PostgreSQL synchronous replication, the standby cut off, and every commit stuck
    waiting for it cancelled (``pg_cancel_backend``, what a long-query killer does:
    PostgreSQL keeps it locally and answers success with a WARNING); then kill -9 and
    promotion of the standby, which never got those commits: no ID issued twice. Without
    the defences (the notice handler and detection) the cancelled ranges are used."""
    if not protected:
        from flakekit.sql import backends

        monkeypatch.setattr(backends, "watch_sync_cancellations", lambda raw: None)
    with _sync_drawers() as (rs, drawers):
        rs.cut_replication()
        killer = create_engine(rs.primary.url)      # the killer, on the primary itself
        cancelled = 0
        until = time.monotonic() + 8
        while time.monotonic() < until:
            with killer.connect() as conn:
                cancelled += conn.execute(text(
                    "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity "
                    "WHERE wait_event = 'SyncRep'")).scalar_one()
            time.sleep(0.05)
        killer.dispose()
        rs.fail_over()                              # the standby lacks every one of them
        twice = _duplicates_once_fetched_again(drawers)
        messages = sorted({e.split(": ", 1)[-1][:140] for _, e in drawers.errors})
        print(f"protected={protected}: {cancelled} commits cancelled; {twice} of "
              f"{drawers.count()} IDs issued twice; callers failed for "
              f"{drawers.outage():.1f} s; {messages[:2]}")
        assert cancelled > 0
        if protected:
            assert twice == 0
            assert any("not made durable" in e for _, e in drawers.errors)
        else:
            assert twice > 0
