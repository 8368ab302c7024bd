"""The in-memory fakes (flakekit.testing.memory_cluster, memory_kv) bound to the same
contract suites as the real stores: a fake that lies about a promise fails here, before
the unit tests that lean on it can pass for the wrong reason."""

from __future__ import annotations

import itertools

import pytest

from flakekit.leases.kv import KvLeaseAllocator
from flakekit.testing import AllocatorContract, MembershipContract
from flakekit.testing.contract_clock import OnManualClock
from flakekit.testing.memory_cluster import MemoryClusterStore
from flakekit.testing.memory_kv import MemoryKv
from flakekit.values.events import Events

S = 1_000_000_000


class TestMemoryMembershipContract(OnManualClock, MembershipContract):
    """MemoryClusterStore's membership adapters, one client name per ``make_membership``,
    on a ManualClock (``pass_time`` moves it; ``expire`` lapses the record)."""

    watch_calls_back = True

    @pytest.fixture(params=[False, True], ids=["unversioned", "versioned"])
    def store(self, clock, request) -> MemoryClusterStore:
        """Both kinds of record: without a renewal counter and with one (``versioned``,
        as the real stores report)."""
        return MemoryClusterStore(clock, renew_interval=self.lease_s / 4,
                                  versioned=request.param)

    @pytest.fixture
    def make_membership(self, store, closing):
        names = itertools.count()
        return lambda: closing(store.membership(f"p{next(names)}"))

    @pytest.fixture
    def expire(self, store):
        return lambda cluster, lease: store.expire(cluster, lease.member.node)


@pytest.mark.parametrize("style", ["zookeeper", "etcd"])
class TestMemoryKvAllocatorContract(OnManualClock, AllocatorContract):
    """KvLeaseAllocator on MemoryKv (both key-value styles), one session per allocator,
    on a ManualClock; ``expire`` ends the holder's session as the server would."""

    ttl_ms = 2000

    @pytest.fixture
    def server(self, clock, style) -> MemoryKv:
        return MemoryKv(clock, style=style)

    @pytest.fixture
    def make_allocator(self, server, clock, closing):
        def make() -> KvLeaseAllocator:
            return closing(KvLeaseAllocator(
                store=server.client(self.ttl_ms), base="/flakekit/t", clock=clock,
                events=Events(), safety_window_ns=S // 2, quarantine_ns=0,
                connect_timeout_ns=5 * S, generator="t"))
        return make

    @pytest.fixture
    def pass_time(self, clock, server):
        def pass_time(seconds: float) -> None:
            clock.advance(seconds)
            server.expire_due()
        return pass_time
