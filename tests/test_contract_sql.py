"""The contract suites against the ``sql`` allocator and segment store on real
PostgreSQL, MariaDB and SQLite (flakekit.testing's AllocatorContract, SegmentStoreContract)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import AllocatorContract, SegmentStoreContract, age_rows
from flakekit.testing.contract_clock import OnManualClock
from flakekit.testing.engines import threaded_engine
from flakekit.values.events import Events

NS = 1_000_000_000
TIERS_NS = (60 * NS,)


@pytest.fixture
def engine(db_url) -> Iterator[Engine]:
    made = threaded_engine(db_url)
    yield made
    assert made.pool.checkedout() == 0, made.pool.status()
    made.dispose()


class TestSqlAllocatorContract(OnManualClock, AllocatorContract):
    """Every allocator made here is another node (its own host) of service "contract";
    they share one ManualClock that moves with the database when rows are aged."""

    @pytest.fixture
    def make_allocator(self, engine, clock, closing):
        hosts = itertools.count(1)
        return lambda: closing(SqlWorkerAllocator(
            engine=engine, service="contract", clock=clock, host=f"10.0.0.{next(hosts)}",
            port=8080, tiers_ns=TIERS_NS, create_schema=True, events=Events(None)))

    @pytest.fixture
    def expire(self, engine, clock):
        def expire(lease: Any) -> None:
            """The holder went silent past the reclaim tier (database and node time)."""
            clock.advance(TIERS_NS[-1] / NS + 1)
            age_rows(engine, TIERS_NS[-1] / NS + 1, "machine_id = :m", m=lease.worker_id)

        return expire


class TestSqlSegmentStoreContract(SegmentStoreContract):
    @pytest.fixture
    def make_store(self, engine):
        def make(keys: dict[str, int]) -> SqlSegmentStore:
            store = SqlSegmentStore(engine)
            for key, step in keys.items():
                store.create(key, step)
            return store

        return make
