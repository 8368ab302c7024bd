"""Hand-off of strict keys: claim a key once this node owns it in the view (at once when
the old owner released it or is proven stopped, else after ``lease + margin``), release
it (fenced give-back) once it does not, and drop it when the fence or the membership
says it is gone.
"""

from __future__ import annotations

import functools
import logging

import attrs

from flakekit.cluster.fenced import FencedStore
from flakekit.cluster.key_state import (
    CLAIMING,
    IDLE,
    NOT_SERVED,
    OWNED,
    RELEASING,
    Slot,
    StrictKey,
)
from flakekit.cluster.node_state import NodeState
from flakekit.cluster.store_contracts import (
    KeyClaim,
    KeyFence,
    LapseMeansStopped,
    ServeShare,
    lapse_wait_ns,
)
from flakekit.errors import FlakekitError
from flakekit.generators.periodic import PeriodicSegment, build_key_generator
from flakekit.generators.segment import SegmentGenerator
from flakekit.values.cluster import MemberInfo
from flakekit.values.owners import OwnerMap

__all__ = ["Handoff"]

log = logging.getLogger("flakekit.cluster")


class Handoff(NodeState):
    """Claims and releases of a :class:`~flakekit.cluster.node.ClusterNode`'s strict keys."""

    def _state(self, key: str) -> StrictKey | None:
        st = self._keys.get(key)
        if st is not None:
            return st
        spec = self._spec(key)
        if spec is None:
            return None
        with self._lock:
            st = self._keys.get(key)
            if st is None:
                now = self.clock.monotonic_ns()
                st = StrictKey(key, spec[0], spec[1], wanted_since_ns=now)
                if self._owners is not None:
                    self._restreak_locked(st, self._owners, False, now)
                self._keys[key] = st
            return st

    def _restreak_locked(self, st: StrictKey, owners: OwnerMap, consecutive: bool,
                         now: int) -> None:
        mine = bool(owners.view.members) and owners.owner(st.key).node == self.member.node
        if not mine or self._closing or self._lost:
            st.owner_since = None
        elif st.owner_since is None or not consecutive:
            st.owner_since, st.since_ns = owners.view.epoch, now
            st.retry_now()

    def _members(self) -> list[MemberInfo]:
        """The membership's records (:meth:`_noted`)."""
        return self._noted(self.membership.members(self.settings.name))

    def _noted(self, infos: list[MemberInfo]) -> list[MemberInfo]:
        """``infos``, just read: remembers the longest lease among them, so a node with a
        shorter lease never takes a crashed longer-leased owner's key early, and when each
        record was first read as it is."""
        seen = self.clock.monotonic_ns()   # after the read: every renewal it shows was sent before
        longest = max((i.lease_ms for i in infos), default=0) / 1000
        with self._lock:
            if longest > self._peer_lease_s:
                self._peer_lease_s = longest
            for i in infos:
                old = self._records.get(i.node)
                if old is None or old[0] != i.fingerprint:
                    self._records[i.node] = (i.fingerprint, seen)
        return infos

    def _first_read_ns(self, info: MemberInfo) -> int | None:
        """When this node first read ``info``'s record as it is now (its own clock,
        after that read returned); None for a store whose renewals write nothing to the
        record, or a record read differently since."""
        if info.version is None:
            return None
        with self._lock:
            old = self._records.get(info.node)
        if old is None or old[0] != info.fingerprint:
            return None
        return old[1]

    def _stopped_after_ns(self, info: MemberInfo) -> int | None:
        """The monotonic ns (this node's clock) from which ``info``'s holder has surely
        stopped if its record stays as it is: its first read plus the share of the lease
        a holder serves after the renewal that wrote it, plus a margin
        (:func:`~flakekit.cluster.store_contracts.lapse_wait_ns`). None: no such proof here."""
        first = self._first_read_ns(info)
        if first is None:
            return None
        lease_s = max(self._peer_lease_s, info.lease_ms / 1000, self.settings.lease)
        share = self._serve_share()
        return first + lapse_wait_ns(lease_s, share)

    def _serve_share(self) -> float:
        """The share of its lease a holder serves after its renewal's send (1.0 when the
        membership does not say: :class:`ServeShare`)."""
        return (float(self.membership.serve_share)
                if isinstance(self.membership, ServeShare) else 1.0)

    def _judged(self, infos: list[MemberInfo]) -> list[MemberInfo]:
        """``infos`` as the proposer weighs them: a serving record that no renewal
        changed for the share of the lease its holder serves (on this node's clock) is
        ``lapsed``, before the store's own clock says so, so the view moves while the
        claim's proof is still running (detection overlaps the wait; liveness only:
        the claim still proves the lapse)."""
        share = self._serve_share()
        now = self.clock.monotonic_ns()
        out = []
        for info in infos:
            first = self._first_read_ns(info) if info.serving else None
            if first is not None and info.node != self.member.node:
                lease_s = max(info.lease_ms / 1000, self.settings.lease)
                if now - first >= round(lease_s * share * 1e9):
                    info = attrs.evolve(info, state="lapsed")
            out.append(info)
        return out

    def _actionable_locked(self, st: StrictKey, now: int) -> bool:
        if st.busy or now < st.next_try_ns:
            return False
        if st.state == RELEASING:
            return True
        return (st.state == IDLE and st.owner_since is not None and not self._closing
                and not self._lost and self._view_epoch >= 0
                and self._target.claim_after_ns <= now < self._target.deadline_ns)

    def _settle_all(self) -> None:
        now = self.clock.monotonic_ns()
        with self._lock:
            due = [st for st in self._keys.values() if self._actionable_locked(st, now)]
        for st in due:
            self._settle(st)

    def _settle(self, st: StrictKey) -> None:
        """Claim or release ``st`` if that is due (store calls without the lock)."""
        now = self.clock.monotonic_ns()
        with self._lock:
            if not self._actionable_locked(st, now):
                return
            st.busy = True
            if st.state == RELEASING:
                slot = st.slot
                claim = None
            else:
                slot = None
                epoch = self._view.epoch
                waited = now - st.since_ns >= self._wait_ns()
                claim = KeyClaim(st.key, self.member.node, epoch)
                st.state = CLAIMING
        try:
            if claim is None:
                self._release(st, slot)
            else:
                self._claim(st, claim, waited, now)
        finally:
            with self._lock:
                st.busy = False
                self._cond.notify_all()

    def _holder_stopped_at(self, fence: KeyFence, key: str) -> int | None:
        """From when (monotonic ns, this node's clock; at or before now: already) the
        key's current holder, another node, has surely stopped, so the new owner need
        not wait ``lease + margin`` from when it became the owner; None when nothing
        proves it. Proofs: its record ``left`` (only the holder writes that, after it
        stopped); it shows ``lapsed`` in a store where that proves the holder's deadline
        passed without a wall clock (``lapse_means_stopped``: ZooKeeper); or this node
        read the record unchanged (no renewal landed) since its first read of it for the
        share of the lease a holder serves after that renewal's send, plus a margin
        (:meth:`_stopped_after_ns`). Never a store's wall-clock age alone: a database
        clock stepped forward makes every member look lapsed (issue 20). A renewal that
        lands after this check re-reads the view epoch after its COMMIT, so the holder
        sees the new view and serves nothing under its old claim."""
        record = fence.key_owner(key)
        if record is None or record.released or record.node == self.member.node:
            return None   # a plain claim takes it (or it is ours)
        info = next((i for i in self._members() if i.node == record.node), None)
        if info is None:
            return None
        if info.state == "left":
            return 0
        if info.state == "lapsed" and isinstance(self.membership, LapseMeansStopped) \
                and self.membership.lapse_means_stopped:
            return 0
        return self._stopped_after_ns(info)

    def _claim(self, st: StrictKey, claim: KeyClaim, waited: bool, now: int) -> None:
        gen: SegmentGenerator | PeriodicSegment | None = None
        store = FencedStore(st.fence, claim, functools.partial(self._fenced, st))
        ok = False
        stopped_at: int | None = None
        try:
            if not waited:
                stopped_at = self._holder_stopped_at(st.fence, st.key)
                if stopped_at is not None and stopped_at <= self.clock.monotonic_ns():
                    waited = True   # the crashed owner has surely stopped
            ok = bool(st.fence.claim_key(claim, waited))
            if ok:
                gen = build_key_generator(store, st.key, st.settings, clock=self.clock,
                                          events=self.events, name=st.key)
                gen.start()   # a fresh segment: never memory from an earlier claim
        except FlakekitError as exc:
            log.warning("%s: claiming strict key %r at epoch %d failed: %s",
                        self._who, st.key, claim.epoch, exc)
            if gen is not None:
                gen.close(timeout=1.0)
                gen = None
        done = self.clock.monotonic_ns()
        handoff_ns: int | None = None
        with self._lock:
            if ok:
                st.slot = Slot(claim, gen)
                if (gen is not None and not store.fenced and not self._closing
                        and not self._lost and st.owner_since is not None
                        and st.owner_since <= claim.epoch):
                    st.state, st.ok_epoch = OWNED, self._view.epoch
                    st.retry_now()
                    self._counts["handoffs"] += 1
                    began = max(st.since_ns, st.wanted_since_ns or st.since_ns)
                    self._handoff_ms.append(max(0, done - began) / 1e6)
                    handoff_ns = max(0, done - began)
                    log.info("%s: serving strict key %r (claim epoch %d%s)", self._who,
                             st.key, claim.epoch,
                             ", after waiting out the old owner" if waited else "")
                else:   # the view moved on meanwhile, or the claim is useless: undo it
                    st.state, st.ok_epoch = RELEASING, NOT_SERVED
            else:
                st.state = IDLE
                st.backoff(done)
                if not waited and st.owner_since is not None:
                    # try exactly when the old owner must have stopped, not later
                    due = st.since_ns + self._wait_ns()
                    if stopped_at is not None:
                        due = min(due, stopped_at)
                    st.next_try_ns = min(st.next_try_ns, due)
        if handoff_ns is not None:   # outside the lock: a plugin's hook may take its time
            self.events.operation("cluster.handoff", st.key, handoff_ns, {
                "key": st.key, "node": self.member.node, "claim_epoch": claim.epoch,
                "waited": waited}, None)

    def _release(self, st: StrictKey, slot: Slot | None) -> None:
        ok = True
        if slot is not None:
            if slot.gen is not None:
                slot.gen.close(timeout=1.0)   # fenced give-back of the unused tail
            try:
                st.fence.release_key(slot.claim)
            except FlakekitError as exc:
                ok = False
                log.warning("%s: releasing strict key %r failed (%s); retrying (the next "
                            "owner waits out this node's lease meanwhile)", self._who, st.key, exc)
        with self._lock:
            if ok:
                st.slot, st.state = None, IDLE
                st.retry_now()
                self._counts["releases"] += 1
            else:
                st.backoff(self.clock.monotonic_ns())

    def _fenced(self, st: StrictKey, claim: KeyClaim) -> None:
        """A fetch found the claim gone: stop serving the key now."""
        with self._lock:
            if st.slot is not None and st.slot.claim == claim:
                log.error("%s: strict key %r: claim at epoch %d was taken over; dropping it",
                          self._who, st.key, claim.epoch)
                self._stop_serving_locked(st)
        self._wake.set()

    def _revoked(self, reason: str) -> None:
        """The keeper lost the membership (the deadline is already gone)."""
        with self._lock:
            self._lost = True
            self._give_up_all_locked()
        self._wake.set()
