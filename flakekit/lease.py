"""Worker leases: the value objects and the allocator contract.

A :class:`WorkerAllocator` hands out worker ids under leases. The lease's ``deadline_ns``
(on the generator clock's monotonic timeline) is the last instant an ID may be issued; an
allocator sets it a safety window before the coordination service could give the id to
someone else. ``None`` means the lease never expires (static ids).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

import attrs

__all__ = ["LeaseRequest", "WorkerAllocator", "WorkerLease", "WorkerRecord"]


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
class WorkerAllocator(Protocol):
    """What a worker-id allocator plugin returns.

    ``renew_interval`` is the seconds between renewals (``None``: nothing to renew).
    ``renew`` raises :class:`~flakekit.errors.LeaseLostError` when the id now belongs to
    someone else and :class:`~flakekit.errors.BackendError` when it cannot tell; the
    keeper keeps the old deadline in the second case, so IDs flow until it passes.
    ``issued_until_ns`` is the wall instant up to which IDs were issued (to persist).
    """

    @property
    def renew_interval(self) -> float | None: ...

    def acquire(self, request: LeaseRequest) -> WorkerLease: ...
    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease: ...
    def release(self, lease: WorkerLease, issued_until_ns: int) -> None: ...
    def records(self) -> list[WorkerRecord]: ...
    def close(self) -> None: ...
