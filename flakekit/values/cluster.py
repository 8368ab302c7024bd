"""Cluster value objects: who is a member, and the versioned view every node routes by.

A :class:`View` is what the owner map is computed from. Its ``epoch`` grows strictly and
only by compare-and-set in the coordination service (SQL row, ZooKeeper znode version,
etcd revision), so two nodes that agree on the epoch agree on every key's owner.
"""

from __future__ import annotations

import attrs

__all__ = ["Member", "MemberInfo", "View"]


@attrs.frozen(order=True)
class Member:
    """One node as the view lists it.

    Attributes:
        node: stable node id from config (never ip:port: it survives a restart).
        advertise: the URL peers and clients reach the node at (``http://10.0.0.5:8080``).
        weight: relative share of keys (rendezvous replicas, a small integer >= 1).
    """

    node: str
    advertise: str = ""
    weight: int = 1


@attrs.frozen
class View:
    """The cluster's membership as agreed: ``epoch`` and its sorted ``members``.

    ``changed_at_ms`` is the store's clock (ms since the Unix epoch) when this epoch was
    written; 0 for the empty view nobody has proposed yet.
    """

    cluster: str
    epoch: int = 0
    members: tuple[Member, ...] = ()
    changed_at_ms: int = 0

    def nodes(self) -> tuple[str, ...]:
        return tuple(m.node for m in self.members)

    def member(self, node: str) -> Member | None:
        return next((m for m in self.members if m.node == node), None)


@attrs.frozen
class MemberInfo:
    """One member record as the membership store holds it (for status and proposing).

    ``state``: ``"alive"`` (lease current on the store's clock), ``"draining"`` (alive,
    asked to own no key), ``"lapsed"`` (lease ran out; the record waits to be reused) or
    ``"left"`` (released cleanly). ``expires_in_ms`` is on the store's clock (negative
    once lapsed); ``holder`` names the process incarnation holding the record;
    ``lease_ms`` is the lease the member holds (a new owner of a crashed member's keys
    waits at least that long, whatever its own lease is). ``version`` changes at every
    renewal of the record (SQL: the ``renewals`` counter; ZooKeeper and etcd: the member
    znode's or key's version); None where a renewal writes nothing to the record: a
    claimer that sees the same ``(holder, incarnation, version)`` since its first read of
    it for the share of the lease a holder serves after a renewal plus a margin
    (``lapse_wait_ns``) on its *own* monotonic clock knows the holder's deadline has
    passed, whatever the store's wall clock says.
    ``config_digest`` is the member's strict-key config as published at its join
    (:mod:`flakekit.cluster.agreement`; "" when the store keeps none).
    """

    member: Member
    state: str
    holder: str = ""
    incarnation: int = 0
    expires_in_ms: int = 0
    lease_ms: int = 0
    version: int | None = None
    config_digest: str = ""

    @property
    def fingerprint(self) -> tuple[str, int, int | None]:
        """What a renewal changes: the same fingerprint means no renewal landed."""
        return (self.holder, self.incarnation, self.version)

    @property
    def node(self) -> str:
        return self.member.node

    @property
    def serving(self) -> bool:
        """True when the member may own keys (alive and not draining)."""
        return self.state == "alive"
