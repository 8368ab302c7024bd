"""ClusterNode: this process as a member of a cluster, serving the strict keys it owns.

What it does, and why in this order:

* **Membership** is a lease (the generic :class:`~flakekit.leases.keeper.LeaseKeeper`
  over the :class:`~flakekit.cluster.store_contracts.Membership`): past its deadline the node
  serves no strict key, whatever else it believes (Helix #691).
* **The view** is re-read on start, whenever a renewal shows a newer epoch (the renewal
  stops the hot path *before* the keeper extends the deadline, so a node whose upkeep
  thread is stuck cannot serve on under an old view), on a ``watch_view`` hint, and at
  every renewal. A :class:`~flakekit.cluster.proposer.Proposer` moves the view to the
  serving members after ``debounce`` (compare-and-set: one proposer wins).
* **Strict keys** (:mod:`flakekit.cluster.key_state`): the owner in the view claims the key
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
import logging
import threading
import time
from typing import Any

from flakekit.cluster.agreement import config_digest, disagreement
from flakekit.cluster.key_state import StrictKey
from flakekit.cluster.member_lease import MemberEvents, MemberSource, MemberTarget
from flakekit.cluster.node_state import Matcher
from flakekit.cluster.proposer import Proposer
from flakekit.cluster.serving import Serving
from flakekit.cluster.settings import ClusterSettings
from flakekit.cluster.store_contracts import (
    HANDOFF_MARGIN_MIN_S,
    HANDOFF_MARGIN_SHARE,
    JoinRequest,
    KeyFence,
    MemberLease,
    Membership,
)
from flakekit.cluster.view_upkeep import ViewUpkeep
from flakekit.errors import (
    ClusterError,
    ClusterUnavailableError,
    ConfigError,
    FlakekitError,
    NotStartedError,
)
from flakekit.generators.segment import SegmentSettings
from flakekit.leases.keeper import LeaseKeeper
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.cluster import Member, View
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.lifecycle import StartsInWith, started_daemon
from flakekit.values.owners import HASH_NAME, OwnerMap

__all__ = ["HANDOFF_MARGIN_MIN_S", "HANDOFF_MARGIN_SHARE", "ClusterNode"]

log = logging.getLogger("flakekit.cluster")

#: hand-off durations kept for stats (the newest)
_HANDOFF_HISTORY = 1000


class ClusterNode(Serving, ViewUpkeep, StartsInWith):
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
            self._thread = started_daemon(self._run, f"flakekit-cluster-{self.member.node}")
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
            self._give_up_all_locked()
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
