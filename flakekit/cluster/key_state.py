"""StrictKey: one strict key's claim and generator on this node.

States: ``idle`` (no claim) → ``claiming`` (a claim_key call in flight) → ``owned``
(claimed; a :class:`~flakekit.generators.segment.SegmentGenerator` of its own, whose every
fetch carries the claim) → ``releasing`` (not served any more; the generator is closed
with a fenced give-back, then the claim is released) → ``idle``.

Every claim gets a NEW generator, never one that served before (tidb #52600: a node that
lost and regained a key must not count on through its old segments). A claim made at
epoch ``E`` stays good across later views only while this node saw itself as the key's
owner in every epoch from ``E`` on: ``owner_since`` is the first epoch of that unbroken
run (None when the latest view gives the key to another node), ``since_ns`` when this
node first saw it (the start of the crash hand-off wait).
"""

from __future__ import annotations

import attrs

from flakekit.cluster.store_contracts import KeyClaim, KeyFence
from flakekit.generators.periodic import PeriodicSegment
from flakekit.generators.segment import SegmentGenerator, SegmentSettings

__all__ = ["NOT_SERVED", "Slot", "StrictKey"]

IDLE, CLAIMING, OWNED, RELEASING = "idle", "claiming", "owned", "releasing"


@attrs.frozen(eq=False)
class Slot:
    """A claim and the generator made for it: replaced as one (the hot path reads it once)."""

    claim: KeyClaim
    gen: SegmentGenerator | PeriodicSegment | None


#: ``StrictKey.ok_epoch`` of a key not served. Never -1, the node's view epoch while a
#: newer view than the applied one is known (not yet applied): a stopped key must never
#: equal that, or the hot path's ``ok_epoch == view_epoch`` would serve it under a claim
#: that another node may already have taken over.
NOT_SERVED = -2


@attrs.define(eq=False)
class StrictKey:
    """Mutable state of one key, guarded by the node's lock (the hot path only reads
    ``slot`` and ``ok_epoch``, each a single attribute read)."""

    key: str
    fence: KeyFence
    settings: SegmentSettings
    state: str = IDLE
    slot: Slot | None = None
    #: the view epoch up to which the claim is known good; the key is served only while it
    #: equals the node's view epoch (:data:`NOT_SERVED`: not served)
    ok_epoch: int = -2
    owner_since: int | None = None
    since_ns: int = 0
    #: one actor (claim or release) at a time; the others wait on the node's condition
    busy: bool = False
    next_try_ns: int = 0
    retry_delay_ns: int = 0
    #: when this node started waiting to serve the key (for handoff_ms)
    wanted_since_ns: int | None = None

    def serving(self, view_epoch: int) -> bool:
        return self.state == OWNED and self.ok_epoch == view_epoch and self.slot is not None

    def backoff(self, now_ns: int, first_ns: int = 20_000_000, max_ns: int = 500_000_000) -> None:
        """Try again later (claims while the old owner has not released, failed writes)."""
        self.retry_delay_ns = min(max(first_ns, self.retry_delay_ns * 2), max_ns)
        self.next_try_ns = now_ns + self.retry_delay_ns

    def retry_now(self) -> None:
        self.retry_delay_ns = 0
        self.next_try_ns = 0
