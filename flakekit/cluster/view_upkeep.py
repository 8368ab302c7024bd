"""The view and the upkeep: the view is re-read on start, when a renewal shows a newer
epoch, on a ``watch_view`` hint, by polling where the store has no notification, and at
every renewal; a :class:`~flakekit.cluster.proposer.Proposer` moves it to the serving
members. One round of this is :meth:`ViewUpkeep.upkeep`.
"""

from __future__ import annotations

import logging

from flakekit.cluster.handoff import Handoff
from flakekit.cluster.key_state import IDLE, OWNED, RELEASING
from flakekit.cluster.store_contracts import PollsView, ReadsViewAndMembers
from flakekit.errors import FlakekitError
from flakekit.values.cluster import View
from flakekit.values.owners import OwnerMap

__all__ = ["ViewUpkeep"]

log = logging.getLogger("flakekit.cluster")


class ViewUpkeep(Handoff):
    """The view and the background rounds of a :class:`~flakekit.cluster.node.ClusterNode`."""

    def upkeep(self) -> None:
        """One round of background work: renew (when the membership has no renewal
        thread), rejoin after a lost lease, re-read the view and propose, claim and
        release keys. The upkeep thread calls it; tests with a manual clock call it."""
        if not self._started:
            return
        with self._upkeep_lock:
            if self._closing:
                return
            if self.membership.renew_interval is None:
                self._keeper.renew_once()
            now = self.clock.monotonic_ns()
            if (self._lost or self._keeper.lost is not None) and now >= self._rejoin_due_ns:
                self._rejoin()
            self._poll_view(now)
            # a difference the proposer is debouncing falls due on its own: re-read and
            # propose then, not only at the next renewal (which may be lease/3 later)
            pending = self._proposer.due_in_ns(now)
            if self._hinted or now >= self._view_due_ns or (pending is not None
                                                            and pending <= 0):
                self._refresh()
            self._settle_all()

    def _poll_view(self, now: int) -> None:
        """A store without change notification (``view_poll_s``: SQL) is asked for the
        view epoch and the member records that often: a planned hand-off moves in about
        that time, not at the next renewal (up to a third of the lease; issue 20); and
        every renewal is first read within that time of its COMMIT, so a crashed
        holder's lapse is proven that soon after its holder's deadline (issue 24). A
        newer epoch stops the hot path at once, as a renewal that read it does; a
        member the view lists that no longer serves (lapsed, left, or no renewal for
        its serving share of the lease) brings the proposer in at once."""
        poll = self.membership.view_poll_s if isinstance(self.membership, PollsView) else 0
        if not poll or now < self._poll_due_ns:
            return
        self._poll_due_ns = now + round(poll * 1e9)
        name = self.settings.name
        try:
            if isinstance(self.membership, ReadsViewAndMembers):   # one round (SQL)
                view, read = self.membership.view_and_members(name)
                infos = self._judged(self._noted(read))
            else:
                view = self.membership.view(name)
                infos = self._judged(self._members())
        except FlakekitError:
            return   # the renewal and the refresh report the store's trouble
        self._lease_view(view.epoch)
        serving = {i.member for i in infos if i.serving}
        if serving and serving != set(view.members):
            self._hinted = True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.upkeep()
            except Exception:  # the upkeep must outlive any one failure
                log.exception("%s: upkeep failed", self._who)

    def _next_wait(self) -> float:
        now = self.clock.monotonic_ns()
        due = [self._view_due_ns - now]
        if isinstance(self.membership, PollsView) and self.membership.view_poll_s:
            due.append(self._poll_due_ns - now)
        pending = self._proposer.due_in_ns(now)
        if pending is not None:
            due.append(pending)
        with self._lock:
            can_claim = self._view_epoch >= 0 and now < self._target.deadline_ns
            for st in self._keys.values():
                if st.state == RELEASING:
                    due.append(st.next_try_ns - now)
                elif can_claim and st.state == IDLE and st.owner_since is not None:
                    due.append(max(st.next_try_ns, self._target.claim_after_ns) - now)
        return min(max(min(due) / 1e9, 0.005), 5.0)

    def _refresh(self) -> None:
        """Re-read the view (and the members), propose when they differ."""
        self._hinted = False
        now = self.clock.monotonic_ns()
        interval = self.membership.renew_interval or self.settings.lease / 3
        self._view_due_ns = now + round(interval * 1e9)
        name = self.settings.name
        try:
            view = self.membership.view(name)
            with self._lock:
                self._apply_view_locked(view, now)
            infos = self._judged(self._members())
            wanted = self._proposer.wanted(infos, view, now, at_once=not view.members)
            if wanted is not None:
                new = self.membership.propose(name, view.epoch, wanted)
                self._proposer.outcome(new is not None)
                if new is None:   # another node moved it first: that view is as good
                    new = self.membership.view(name)
                else:
                    log.info("%s: proposed view epoch %d: %s", self._who, new.epoch,
                             ", ".join(new.nodes()))
                with self._lock:
                    self._apply_view_locked(new, self.clock.monotonic_ns())
        except FlakekitError as exc:
            log.warning("%s: reading the view failed (%s); serving until the member "
                        "deadline at the latest", self._who, exc)

    def _rejoin(self) -> None:
        """After the membership was lost: drop every claim (fenced), join again."""
        with self._lock:
            self._give_up_all_locked()
        self._settle_all()
        self._keeper.close(release=False)
        try:
            self._keeper.start(self._target)
        except FlakekitError as exc:
            self._rejoin_due_ns = self.clock.monotonic_ns() + 500_000_000
            log.warning("%s: rejoining failed (%s); retrying", self._who, exc)
            return
        with self._lock:
            self._lost = False
            self._apply_view_locked(self._view, self.clock.monotonic_ns(), restreak=True)
        self._hinted = True
        self._refresh()

    def _lease_view(self, epoch: int) -> None:
        """A lease (acquired or renewed) read view ``epoch``; runs before the keeper
        extends the deadline: a newer epoch stops the hot path until it is applied."""
        with self._lock:
            if epoch > self._lease_epoch:
                self._lease_epoch = epoch
            if epoch > self._view.epoch:
                self._view_epoch = -1
                self._hinted = True
        if epoch > self._view.epoch:
            self._wake.set()

    def _hint(self) -> None:
        self._hinted = True
        self._wake.set()

    def _apply_view_locked(self, view: View, now: int, *, restreak: bool = False) -> None:
        prev = self._view
        if view.epoch > prev.epoch or self._owners is None or restreak:
            if view.epoch < prev.epoch:
                view = prev
            consecutive = (not restreak and self._owners is not None
                           and view.epoch == prev.epoch + 1)
            owners = OwnerMap(view)
            self._view, self._owners = view, owners
            for st in self._keys.values():
                self._restreak_locked(st, owners, consecutive, now)
                if st.state == OWNED:
                    assert st.slot is not None
                    if st.owner_since is not None and st.owner_since <= st.slot.claim.epoch:
                        st.ok_epoch = view.epoch
                    else:
                        self._stop_serving_locked(st)
            self._cond.notify_all()
        if self._view.epoch >= self._lease_epoch:
            self._view_epoch = self._view.epoch
        else:
            self._view_epoch = -1
