"""SnowflakeGenerator: time-ordered IDs under a worker lease.

The hot path is lock-free and touches no hook and no I/O. Each tick (a millisecond for
Snowflake) gets an ``itertools.count`` that yields finished IDs (time, node fields and
sequence already combined); ``count.__next__`` is atomic under the GIL, so two threads
can never draw one value. A call reads the clock once, draws, and checks the draw
against the tick's last ID and against the lease deadline. Everything else (a new tick,
an exhausted sequence, a clock step, an expired or lost lease, a fork) goes through
``_slow`` under a lock.

A tick's counter is replaced, never reset. A batch first closes the counter it takes
over (sets ``limit = -1``) and only then draws from it, so a thread that raced it gets
a rejected value and retries under the lock.

``workers = N`` (N > 1) leases N worker ids, one :class:`LeaseKeeper` each, and keeps the
one-id hot path apart (it is built only for N = 1, untouched). With several ids a tick's
IDs are handed out in numeric order as *runs*: arithmetic progressions of finished IDs
(one id's whole sequence when the worker field lies above the sequence field, as in
Snowflake; one sequence value across consecutive ids when it lies below, as in Sonyflake).
A run carries the earliest lease deadline of its ids, taken when it is opened and never
raised, so the check after the draw is per id: a run is closed the moment one of its ids
is revoked, an id whose lease ran out is skipped (and comes back on a renewal), and a lost
id is never used again. Within a tick the position only moves forward, so IDs stay
strictly increasing whatever ids come and go.
"""

from __future__ import annotations

import bisect
import itertools
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from flakekit.errors import (
    ClockMovedBackwardsError,
    ForkedProcessError,
    LayoutError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
    TimeOverflowError,
    WaitTooLongError,
    WorkerExhaustedError,
)
from flakekit.leases.keeper import LeaseKeeper
from flakekit.leases.lease import LeaseRequest, SeveralLeases, WorkerAllocator, WorkerLease
from flakekit.values.batch import IdBatch
from flakekit.values.clock import Clock
from flakekit.values.counter import peek
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.forks import after_fork_in_child
from flakekit.values.formats import StringIds
from flakekit.values.layout import SEQUENCE, TIME, BitLayout
from flakekit.values.stats import SnowflakeStats

__all__ = ["SeveralLeases", "SnowflakeGenerator"]

#: waits for the next tick sleep until this close to it, then spin (sleep overshoots)
_SPIN_NS = 1_000_000
_NEVER = 1 << 127
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


class _Draws:
    """Finished IDs ``start, start + step, ...`` up to ``top``, drawn from one atomic counter.

    ``limit`` is what draws are checked against: ``top`` while the counter is open, -1 once
    it is closed.
    """

    __slots__ = ("counter", "draw", "limit", "start", "step", "tick", "top")

    def _open(self, tick: int, start: int, top: int, step: int) -> None:
        self.tick, self.start, self.top, self.step = tick, start, top, step
        self.limit = top
        self.counter = itertools.count(start, step)
        self.draw = self.counter.__next__

    def close(self) -> int:
        """Reject every draw from now on; return how many values were drawn before.

        The value drawn here is the hard line: a racing thread drew below it (and may
        return its value) or draws above it and sees ``limit`` -1 (the segment
        generator's ``stop()`` works the same way).
        """
        self.limit = -1
        return self._count(self.draw())

    def drawn(self) -> int:
        """How many values were drawn so far (issued, or lost to a race); for stats."""
        return self._count(peek(self.counter))

    def _count(self, line: int) -> int:
        return max(0, (min(line, self.top + self.step) - self.start) // self.step)


class _Tick(_Draws):
    """The IDs of one tick of a generator with one worker id (``base``: the tick's
    first ID, sequence 0)."""

    __slots__ = ("base",)

    def __init__(self, tick: int, base: int, start: int, top: int, step: int) -> None:
        self.base = base
        self._open(tick, start, top, step)


class _Slot:
    """One of the N leased worker ids of a generator with ``workers = N``.

    ``deadline`` is -1 while the id may not issue (not bound yet, revoked, closed);
    ``first_tick`` / ``last_tick`` bound the ticks it may stamp (the previous holder's
    mark, the lease's stamp_until)."""

    __slots__ = ("deadline", "error", "first_tick", "index", "last_tick", "node", "reason",
                 "rest", "worker")

    def __init__(self, index: int) -> None:
        self.index = index
        self.worker = -1
        self.node = 0
        self.rest = 0   # the node value without the worker field
        self.deadline = -1
        self.first_tick = 0
        self.last_tick = _NEVER
        self.error: type[Exception] = NotStartedError
        self.reason = "not started: call start() or use the generator in a `with` block"


class _Run(_Draws):
    """Finished IDs ``start, start + step, ...`` (``count`` of them) of one tick, from the
    ids in ``slots``; ``major`` / ``minor0`` place it in the tick's order. ``deadline`` is
    the earliest lease deadline of those ids when the run was opened."""

    __slots__ = ("count", "deadline", "major", "minor0", "slots")

    def __init__(self, tick: int, start: int, step: int, count: int, slots: list[_Slot],
                 major: int, minor0: int, deadline: int | None = None) -> None:
        self.count, self.slots, self.major, self.minor0 = count, slots, major, minor0
        self.deadline = min((s.deadline for s in slots), default=-1) if deadline is None \
            else deadline
        self._open(tick, start, start + (count - 1) * step, step)


class _Group:
    """Usable ids with consecutive worker values (and equal other node fields): in a
    Sonyflake-like layout one sequence value across them is one run."""

    __slots__ = ("deadline", "first", "last", "node", "rest", "slots")

    def __init__(self, slot: _Slot) -> None:
        self.slots = [slot]
        self.first = self.last = slot.worker
        self.node, self.rest, self.deadline = slot.node, slot.rest, slot.deadline

    def add(self, slot: _Slot) -> None:
        self.slots.append(slot)
        self.last = slot.worker
        self.deadline = min(self.deadline, slot.deadline)


class _SlotTarget:
    """The lease target of one id's keeper: routes bind/extend/revoke to its slot."""

    def __init__(self, gen: SnowflakeGenerator, slot: _Slot) -> None:
        self.gen, self.slot = gen, slot

    def bind(self, lease: WorkerLease) -> None:
        self.gen._bind_slot(self.slot, lease)

    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None:
        self.gen._extend_slot(self.slot, deadline_ns, stamp_until_ns)

    def revoke(self, reason: str) -> None:
        if reason == "closed":
            self.gen._revoke_slot(self.slot, "closed: the generator was closed; start() it "
                                  "again", NotStartedError)
        else:
            self.gen._revoke_slot(self.slot, reason, LeaseLostError)

    def issued_until_ns(self) -> int:
        return int(self.gen.issued_until_ns())


class SnowflakeGenerator(StringIds):
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
        self._slots = [_Slot(k) for k in range(n)]
        self._targets = [_SlotTarget(self, slot) for slot in self._slots]
        # free-threaded CPython: the hot path takes the (re-entrant) lock too
        self._lock: Any = threading.Lock() if _GIL else threading.RLock()
        self._pid = os.getpid()
        self._starting = threading.Lock()
        self._issued = 0          # IDs drawn from finished ticks
        self._reason = "not started: call start() or use the generator in a `with` block"
        self._error: type[Exception] = NotStartedError
        if n == 1:
            self._build()
        else:
            self._build_many()
        after_fork_in_child(self, lambda gen: gen._forked())

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

    # -- the hot path ---------------------------------------------------------------------
    def _wait_for_mark(self, lease: WorkerLease) -> None:
        """Wait until this host's clock passes the previous holder's mark
        (``lease.not_before_ns``); refuse a mark further ahead than ``max_start_wait``."""
        wall, mark = self.clock.time_ns, lease.not_before_ns
        wait_ns = mark - wall()
        if wait_ns > self.max_start_wait_ns:
            raise WaitTooLongError(
                f"{self.name}: worker {lease.worker_id} issued IDs up to "
                f"{wait_ns / 1e9:.3f} s ahead of this host's clock; that is more "
                f"than max_start_wait ({self.max_start_wait_ns / 1e9:g} s). Fix "
                "the clock (NTP), or raise max_start_wait"
            )
        while wall() < mark:
            self.clock.sleep(max(mark - wall(), 1_000) / 1e9)

    def _time_helpers(self) -> tuple[Any, Any, Any]:
        """``read()`` (monotonic now, tick), ``wait_for_tick_after(t)`` and
        ``behind(t, now_tick)`` (wait out a small step back or refuse)."""
        layout, clock, events, name = self.layout, self.clock, self.events, self.name
        unit, epoch_ns = layout.unit_ns, layout.epoch_ns
        mono, wall, offset = clock.monotonic_ns, clock.time_ns, clock.offset_ns
        if offset is not None:
            shift = offset - epoch_ns

            def read() -> tuple[int, int]:
                now = mono()
                return now, (now + shift) // unit
        else:
            def read() -> tuple[int, int]:
                t = (wall() - epoch_ns) // unit
                return mono(), t

        def wait_for_tick_after(t: int) -> None:
            target = (t + 1) * unit + epoch_ns
            while True:
                left = target - (wall() if offset is None else mono() + offset)
                if left <= 0:
                    return
                if offset is None:
                    clock.sleep(left / 1e9)
                elif left > _SPIN_NS:
                    clock.sleep((left - _SPIN_NS) / 1e9)
                else:
                    # spin, handing the GIL to any thread that waits for it: a spin that
                    # keeps it makes that thread (a server's event loop) wait out the
                    # interpreter's 5 ms switch interval
                    os.sched_yield()

        def behind(t: int, now_tick: int) -> None:
            """The clock reads a tick before the last one used: wait or refuse."""
            if now_tick < 0:
                raise LayoutError(
                    "epoch", f"layout {layout.name!r}: the clock ({clock.name}) reads "
                    f"{-now_tick * unit / 1e9:.3f} s before the layout's epoch "
                    f"({layout.time_of_tick(0).isoformat()}); no ID can be stamped before "
                    "it: use a layout with an earlier epoch"
                )
            behind_ns = (t - now_tick) * unit
            if behind_ns <= clock.max_backward_ns:
                events.clock_moved_backwards(name, clock.name, behind_ns, True)
                wait_for_tick_after(t - 1)
                return
            events.clock_moved_backwards(name, clock.name, behind_ns, False)
            raise ClockMovedBackwardsError(clock.name, behind_ns, clock.max_backward_ns)

        return read, wait_for_tick_after, behind

    def _build(self) -> None:
        """Create the hot-path closures; their state lives in closure cells."""
        layout, clock = self.layout, self.clock
        unit, epoch_ns = layout.unit_ns, layout.epoch_ns
        tshift = layout.shift(TIME)
        step = 1 << layout.shift(SEQUENCE)
        seq_top = layout.max_value(SEQUENCE)
        time_max = layout.max_value(TIME)
        lock = self._lock
        mono = clock.monotonic_ns
        wall = clock.time_ns
        offset = clock.offset_ns
        name = self.name

        state = _Tick(-1, 0, 0, -1, step)   # closed: every draw goes to _slow
        deadline = -1                      # monotonic ns; -1: not started / revoked
        last_tick = _NEVER                 # the lease's last tick (its stamp_until)
        node = 0

        def tick_bound(stamp_until_ns: int | None) -> int:
            return _NEVER if stamp_until_ns is None else (stamp_until_ns - epoch_ns) // unit

        read, wait_for_tick_after, behind = self._time_helpers()
        if offset is not None:
            shift = offset - epoch_ns

            def next_id() -> int:
                st = state
                now = mono()
                if (now + shift) // unit == st.tick:
                    i = st.draw()
                    if i <= st.limit and now <= deadline:
                        return i
                return slow()
        else:
            def next_id() -> int:
                st = state
                if (wall() - epoch_ns) // unit == st.tick:
                    i = st.draw()
                    if i <= st.limit and mono() <= deadline:
                        return i
                return slow()

        def check_lease(now: int) -> None:
            if now > deadline:
                raise self._error(self._reason) if self._error is not ForkedProcessError \
                    else ForkedProcessError()

        def open_tick(t: int, first: int = 0) -> _Tick:
            """Close the current tick's counter and install a new one (under the lock)."""
            nonlocal state
            if t > last_tick:
                # the wall clock ran ahead of what the lease lets this holder stamp (it
                # jumped forward); a renewal moves the bound on
                raise LeaseExpiredError(
                    f"{name}: the clock ({clock.name}) reads past the last instant the "
                    f"lease allows stamping ({layout.time_of_tick(last_tick).isoformat()}); "
                    "it jumped forward since the last renewal. IDs resume after the next "
                    "one"
                )
            if t > time_max:
                raise TimeOverflowError(
                    f"layout {layout.name!r}: the time field is full since "
                    f"{layout.time_of_tick(time_max + 1).isoformat()}; use a layout with a "
                    "later epoch or more time bits"
                )
            old = state
            base = t << tshift | node
            new = _Tick(t, base, base + first * step, base + seq_top * step, step)
            self._issued += old.close()
            state = new
            return new

        def slow() -> int:
            with lock:
                while True:
                    now, t = read()
                    check_lease(now)
                    st = state
                    if t > st.tick:
                        return open_tick(t).draw()
                    if t < st.tick:
                        behind(st.tick, t)
                        continue
                    i = st.draw()
                    if i <= st.limit:
                        return i
                    wait_for_tick_after(t)

        def next_ids(n: int) -> IdBatch:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"n must be a non-negative integer, got {n!r}")
            ranges: list[range] = []
            left = n
            with lock:
                while left:
                    now, t = read()
                    check_lease(now)
                    st = state
                    if t < st.tick:
                        behind(st.tick, t)
                        continue
                    if t > st.tick:
                        first = 0
                    else:
                        limit, st.limit = st.limit, -1   # close before drawing
                        start = st.draw()
                        first = (start - st.base) // step if start <= limit else seq_top + 1
                    take = min(seq_top + 1 - first, left)
                    new = open_tick(t, first + take)
                    if take > 0:
                        begin = new.base + first * step
                        ranges.append(range(begin, begin + take * step, step))
                        left -= take
                        self._issued += take
                    if left:
                        wait_for_tick_after(t)
                check_lease(mono())
            return IdBatch(ranges)

        def bind(lease: WorkerLease) -> None:
            nonlocal node, deadline, last_tick
            with lock:
                last_tick = tick_bound(lease.stamp_until_ns)
                worker = layout.check_part(layout.worker_field, lease.worker_id)  # type: ignore[arg-type]
                extra = {k: v for k, v in lease.extra.items() if k != layout.worker_field}
                node = (self._fixed_nodes | layout.node_value(extra)
                        | worker << layout.shift(layout.worker_field))  # type: ignore[arg-type]
                floor = state.tick
                if lease.not_before_ns:
                    self._wait_for_mark(lease)
                    # the tick containing the mark is used up: while held, the mark is
                    # the holder's last permitted instant (its deadline is inclusive)
                    floor = max(floor, (lease.not_before_ns - epoch_ns) // unit)
                closed = open_tick(floor, seq_top + 1)   # exhausted: next draw opens a tick
                closed.limit = -1
                self._error, self._reason = LeaseExpiredError, (
                    f"{name}: the lease on worker {lease.worker_id} expired (renewals "
                    "failed); IDs resume when a renewal succeeds"
                )
                deadline = _NEVER if lease.deadline_ns is None else lease.deadline_ns

        def extend(new_deadline: int | None, stamp_until_ns: int | None = None) -> None:
            nonlocal deadline, last_tick
            last_tick = tick_bound(stamp_until_ns)
            deadline = _NEVER if new_deadline is None else new_deadline

        def revoke(reason: str, error: type[Exception] = LeaseLostError) -> None:
            nonlocal deadline
            with lock:
                self._error, self._reason = error, f"{name}: {reason}"
                state.limit = -1   # a draw from here on is rejected, whatever bind() does next
                deadline = -1

        def forked() -> None:
            nonlocal deadline, lock
            # a parent thread may have held the lock at fork(): the child gets a new one
            lock = self._lock = threading.Lock() if _GIL else threading.RLock()
            self._starting = threading.Lock()
            self._error = ForkedProcessError
            deadline = -1

        def issued_until_ns() -> int:
            st = state
            return 0 if st.tick < 0 else (st.tick + 1) * unit + epoch_ns

        def current() -> tuple[_Tick, int]:
            return state, deadline

        self.next_id = next_id
        self.next_ids = next_ids
        self.bind = bind
        self.extend = extend
        self.issued_until_ns = issued_until_ns
        self._revoke = revoke
        self._forked = forked
        self._current = current
        if not _GIL:  # free-threaded CPython: count.__next__ is no longer atomic
            self.next_id = self._locked(next_id, lock)

    def _build_many(self) -> None:
        """The hot path and slow path for ``workers = N > 1`` (see the module docstring)."""
        layout, clock = self.layout, self.clock
        unit, epoch_ns = layout.unit_ns, layout.epoch_ns
        tshift = layout.shift(TIME)
        sshift = layout.shift(SEQUENCE)
        wfield: str = layout.worker_field  # type: ignore[assignment]  # checked in __init__
        wshift = layout.shift(wfield)
        seq_top = layout.max_value(SEQUENCE)
        time_max = layout.max_value(TIME)
        #: the worker field above the sequence (Snowflake): a run is one id's sequence;
        #: below it (Sonyflake): a run is one sequence value across consecutive ids
        worker_major = wshift > sshift
        lock = self._lock
        mono, wall, offset = clock.monotonic_ns, clock.time_ns, clock.offset_ns
        name, slots = self.name, self._slots
        read, wait_for_tick_after, behind = self._time_helpers()

        nobody = _Slot(-1)
        state = _Run(-1, 0, 1, 0, [nobody], 0, 0)   # empty: every draw goes to slow()
        state.limit = -1
        order: list[_Slot] = []    # bound slots by worker id
        keys: list[int] = []       # their worker ids (for bisect)

        def tick_bound(stamp_until_ns: int | None) -> int:
            return _NEVER if stamp_until_ns is None else (stamp_until_ns - epoch_ns) // unit

        if offset is not None:
            shift = offset - epoch_ns

            def next_id() -> int:
                st = state
                now = mono()
                if (now + shift) // unit == st.tick:
                    i = st.draw()
                    if i <= st.limit and now <= st.deadline:
                        return i
                return slow()
        else:
            def next_id() -> int:
                st = state
                if (wall() - epoch_ns) // unit == st.tick:
                    i = st.draw()
                    if i <= st.limit and mono() <= st.deadline:
                        return i
                return slow()

        def usable(s: _Slot, now: int, t: int) -> bool:
            return now <= s.deadline and s.first_tick <= t <= s.last_tick

        def next_run(t: int, major: int, minor: int, now: int) -> _Run | None:
            """The first run of tick ``t`` at or after position (major, minor)."""
            if t > time_max:
                raise TimeOverflowError(
                    f"layout {layout.name!r}: the time field is full since "
                    f"{layout.time_of_tick(time_max + 1).isoformat()}; use a layout with a "
                    "later epoch or more time bits"
                )
            base = t << tshift
            if worker_major:   # position: (worker, sequence)
                if minor > seq_top:
                    major, minor = major + 1, 0
                for s in order[bisect.bisect_left(keys, major):]:
                    if usable(s, now, t):
                        first = minor if s.worker == major else 0
                        return _Run(t, base | s.node | first << sshift, 1 << sshift,
                                    seq_top + 1 - first, [s], s.worker, first)
                return None
            # position: (sequence, worker). The usable ids fall into groups of consecutive
            # ids, the same for every sequence value of a tick: worked out once per tick
            # (and again when one of them is revoked, rebound or found expired)
            while major <= seq_top:
                groups, firsts = groups_in(t, now)
                if not groups:
                    return None
                at = bisect.bisect_right(firsts, minor) - 1
                if at < 0 or groups[at].last < minor:
                    at += 1
                    if at == len(groups):
                        major, minor = major + 1, 0
                        continue
                    minor = groups[at].first
                g = groups[at]
                if now > g.deadline:   # one of its ids expired meanwhile: look again
                    group_cache.clear()
                    continue
                off = minor - g.first
                return _Run(t, base | (g.node + (off << wshift)) | major << sshift,
                            1 << wshift, len(g.slots) - off, g.slots[off:] if off else g.slots,
                            major, minor, g.deadline)
            return None

        group_cache: list[tuple[int, list[_Group], list[int]]] = []

        def groups_in(t: int, now: int) -> tuple[list[_Group], list[int]]:
            if group_cache and group_cache[0][0] == t:
                return group_cache[0][1], group_cache[0][2]
            groups: list[_Group] = []
            for s in order:
                if not usable(s, now, t):
                    continue
                last = groups[-1] if groups else None
                if last is not None and s.worker == last.last + 1 and s.rest == last.rest:
                    last.add(s)
                else:
                    groups.append(_Group(s))
            group_cache[:] = [(t, groups, [g.first for g in groups])]
            return groups, group_cache[0][2]

        def advance(t: int, now: int, install: bool = True) -> _Run | None:
            """Close the current run and install the next one of tick ``t`` (lock held);
            ``install=False`` (a batch) leaves the closed one in place."""
            nonlocal state
            old = state
            drawn = old.close()
            self._issued += drawn
            major, minor = (old.major, old.minor0 + drawn) if old.tick == t else (0, 0)
            run = next_run(t, major, minor, now)
            if run is None:   # nothing left in this tick: stay closed, remember the spot
                run = _Run(t, 0, 1, 0, [nobody], major, minor)
                run.limit = -1
                state = run
                return None
            if install:
                state = run
            return run

        def rest_of(run: _Run, taken: int) -> _Run:
            """What is left of ``run`` after its first ``taken`` values (a batch)."""
            left = run.slots if worker_major else run.slots[taken:]
            rest = _Run(run.tick, run.start + taken * run.step, run.step, run.count - taken,
                        left or [nobody], run.major, run.minor0 + taken)
            if rest.count == 0:
                rest.limit = -1
            return rest

        def refuse_or_wait(now: int, t: int) -> None:
            """No run left in tick ``t``: wait for the next tick if some id can go on,
            else raise why none can."""
            if any(now <= s.deadline and t <= s.last_tick for s in slots):
                wait_for_tick_after(t)
                return
            live = [s for s in slots if now <= s.deadline]
            if live:
                s = live[0]
                raise LeaseExpiredError(
                    f"{name}: the clock ({clock.name}) reads past the last instant the "
                    f"lease on worker {s.worker} allows stamping "
                    f"({layout.time_of_tick(s.last_tick).isoformat()}); it jumped forward "
                    "since the last renewal. IDs resume after the next one"
                )
            errors = [s.error for s in slots]
            first = slots[0]
            if ForkedProcessError in errors:
                raise ForkedProcessError()
            if all(e is NotStartedError for e in errors):
                raise NotStartedError(first.reason if first.reason.startswith(name)
                                      else f"{name}: {first.reason}")
            expired = [s for s in slots if s.error is LeaseExpiredError]
            if expired:
                raise LeaseExpiredError(
                    f"{name}: the leases on all {len(slots)} worker ids expired or were "
                    f"lost (first: {expired[0].reason}); IDs resume when a renewal succeeds")
            lost = [s for s in slots if s.error is LeaseLostError]
            raise LeaseLostError(
                f"{name}: all {len(slots)} worker ids are lost"
                + (f" (first: {lost[0].reason})" if lost else ""))

        def slow() -> int:
            with lock:
                while True:
                    now, t = read()
                    st = state
                    if t < st.tick:
                        behind(st.tick, t)
                        continue
                    if t == st.tick:
                        i = st.draw()
                        if i <= st.limit and now <= st.deadline:
                            return i
                    run = advance(t, now)
                    if run is not None:
                        return run.draw()
                    refuse_or_wait(now, t)

        def next_ids(n: int) -> IdBatch:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"n must be a non-negative integer, got {n!r}")
            nonlocal state
            ranges: list[range] = []
            used: dict[int, _Slot] = {}
            left = n
            with lock:
                while left:
                    now, t = read()
                    st = state
                    if t < st.tick:
                        behind(st.tick, t)
                        continue
                    run = advance(t, now, install=False)   # never seen by next_id()
                    if run is None:
                        refuse_or_wait(now, t)
                        continue
                    take = min(run.count, left)
                    ranges.append(range(run.start, run.start + take * run.step, run.step))
                    for s in run.slots[:1] if worker_major else run.slots[:take]:
                        used[id(s)] = s
                    left -= take
                    self._issued += take
                    state = rest_of(run, take)
                # the check after the draw, per id: each id's lease still holds
                now = mono()
                for s in used.values():
                    if now > s.deadline:
                        raise s.error(s.reason)
            return IdBatch(ranges)

        def reorder() -> None:
            order[:] = sorted((s for s in slots if s.worker >= 0), key=lambda s: s.worker)
            keys[:] = [s.worker for s in order]
            group_cache.clear()

        def bind_slot(slot: _Slot, lease: WorkerLease) -> None:
            worker = layout.check_part(wfield, lease.worker_id)
            extra = {k: v for k, v in lease.extra.items() if k != wfield}
            rest = self._fixed_nodes | layout.node_value(extra)
            first = 0
            if lease.not_before_ns:   # wait out the previous holder, without the lock
                self._wait_for_mark(lease)
                first = (lease.not_before_ns - epoch_ns) // unit + 1
            with lock:
                for other in slots:
                    if other is not slot and other.worker == worker and other.deadline >= 0:
                        raise WorkerExhaustedError(
                            f"{name}: the allocator handed out worker {worker} twice to one "
                            "generator; it cannot serve workers > 1 (give one allocator "
                            "per id)")
                if slot in state.slots:
                    state.limit = -1
                slot.worker, slot.rest = worker, rest
                slot.node = rest | worker << wshift
                slot.first_tick, slot.last_tick = first, tick_bound(lease.stamp_until_ns)
                slot.error, slot.reason = LeaseExpiredError, (
                    f"{name}: the lease on worker {lease.worker_id} expired (renewals "
                    "failed); IDs resume when a renewal succeeds")
                slot.deadline = _NEVER if lease.deadline_ns is None else lease.deadline_ns
                reorder()

        def extend_slot(slot: _Slot, new_deadline: int | None,
                        stamp_until_ns: int | None = None) -> None:
            # lock-free like the one-id extend: a run keeps the deadline it was opened
            # with (never raised), so a renewal only matters for the runs after it
            slot.last_tick = tick_bound(stamp_until_ns)
            slot.deadline = _NEVER if new_deadline is None else new_deadline

        def revoke_slot(slot: _Slot, reason: str, error: type[Exception]) -> None:
            with lock:
                slot.error, slot.reason = error, (reason if reason.startswith(f"{name}:")
                                                  else f"{name}: {reason}")
                slot.deadline = -1
                group_cache.clear()
                if slot in state.slots:
                    state.limit = -1   # the run in use has this id: closed at once
                    state.deadline = -1

        def revoke(reason: str, error: type[Exception] = LeaseLostError) -> None:
            for slot in slots:
                revoke_slot(slot, reason, error)

        def forked() -> None:
            nonlocal lock
            lock = self._lock = threading.Lock() if _GIL else threading.RLock()
            self._starting = threading.Lock()
            for slot in slots:
                slot.error, slot.deadline = ForkedProcessError, -1
            state.limit = -1

        def issued_until_ns() -> int:
            st = state
            return 0 if st.tick < 0 else (st.tick + 1) * unit + epoch_ns

        def current() -> tuple[Any, int]:
            return state, state.deadline

        self.next_id = next_id
        self.next_ids = next_ids
        self.issued_until_ns = issued_until_ns
        self._bind_slot = bind_slot
        self._extend_slot = extend_slot
        self._revoke_slot = revoke_slot
        self._revoke = revoke
        self._forked = forked
        self._current = current
        if not _GIL:  # free-threaded CPython: count.__next__ is no longer atomic
            self.next_id = self._locked(next_id, lock)

    @staticmethod
    def _locked(fn: Any, lock: Any) -> Any:
        def next_id() -> int:
            with lock:
                return int(fn())
        return next_id

    # -- lease target (called by the LeaseKeeper) --------------------------------------------
    def revoke(self, reason: str) -> None:
        """Stop issuing IDs at once (lease lost or generator closed)."""
        if reason == "closed":
            self._revoke("closed: the generator was closed; start() it again", NotStartedError)
        else:
            self._revoke(reason, LeaseLostError)

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

    def __enter__(self) -> SnowflakeGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return tuple(sorted(s.worker for s in self._slots if s.deadline >= 0))

    def stats(self) -> SnowflakeStats:
        """Numbers for metrics: IDs drawn, lease remaining, renew failures, epoch."""
        st, _ = self._current()
        return SnowflakeStats.of(self.name, self.layout.name, self.clock.name,
                                 self._issued + st.drawn(), self.keeper.stats())

    def __repr__(self) -> str:
        if self.workers > 1:
            return (f"<SnowflakeGenerator {self.name!r} layout={self.layout.name!r} "
                    f"workers={list(self.worker_ids)}>")
        return (f"<SnowflakeGenerator {self.name!r} layout={self.layout.name!r} "
                f"worker={self.worker_id}>")
