"""The node's membership as a lease: the adapters that put a :class:`Membership` under
the generic :class:`~flakekit.leases.keeper.LeaseKeeper`.

* :class:`MemberSource` is the keeper's lease source. It does not close the membership
  (the node owns it: the same object serves the view half), and it reports the view epoch
  of every lease it hands over *before* the keeper extends the deadline, so a renewal that
  reveals a newer view stops the hot path before it could serve another minute under the
  old one.
* :class:`MemberTarget` holds the deadline the hot path compares against.
* :class:`MemberEvents` logs lease changes and tells the node about them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flakekit.cluster.store_contracts import JoinRequest, MemberLease, Membership

__all__ = ["MemberEvents", "MemberSource", "MemberTarget"]

log = logging.getLogger("flakekit.cluster")

#: below every monotonic reading: nothing is served
NEVER = -(2**63)
#: a lease without a deadline (a store that never expires members)
FOREVER = 2**63 - 1


class MemberSource:
    """``membership`` as the keeper's lease source; ``seen(view_epoch)`` is called with
    the view epoch of each lease acquired or renewed, before the keeper installs it."""

    def __init__(self, membership: Membership, seen: Callable[[int], None]) -> None:
        self.membership, self.seen = membership, seen

    @property
    def renew_interval(self) -> float | None:
        return self.membership.renew_interval

    def acquire(self, request: JoinRequest) -> MemberLease:
        lease = self.membership.acquire(request)
        self.seen(lease.view_epoch)
        return lease

    def renew(self, lease: MemberLease, mark: int) -> MemberLease:
        new = self.membership.renew(lease, mark)
        self.seen(new.view_epoch)
        return new

    def release(self, lease: MemberLease, mark: int) -> None:
        self.membership.release(lease, mark)

    def close(self) -> None:
        """Nothing: the node closes the membership when it closes."""


class MemberTarget:
    """The member deadline (monotonic ns) the hot path reads: a plain int attribute."""

    def __init__(self, on_revoke: Callable[[str], None]) -> None:
        self.deadline_ns = NEVER
        self.lease: MemberLease | None = None
        self.revoked: str | None = None
        #: no claim before this (monotonic ns; see MemberLease.claim_after_ns)
        self.claim_after_ns = 0
        self._on_revoke = on_revoke

    def bind(self, lease: MemberLease) -> None:
        self.lease = lease
        self.revoked = None
        self.claim_after_ns = lease.claim_after_ns
        self.deadline_ns = FOREVER if lease.deadline_ns is None else lease.deadline_ns

    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None:
        if self.revoked is None and deadline_ns is not None:
            self.deadline_ns = deadline_ns

    def revoke(self, reason: str) -> None:
        self.deadline_ns = NEVER   # first: nothing served from here on
        self.revoked = reason
        self._on_revoke(reason)

    def issued_until_ns(self) -> int:
        return 0   # a membership persists no progress mark


class MemberEvents:
    """Lease events of the membership: logged; ``changed()`` wakes the node."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self.changed = changed

    def lease_acquired(self, generator: str, lease: MemberLease) -> None:
        log.info("%s: joined (incarnation %d, view epoch %d, lease %.1fs)",
                 generator, lease.epoch, lease.view_epoch, lease.ttl)
        self.changed()

    def lease_renewed(self, generator: str, lease: MemberLease) -> None:
        self.changed()

    def lease_lost(self, generator: str, lease: MemberLease, reason: str) -> None:
        log.error("%s: lost its membership: %s", generator, reason)
        self.changed()
