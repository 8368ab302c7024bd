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

from flakekit.errors import BackendError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql import failover
from flakekit.sql.leaf import SqlSegmentStore, leaf_alloc_table
from flakekit.sql.schema import WORKERS_COMPONENT, init_schema, system_nodes
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import EventRecorder
from flakekit.testing.databases import fresh_server_database
from flakekit.values.clock import MonotonicClock

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
        writer = conn.execute(text("SELECT writer FROM flakekit_primary")).scalar_one()
        assert writer == failover.primary_identity(conn)


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
    promote(engine, "workers:orders")

    newcomer = _allocator(engine, recorder.events, port=2)
    with pytest.raises(BackendError, match="no worker id is granted until .*fail-over"):
        newcomer.acquire(LeaseRequest("orders", 3, "10.0.0.1"))
    assert recorder.alerts().count("database-failover") == 1
    lease = holder.renew(lease, 0)                      # re-asserts, not "released"
    with engine.connect() as conn:
        held = conn.execute(text("SELECT holder FROM system_nodes")).scalars().all()
    assert held == [lease.holder]

    deadline = time.monotonic() + 10                    # the quarantine: one tier
    while True:
        holder.renew(lease, 0)
        try:
            other = newcomer.acquire(LeaseRequest("orders", 3, "10.0.0.1"))
            break
        except BackendError as exc:
            assert "no worker id is granted" in str(exc)
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert other.worker_id != lease.worker_id           # never two holders of one id
