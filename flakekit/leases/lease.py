"""Leases: the generic contracts of the lease machine, and the worker-id lease.

The :class:`~flakekit.leases.keeper.LeaseKeeper` keeps any lease that meets
:class:`Lease`, taken from a :class:`LeaseSource` and pushed into a
:class:`LeaseTarget`: a worker id today; node membership and key ownership (cluster
mode) are other leases on the same machine. Nothing here knows what is leased.

A :class:`WorkerAllocator` is the lease source of worker ids. The lease's ``deadline_ns``
(on the generator clock's monotonic timeline) is the last instant an ID may be issued; an
allocator sets it a safety window before the coordination service could give the id to
someone else. ``None`` means the lease never expires (static ids).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

__all__ = [
    "Lease",
    "LeaseEvents",
    "LeaseRequest",
    "LeaseSource",
    "LeaseTarget",
    "CountsWorkers",
    "Pushes",
    "SeveralLeases",
    "TracedEvents",
    "WorkerAllocator",
    "WorkerLease",
    "WorkerRecord",
]


# -- the generic contracts ------------------------------------------------------------------
class Lease(Protocol):
    """What the keeper reads from a lease (any attrs value object with these fields).

    ``deadline_ns``: monotonic ns after which the holder must stop (``None``: never);
    ``stamp_until_ns`` / ``not_before_ns``: wall bounds handed to the target as they
    are (``None`` / 0 when the lease has none); ``subject``: what is held, for messages
    (``"worker 7"``).
    """

    @property
    def epoch(self) -> int: ...
    @property
    def deadline_ns(self) -> int | None: ...
    @property
    def stamp_until_ns(self) -> int | None: ...
    @property
    def not_before_ns(self) -> int: ...
    @property
    def subject(self) -> str: ...


class Asks(Protocol):
    """What the keeper reads from a request: who asks (for messages and events)."""

    @property
    def owner(self) -> str: ...


L = TypeVar("L", bound=Lease)
R = TypeVar("R", bound=Asks, contravariant=True)
LT = TypeVar("LT", bound=Lease, contravariant=True)


class LeaseSource(Protocol[R, L]):
    """Where leases come from: the keeper's only partner besides the target.

    ``renew_interval``: seconds between renewals (``None``: nothing to renew).
    ``renew`` raises :class:`~flakekit.errors.LeaseLostError` when the lease now belongs
    to someone else and :class:`~flakekit.errors.BackendError` when it cannot tell; the
    keeper keeps the old deadline in the second case. ``mark`` is the progress to
    persist with the lease (for worker ids: the wall ns up to which IDs were issued).
    Every call should be bounded in time: the keeper never holds its lock across one.
    """

    @property
    def renew_interval(self) -> float | None: ...

    def acquire(self, request: R) -> L: ...
    def renew(self, lease: L, mark: int) -> L: ...
    def release(self, lease: L, mark: int) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Pushes(Protocol):
    """Optional capability of a lease source that learns of a loss on its own (a
    ZooKeeper session watcher): ``callback("lost", reason)`` revokes at once,
    ``callback("connected", "")`` makes the keeper renew now."""

    def watch(self, callback: Callable[[str, str], None] | None) -> None: ...


@runtime_checkable
class SeveralLeases(Protocol):
    """An allocator that can hold several leases for one process at once (``sql``,
    ``static`` with a list), so ``workers = N`` shares it; any other gets one allocator
    per id."""

    several_leases: bool


@runtime_checkable
class CountsWorkers(Protocol):
    """An allocator whose config names its ids (``static``: ``"0-63"`` or a list), so
    ``workers = N`` is taken from it; None when that is not known before ``acquire``."""

    @property
    def worker_count(self) -> int | None: ...


class LeaseTarget(Protocol[LT]):
    """The side that uses the lease (SnowflakeGenerator for worker ids)."""

    def bind(self, lease: LT) -> None: ...
    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None: ...
    def revoke(self, reason: str) -> None: ...
    def issued_until_ns(self) -> int: ...


class LeaseEvents(Protocol[LT]):
    """Where the keeper reports lease changes (:class:`~flakekit.values.events.Events`
    for worker leases)."""

    def lease_acquired(self, generator: str, lease: LT) -> None: ...
    def lease_renewed(self, generator: str, lease: LT) -> None: ...
    def lease_lost(self, generator: str, lease: LT, reason: str) -> None: ...


@runtime_checkable
class TracedEvents(Protocol):
    """Lease events that also take each renewal's round trip (optional:
    :class:`~flakekit.values.events.Events` does, for the ``flakekit_operation`` hook; a
    membership's or a test's events need not)."""

    def operation(self, name: str, generator: str, duration_ns: int,
                  attributes: dict[str, Any], error: str | None = None) -> None: ...


# -- worker ids -------------------------------------------------------------------------------


@attrs.frozen
class LeaseRequest:
    """What a generator asks an allocator for.

    Attributes:
        generator: the generator's name in config (for messages and records).
        max_worker_id: the largest worker id the layout can hold.
        host: this process's host identity (name or address).
        port: this process's port identity (0 when it serves none).
        instance: which of several cooperating processes sharing this host:port
            (a server's worker processes: 0, 1, ...); each needs its own worker id.
    """

    generator: str
    max_worker_id: int
    host: str
    port: int = 0
    instance: int = 0

    @property
    def owner(self) -> str:
        return self.generator


@attrs.frozen
class WorkerLease:
    """A worker id held by this process.

    Attributes:
        worker_id: the id to put into the layout's worker field.
        epoch: fencing token; grows every time the id changes hands.
        holder: who holds it (``host:port`` plus a per-process token).
        ttl: seconds a renewal extends the lease by; ``None`` for "forever".
        deadline_ns: monotonic ns after which no ID may be issued; ``None`` for "never".
        not_before_ns: wall ns (Unix) before which no ID may be stamped, because an
            earlier holder of this id issued IDs up to it (the persisted high-water mark).
        stamp_until_ns: wall ns after which this holder may not stamp an ID: the mark
            the allocator persisted for a successor to wait past. It only matters when the
            wall clock can jump forward (the ``system`` clock); ``None``: no bound.
        extra: node fields other than the worker (e.g. ``{"region": 1}``).
    """

    worker_id: int
    epoch: int = 1
    holder: str = ""
    ttl: float | None = None
    deadline_ns: int | None = None
    not_before_ns: int = 0
    extra: dict[str, int] = attrs.field(factory=dict)
    stamp_until_ns: int | None = None

    @property
    def subject(self) -> str:
        return f"worker {self.worker_id}"


@attrs.frozen
class WorkerRecord:
    """One row of an allocator's registry, for ``flakekit workers``."""

    worker_id: int
    holder: str
    epoch: int
    last_seen: dt.datetime | None
    state: str  # "held", "lapsed", "released", ...
    mine: bool = False
    extra: dict[str, object] = attrs.field(factory=dict)


@runtime_checkable
class WorkerAllocator(LeaseSource[LeaseRequest, WorkerLease], Protocol):
    """What a worker-id allocator plugin returns: a :class:`LeaseSource` of
    :class:`WorkerLease` (same rules) that also lists its registry.

    The ``mark`` of ``renew`` and ``release`` is ``issued_until_ns``, the wall instant up
    to which IDs were issued (to persist). Optional: :class:`Pushes` (``watch(callback)``).
    """

    def records(self) -> list[WorkerRecord]: ...
