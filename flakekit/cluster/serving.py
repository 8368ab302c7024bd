"""The hot path of strict keys (no I/O, no lock): draw from the key's generator, THEN
check the member deadline and that the claim is good for the view epoch seen; otherwise
the value is dropped and the request waits for the hand-off or is refused
(NotOwnerError / KeyMovingError / ClusterUnavailableError).
"""

from __future__ import annotations

import logging
import time

from flakekit import errors
from flakekit.cluster.handoff import Handoff
from flakekit.cluster.key_state import Slot, StrictKey
from flakekit.values.batch import IdBatch
from flakekit.values.cluster import Member

__all__ = ["Serving"]

log = logging.getLogger("flakekit.cluster")


class Serving(Handoff):
    """The IDs of a :class:`~flakekit.cluster.node.ClusterNode`'s strict keys."""

    def next_id(self, key: str) -> tuple[int, int]:
        """The next ID of strict ``key`` and the owner epoch it was served under.

        Raises:
            NotOwnerError: another node owns the key (``.owner``, ``.epoch``).
            KeyMovingError: the key is being handed to this node and did not settle
                within ``handoff_wait``.
            ClusterUnavailableError: this node's membership lease has run out.
            ClusterError: ``key`` is not a strict key here.
        """
        return self._serve(key, None)  # type: ignore[return-value]

    def next_ids(self, key: str, n: int) -> tuple[IdBatch, int]:
        """``n`` IDs of strict ``key`` and the owner epoch; refusals as :meth:`next_id`
        (IDs drawn before a failed check are dropped, never reissued)."""
        return self._serve(key, n)  # type: ignore[return-value]

    def _serve(self, key: str, n: int | None) -> tuple[int | IdBatch, int]:
        """One ID (``n`` None) or ``n`` of ``key``: from the slot this node serves, else
        :meth:`_slow` (refuse, claim inline, or wait for the hand-off)."""
        st = self._keys.get(key)
        if st is not None:
            slot = st.slot
            if slot is not None and slot.gen is not None:
                got = self._draw(st, slot, n)
                if got is not None:
                    return got
        return self._slow(key, n)

    def _good(self, st: StrictKey, slot: Slot) -> bool:
        """Whether what was just drawn from ``slot`` may be issued: the member deadline
        has not passed, the claim is good for the view epoch seen, the slot unchanged."""
        return (self.clock.monotonic_ns() < self._target.deadline_ns
                and st.ok_epoch == self._view_epoch and st.slot is slot)

    def _draw(self, st: StrictKey, slot: Slot, n: int | None) -> tuple[int | IdBatch, int] | None:
        """Draw from ``slot`` (it has a generator), THEN check (:meth:`_good`): the value
        and the claim's epoch, or None when it is dropped (or the draw failed because the
        slot is going away: the caller looks again)."""
        assert slot.gen is not None
        try:
            value: int | IdBatch = slot.gen.next_id() if n is None else slot.gen.next_ids(n)
        except (errors.NotStartedError, errors.SegmentUnavailableError):
            if st.slot is slot and st.ok_epoch == self._view_epoch:
                raise
            return None
        return (value, slot.claim.epoch) if self._good(st, slot) else None

    def try_next_id(self, key: str) -> tuple[int, int] | None:
        """:meth:`next_id` from memory, for an event loop: ``None`` instead of waiting or
        refusing (the key's buffers are empty, it is moving, another node owns it, the
        membership ran out): the caller then calls :meth:`next_id` where it may wait.

        The same checks as :meth:`next_id`, after the draw: a value drawn when the member
        deadline has passed, the view moved or the slot changed is dropped, never issued.
        """
        return self._from_memory(key, None)  # type: ignore[return-value]

    def try_next_ids(self, key: str, n: int) -> tuple[IdBatch, int] | None:
        """:meth:`next_ids` from memory, as :meth:`try_next_id` (``None``: call
        :meth:`next_ids` where it may wait; a batch drawn before a failed check is dropped)."""
        return self._from_memory(key, n)  # type: ignore[return-value]

    def _from_memory(self, key: str, n: int | None) -> tuple[int | IdBatch, int] | None:
        st = self._keys.get(key)
        if st is None:
            return None
        slot = st.slot
        if slot is None or slot.gen is None:
            return None
        try:
            got = slot.gen.try_next_id() if n is None else slot.gen.try_next_ids(n)
        except (errors.NotStartedError, errors.SegmentUnavailableError):
            return None
        if got is not None and self._good(st, slot):
            return got, slot.claim.epoch
        return None

    def other_owner(self, key: str) -> tuple[Member, int] | None:
        """Another node's claim to ``key`` as the applied view says, read without a lock:
        ``(owner, view epoch)`` while this node's membership is valid and its view is the
        newest it knows of; ``None`` when this node owns the key or cannot tell without
        :meth:`next_id` (which then refuses, waits or serves). For forwarding: the owner
        checks its own claim on every ID it serves."""
        owners = self._owners
        if (owners is None or not owners.view.members or self._view_epoch != owners.epoch
                or self.clock.monotonic_ns() >= self._target.deadline_ns):
            return None
        owner = owners.owner(key)
        if owner.node == self.member.node:
            return None
        return owner, owners.epoch

    def _slow(self, key: str, n: int | None) -> tuple[int | IdBatch, int]:
        """Not served from memory: refuse, claim inline, or wait for the hand-off."""
        st = self._state(key)
        if st is None:
            raise errors.ClusterError(f"key {key!r} is not a strict key of cluster node "
                                      f"{self.member.node!r} (is_strict() first)")
        give_up = time.monotonic() + self.settings.handoff_wait
        while True:
            now = self.clock.monotonic_ns()
            slot: Slot | None = None
            with self._lock:
                self._check_member_locked(now)
                owner = self._owner_locked(key)
                if owner.node != self.member.node:
                    self._counts["refused_not_owner"] += 1
                    raise errors.NotOwnerError(
                        f"strict key {key!r} is owned by node {owner.node!r} in view epoch "
                        f"{self._view.epoch} ({owner.advertise or 'no advertise URL'})",
                        owner=owner, epoch=self._view.epoch)
                if st.serving(self._view_epoch):
                    slot = st.slot
                act = slot is None and self._actionable_locked(st, now)
            if slot is not None and slot.gen is not None:
                got = self._draw(st, slot, n)
                if got is not None:
                    return got
                continue
            if act:
                self._settle(st)
                continue
            remaining = give_up - time.monotonic()
            with self._lock:
                if remaining <= 0:
                    self._counts["refused_moving"] += 1
                    raise errors.KeyMovingError(self._moving_message(st),
                                                retry_after=self._retry_after(st))
                poll = st.retry_delay_ns / 1e9 if st.retry_delay_ns else 0.05
                self._cond.wait(min(remaining, max(poll, 0.005)))
