"""ClusterNode: this process as a member of a cluster, serving the strict keys it owns.

What it does, and why in this order:

* **Membership** is a lease (the generic :class:`~flakekit.leases.keeper.LeaseKeeper`
  over the :class:`~flakekit.cluster.membership.Membership`): past its deadline the node
  serves no strict key, whatever else it believes (Helix #691).
* **The view** is re-read on start, whenever a renewal shows a newer epoch (the renewal
  stops the hot path *before* the keeper extends the deadline, so a node whose upkeep
  thread is stuck cannot serve on under an old view), on a ``watch_view`` hint, and at
  every renewal. A :class:`~flakekit.cluster.proposer.Proposer` moves the view to the
  serving members after ``debounce`` (compare-and-set: one proposer wins).
* **Strict keys** (:mod:`flakekit.cluster.strict`): the owner in the view claims the key
  in the fence and serves it from a generator of its own; a node that is no longer the
  owner stops, closes that generator (fenced give-back) and releases the claim; the new
  owner claims once it is released, or, when the old owner is dead or cut off, once it
  read the old owner's record unchanged since its first read of it for the share of the
  lease an owner serves after a renewal, plus a margin (issue 24), else after waiting
  ``lease + margin`` on its own clock from when it first saw itself the owner.
* **Hot path** (no I/O, no lock): draw from the key's generator, THEN check the member
  deadline and that the claim is good for the view epoch seen; otherwise the value is
  dropped and the request refused (NotOwnerError / KeyMovingError /
  ClusterUnavailableError).

Background work runs on one daemon thread (``flakekit-cluster-<node>``) plus the keeper's
renewal thread; with ``threads=False`` nothing runs on its own and a test drives
:meth:`ClusterNode.upkeep` with a manual clock.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from flakekit.cluster.agreement import config_digest, disagreement
from flakekit.cluster.fenced import FencedStore
from flakekit.cluster.member_lease import MemberEvents, MemberSource, MemberTarget
from flakekit.cluster.membership import (
    HANDOFF_MARGIN_MIN_S,
    HANDOFF_MARGIN_SHARE,
    JoinRequest,
    KeyClaim,
    KeyFence,
    LapseMeansStopped,
    MemberLease,
    Membership,
    PollsView,
    ServeShare,
    lapse_wait_ns,
)
from flakekit.cluster.proposer import Proposer
from flakekit.cluster.settings import ClusterSettings
from flakekit.cluster.strict import (
    CLAIMING,
    IDLE,
    NOT_SERVED,
    OWNED,
    RELEASING,
    Slot,
    StrictKey,
)
from flakekit.errors import (
    ClusterError,
    ClusterUnavailableError,
    ConfigError,
    FlakekitError,
    KeyMovingError,
    NotOwnerError,
    NotStartedError,
    SegmentUnavailableError,
)
from flakekit.generators.periodic import PeriodicSegment, build_key_generator
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.leases.keeper import LeaseKeeper
from flakekit.values.batch import IdBatch
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.cluster import Member, MemberInfo, View
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.owners import HASH_NAME, OwnerMap

__all__ = ["HANDOFF_MARGIN_MIN_S", "HANDOFF_MARGIN_SHARE", "ClusterNode"]

log = logging.getLogger("flakekit.cluster")

#: hand-off durations kept for stats (the newest)
_HANDOFF_HISTORY = 1000

Matcher = Callable[[str], bool]


class ClusterNode:
    """One node of a cluster: membership, view, and the strict keys it owns.

    Args:
        settings: this node's ``[cluster]`` settings.
        membership: the membership store (the node owns it: ``close()`` closes it).
        clock: deadlines and hand-off waits run on its monotonic time.
        events: where alerts go.
        threads: False runs nothing in the background (tests call :meth:`upkeep`).
    """

    def __init__(self, settings: ClusterSettings, membership: Membership,
                 clock: Clock | None = None, events: Events = NO_EVENTS, *,
                 threads: bool = True) -> None:
        self.settings = settings
        self.membership = membership
        self.clock: Clock = clock or MonotonicClock()
        self.events = events
        self.member = Member(settings.node, settings.advertise, settings.weight)
        self._threads = threads
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._upkeep_lock = threading.Lock()
        self._view = View(settings.name)
        self._owners: OwnerMap | None = None
        #: the hot path's view epoch: the applied view's, or -1 while a newer one is known
        #: to exist (a renewal saw it) and has not been applied yet
        self._view_epoch = -1
        self._lease_epoch = 0
        self._target = MemberTarget(self._revoked)
        self._keeper: LeaseKeeper[MemberLease] = LeaseKeeper(
            source=MemberSource(membership, self._lease_view),
            request=JoinRequest(settings.name, self.member, settings.lease),
            clock=self.clock, events=MemberEvents(self._hint), on_lease_lost="stop",
        )
        self._proposer = Proposer(round(settings.debounce * 1e9))
        self._keys: dict[str, StrictKey] = {}
        self._exact: dict[str, tuple[KeyFence, SegmentSettings]] = {}
        self._resolvers: list[tuple[Matcher, KeyFence, SegmentSettings]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hinted = True
        self._view_due_ns = 0
        #: the longest lease any member was seen holding (s): a crash hand-off waits it
        self._peer_lease_s = 0.0
        #: node -> (its record's fingerprint, monotonic ns this node first read it)
        self._records: dict[str, tuple[tuple[str, int, int | None], int]] = {}
        self._rejoin_due_ns = 0
        self._poll_due_ns = 0
        self._started = False
        self._closing = False
        self._lost = False
        self._counts = collections.Counter[str]()
        self._handoff_ms: collections.deque[float] = collections.deque(maxlen=_HANDOFF_HISTORY)

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> ClusterNode:
        """Join (a membership lease), read the view, propose one if this node's arrival
        changes the serving set (at once when the view is empty), start the upkeep."""
        if self._closing:
            raise NotStartedError(f"cluster node {self.member.node!r} was closed; build a new one")
        if self._started:
            return self
        with self._lock:
            digest = config_digest(self._exact)
        self._keeper.request = JoinRequest(self.settings.name, self.member, self.settings.lease,
                                           config_digest=digest)
        self._keeper.start(self._target)
        self._check_agreement(digest)
        self._started = True
        self._refresh()
        try:
            self.membership.watch_view(self.settings.name, self._hint)
        except FlakekitError as exc:   # a hint only: the renewals re-read the view anyway
            log.warning("%s: cannot watch the view (%s); renewals re-read it", self._who, exc)
        self._settle_all()
        if self._threads:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"flakekit-cluster-{self.member.node}")
            self._thread.start()
        return self

    def _check_agreement(self, digest: str) -> None:
        """Refuse (leave again, ConfigError naming the keys) when a serving member
        published other strict keys than this node's (:mod:`flakekit.cluster.agreement`).
        Nothing was claimed yet: this node leaves before it could serve anything."""
        try:
            infos = self._members()
            with self._lock:
                mine = list(self._exact)
                fences = {id(f): f for f, _ in self._exact.values()}
            claimed = {r.key for f in fences.values() for r in f.key_owners()
                       if r.node != self.member.node}
        except FlakekitError as exc:   # the renewals and proposals will fail loudly too
            log.warning("%s: cannot compare the strict keys with the members (%s)",
                        self._who, exc)
            return
        line = disagreement(self.settings.name, self.member.node, digest, infos, mine,
                            claimed)
        if line is not None:
            self._keeper.close()   # leave: the record says ``left`` (this node served nothing)
            raise ConfigError("", line)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, give back and release every claim (fenced: a deposed owner changes
        nothing), leave the cluster, close the membership. Bounded by ``timeout``."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for st in self._keys.values():
                self._stop_serving_locked(st)
                st.owner_since = None
            self._cond.notify_all()
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        until = time.monotonic() + min(timeout, 2.0)
        with self._lock:   # a caller's claim in flight: let it finish (it ends releasing)
            while any(st.busy for st in self._keys.values()) and time.monotonic() < until:
                self._cond.wait(0.05)
        for st in list(self._keys.values()):
            st.retry_now()
            self._settle(st)
        try:
            self.membership.watch_view(self.settings.name, None)
        except FlakekitError:
            pass
        self._keeper.close()
        try:
            self.membership.close()
        except Exception as exc:  # noqa: BLE001 - a plugin's close: log it, go on closing
            log.warning("%s: closing the membership: %s", self._who, exc)

    def __enter__(self) -> ClusterNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- strict keys ------------------------------------------------------------------------
    def add_strict(self, key: str | Matcher, fence: KeyFence,
                   settings: SegmentSettings | None = None) -> None:
        """Serve ``key`` (a ``biz_tag``) in strict order through ``fence``; or, given a
        function ``key -> bool``, every key it accepts (all keys of a strict segment
        generator). An exact key is claimed in the background as soon as this node owns
        it; a matched one on its first request."""
        settings = settings or SegmentSettings()
        if isinstance(key, str):
            with self._lock:
                self._exact[key] = (fence, settings)
            st = self._state(key)
            if st is not None and self._started and self._threads:
                self._wake.set()
        elif callable(key):
            with self._lock:
                self._resolvers.append((key, fence, settings))
        else:
            raise TypeError(f"add_strict: key must be a str or a function of the key, got {key!r}")

    def is_strict(self, key: str) -> bool:
        """Whether requests for ``key`` go through the cluster (an owner, in order)."""
        return key in self._keys or self._spec(key) is not None

    def owner(self, key: str) -> Member:
        """The owner of ``key`` in the view this node has applied."""
        owners = self._owners
        if owners is None or not owners.view.members:
            raise ClusterUnavailableError(self._no_view_message(), retry_after=1.0)
        return owners.owner(key)

    def next_id(self, key: str) -> tuple[int, int]:
        """The next ID of strict ``key`` and the owner epoch it was served under.

        Raises:
            NotOwnerError: another node owns the key (``.owner``, ``.epoch``).
            KeyMovingError: the key is being handed to this node and did not settle
                within ``handoff_wait``.
            ClusterUnavailableError: this node's membership lease has run out.
            ClusterError: ``key`` is not a strict key here.
        """
        st = self._keys.get(key)
        if st is not None:
            slot = st.slot
            if slot is not None and slot.gen is not None:
                try:
                    value = slot.gen.next_id()
                except (NotStartedError, SegmentUnavailableError):
                    if st.slot is slot and st.ok_epoch == self._view_epoch:
                        raise
                else:   # the draw first, then the checks (a value drawn late is dropped)
                    if (self.clock.monotonic_ns() < self._target.deadline_ns
                            and st.ok_epoch == self._view_epoch and st.slot is slot):
                        return value, slot.claim.epoch
        return self._slow(key, None)  # type: ignore[return-value]

    def next_ids(self, key: str, n: int) -> tuple[IdBatch, int]:
        """``n`` IDs of strict ``key`` and the owner epoch; refusals as :meth:`next_id`
        (IDs drawn before a failed check are dropped, never reissued)."""
        st = self._keys.get(key)
        if st is not None:
            slot = st.slot
            if slot is not None and slot.gen is not None:
                try:
                    batch = slot.gen.next_ids(n)
                except (NotStartedError, SegmentUnavailableError):
                    if st.slot is slot and st.ok_epoch == self._view_epoch:
                        raise
                else:
                    if (self.clock.monotonic_ns() < self._target.deadline_ns
                            and st.ok_epoch == self._view_epoch and st.slot is slot):
                        return batch, slot.claim.epoch
        return self._slow(key, n)  # type: ignore[return-value]

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
        except (NotStartedError, SegmentUnavailableError):
            return None
        if got is not None and (self.clock.monotonic_ns() < self._target.deadline_ns
                                and st.ok_epoch == self._view_epoch and st.slot is slot):
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
            raise ClusterError(f"key {key!r} is not a strict key of cluster node "
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
                    raise NotOwnerError(
                        f"strict key {key!r} is owned by node {owner.node!r} in view epoch "
                        f"{self._view.epoch} ({owner.advertise or 'no advertise URL'})",
                        owner=owner, epoch=self._view.epoch)
                if st.serving(self._view_epoch):
                    slot = st.slot
                act = slot is None and self._actionable_locked(st, now)
            if slot is not None and slot.gen is not None:
                try:
                    value: int | IdBatch = slot.gen.next_id() if n is None else slot.gen.next_ids(n)
                except (NotStartedError, SegmentUnavailableError):
                    if st.slot is slot and st.ok_epoch == self._view_epoch:
                        raise
                else:
                    if (self.clock.monotonic_ns() < self._target.deadline_ns
                            and st.ok_epoch == self._view_epoch and st.slot is slot):
                        return value, slot.claim.epoch
                continue
            if act:
                self._settle(st)
                continue
            remaining = give_up - time.monotonic()
            with self._lock:
                if remaining <= 0:
                    self._counts["refused_moving"] += 1
                    raise KeyMovingError(self._moving_message(st),
                                         retry_after=self._retry_after(st))
                poll = st.retry_delay_ns / 1e9 if st.retry_delay_ns else 0.05
                self._cond.wait(min(remaining, max(poll, 0.005)))

    # -- drain, status, stats ---------------------------------------------------------------
    def drain(self, node: str | None = None) -> View:
        """Planned hand-off of every key of ``node`` (default: this one): mark it
        draining and propose a view without it at once. Returns the view afterwards
        (unchanged when ``node`` is the last serving member: nobody could take over)."""
        node = node or self.member.node
        if not self.membership.set_draining(self.settings.name, node, True):
            raise ClusterError(f"cluster {self.settings.name!r} has no member {node!r} to drain")
        view = self._view
        for _ in range(5):
            view = self.membership.view(self.settings.name)
            infos = self._members()
            wanted = self._proposer.wanted(infos, view, self.clock.monotonic_ns(), at_once=True)
            if wanted is None:
                break
            new = self.membership.propose(self.settings.name, view.epoch, wanted)
            self._proposer.outcome(new is not None)
            if new is not None:
                view = new
                break
        with self._lock:
            self._apply_view_locked(view, self.clock.monotonic_ns())
        self._hint()
        return view

    def status(self) -> dict[str, Any]:
        """What ``GET /api/v1/cluster`` shows."""
        try:
            infos = {i.node: i.state for i in self._members()}
        except FlakekitError:
            infos = {}
        with self._lock:
            view, owners = self._view, self._owners
            keys = sorted(set(self._keys) | set(self._exact))
            claims = {k: {"epoch": st.slot.claim.epoch if st.slot else None, "state": st.state}
                      for k, st in sorted(self._keys.items())}
        remaining = self._keeper.remaining_s()
        return {
            "cluster": self.settings.name,
            "node": self.member.node,
            "epoch": view.epoch,
            "hash": HASH_NAME,
            "members": [{"node": m.node, "advertise": m.advertise, "weight": m.weight,
                         "state": infos.get(m.node, "unknown")} for m in view.members],
            "owners": ({k: owners.owner(k).node for k in keys}
                       if owners is not None and view.members else {}),
            "claims": claims,
            "lease": {"remaining_s": remaining},
        }

    def stats(self) -> dict[str, Any]:
        """Counters: hand-offs to this node (and how long each took, ms, newest last),
        refusals by kind, proposals made and lost."""
        with self._lock:
            return {
                "handoffs": self._counts["handoffs"],
                "handoff_ms": list(self._handoff_ms),
                "refused_not_owner": self._counts["refused_not_owner"],
                "refused_moving": self._counts["refused_moving"],
                "refused_unavailable": self._counts["refused_unavailable"],
                "releases": self._counts["releases"],
                "proposals": self._proposer.proposals,
                "proposals_lost": self._proposer.lost,
                "forwards": 0,
            }

    # -- upkeep -----------------------------------------------------------------------------
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
        try:
            view = self.membership.view(self.settings.name)
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
            for st in self._keys.values():
                self._stop_serving_locked(st)
                st.owner_since = None
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

    # -- the view ---------------------------------------------------------------------------
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

    def _restreak_locked(self, st: StrictKey, owners: OwnerMap, consecutive: bool,
                         now: int) -> None:
        mine = bool(owners.view.members) and owners.owner(st.key).node == self.member.node
        if not mine or self._closing or self._lost:
            st.owner_since = None
        elif st.owner_since is None or not consecutive:
            st.owner_since, st.since_ns = owners.view.epoch, now
            st.retry_now()

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

    # -- claims and releases ----------------------------------------------------------------
    def _spec(self, key: str) -> tuple[KeyFence, SegmentSettings] | None:
        spec = self._exact.get(key)
        if spec is not None:
            return spec
        for match, fence, settings in self._resolvers:
            if match(key):
                return fence, settings
        return None

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

    def _members(self) -> list[MemberInfo]:
        """The membership's records; remembers the longest lease among them, so a node
        with a shorter lease never takes a crashed longer-leased owner's key early."""
        infos = self.membership.members(self.settings.name)
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
        (:func:`~flakekit.cluster.membership.lapse_wait_ns`). None: no such proof here."""
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

    def _wait_ns(self) -> int:
        lease = max(self.settings.lease, self._peer_lease_s)
        held = self._keeper.lease
        if held is not None:
            lease = max(lease, held.ttl)
        return lapse_wait_ns(lease)

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

    def _stop_serving_locked(self, st: StrictKey) -> None:
        st.ok_epoch = NOT_SERVED   # never the -1 of a node whose view is not applied yet
        if st.state == OWNED:
            st.state = RELEASING
            st.retry_now()

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
            for st in self._keys.values():
                self._stop_serving_locked(st)
                st.owner_since = None
            self._cond.notify_all()
        self._wake.set()

    # -- messages ---------------------------------------------------------------------------
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
