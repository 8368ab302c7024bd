"""LeaseKeeper: close() never waits for a re-acquire stuck in the network (issue 10, 1).

The ZooKeeper allocator's re-acquire once hung in ``KazooClient.start()`` while holding
the keeper's lock, so ``close()`` (SIGTERM) hung too. The keeper now holds its lock only
to install a lease; a lease won after close() is given back at once.
"""

from __future__ import annotations

import threading

import attrs
import pytest

from flakekit.builtin.layouts import SNOWFLAKE
from flakekit.errors import LeaseError, NotStartedError
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.testing import ManualClock


@attrs.define
class StuckAllocator:
    """The first acquire succeeds; later ones block until ``unblock`` is set (a network
    call that does not return), then succeed."""

    clock: ManualClock
    renew_interval: float | None = 3600.0
    unblock: threading.Event = attrs.Factory(threading.Event)
    entered: threading.Event = attrs.Factory(threading.Event)
    acquired: int = 0
    released: list[int] = attrs.Factory(list)
    closed: int = 0
    pushed: object = None

    def acquire(self, request: LeaseRequest) -> WorkerLease:
        self.acquired += 1
        if self.acquired > 1:
            self.entered.set()
            self.unblock.wait(30)
        return WorkerLease(self.acquired, self.acquired, "t", 1.0,
                           self.clock.monotonic_ns() + 10**12)

    def watch(self, callback) -> None:
        self.pushed = callback

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        return lease

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        self.released.append(lease.worker_id)

    def records(self):
        return []

    def close(self) -> None:
        self.closed += 1


def test_close_returns_while_a_reacquire_is_stuck():
    """Lease lost, on_lease_lost="restart": the re-acquire blocks in the allocator;
    close() returns anyway, and the lease the re-acquire wins later is given back, never
    used."""
    clock = ManualClock()
    alloc = StuckAllocator(clock)
    gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc, on_lease_lost="restart").start()
    gen.next_id()
    alloc.pushed("lost", "session expired")
    assert alloc.entered.wait(10), "the re-acquire never started"
    closer = threading.Thread(target=gen.close, daemon=True)
    closer.start()
    closer.join(10)
    stuck = closer.is_alive()
    alloc.unblock.set()            # the network call returns: a lease after close()
    closer.join(10)
    assert not stuck, "close() waited for the stuck re-acquire"
    for _ in range(1000):
        if 2 in alloc.released:
            break
        threading.Event().wait(0.01)
    assert alloc.released == [2]   # the late lease went back at once
    with pytest.raises((LeaseError, NotStartedError)):   # no ID after close()
        gen.next_id()
