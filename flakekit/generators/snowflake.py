"""SnowflakeGenerator: time-ordered IDs under a worker lease.

The hot path is lock-free and touches no hook and no I/O: ``next_id`` is the measured
hot loop in :mod:`flakekit.generators.snowflake_core` (one clock read, one draw from an
atomic ``itertools.count`` per tick, two compares; the invariants it keeps are written
beside the lines that keep them). Everything else (a new tick, an exhausted sequence, a
clock step, an expired or lost lease, a fork) goes through the core's slow path under a
lock: :class:`~flakekit.generators.snowflake_core.OneWorker` for one worker id,
:class:`~flakekit.generators.snowflake_workers.ManyWorkers` for ``workers = N``; the time
rules both share are in :mod:`flakekit.generators.ticks`.

A tick's counter is replaced, never reset. A batch first closes the counter it takes
over (sets ``limit = -1``) and only then draws from it, so a thread that raced it gets
a rejected value and retries under the lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from flakekit.errors import ForkedProcessError, LayoutError, LeaseLostError, NotStartedError
from flakekit.leases.keeper import LeaseKeeper
from flakekit.leases.lease import LeaseRequest, SeveralLeases, WorkerAllocator, WorkerLease
from flakekit.values.clock import Clock
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.forks import after_fork_in_child
from flakekit.values.formats import StringIds
from flakekit.values.layout import BitLayout
from flakekit.values.lifecycle import StartsInWith
from flakekit.values.stats import SnowflakeStats

from .snowflake_core import OneWorker
from .snowflake_workers import ManyWorkers, SlotTarget
from .ticks import TickClock

__all__ = ["SeveralLeases", "SnowflakeGenerator"]


class SnowflakeGenerator(StringIds, StartsInWith):
    """Time-ordered 64-bit IDs for one layout, one clock and one worker lease.

    Args:
        layout: the bit layout.
        clock: where time comes from.
        allocator: where the worker id and its lease come from; with ``workers`` > 1
            either one allocator that holds several leases (:class:`SeveralLeases`:
            ``sql``, ``static``) or a list of N allocators, one per id.
        name: the generator's name (config key), for messages and hooks.
        events: where lease and clock events go.
        on_lease_lost: ``"stop"`` (raise from then on) or ``"exit"`` (end the process).
        host: this process's host, for the allocator.
        port: this process's port, for the allocator.
        instance: which of several cooperating processes on one host:port.
        nodes: values of node fields other than the worker field (e.g. ``{"region": 1}``).
        max_start_wait_s: how long start() may wait for the clock to pass the previous
            holder's last issued time before it raises :class:`WaitTooLongError`.
        workers: how many worker ids to lease (default 1, or the length of a list of
            allocators); the per-tick cap grows N-fold. Each id's request is instance
            ``instance * N + k``, so sibling processes never ask for the same slot.
    """

    def __init__(
        self, layout: BitLayout, clock: Clock,
        allocator: WorkerAllocator | Sequence[WorkerAllocator], *,
        name: str = "default", events: Events = NO_EVENTS, on_lease_lost: str = "stop",
        host: str = "", port: int = 0, instance: int = 0, nodes: dict[str, int] | None = None,
        max_start_wait_s: float = 10.0, workers: int | None = None,
    ) -> None:
        if layout.worker_field is None:
            raise LayoutError(
                "worker_field", f"layout {layout.name!r} has no worker field to put a "
                "leased worker id in; add a 'worker' field or set worker_field"
            )
        nodes = dict(nodes or {})
        if layout.worker_field in nodes:
            raise LayoutError(
                f"nodes.{layout.worker_field}", "the worker field comes from the allocator; "
                "set it in the allocator (e.g. allocator = {type = \"static\", worker_id = 7})"
            )
        self._fixed_nodes = layout.node_value(nodes)
        self.layout, self.clock, self.name, self.events = layout, clock, name, events
        self.nodes = nodes
        self.max_start_wait_ns = int(max_start_wait_s * 1e9)
        sources = self._sources(allocator, workers, layout.max_value(layout.worker_field))
        self.workers = n = len(sources)
        self.keepers = [
            LeaseKeeper(source, LeaseRequest(name, layout.max_value(layout.worker_field),
                                              host, port, instance * n + k),
                        clock, events, on_lease_lost)
            for k, source in enumerate(sources)
        ]
        self.keeper = self.keepers[0]
        self._pid = os.getpid()
        self._starting = threading.Lock()
        ticks = TickClock(layout, clock, events, name, self.max_start_wait_ns)
        self._core: OneWorker | ManyWorkers
        if n == 1:
            self._core = core = OneWorker(ticks, self._fixed_nodes)
            self.bind, self.extend = core.bind, core.extend   # the keeper's lease target
            self._targets: list[Any] = [self]
        else:
            self._core = many = ManyWorkers(ticks, self._fixed_nodes, n)
            self._targets = [SlotTarget(many, slot) for slot in many.slots]
        self.next_id = self._core.next_id
        self.next_ids = self._core.next_ids
        self.issued_until_ns = self._core.issued_until_ns
        self._current = self._core.current
        after_fork_in_child(self, lambda gen: gen._forked())

    @property
    def _lock(self) -> Any:
        """The slow path's lock (a new one in a forked child)."""
        return self._core.lock

    def _forked(self) -> None:
        """In a forked child: fresh locks (a parent thread may have held them at fork())
        and every draw refuses until restart()."""
        self._starting = threading.Lock()
        self._core.forked()

    @staticmethod
    def _sources(allocator: Any, workers: int | None, max_worker: int) -> list[Any]:
        """One allocator per id: the list given, or the one allocator N times (it must
        hold several leases at once)."""
        many = list(allocator) if isinstance(allocator, (list, tuple)) else None
        if workers is None:
            workers = len(many) if many else 1
        if isinstance(workers, bool) or not isinstance(workers, int) \
                or not 1 <= workers <= max_worker + 1:
            raise ValueError(f"workers must be a whole number from 1 to {max_worker + 1} "
                             f"(the layout's worker ids), got {workers!r}")
        if many is not None:
            if len(many) != workers:
                raise ValueError(f"workers = {workers} but {len(many)} allocators were "
                                 "given; give one per id")
            return many
        if workers > 1 and not (isinstance(allocator, SeveralLeases)
                                and allocator.several_leases):
            raise ValueError(
                f"workers = {workers}: allocator {type(allocator).__name__} holds one lease "
                "at a time; pass a list of one allocator per id")
        return [allocator] * workers

    # -- lease target (called by the LeaseKeeper) --------------------------------------------
    def revoke(self, reason: str) -> None:
        """Stop issuing IDs at once (lease lost or generator closed)."""
        if reason == "closed":
            self._core.revoke("closed: the generator was closed; start() it again",
                              NotStartedError)
        else:
            self._core.revoke(reason, LeaseLostError)

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> SnowflakeGenerator:
        """Acquire a worker lease (waiting past the previous holder's last ID) and go."""
        with self._starting:  # two threads starting at once take one lease
            if self.workers == 1:
                if self.keeper.lease is None:
                    self._pid = os.getpid()
                    self.keeper.start(self)
                return self
            self._pid = os.getpid()
            started = []
            try:
                for keeper, target in zip(self.keepers, self._targets):
                    if keeper.lease is None:   # one after another: id k = 0 first
                        keeper.start(target)
                        started.append(keeper)
            except BaseException:
                for keeper in started:   # all N or none
                    keeper.close()
                raise
        return self

    def close(self) -> None:
        """Stop issuing, stop renewing and release the worker id.

        In a forked child the lease is the parent's: it is forgotten, never released.
        """
        if os.getpid() != self._pid:
            self._forget_parent_lease()
        else:
            for keeper in self.keepers:
                if keeper.lease is not None:
                    keeper.close()
        self.revoke("closed")

    def _forget_parent_lease(self) -> None:
        self.keepers = [
            LeaseKeeper(k.allocator, k.request, self.clock, self.events, k.on_lease_lost)
            for k in self.keepers
        ]
        self.keeper = self.keepers[0]

    def restart(self) -> SnowflakeGenerator:
        """Get a new lease (after a fork, in the child; or after the lease was lost).

        A forked child never releases its parent's lease: it only forgets it.
        """
        if os.getpid() != self._pid:
            parents = {k.lease.worker_id for k in self.keepers
                       if k.lease is not None and k.lease.deadline_ns is None}
            self._forget_parent_lease()
            self.start()
            shared = sorted(parents & {k.lease.worker_id for k in self.keepers
                                       if k.lease is not None and k.lease.deadline_ns is None})
            if shared:
                # a fixed id (static) would be shared with the parent: certain duplicates
                self._forget_parent_lease()
                self.revoke("closed")
                ids = ", ".join(map(str, shared))
                raise ForkedProcessError(
                    f"{self.name}: the forked child got worker {ids} again, the "
                    "parent's fixed id; give the child its own (e.g. set FLAKEKIT_WORKER_ID "
                    "in the child before restart()) or use an allocator that leases ids"
                )
            return self
        for keeper in self.keepers:
            keeper.close()
        return self.start()

    # -- introspection ----------------------------------------------------------------------
    @property
    def lease(self) -> WorkerLease | None:
        return self.keeper.lease

    @property
    def worker_id(self) -> int | None:
        lease = self.keeper.lease
        return lease.worker_id if lease else None

    @property
    def leases(self) -> list[WorkerLease | None]:
        """Each id's lease (``workers = N``: N of them; None where none is held)."""
        return [k.lease for k in self.keepers]

    @property
    def worker_ids(self) -> tuple[int, ...]:
        """The worker ids this generator may issue under now, in numeric order (a lost
        one is gone from here)."""
        if self.workers == 1:
            st, deadline = self._current()
            return (self.worker_id,) if self.worker_id is not None and deadline >= 0 else ()
        return tuple(sorted(s.worker for s in self._core.slots  # type: ignore[union-attr]
                            if s.deadline >= 0))

    def stats(self) -> SnowflakeStats:
        """Numbers for metrics: IDs drawn, lease remaining, renew failures, epoch."""
        st, _ = self._current()
        return SnowflakeStats.of(self.name, self.layout.name, self.clock.name,
                                 self._core.issued + st.drawn(), self.keeper.stats())

    def __repr__(self) -> str:
        if self.workers > 1:
            return (f"<SnowflakeGenerator {self.name!r} layout={self.layout.name!r} "
                    f"workers={list(self.worker_ids)}>")
        return (f"<SnowflakeGenerator {self.name!r} layout={self.layout.name!r} "
                f"worker={self.worker_id}>")
