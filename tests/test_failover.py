"""Fail-over detection (flakekit/sql/failover.py) on the real servers.

A promoted asynchronous replica is what these tests build by hand on one server: the
marker row says another primary wrote the scope last (what the replica received from
the old primary), and the rows the old primary wrote last are gone or older (what the
replica never received). The first fetch or grant on it must know.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, delete, text, update

from flakekit.cluster.store_contracts import JoinRequest, KeyClaim
from flakekit.errors import BackendError, FenceError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql import failover
from flakekit.sql.leaf import SqlSegmentStore, leaf_alloc_table
from flakekit.sql.membership import VIEW_EPOCH_SKIP, SqlMembership
from flakekit.sql.schema import (
    CLUSTER_COMPONENT,
    WORKERS_COMPONENT,
    init_schema,
    key_owner,
    members,
    system_nodes,
)
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import EventRecorder
from flakekit.testing.databases import fresh_server_database
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mariadb", marks=pytest.mark.mariadb)]
OLD = "server of the old primary"


@pytest.fixture(params=SERVERS)
def engine(request: pytest.FixtureRequest):
    with fresh_server_database(request.param) as url:
        eng = create_engine(url)
        yield eng
        eng.dispose()


def promote(engine, scope: str) -> None:
    """Make the database look like a replica promoted after the old primary wrote
    ``scope`` last."""
    with engine.begin() as conn:
        conn.execute(update(failover.primary_marker)
                     .where(failover.primary_marker.c.scope == scope).values(writer=OLD))


def test_a_fetch_on_a_promoted_replica_skips_past_the_lost_ranges(engine):
    recorder = EventRecorder()
    old = SqlSegmentStore(engine, events=recorder.events)
    old.create("orders", step=100)
    before = old.fetch("orders").max_id
    issued = [old.fetch("orders") for _ in range(5)]    # the replica never got these
    with engine.begin() as conn:
        conn.execute(update(leaf_alloc_table()).values(max_id=before))
    promote(engine, "segments:leaf_alloc:orders")

    fresh = SqlSegmentStore(engine, events=recorder.events)  # started after: no memory
    got = fresh.fetch("orders")
    assert got.start >= before + old.failover_skip
    assert all(got.start >= a.max_id for a in issued)    # no ID issued twice
    assert recorder.alerts().count("database-failover") == 1
    again = fresh.fetch("orders")                       # detected once, not again
    assert again.start == got.max_id
    with engine.connect() as conn:
        writer = conn.execute(text("SELECT writer FROM flakekit_primary WHERE scope = "
                                   "'segments:leaf_alloc:orders'")).scalar_one()
        assert writer == failover.primary_identity(conn)


def test_a_key_first_fetched_within_the_lag_skips_ahead_too(engine):
    """A key whose marker row the replica never received (its first fetch ever was on
    the old primary within the replication lag): the table's marker shows the fail-over,
    so the key's first fetch here skips ahead all the same."""
    recorder = EventRecorder()
    old = SqlSegmentStore(engine, events=recorder.events)
    old.create("warm", step=100)
    old.fetch("warm")                                   # the table's marker exists
    with engine.begin() as conn:  # a key made by hand (no marker), as before issue 19
        conn.execute(leaf_alloc_table().insert().values(biz_tag="late", max_id=1, step=100))
    issued = [old.fetch("late") for _ in range(3)]      # first fetched within the lag
    with engine.begin() as conn:  # the replica has neither these ranges nor the marker
        t = leaf_alloc_table()
        conn.execute(update(t).where(t.c.biz_tag == "late").values(max_id=1))
        conn.execute(delete(failover.primary_marker).where(
            failover.primary_marker.c.scope == "segments:leaf_alloc:late"))
    promote(engine, "segments:leaf_alloc")
    promote(engine, "segments:leaf_alloc:warm")

    other = create_engine(engine.url)                   # a process started after
    fresh = SqlSegmentStore(other, events=recorder.events)
    got = fresh.fetch("late")
    assert all(got.start >= a.max_id for a in issued)   # no ID issued twice
    assert got.start >= 1 + fresh.failover_skip
    assert recorder.alerts() == ["database-failover"]
    assert fresh.fetch("warm").start >= 101 + fresh.failover_skip   # its own marker
    assert fresh.fetch("late").start == got.max_id      # detected once
    made = fresh.create("new", step=10)                 # made after: no skip
    assert fresh.fetch("new").start == made.max_id
    other.dispose()


def test_a_service_first_used_within_the_lag_is_quarantined_too(engine):
    """The registry's marker is one per database: a service whose first grant ever the
    replica never received is covered by it."""
    init_schema(engine, WORKERS_COMPONENT)
    _allocator(engine).acquire(LeaseRequest("orders", 3, "10.0.0.1"))  # long before
    late = SqlWorkerAllocator(engine=engine, service="late", clock=MonotonicClock(),
                              host="10.0.0.1", port=5, heartbeat_ns=200_000_000,
                              tiers_ns=(1_500_000_000,), safety_window_ns=500_000_000)
    late.acquire(LeaseRequest("late", 3, "10.0.0.1"))   # within the lag
    with engine.begin() as conn:  # the replica never received the service's rows
        conn.execute(delete(system_nodes).where(system_nodes.c.service == "late"))
    promote(engine, failover.WORKERS_SCOPE)
    newcomer = SqlWorkerAllocator(engine=create_engine(engine.url), service="late",
                                  clock=MonotonicClock(), host="10.0.0.1", port=6,
                                  heartbeat_ns=200_000_000, tiers_ns=(1_500_000_000,),
                                  safety_window_ns=500_000_000)
    with pytest.raises(BackendError, match="no worker id is granted until .*fail-over"):
        newcomer.acquire(LeaseRequest("late", 3, "10.0.0.1"))
    newcomer.engine.dispose()


def test_a_process_holding_old_ranges_raises_max_id_to_its_high_water(engine, caplog):
    store = SqlSegmentStore(engine)
    store.create("k", step=10)
    top = [store.fetch("k") for _ in range(3)][-1].max_id
    with engine.begin() as conn:  # the database went back, nobody rewrote the marker
        conn.execute(update(leaf_alloc_table()).values(max_id=1))
    got = store.fetch("k")
    assert got.start >= top
    assert "the database went back" in caplog.text


def _allocator(engine, events=None, **kw):
    return SqlWorkerAllocator(engine=engine, service="orders", clock=MonotonicClock(),
                              host="10.0.0.1", port=kw.pop("port", 1),
                              heartbeat_ns=200_000_000, tiers_ns=(1_500_000_000,),
                              safety_window_ns=500_000_000, events=events or EventRecorder().events,
                              **kw)


def test_worker_grants_wait_out_the_quarantine_and_the_holder_reasserts(engine):
    init_schema(engine, WORKERS_COMPONENT)
    recorder = EventRecorder()
    holder = _allocator(engine, recorder.events)
    lease = holder.acquire(LeaseRequest("orders", 3, "10.0.0.1"))
    with engine.begin() as conn:  # the replica never received the holder's row
        conn.execute(delete(system_nodes))
    promote(engine, failover.WORKERS_SCOPE)

    newcomer = _allocator(engine, recorder.events, port=2)
    with pytest.raises(BackendError, match="no worker id is granted until .*fail-over"):
        newcomer.acquire(LeaseRequest("orders", 3, "10.0.0.1"))
    assert recorder.alerts().count("database-failover") == 1
    lease = holder.renew(lease, 0)                      # re-asserts, not "released"
    with engine.connect() as conn:
        held = conn.execute(text("SELECT holder FROM system_nodes")).scalars().all()
    assert held == [lease.holder]

    other = _after_quarantine(                          # the quarantine: one tier
        lambda: newcomer.acquire(LeaseRequest("orders", 3, "10.0.0.1")),
        lambda: holder.renew(lease, 0), "no worker id is granted")
    assert other.worker_id != lease.worker_id           # never two holders of one id


def _after_quarantine(attempt, keep_alive, refused: str, within_s: float = 10):
    """Poll ``attempt`` (refused with BackendError naming ``refused``, or returning a
    false value) until it succeeds, calling ``keep_alive`` before each try; its result."""
    deadline = time.monotonic() + within_s
    while True:
        keep_alive()
        try:
            got = attempt()
            if got:
                return got
        except BackendError as exc:
            assert refused in str(exc)
        assert time.monotonic() < deadline, f"still refused after {within_s} s"
        time.sleep(0.1)


CLUSTER = "ids"
SHORT_LEASE_S = 1.0  # the quarantine is this plus a margin (lapse_wait_ns)


def _join(membership, node: str):
    return membership.acquire(JoinRequest(CLUSTER, Member(node, f"http://{node}:1"),
                                          lease_s=SHORT_LEASE_S))


@pytest.mark.slow  # waits out a real quarantine (1.25 s)
def test_cluster_joins_wait_out_the_quarantine_and_members_reassert(engine):
    recorder = EventRecorder()
    old = SqlMembership(engine, MonotonicClock(), create_schema=True,
                        events=recorder.events)
    a, c = _join(old, "a"), _join(old, "c")
    view = old.propose(CLUSTER, 0, [a.member, c.member])
    with engine.begin() as conn:  # the replica never received a's row, and has an
        conn.execute(delete(members).where(members.c.node == "a"))  # older copy of c's
        conn.execute(update(members).where(members.c.node == "c").values(
            holder="someone earlier", incarnation=0))
    promote(engine, f"members:{CLUSTER}")

    fresh = SqlMembership(engine, MonotonicClock(), events=recorder.events)
    with pytest.raises(BackendError, match="may not join cluster 'ids' until .*fail-over"):
        _join(fresh, "a")                                # the id the replica lost
    assert recorder.alerts().count("database-failover") == 1
    assert fresh.view(CLUSTER).epoch == view.epoch + VIEW_EPOCH_SKIP  # never reused
    assert fresh.propose(CLUSTER, view.epoch + VIEW_EPOCH_SKIP, [c.member]) is None
    a, c = old.renew(a, 0), old.renew(c, 0)              # re-assert, not "lost"
    assert a.view_epoch == view.epoch + VIEW_EPOCH_SKIP  # the holder sees the jump
    held = {i.member.node: i.holder for i in fresh.members(CLUSTER)}
    assert held == {"a": a.holder, "c": c.holder}

    def keep_alive():
        old.renew(a, 0)
        old.renew(c, 0)
    b = _after_quarantine(lambda: _join(fresh, "b"), keep_alive, "may not join")
    assert b.member.node == "b"
    with pytest.raises(BackendError, match="held by a live process"):
        _join(fresh, "a")                                # never two holders of a
    assert fresh.propose(CLUSTER, view.epoch + VIEW_EPOCH_SKIP, [a.member, b.member])


@pytest.mark.slow  # waits out a real quarantine (1.25 s)
def test_key_claims_wait_out_the_quarantine_and_the_owner_reasserts(engine):
    recorder = EventRecorder()
    init_schema(engine, CLUSTER_COMPONENT)
    _join(SqlMembership(engine, MonotonicClock()), "a")  # the cluster's lease: short
    store = SqlSegmentStore(engine, events=recorder.events)
    store.create("k", step=10)
    mine, theirs = KeyClaim("k", "a", 5), KeyClaim("k", "b", 6)
    assert store.claim_key(mine, False)
    store.fetch("k", claim=mine)
    with engine.begin() as conn:  # the replica never received the claim
        conn.execute(delete(key_owner))
    promote(engine, "key-owners")

    assert not store.claim_key(theirs, True)            # no second owner let in
    assert recorder.alerts().count("database-failover") == 1
    store.fetch("k", claim=mine)                         # the owner re-asserts
    assert store.key_owner("k").node == "a"
    assert _after_quarantine(lambda: store.claim_key(theirs, True), lambda: None,
                             "never raised")
    with pytest.raises(FenceError, match="owned by node 'b' at epoch 6"):
        store.fetch("k", claim=mine)                     # the old owner is fenced
