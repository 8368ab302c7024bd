"""An in-memory cluster store on an injected clock: membership, the key fence and the
segment rows, modelled on what the SQL store does, for unit and property tests of the
ownership logic (real-service drills use SQL or ZooKeeper).

:class:`MemoryClusterStore` is the server; :meth:`~MemoryClusterStore.membership` and
:meth:`~MemoryClusterStore.fence` give one process's adapters (a :class:`Membership` and
a :class:`KeyFence`). What is modelled: member leases that expire on the store's clock
(``last_seen + lease``, like ``last_seen`` on the database clock), a renewal that reads
the view epoch, the view changed only by compare-and-set, claims and releases fenced by
node and epoch, segment fetches and give-backs checked against the claim in one step.
:meth:`~MemoryClusterStore.cut` cuts one process off (each of its calls raises
:class:`~flakekit.errors.BackendError`) while the others carry on.

``renew_interval=None`` (the default) starts no renewal thread anywhere: a test drives
each node with :meth:`ClusterNode.upkeep() <flakekit.cluster.node.ClusterNode.upkeep>`
and a manual clock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.cluster.store_contracts import (
    JoinRequest,
    KeyClaim,
    KeyOwnerRecord,
    MemberLease,
    check_key_segment,
    proposed_members,
)
from flakekit.errors import BackendError, FenceError, LeaseLostError, UnknownKeyError
from flakekit.values.allocation import Allocation
from flakekit.values.cluster import Member, MemberInfo, View

if TYPE_CHECKING:
    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.settings import ClusterSettings
    from flakekit.generators.segment import SegmentSettings

__all__ = ["MemoryAllocation", "MemoryClusterStore", "MemoryFence", "MemoryMembership",
           "SegmentEvent", "keyed_store", "manual_node"]


#: one fetch: the :class:`~flakekit.values.allocation.Allocation` every store returns
MemoryAllocation = Allocation


@attrs.define
class _Record:
    member: Member
    holder: str
    incarnation: int
    last_seen_ns: int
    lease_ns: int
    draining: bool = False
    left: bool = False
    renewals: int = 0
    config_digest: str = ""


@attrs.define
class _Owner:
    node: str
    epoch: int
    released: bool
    claimed_at_ms: int


@attrs.define
class _Row:
    max_id: int
    step: int


@attrs.frozen
class SegmentEvent:
    """A fetch or give-back as the store saw it (for assertions)."""

    kind: str    # "fetch" | "give_back"
    key: str
    start: int
    end: int
    node: str | None
    epoch: int | None


@attrs.define(eq=False)
class MemoryClusterStore:
    """The shared store. ``safety`` is the share of a lease a node's deadline stops
    short of the store's expiry (a real store's margin for clock-rate drift).
    ``renew_lapsed=True`` lets a holder renew a lapsed record nobody took meanwhile (as a
    store that only checks the holder does); by default that is a lost lease.
    ``lapse_means_stopped`` is what the memberships declare (see
    :class:`~flakekit.cluster.store_contracts.Membership`): True lets a new owner take a
    lapsed owner's key at once, as on ZooKeeper. ``versioned=True`` reports a renewal
    counter in every record (``MemberInfo.version``), as SQL does: a claimer proves a
    lapse by reading it unchanged for a lease plus a margin on its own clock."""

    clock: Any
    renew_interval: float | None = None
    safety: float = 0.1
    renew_lapsed: bool = False
    lapse_means_stopped: bool = False
    versioned: bool = False
    events: list[SegmentEvent] = attrs.Factory(list)
    _members: dict[tuple[str, str], _Record] = attrs.Factory(dict)
    _views: dict[str, View] = attrs.Factory(dict)
    _owners: dict[str, _Owner] = attrs.Factory(dict)
    _rows: dict[str, _Row] = attrs.Factory(dict)
    _cut: set[str] = attrs.Factory(set)
    _watchers: dict[tuple[str, int], Callable[[], None]] = attrs.Factory(dict)
    _tokens: itertools.count[int] = attrs.Factory(lambda: itertools.count(1))
    _lock: threading.RLock = attrs.Factory(threading.RLock)

    # -- adapters and switches ------------------------------------------------------------
    def membership(self, client: str) -> MemoryMembership:
        """The membership adapter of process ``client`` (cut together with its fence)."""
        return MemoryMembership(self, client)

    def fence(self, client: str) -> MemoryFence:
        """The key fence and segment store adapter of process ``client``."""
        return MemoryFence(self, client)

    def cut(self, client: str) -> None:
        """From now on every call of ``client``'s adapters raises BackendError."""
        with self._lock:
            self._cut.add(client)

    def restore(self, client: str) -> None:
        with self._lock:
            self._cut.discard(client)

    def is_cut(self, client: str) -> bool:
        return client in self._cut

    def add_key(self, key: str, max_id: int = 1, step: int = 1000) -> None:
        """A ``leaf_alloc`` row."""
        with self._lock:
            self._rows[key] = _Row(max_id, step)

    def max_id(self, key: str) -> int:
        with self._lock:
            return self._rows[key].max_id

    def owner_row(self, key: str) -> KeyOwnerRecord | None:
        with self._lock:
            row = self._owners.get(key)
            return None if row is None else KeyOwnerRecord(
                key, row.node, row.epoch, row.released, row.claimed_at_ms)

    def expire(self, cluster: str, node: str) -> None:
        """End a member's lease from outside (as if it lapsed on the store's clock)."""
        with self._lock:
            rec = self._members.get((cluster, node))
            if rec is not None:
                rec.last_seen_ns = self.clock.monotonic_ns() - rec.lease_ns - 1

    # -- inside -----------------------------------------------------------------------------
    def _check(self, client: str) -> None:
        if client in self._cut:
            raise BackendError(f"memory cluster store: unreachable from {client!r} (cut)")

    def _alive(self, rec: _Record, now: int) -> bool:
        return not rec.left and now < rec.last_seen_ns + rec.lease_ns

    def _deadline(self, sent_ns: int, lease_ns: int) -> int:
        return sent_ns + lease_ns - round(lease_ns * self.safety)

    def _view(self, cluster: str) -> View:
        return self._views.get(cluster) or View(cluster)


class _Client:
    """One process's side of the store (``client``: what :meth:`MemoryClusterStore.cut`
    names)."""

    def __init__(self, store: MemoryClusterStore, client: str) -> None:
        self.store, self.client = store, client

    @property
    def where(self) -> str:
        return "the memory cluster store"

    def _check(self) -> None:
        self.store._check(self.client)

    @contextmanager
    def _checked(self) -> Iterator[MemoryClusterStore]:
        """The store, locked, once this client may reach it (open, not cut off)."""
        with self.store._lock:
            self._check()
            yield self.store


class MemoryMembership(_Client):
    """One process's :class:`~flakekit.cluster.store_contracts.Membership`."""

    def __init__(self, store: MemoryClusterStore, client: str) -> None:
        super().__init__(store, client)
        self.closed = False
        self.lapse_means_stopped = store.lapse_means_stopped

    @property
    def renew_interval(self) -> float | None:
        return self.store.renew_interval

    def _check(self) -> None:
        if self.closed:
            raise BackendError(f"memory membership of {self.client!r} is closed")
        super()._check()

    def acquire(self, request: JoinRequest) -> MemberLease:
        with self._checked() as s:
            now = s.clock.monotonic_ns()
            key = (request.cluster, request.member.node)
            rec = s._members.get(key)
            if rec is not None and s._alive(rec, now):
                raise BackendError(
                    f"node {request.member.node!r} of cluster {request.cluster!r} is held by "
                    f"live process {rec.holder!r}; give each process its own node id")
            lease_ns = round(request.lease_s * 1e9)
            rec = _Record(request.member, f"{request.member.node}/{next(s._tokens)}",
                          (rec.incarnation if rec else 0) + 1, now, lease_ns,
                          config_digest=request.config_digest)
            s._members[key] = rec
            return MemberLease(request.member, rec.holder, rec.incarnation,
                               s._view(request.cluster).epoch, request.lease_s,
                               s._deadline(now, lease_ns))

    def _cluster_of(self, lease: MemberLease) -> tuple[str, str] | None:
        for key, rec in self.store._members.items():
            if rec.holder == lease.holder:
                return key
        return None

    def renew(self, lease: MemberLease, mark: int) -> MemberLease:
        with self._checked() as s:
            now = s.clock.monotonic_ns()
            key = self._cluster_of(lease)
            rec = s._members.get(key) if key else None
            if rec is None or rec.holder != lease.holder:
                raise LeaseLostError(f"member {lease.member.node!r}: the record has another holder")
            if rec.left or (not s._alive(rec, now) and not s.renew_lapsed):
                raise LeaseLostError(f"member {lease.member.node!r}: the lease lapsed on the store")
            rec.last_seen_ns = now
            rec.renewals += 1
            assert key is not None
            return attrs.evolve(lease, view_epoch=s._view(key[0]).epoch,
                                deadline_ns=s._deadline(now, rec.lease_ns))

    def release(self, lease: MemberLease, mark: int) -> None:
        with self._checked() as s:
            key = self._cluster_of(lease)
            if key is not None:
                s._members[key].left = True

    def members(self, cluster: str) -> list[MemberInfo]:
        with self._checked() as s:
            now = s.clock.monotonic_ns()
            out = []
            for (c, _node), rec in sorted(s._members.items()):
                if c != cluster:
                    continue
                left = rec.last_seen_ns + rec.lease_ns - now
                state = ("left" if rec.left else "lapsed" if left <= 0
                         else "draining" if rec.draining else "alive")
                out.append(MemberInfo(rec.member, state, rec.holder, rec.incarnation,
                                      left // 1_000_000, rec.lease_ns // 1_000_000,
                                      rec.renewals if s.versioned else None,
                                      rec.config_digest))
            return out

    def view(self, cluster: str) -> View:
        with self._checked() as s:
            return s._view(cluster)

    def propose(self, cluster: str, seen_epoch: int, members: Sequence[Member]) -> View | None:
        if isinstance(seen_epoch, bool) or not isinstance(seen_epoch, int) or seen_epoch < 0:
            raise ValueError(f"seen_epoch must be an integer from 0, got {seen_epoch!r}")
        ordered = proposed_members(members, check_key_segment)   # as the real stores vet
        with self._checked() as s:
            if s._view(cluster).epoch != seen_epoch:
                return None
            view = View(cluster, seen_epoch + 1, tuple(ordered),
                        s.clock.time_ns() // 1_000_000)
            s._views[cluster] = view
            watchers = [cb for (c, _), cb in s._watchers.items() if c == cluster]
        for callback in watchers:   # outside the lock, as a watch thread would
            callback()
        return view

    def set_draining(self, cluster: str, node: str, draining: bool) -> bool:
        with self._checked() as s:
            rec = s._members.get((cluster, node))
            if rec is None or rec.left:   # a member that left has no lease to mark
                return False
            rec.draining = draining
            return True

    def watch_view(self, cluster: str, callback: Callable[[], None] | None) -> None:
        s = self.store
        with s._lock:
            if callback is None:
                s._watchers.pop((cluster, id(self)), None)
            else:
                s._watchers[(cluster, id(self))] = callback

    def close(self) -> None:
        self.closed = True
        with self.store._lock:
            for key in [k for k in self.store._watchers if k[1] == id(self)]:
                del self.store._watchers[key]


class MemoryFence(_Client):
    """One process's :class:`~flakekit.cluster.store_contracts.KeyFence` and segment store."""

    def claim_key(self, claim: KeyClaim, waited: bool) -> bool:
        with self._checked() as s:
            row = s._owners.get(claim.key)
            now_ms = s.clock.time_ns() // 1_000_000
            if row is None:
                s._owners[claim.key] = _Owner(claim.node, claim.epoch, False, now_ms)
                return True
            if row.node == claim.node:
                ok = claim.epoch >= row.epoch          # already this node's
            else:
                ok = row.epoch < claim.epoch and (row.released or waited)
            if ok:
                s._owners[claim.key] = _Owner(claim.node, claim.epoch, False, now_ms)
            return ok

    def release_key(self, claim: KeyClaim) -> bool:
        with self._checked() as s:
            row = s._owners.get(claim.key)
            if row is None or not self._holds(row, claim):
                return False
            row.released = True
            return True

    @staticmethod
    def _holds(row: _Owner | None, claim: KeyClaim) -> bool:
        return (row is not None and row.node == claim.node and row.epoch == claim.epoch
                and not row.released)

    @staticmethod
    def _record(s: MemoryClusterStore, kind: str, key: str, low: int, high: int,
                claim: KeyClaim | None) -> None:
        s.events.append(SegmentEvent(kind, key, low, high, claim.node if claim else None,
                                     claim.epoch if claim else None))

    def fetch(self, key: str, step: int | None = None,
              claim: KeyClaim | None = None) -> MemoryAllocation:
        with self._checked() as s:
            row = s._rows.get(key)
            if row is None:
                raise UnknownKeyError(key)
            owner = s._owners.get(key)
            if claim is not None and not self._holds(owner, claim):
                raise FenceError(f"strict key {key!r}: claim of node {claim.node!r} at epoch "
                                 f"{claim.epoch} is no longer the owner row's ({owner})")
            size = step or row.step
            row.max_id += size
            self._record(s, "fetch", key, row.max_id - size, row.max_id, claim)
            return MemoryAllocation(key, row.max_id, size, row.step)

    def give_back(self, key: str, expected_max_id: int, new_max_id: int,
                  claim: KeyClaim | None = None) -> bool:
        with self._checked() as s:
            row = s._rows.get(key)
            if row is None or row.max_id != expected_max_id:
                return False
            if claim is not None and not self._holds(s._owners.get(key), claim):
                return False
            row.max_id = new_max_id
            self._record(s, "give_back", key, new_max_id, expected_max_id, claim)
            return True

    def key_owners(self) -> list[KeyOwnerRecord]:
        with self._checked() as s:
            return [KeyOwnerRecord(k, r.node, r.epoch, r.released, r.claimed_at_ms)
                    for k, r in sorted(s._owners.items())]

    def key_owner(self, key: str) -> KeyOwnerRecord | None:
        return next((r for r in self.key_owners() if r.key == key), None)


def keyed_store(keys: Sequence[str], step: int, **flags: Any) -> MemoryClusterStore:
    """A store on a fresh manual clock (``store.clock``) with a segment row of ``step``
    per key of ``keys``; ``flags`` are :class:`MemoryClusterStore`'s switches."""
    from flakekit.testing.clock import ManualClock

    store = MemoryClusterStore(ManualClock(), **flags)
    for key in keys:
        store.add_key(key, step=step)
    return store


def manual_node(store: MemoryClusterStore, settings: ClusterSettings, keys: Sequence[str],
                segments: SegmentSettings) -> ClusterNode:
    """A not yet started node of process ``settings.node`` on ``store`` and its clock,
    driven by hand (``threads=False``: a test calls ``upkeep()``), strict on ``keys``."""
    from flakekit.cluster.node import ClusterNode

    node = ClusterNode(settings, store.membership(settings.node), store.clock, threads=False)
    for key in keys:
        node.add_strict(key, store.fence(settings.node), segments)
    return node
