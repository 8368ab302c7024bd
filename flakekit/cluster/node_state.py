"""What the parts of a :class:`~flakekit.cluster.node.ClusterNode` share: its state and
the checks and messages every part makes.

The parts, one concern a module: :mod:`~flakekit.cluster.serving` (the hot path and
the wait for a hand-off), :mod:`~flakekit.cluster.handoff` (claims and releases of
strict keys, and the proofs that an old owner has stopped),
:mod:`~flakekit.cluster.view_upkeep` (the view: re-read, proposed, applied; the upkeep
loop) and :mod:`~flakekit.cluster.node` (life cycle, strict keys, drain, status).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

from flakekit.cluster.key_state import IDLE, NOT_SERVED, OWNED, RELEASING, StrictKey
from flakekit.cluster.member_lease import MemberTarget
from flakekit.cluster.proposer import Proposer
from flakekit.cluster.settings import ClusterSettings
from flakekit.cluster.store_contracts import KeyFence, MemberLease, Membership, lapse_wait_ns
from flakekit.errors import ClusterUnavailableError
from flakekit.generators.segment import SegmentSettings
from flakekit.leases.keeper import LeaseKeeper
from flakekit.values.clock import Clock
from flakekit.values.cluster import Member, View
from flakekit.values.events import Events
from flakekit.values.owners import OwnerMap

__all__ = ["Matcher", "NodeState"]

log = logging.getLogger("flakekit.cluster")

Matcher = Callable[[str], bool]


class NodeState:
    """The state of one :class:`~flakekit.cluster.node.ClusterNode` (set by its
    ``__init__``; declared here for the reader and the type checker), and the helpers
    every part of it calls: the member and owner checks made under the lock, and the
    messages of its refusals."""

    settings: ClusterSettings
    membership: Membership
    clock: Clock
    events: Events
    member: Member
    _threads: bool
    #: guards everything below that a request or the upkeep changes; ``_cond`` on it
    #: wakes requests waiting for a hand-off
    _lock: threading.Lock
    _cond: threading.Condition
    _upkeep_lock: threading.Lock
    _view: View
    _owners: OwnerMap | None
    #: the hot path's view epoch: the applied view's, or -1 while a newer one is known
    #: to exist (a renewal saw it) and has not been applied yet
    _view_epoch: int
    _lease_epoch: int
    _target: MemberTarget
    _keeper: LeaseKeeper[MemberLease]
    _proposer: Proposer
    _keys: dict[str, StrictKey]
    _exact: dict[str, tuple[KeyFence, SegmentSettings]]
    _resolvers: list[tuple[Matcher, KeyFence, SegmentSettings]]
    _wake: threading.Event
    _stop: threading.Event
    _thread: threading.Thread | None
    _hinted: bool
    _view_due_ns: int
    #: the longest lease any member was seen holding (s): a crash hand-off waits it
    _peer_lease_s: float
    #: node -> (its record's fingerprint, monotonic ns this node first read it)
    _records: dict[str, tuple[tuple[str, int, int | None], int]]
    _rejoin_due_ns: int
    _poll_due_ns: int
    _started: bool
    _closing: bool
    _lost: bool
    _counts: collections.Counter[str]
    _handoff_ms: collections.deque[float]

    def _wait_ns(self) -> int:
        lease = max(self.settings.lease, self._peer_lease_s)
        held = self._keeper.lease
        if held is not None:
            lease = max(lease, held.ttl)
        return lapse_wait_ns(lease)

    def _owner_locked(self, key: str) -> Member:
        owners = self._owners
        if owners is None or not owners.view.members:
            self._counts["refused_unavailable"] += 1
            raise ClusterUnavailableError(self._no_view_message(), retry_after=1.0)
        return owners.owner(key)

    def _check_member_locked(self, now: int) -> None:
        if now >= self._target.deadline_ns:
            self._counts["refused_unavailable"] += 1
            reason = self._target.revoked or "it could not renew it in time"
            raise ClusterUnavailableError(
                f"cluster node {self.member.node!r} serves no strict key: its membership "
                f"lease in {self.membership.where} ran out ({reason}); it resumes once it "
                "renews (check that the membership store is up and reachable)",
                retry_after=max(1.0, (self.membership.renew_interval or 1.0)))

    def _give_up_all_locked(self) -> None:
        """Stop serving every key and forget when this node became its owner (closing,
        the membership lost); requests waiting for a hand-off look again."""
        for st in self._keys.values():
            self._stop_serving_locked(st)
            st.owner_since = None
        self._cond.notify_all()

    def _stop_serving_locked(self, st: StrictKey) -> None:
        st.ok_epoch = NOT_SERVED   # never the -1 of a node whose view is not applied yet
        if st.state == OWNED:
            st.state = RELEASING
            st.retry_now()

    def _spec(self, key: str) -> tuple[KeyFence, SegmentSettings] | None:
        spec = self._exact.get(key)
        if spec is not None:
            return spec
        for match, fence, settings in self._resolvers:
            if match(key):
                return fence, settings
        return None

    @property
    def _who(self) -> str:
        return f"cluster {self.settings.name} node {self.member.node}"

    def _no_view_message(self) -> str:
        return (f"cluster {self.settings.name!r} has no members in its view yet (epoch "
                f"{self._view.epoch}); wait for a node to join")

    def _retry_after(self, st: StrictKey) -> float:
        now = self.clock.monotonic_ns()
        if st.owner_since is not None and st.state == IDLE:
            left = (st.since_ns + self._wait_ns() - now) / 1e9
            return max(0.1, min(left, self.settings.lease * 2))
        return 0.1

    def _moving_message(self, st: StrictKey) -> str:
        return (f"strict key {st.key!r} is moving to node {self.member.node!r} (view epoch "
                f"{self._view.epoch}, {st.state}) and did not settle within handoff_wait "
                f"({self.settings.handoff_wait:g}s); retry shortly")
