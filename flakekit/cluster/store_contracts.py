"""The contracts of cluster mode's two stores: membership (who is in the cluster, the
versioned view) and the key fence (who owns a strict key, checked where IDs are made).

Membership can live in SQL, ZooKeeper or etcd (plugins register more with
``flakekit_register_memberships``); the fence always lives beside the segments it guards
(the SQL store's ``flakekit_key_owner`` table), so every segment fetch checks owner and
epoch in the same transaction that advances ``max_id``.

A :class:`Membership` is a :class:`~flakekit.leases.lease.LeaseSource` of
:class:`MemberLease`: the generic :class:`~flakekit.leases.keeper.LeaseKeeper` keeps a
node's membership exactly as it keeps a worker id (deadline from the send time of the
last good renewal; nothing served past it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from flakekit.leases.lease import LeaseSource
from flakekit.values.allocation import Allocation
from flakekit.values.cluster import Member, MemberInfo, View

__all__ = [
    "MAX_WEIGHT",
    "JoinRequest",
    "KeyClaim",
    "KeyFence",
    "KeyOwnerRecord",
    "LapseMeansStopped",
    "MemberLease",
    "Membership",
    "PollsView",
    "ReadsViewAndMembers",
    "ServeShare",
    "check_key_segment",
    "lapse_wait_ns",
    "proposed_members",
]

#: the largest weight a member may have (its rendezvous replicas; see cluster-routing.md)
MAX_WEIGHT = 64
#: a crash hand-off waits ``lease + max(HANDOFF_MARGIN_MIN_S, HANDOFF_MARGIN_SHARE *
#: lease)`` on the waiter's own clock (clock-rate drift between nodes, with room to spare)
HANDOFF_MARGIN_MIN_S = 0.25
HANDOFF_MARGIN_SHARE = 0.1


def lapse_wait_ns(lease_s: float, share: float = 1.0) -> int:
    """How long (monotonic ns, on the waiter's own clock) a record must stay unchanged,
    or a new owner wait, before the holder of a ``lease_s`` lease has surely stopped.

    ``share``: the holder serves at most ``share * lease_s`` after the send of the
    renewal that wrote what the waiter first read (SQL: 0.8, its safety window being at
    least a fifth of the lease). That send came before the write's COMMIT, hence before
    the waiter's first read of it: the waiter's wait, counted from that read, covers the
    holder's deadline plus the margin for clock-rate drift between the two nodes."""
    served = lease_s * share
    return round((served + max(HANDOFF_MARGIN_MIN_S, HANDOFF_MARGIN_SHARE * served)) * 1e9)


@attrs.frozen
class JoinRequest:
    """What a node asks the membership for: to be ``member`` of ``cluster``, with a lease
    of ``lease_s`` seconds (the store may grant a different TTL; the lease says which).
    ``config_digest`` is published in the member's record (see
    :mod:`flakekit.cluster.agreement`)."""

    cluster: str
    member: Member
    lease_s: float = 10.0
    config_digest: str = ""

    @property
    def owner(self) -> str:  # the keeper's name for messages
        return f"cluster {self.cluster} node {self.member.node}"


@attrs.frozen
class MemberLease:
    """This process's membership.

    Attributes:
        member: the node as it joined.
        cluster: the cluster it joined (``JoinRequest.cluster``).
        holder: the process incarnation that holds the record (a random token): a second
            process started with the same node id cannot renew it.
        epoch: fencing token of this incarnation (grows every time the record changes
            hands: SQL row counter, znode czxid, etcd create revision).
        view_epoch: the view epoch read by the acquire or renewal that made this lease (a
            renewal re-reads it, so a member whose watch died still learns of a change
            within a third of the lease).
        ttl: the lease the store granted, seconds.
        deadline_ns: monotonic ns after which this node serves no strict key.
        claim_after_ns: monotonic ns before which this node claims no key (a join that
            took its record from a holder that did not leave: that process may still
            serve this node's claims from memory until then).
    """

    member: Member
    holder: str
    epoch: int
    view_epoch: int
    ttl: float
    deadline_ns: int | None
    stamp_until_ns: int | None = None
    not_before_ns: int = 0
    claim_after_ns: int = 0
    #: the cluster joined: renew and release get only the lease, so it must say which
    #: record it is (a store serving several clusters cannot tell otherwise)
    cluster: str = ""

    @property
    def subject(self) -> str:
        return f"member {self.member.node}"


def check_key_segment(field: str, value: object) -> str:
    """``value`` if it can be one segment of a ZooKeeper path or an etcd key (a node or a
    cluster name there); ValueError naming ``field`` otherwise."""
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{field} must be a non-empty string without '/', got {value!r}")
    return value


def proposed_members(members: Sequence[Member],
                     check_node: Callable[[str, object], object]) -> list[Member]:
    """The members of a proposed view as every membership stores them: sorted by node,
    each node once, weights from 1 to ``MAX_WEIGHT``; ``check_node("node", node)`` vets
    a node id the way this store can hold it. ValueError names the first bad entry."""
    ordered = sorted(members, key=lambda m: m.node)
    nodes = [m.node for m in ordered]
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"a view lists each node once, got {nodes}")
    for m in ordered:
        check_node("node", m.node)
        if isinstance(m.weight, bool) or not isinstance(m.weight, int) \
                or not 1 <= m.weight <= MAX_WEIGHT:
            raise ValueError(f"member {m.node!r}: weight must be an integer from 1 to "
                             f"{MAX_WEIGHT}, got {m.weight!r}")
    return ordered


@runtime_checkable
class Membership(LeaseSource[JoinRequest, MemberLease], Protocol):
    """A node lease per member and one versioned view per cluster.

    Lease-source half (used by the keeper): ``renew_interval`` (≤ lease/3), ``acquire``
    (join; raises :class:`~flakekit.errors.BackendError` naming the live holder when
    another live process holds this node id, one line), ``renew(lease, mark)`` (raises
    :class:`~flakekit.errors.LeaseLostError` when the record is gone or has another
    holder; re-reads the view epoch into the new lease), ``release(lease, mark)`` (leave;
    fenced by holder and epoch), ``close()``.

    View half: ``members()`` lists every record with its state on the store's clock;
    ``view()`` reads the current view; ``propose(seen_epoch, members)`` writes
    ``seen_epoch + 1`` with ``members`` only if the stored epoch is still ``seen_epoch``
    (compare-and-set) and returns the new view, else None (someone else moved it first);
    ``set_draining(node, draining)`` marks a member as asked to own no key (planned
    hand-off; the next proposal leaves it out of the view); ``watch_view(callback)`` calls
    ``callback()`` on a hint that the view may have changed (optional to honour: safety
    comes from the renewal re-reading the epoch); ``where`` names the store for messages.

    A record ``"left"`` proves its holder stopped (only the holder writes it, after it
    stopped serving). Optional capability :class:`LapseMeansStopped` (default False): True
    when a record the store shows ``"lapsed"`` proves its holder's own deadline has passed
    *without any wall clock* (ZooKeeper: the leader expires a session on its elapsed-time
    clock only its timeout after the last packet, and the holder stops before that). SQL
    leaves it False: ``last_seen + lease_ms`` is on the database's wall clock, which an
    NTP step or a VM resume moves by any amount. etcd leaves it False: its leases can
    vanish early under a stuck leader. In every store a lapse is also proven by the
    claimer seeing the record's ``version`` unchanged since its first read of it for
    ``lapse_wait_ns(lease, serve_share)`` on its own clock, as every renewal writes the
    record and then reads the view epoch *after* that write. Optional capability
    :class:`ServeShare` (default 1.0): a holder serves at most that share of its lease after
    the send of the renewal that wrote its record's current ``version`` (SQL, ZooKeeper,
    etcd: 0.8). Optional capability :class:`PollsView`: nodes read the view and the members
    that often, so a renewal is first read soon after its write.
    """

    @property
    def where(self) -> str: ...

    def members(self, cluster: str) -> list[MemberInfo]: ...
    def view(self, cluster: str) -> View: ...
    def propose(self, cluster: str, seen_epoch: int, members: Sequence[Member]) -> View | None: ...
    def set_draining(self, cluster: str, node: str, draining: bool) -> bool: ...
    def watch_view(self, cluster: str, callback: Callable[[], None] | None) -> None: ...


@runtime_checkable
class LapseMeansStopped(Protocol):
    """A membership that declares whether a record its store shows ``"lapsed"`` proves,
    without any wall clock, that its holder has stopped (see :class:`Membership`):
    ZooKeeper True; SQL and etcd False (a membership without it counts as False)."""

    lapse_means_stopped: bool


@runtime_checkable
class ServeShare(Protocol):
    """A membership whose holders serve at most ``serve_share`` of their lease after the
    send of the renewal that wrote their record (see :class:`Membership`); a claimer
    counts on it (a membership without it counts as 1.0)."""

    serve_share: float


@runtime_checkable
class PollsView(Protocol):
    """A membership whose store cannot notify a view change (SQL): nodes ask for the view
    epoch every ``view_poll_s`` seconds, so a planned hand-off moves in about that time."""

    view_poll_s: float


@runtime_checkable
class ReadsViewAndMembers(Protocol):
    """A :class:`PollsView` membership that reads the view and the member records in one
    round (``view_and_members(cluster) -> (View, [MemberInfo])``): what a node polls. A
    membership without it is asked ``view`` and ``members`` one after the other."""

    def view_and_members(self, cluster: str) -> tuple[View, list[MemberInfo]]: ...


@attrs.frozen
class KeyClaim:
    """A node's claim on a strict key: the fence every fetch and give-back carries."""

    key: str
    node: str
    epoch: int   # the view epoch the claim was made under


@attrs.frozen
class KeyOwnerRecord:
    """One row of the key-owner table (for status and drills)."""

    key: str
    node: str
    epoch: int
    released: bool
    claimed_at_ms: int = 0


@runtime_checkable
class KeyFence(Protocol):
    """Key ownership, fenced where the IDs are made (the SQL segment store implements it:
    its ``fetch``/``give_back`` take an optional ``claim``).

    ``claim_key(claim, waited)``: take the key for ``claim.node`` at ``claim.epoch``;
    succeeds only if the stored epoch is lower and the row is released, or already this
    node's, or ``waited`` is True (the caller waited out the old owner's lease plus a
    margin since it saw this epoch); a missing row is created. Returns False when a claim
    at an equal or newer epoch of another node holds it, or the row is not released and
    ``waited`` is False. ``release_key(claim)``: fenced write (node and epoch in the
    WHERE); False if not ours any more. ``fetch(key, step, claim=...)``: the segment
    fetch, checking the claim in the same transaction that advances ``max_id``; raises
    :class:`~flakekit.errors.FenceError` when the claim is no longer the row's.
    ``give_back(key, expected_max_id, new_max_id, claim=...)`` is fenced the same way
    (returns False instead of raising). ``key_owners()`` lists the table;
    ``key_owner(key)`` reads one row (None: never claimed); ``where`` names the store
    for messages.
    """

    def claim_key(self, claim: KeyClaim, waited: bool) -> bool: ...
    def release_key(self, claim: KeyClaim) -> bool: ...
    @property
    def where(self) -> str: ...

    def fetch(self, key: str, step: int | None = None,
              claim: KeyClaim | None = None) -> Allocation: ...
    def give_back(self, key: str, expected_max_id: int, new_max_id: int,
                  claim: KeyClaim | None = None) -> bool: ...
    def key_owners(self) -> list[KeyOwnerRecord]: ...
    def key_owner(self, key: str) -> KeyOwnerRecord | None: ...
