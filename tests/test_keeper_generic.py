"""One lease machine: LeaseKeeper keeps a lease that is not a worker id (here cluster
mode's node membership, :class:`MemberLease`) with the same renewal, loss, restart and
close rules.
"""

from __future__ import annotations

import threading
import time

import attrs

from flakekit.cluster.store_contracts import MemberLease
from flakekit.errors import BackendError, LeaseLostError
from flakekit.leases.keeper import LeaseKeeper
from flakekit.testing import ManualClock
from flakekit.values.cluster import Member


@attrs.frozen
class Join:
    owner: str
    node: str


@attrs.define
class Members:
    """A membership registry: one lease per node, epochs grow per grant."""

    clock: ManualClock
    ttl_ns: int = 9 * 10**9
    renew_interval: float | None = 3600.0
    epoch: int = 0
    fail: type[Exception] | None = None
    released: list[tuple[str, int, int]] = attrs.Factory(list)
    pushed: object = None
    #: set: renew() waits for it, then answers "lost" (a reply that arrives late)
    gate: threading.Event | None = None
    entered: threading.Event = attrs.Factory(threading.Event)

    def acquire(self, request: Join) -> MemberLease:
        self.epoch += 1
        return MemberLease(Member(request.node, ""), request.owner, self.epoch, 0,
                           self.ttl_ns / 1e9, self.clock.monotonic_ns() + self.ttl_ns)

    def renew(self, lease: MemberLease, mark: int) -> MemberLease:
        sent = self.clock.monotonic_ns()
        if self.gate is not None:
            self.entered.set()
            self.gate.wait(10)
            raise LeaseLostError(f"epoch {lease.epoch} is gone")
        if self.fail is not None:
            raise self.fail("membership store says no")
        return attrs.evolve(lease, deadline_ns=sent + self.ttl_ns)

    def release(self, lease: MemberLease, mark: int) -> None:
        self.released.append((lease.member.node, lease.epoch, mark))

    def watch(self, callback) -> None:
        self.pushed = callback

    def close(self) -> None:
        pass


@attrs.define
class Serving:
    """The target: serves while the deadline lasts."""

    bound: list[MemberLease] = attrs.Factory(list)
    deadline: int | None = None
    revoked: list[str] = attrs.Factory(list)
    progress: int = 42

    def bind(self, lease: MemberLease) -> None:
        self.bound.append(lease)
        self.deadline = lease.deadline_ns

    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None:
        self.deadline = deadline_ns

    def revoke(self, reason: str) -> None:
        self.revoked.append(reason)
        self.deadline = -1

    def issued_until_ns(self) -> int:
        return self.progress


@attrs.define
class Log:
    seen: list[tuple[str, str]] = attrs.Factory(list)

    def lease_acquired(self, owner: str, lease: MemberLease) -> None:
        self.seen.append(("acquired", lease.subject))

    def lease_renewed(self, owner: str, lease: MemberLease) -> None:
        self.seen.append(("renewed", lease.subject))

    def lease_lost(self, owner: str, lease: MemberLease, reason: str) -> None:
        self.seen.append(("lost", reason))


def keeper(clock: ManualClock, on_lost: str = "stop") -> tuple[LeaseKeeper, Members, Log]:
    src, log = Members(clock), Log()
    return LeaseKeeper(src, Join("cluster-a", "n1"), clock, log, on_lost), src, log


def started(on_lost: str = "stop") -> tuple[ManualClock, LeaseKeeper, Members, Log, Serving,
                                            MemberLease]:
    """A :func:`keeper` on a fresh manual clock, started on a new target: (clock, keeper,
    source, log, target, the first lease)."""
    clock = ManualClock()
    k, src, log = keeper(clock, on_lost)
    target = Serving()
    return clock, k, src, log, target, k.start(target)


def test_renewal_extends_from_the_send_time_and_failures_keep_the_deadline():
    clock, k, src, log, target, lease = started()
    assert target.bound == [lease] and log.seen == [("acquired", "member n1")]
    clock.advance(3)
    assert k.renew_once()
    assert target.deadline == clock.monotonic_ns() + src.ttl_ns
    before = target.deadline
    src.fail = BackendError
    clock.advance(3)
    assert not k.renew_once() and k.renew_failures == 1
    assert target.deadline == before and k.lost is None   # cannot tell: keep the deadline
    k.close()
    assert src.released == [("n1", 1, 42)] and target.revoked == ["closed"]


def test_loss_revokes_and_restart_takes_a_new_lease():
    _, k, src, log, target, _ = started(on_lost="restart")
    src.fail = LeaseLostError
    assert not k.renew_once()
    assert target.revoked and "says no" in target.revoked[0]
    assert ("lost", "membership store says no") in log.seen
    src.fail = None
    deadline = time.monotonic() + 10
    while (k.lease is None or k.lease.epoch != 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert k.lease is not None and k.lease.epoch == 2 and k.lost is None
    assert target.bound[-1].epoch == 2
    k.close()


def test_pushed_loss_revokes_at_once():
    _, k, src, _, target, _ = started()
    assert callable(src.pushed)          # the optional push channel was found by its type
    src.pushed("lost", "session ended")
    assert target.revoked == ["session ended"] and k.lost == "session ended"
    k.close()
    assert src.released == []            # a lost lease is never "released" over a successor


def test_a_stale_renewal_never_revokes_a_newer_lease():
    _, k, src, _, target, old = started()
    src.gate = gate = threading.Event()
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(k.renew_once()))
    t.start()
    assert src.entered.wait(10)
    k.lease = attrs.evolve(old, epoch=7)   # re-acquired meanwhile
    gate.set()
    t.join(10)
    assert result == [False] and target.revoked == [] and k.lost is None
    k.close(release=False)


def test_allocator_is_the_source():
    """The worker-id path calls the source ``allocator``; both names are one attribute."""
    clock = ManualClock()
    k, src, _ = keeper(clock)
    other = Members(clock)
    k.allocator = other
    assert k.source is other and k.allocator is other
