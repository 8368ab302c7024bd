"""The snowflake generators' core: the measured hot loop, and the slow path both the
one-id and the N-id generators share.

``next_id()`` is the hot loop (below, between the ``measured hot loop`` markers): a
closure over two cells, ``state`` (the current tick's or run's counter) and ``deadline``
(the one-id path's lease deadline), that reads the clock once, draws once from an
``itertools.count`` and checks the draw against the counter's limit and the deadline.
Anything else goes to :meth:`Core.slow` under the lock, which the two kinds of core fill
in: :class:`OneWorker` here, ``ManyWorkers`` in :mod:`flakekit.generators.snowflake_workers`.

Only the slow path (under the lock) installs a new counter; the closure's setters are
the one way to do it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from flakekit.errors import (
    ForkedProcessError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
)
from flakekit.leases.lease import WorkerLease
from flakekit.values.batch import IdBatch
from flakekit.values.layout import SEQUENCE, TIME, BitLayout

from .ticks import NEVER, Draws, RunDraws, Tick, TickClock

__all__ = ["GIL_ENABLED", "Core", "OneWorker", "expired_reason", "lease_hot_loop", "lease_node",
           "run_hot_loop"]

#: False on free-threaded CPython, where ``count.__next__`` is not atomic and ``next_id``
#: takes the lock on every call. Read when a generator is built (tests set it False to
#: run the free-threaded path on any build).
GIL_ENABLED: bool = getattr(sys, "_is_gil_enabled", lambda: True)()

NOT_STARTED = "not started: call start() or use the generator in a `with` block"

NextId = Callable[[], int]
Install = Callable[[Any], None]
Current = Callable[[], tuple[Any, int]]


# --- measured hot loop -------------------------------------------------------------------
# benchmarks/bench_ids.py times these lines ("flakekit next_id()"). Per ID: one clock read
# (a clock without a fixed offset: wall for the tick, monotonic for the lease), one draw
# from an atomic itertools.count, the tick compare and two checks, and no other call: no
# hook, no I/O, no lock (DESIGN.md §1.4). Keep them that way; everything else is slow().
#
# What each line enforces (DESIGN.md §1):
# - never a duplicate: a tick's IDs come from one itertools.count whose __next__ is
#   atomic under the GIL, so no two threads draw one value (free-threaded CPython:
#   Core._locked holds the lock around next_id); a counter is replaced, never reset, and
#   closed (limit = -1) before the one after it opens.
# - time-ordered: the counter serves only the tick it was opened for (tick == st.tick);
#   a later tick opens a new counter above it in slow(), an earlier one waits or raises.
# - no ID without a valid lease, checked after the ID is formed and before it is
#   returned: the draw gives the finished ID, then ``now <= deadline`` (the lease's, or
#   the run's: the earliest of its ids' leases when it was opened) is checked before it
#   goes out. A revoked lease closes the counter and sets the deadline to -1.
# - a used-up tick (i > limit) or a closed counter falls through to slow().
def lease_hot_loop(layout: BitLayout, clock: Any, slow: NextId, first: Draws) -> tuple[
        NextId, Install, Current, Callable[[int], None], Callable[[], int]]:
    """One worker id: ``next_id`` checks the lease's deadline (a cell, raised by a
    renewal without the lock); also the setters of the cells it reads."""
    state = first     # the counter in use; replaced by install() under the lock
    deadline = -1     # monotonic ns the lease holds until; -1: not started, revoked, forked
    unit, epoch_ns = layout.unit_ns, layout.epoch_ns
    mono, wall, offset = clock.monotonic_ns, clock.time_ns, clock.offset_ns

    def install(st: Draws) -> None:
        nonlocal state
        state = st

    def set_deadline(value: int) -> None:
        nonlocal deadline
        deadline = value

    def current() -> tuple[Any, int]:
        return state, deadline

    def lease_deadline() -> int:
        return deadline

    if offset is not None:   # wall = monotonic + offset: one monotonic read serves both
        shift = offset - epoch_ns

        def next_id() -> int:
            st = state
            now = mono()
            if (now + shift) // unit == st.tick:       # this counter's tick only
                i = st.draw()                          # atomic: never a duplicate
                if i <= st.limit and now <= deadline:  # open; the lease holds at its time
                    return i
            return slow()
    else:
        def next_id() -> int:
            st = state
            if (wall() - epoch_ns) // unit == st.tick:    # this counter's tick only
                i = st.draw()                             # atomic: never a duplicate
                if i <= st.limit and mono() <= deadline:  # open; the lease holds after it
                    return i
            return slow()
    return next_id, install, current, set_deadline, lease_deadline


def run_hot_loop(layout: BitLayout, clock: Any, slow: NextId,
                 first: RunDraws) -> tuple[NextId, Install, Current]:
    """``workers = N``: ``next_id`` checks the run's deadline (the earliest of its ids'
    leases when it was opened, never raised); also the setter of the cell it reads."""
    run = first       # the run in use; replaced by install() under the lock
    unit, epoch_ns = layout.unit_ns, layout.epoch_ns
    mono, wall, offset = clock.monotonic_ns, clock.time_ns, clock.offset_ns

    def install(st: RunDraws) -> None:
        nonlocal run
        run = st

    def current() -> tuple[Any, int]:
        return run, run.deadline

    if offset is not None:   # wall = monotonic + offset: one monotonic read serves both
        shift = offset - epoch_ns

        def next_id() -> int:
            st = run
            now = mono()
            if (now + shift) // unit == st.tick:          # this run's tick only
                i = st.draw()                             # atomic: never a duplicate
                if i <= st.limit and now <= st.deadline:  # open; its ids' leases hold
                    return i
            return slow()
    else:
        def next_id() -> int:
            st = run
            if (wall() - epoch_ns) // unit == st.tick:       # this run's tick only
                i = st.draw()                                # atomic: never a duplicate
                if i <= st.limit and mono() <= st.deadline:  # open; leases hold after it
                    return i
            return slow()
    return next_id, install, current


# --- end of the measured hot loop -----------------------------------------------------------


def lease_node(layout: BitLayout, fixed_nodes: int, lease: WorkerLease) -> tuple[int, int]:
    """``(worker, rest)``: the lease's worker id, checked against the layout, and the node
    value without the worker field (the fixed node fields and the lease's extra ones)."""
    wfield: str = layout.worker_field  # type: ignore[assignment]  # the generator checks it
    worker = layout.check_part(wfield, lease.worker_id)
    extra = {k: v for k, v in lease.extra.items() if k != wfield}
    return worker, fixed_nodes | layout.node_value(extra)


def expired_reason(name: str, worker: int) -> str:
    return (f"{name}: the lease on worker {worker} expired (renewals failed); IDs resume "
            "when a renewal succeeds")


class Core:
    """The slow path of one generator: the lock, the loop around a draw that the hot loop
    could not make, batches, fork handling. Subclasses say how a tick's IDs are laid out
    and which lease guards them (``check_lease``, ``draw_at``, ``take``,
    ``check_batch``, ``refuse_forked``)."""

    def __init__(self, ticks: TickClock, first: Draws, draw: NextId, install: Install,
                 current: Current) -> None:
        """``draw``, ``install``, ``current``: the hot loop built around ``self.slow``
        (first in use: ``first``) and the setter and getter of its counter cell."""
        self.ticks, self.name, self.read = ticks, ticks.name, ticks.read
        self.gil = GIL_ENABLED
        self.lock = self.new_lock()
        self.issued = 0   # IDs drawn from counters already replaced (stats)
        self._install, self.current = install, current
        self.state: Any = first   # the counter in use, as the hot loop sees it (lock held)
        self.next_id: NextId = draw if self.gil else self._locked(draw)

    def install(self, st: Any) -> None:
        """Put ``st`` in use (lock held): in the hot loop's cell, and in ``state`` for
        the slow path."""
        self.state = st
        self._install(st)

    def new_lock(self) -> Any:
        """With the GIL, a plain lock for the slow path; free-threaded, ``next_id`` takes
        it around the hot loop too, and the slow path inside it again: re-entrant."""
        return threading.Lock() if self.gil else threading.RLock()

    def _locked(self, draw: NextId) -> NextId:
        """Free-threaded CPython: ``count.__next__`` is not atomic, so every draw holds the
        lock. It is looked up on each call, so a forked child uses the fresh one that
        :meth:`forked` made, never the parent's (a parent thread may have held that one
        at fork(): it is held for ever in the child)."""
        def next_id() -> int:
            with self.lock:
                return draw()
        return next_id

    # -- the slow path --------------------------------------------------------------------
    def slow(self) -> int:
        """What the hot loop did not take: a new tick, a used-up one, a clock step back,
        a lease that is gone, a fork."""
        with self.lock:
            while True:
                i = self.draw_at(*self.read_ahead())
                if i is not None:
                    return i

    def read_ahead(self) -> tuple[int, int, Any]:
        """``(now, t, st)`` once the clock's tick ``t`` is not behind the counter in use
        ``st`` (lock held): the lease is checked at each reading, a clock behind waits or
        raises."""
        while True:
            now, t = self.read()
            self.check_lease(now)
            st = self.state
            if t >= st.tick:
                return now, t, st
            self.ticks.behind(st.tick, t)

    def next_ids(self, n: int) -> IdBatch:
        """``n`` IDs as ranges, taken under the lock tick by tick; every lease they were
        taken under is checked after the last one is formed."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        ranges: list[range] = []
        used: dict[int, Any] = {}
        left = n
        with self.lock:
            while left:
                left -= self.take(*self.read_ahead(), left, ranges, used)
            self.check_batch(used)
        return IdBatch(ranges)

    def issued_until_ns(self) -> int:
        """The end of the last tick a counter was opened for (0: none yet): the mark the
        next holder of the worker id must wait past."""
        st = self.state
        return 0 if st.tick < 0 else (st.tick + 1) * self.ticks.unit + self.ticks.epoch_ns

    def forked(self) -> None:
        """In a forked child (before any of its code runs): a fresh lock, since a parent
        thread may have held this one at fork(), and every draw refuses with
        :class:`ForkedProcessError` until ``restart()``."""
        self.lock = self.new_lock()
        self.refuse_forked()

    # -- what a kind of core fills in -----------------------------------------------------
    def check_lease(self, now: int) -> None:
        """Raise if no ID may be issued at monotonic ``now`` (before any draw)."""

    def draw_at(self, now: int, t: int, st: Any) -> int | None:
        """An ID of tick ``t`` (``st``: the counter in use), or None after a wait."""
        raise NotImplementedError

    def take(self, now: int, t: int, st: Any, left: int, ranges: list[range],
             used: dict[int, Any]) -> int:
        """Add up to ``left`` IDs of tick ``t`` to ``ranges`` (and the ids they came from
        to ``used``); return how many."""
        raise NotImplementedError

    def check_batch(self, used: dict[int, Any]) -> None:
        """The check after a batch's draws: every lease it was taken under still holds."""
        self.check_lease(self.ticks.clock.monotonic_ns())

    def refuse_forked(self) -> None:
        raise NotImplementedError


class OneWorker(Core):
    """One worker id: a tick's IDs are ``base + k * 2^sequence_shift`` for the sequence
    ``k`` (step 2^16 in Sonyflake's layout); the lease's deadline is the hot loop's
    ``deadline`` cell, raised by a renewal without the lock."""

    def __init__(self, ticks: TickClock, fixed_nodes: int) -> None:
        layout = ticks.layout
        self.layout, self.fixed_nodes = layout, fixed_nodes
        self.tshift = layout.shift(TIME)
        self.wshift = layout.shift(layout.worker_field)  # type: ignore[arg-type]
        self.step = 1 << layout.shift(SEQUENCE)
        self.seq_top = layout.max_value(SEQUENCE)
        self.node = 0
        self.last_tick = NEVER   # the lease's last tick (its stamp_until)
        self.error: type[Exception] = NotStartedError
        self.reason = NOT_STARTED
        closed = Tick(-1, 0, 0, -1, self.step)   # every draw goes to slow()
        draw, install, current, self.set_deadline, self.lease_deadline = lease_hot_loop(
            layout, ticks.clock, self.slow, closed)
        super().__init__(ticks, closed, draw, install, current)

    def check_lease(self, now: int) -> None:
        if now > self.lease_deadline():
            raise self.error(self.reason) if self.error is not ForkedProcessError \
                else ForkedProcessError()

    def open_tick(self, t: int, first: int = 0) -> Tick:
        """Close the current tick's counter and install one for tick ``t`` from
        sequence ``first`` (lock held)."""
        if t > self.last_tick or t > self.ticks.time_max:
            self.ticks.check_stampable(t, self.last_tick)   # raises
        base = t << self.tshift | self.node
        new = Tick(t, base, base + first * self.step, base + self.seq_top * self.step,
                   self.step)
        self.issued += self.state.close()
        self.install(new)
        return new

    def draw_at(self, now: int, t: int, st: Tick) -> int | None:
        if t > st.tick:
            return self.open_tick(t).draw()
        i = st.draw()
        if i <= st.limit:
            return i
        self.ticks.wait_for_tick_after(t)   # the sequence is used up: the next tick
        return None

    def take(self, now: int, t: int, st: Tick, left: int, ranges: list[range],
             used: dict[int, Any]) -> int:
        first = 0 if t > st.tick else self._close_for_batch(st)
        take = min(self.seq_top + 1 - first, left)
        new = self.open_tick(t, first + take)
        if take > 0:
            begin = new.base + first * self.step
            ranges.append(range(begin, begin + take * self.step, self.step))
            self.issued += take
        if take < left:
            self.ticks.wait_for_tick_after(t)
        return take

    def _close_for_batch(self, st: Tick) -> int:
        """Close the tick's counter before drawing from it; the sequence a batch may
        start at (past the top: the tick is used up). A racing hot loop drew below the
        line, or sees the counter closed."""
        limit, st.limit = st.limit, -1
        start = st.draw()
        return (start - st.base) // self.step if start <= limit else self.seq_top + 1

    # -- lease target (called by the LeaseKeeper) --------------------------------------------
    def bind(self, lease: WorkerLease) -> None:
        with self.lock:
            self.last_tick = self.ticks.tick_bound(lease.stamp_until_ns)
            worker, rest = lease_node(self.layout, self.fixed_nodes, lease)
            self.node = rest | worker << self.wshift
            floor = max(self.state.tick, self.ticks.wait_for_mark(lease))
            closed = self.open_tick(floor, self.seq_top + 1)   # used up: the next draw opens a tick
            closed.limit = -1
            self.error, self.reason = LeaseExpiredError, expired_reason(self.name,
                                                                        lease.worker_id)
            self.set_deadline(NEVER if lease.deadline_ns is None else lease.deadline_ns)

    def extend(self, new_deadline: int | None, stamp_until_ns: int | None = None) -> None:
        """A renewal: lock-free (the hot loop reads the deadline cell at its next call)."""
        self.last_tick = self.ticks.tick_bound(stamp_until_ns)
        self.set_deadline(NEVER if new_deadline is None else new_deadline)

    def revoke(self, reason: str, error: type[Exception] = LeaseLostError) -> None:
        with self.lock:
            self.error, self.reason = error, f"{self.name}: {reason}"
            self.state.limit = -1   # a draw from here on is rejected, whatever bind() does next
            self.set_deadline(-1)

    def refuse_forked(self) -> None:
        self.error = ForkedProcessError
        self.set_deadline(-1)

