"""A stuck peer costs the others a bounded wait (issue 9, item 2).

The peer is real: its connection goes through ``tests/proxy.py``, which partitions it the
moment it sends COMMIT (the COMMIT never arrives; nothing flows either way) while the
server keeps its session, its open transaction and its row locks -- as after a network
partition. Everyone else uses flakekit's default backend settings; the server ends the
stuck session after ``idle_in_transaction_timeout`` and the others go on. Nothing here
asserts a speed: a call must *finish* (the join timeouts are far above any default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from flakekit.errors import BackendError
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.sql.backends import BackendPool, BackendSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.schema import init_schema
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import proxied
from flakekit.testing.pytest_plugin import cleaned_up
from flakekit.testing.threads import Call
from flakekit.values.clock import MonotonicClock

pytestmark = pytest.mark.slow

NS = 1_000_000_000
# Call(...).join() waits 120 s: far beyond the defaults' worst case
# (idle_in_transaction_timeout 10 s, then one retry)


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
def server(request) -> Iterator[tuple[str, int]]:
    """(URL of a fresh database, the server's port) on PostgreSQL and MariaDB."""
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_url"), 5432
    else:
        yield request.getfixturevalue("mariadb_url"), 3306


@pytest.fixture
def pools() -> Iterator[Callable[..., BackendPool]]:
    def make(url: str, **limits: int) -> BackendPool:
        return BackendPool({"b": BackendSettings(url, **limits)})  # default: defaults

    with cleaned_up(make, BackendPool.dispose) as made:
        yield made


@pytest.fixture
def split(server, tcp_proxy, pools) -> tuple[Any, BackendPool, BackendPool]:
    """(a proxy to ``server``, a pool ``direct`` to it, a pool ``through`` the proxy)."""
    url, port = server
    proxy = tcp_proxy(port)
    return proxy, pools(url), pools(proxied(url, proxy))


def allocator(pool: BackendPool, service: str, host: str) -> SqlWorkerAllocator:
    return SqlWorkerAllocator(engine=pool.engine("b"), service=service,
                              clock=MonotonicClock(), host=host, port=8080)


def acquire(alloc: SqlWorkerAllocator) -> WorkerLease:
    return alloc.acquire(LeaseRequest(alloc.service, 1023, "", 0))


def stuck_at_commit(proxy: Any, fn: Callable[[], Any]) -> Call:
    """Run ``fn`` through ``proxy`` and partition it when it sends COMMIT."""
    proxy.stall_at(b"COMMIT")
    call = Call(fn)
    assert proxy.marker_hit.wait(60), "the peer never sent COMMIT"
    return call


class TestStuckAcquirer:
    def test_other_services_and_nodes_get_ids(self, split):
        """A peer partitioned inside its acquire transaction: another service's acquire
        finishes (it does not share the peer's lock), and so does one of the peer's own
        service (the server ends the stuck session); each gets an id nobody holds."""
        proxy, direct, through = split
        init_schema(direct.engine("b"), "workers")
        holder = acquire(allocator(direct, "orders", "10.0.0.1"))  # a live node: id 0
        other = allocator(through, "orders", "10.0.0.2")
        other.release(acquire(other), 0)  # the peer's connection is open and warm
        peer = stuck_at_commit(proxy, lambda: acquire(allocator(through, "orders",
                                                                "10.0.0.3")))

        payments = Call(lambda: acquire(allocator(direct, "payments", "10.0.0.4"))).join()
        assert payments.worker_id == 0  # its own service's range, untouched by the peer
        same = Call(lambda: acquire(allocator(direct, "orders", "10.0.0.5"))).join()
        assert same.worker_id not in (holder.worker_id, None)
        with direct.engine("b").connect() as conn:
            held = conn.execute(text(
                "SELECT machine_id, holder FROM system_nodes WHERE service = 'orders' "
                "AND holder IS NOT NULL")).all()
        assert sorted(r[0] for r in held) == sorted({holder.worker_id, same.worker_id})

        proxy.stop()  # the peer's partition never heals: its acquire fails, no lease
        with pytest.raises(BackendError):
            peer.join()

    def test_commit_delivered_but_unanswered(self, split):
        """The peer's COMMIT reaches the server but the answer never comes back: the peer
        gets no lease (its acquire fails), and the row it committed is not handed to a
        restart on the same host:port while it might be live."""
        proxy, direct, through = split
        init_schema(direct.engine("b"), "workers")
        warm = allocator(through, "orders", "10.0.0.9")
        warm.release(acquire(warm), 0)
        proxy.stall_at(b"COMMIT", forward=True)
        peer = Call(lambda: acquire(allocator(through, "orders", "10.0.0.1")))
        assert proxy.marker_hit.wait(60)
        restart = Call(lambda: acquire(allocator(direct, "orders", "10.0.0.1"))).join()
        with direct.engine("b").connect() as conn:
            held = dict(conn.execute(text(
                "SELECT slot, machine_id FROM system_nodes WHERE service = 'orders' AND "
                "host = '10.0.0.1' AND holder IS NOT NULL")).all())
        assert held == {0: held[0], 1: restart.worker_id}  # the peer's row, and another
        assert held[0] != restart.worker_id
        proxy.stop()
        with pytest.raises(BackendError):
            peer.join()

    def test_a_lock_held_by_another_client_is_named(self, db_url, pools):
        """A session that is not flakekit's (no idle timeout) holds the service's acquire
        lock: acquire retries for a bounded time, then fails with one line naming the
        lock, the database (password hidden) and what to do."""
        engine = create_engine(db_url)
        try:
            init_schema(engine, "workers")
            pool = pools(db_url, lock_timeout=NS)
            alloc = allocator(pool, "orders", "10.0.0.1")
            alloc.lock_retry_s = 2.5
            alloc.release(acquire(alloc), 0)  # creates the service's lock row
            with engine.connect() as other:
                if engine.dialect.name == "sqlite":
                    other.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    other.begin()
                other.execute(text("UPDATE flakekit_schema SET version = version "
                                   "WHERE component = 'workers:orders'"))
                with pytest.raises(BackendError) as info:
                    Call(lambda: acquire(alloc)).join()
                other.rollback()
            message = str(info.value)
            assert "\n" not in message
            assert "'workers:orders' of flakekit_schema" in message
            assert pool.engine("b").url.render_as_string(hide_password=True) in message
            hint = {"postgresql": "pg_terminate_backend", "sqlite": "fuser"}.get(
                engine.dialect.name, "KILL")
            assert hint in message
            assert acquire(alloc).worker_id == 0  # free again once the other client ended
        finally:
            engine.dispose()


class TestStuckSegmentFetch:
    def test_second_node_fetches_the_same_key(self, split):
        """A node partitioned between its segment UPDATE and COMMIT: a second node's fetch
        of the same key finishes (the server rolls the stuck one back) and hands out the
        range the stuck node never got; the stuck node's fetch fails."""
        proxy, direct, through = split
        second, first = SqlSegmentStore(direct.engine("b")), SqlSegmentStore(through.engine("b"))
        second.create("invoice", step=100, start=1)
        warm = first.fetch("invoice")  # the first node's connection is open and warm
        peer = stuck_at_commit(proxy, lambda: first.fetch("invoice"))

        got = Call(lambda: second.fetch("invoice")).join()
        assert (got.start, got.max_id) == (warm.max_id, warm.max_id + 100)
        assert second.fetch("invoice").start == got.max_id  # and the key keeps going

        proxy.stop()
        with pytest.raises(BackendError):
            peer.join()
