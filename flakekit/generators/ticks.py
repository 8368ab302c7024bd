"""Ticks for the snowflake generators: one tick's IDs as an atomic counter, and the time
rules both the one-id and the N-id paths share (reading the tick, waiting for the next
one, a clock step back, the end of the time field, a lease's last stampable tick, the
previous holder's mark).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from flakekit.errors import (
    ClockMovedBackwardsError,
    LayoutError,
    LeaseExpiredError,
    TimeOverflowError,
    WaitTooLongError,
)
from flakekit.leases.lease import WorkerLease
from flakekit.values.clock import Clock
from flakekit.values.counter import peek
from flakekit.values.events import Events
from flakekit.values.layout import BitLayout

__all__ = ["NEVER", "Draws", "RunDraws", "Tick", "TickClock"]

#: waits for the next tick sleep until this close to it, then spin (sleep overshoots)
_SPIN_NS = 1_000_000
#: a deadline or tick bound that never comes (a lease without one)
NEVER = 1 << 127


class Draws:
    """Finished IDs ``start, start + step, ...`` up to ``top``, drawn from one atomic counter.

    ``limit`` is what draws are checked against: ``top`` while the counter is open, -1 once
    it is closed. A counter is replaced, never reset.
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


class Tick(Draws):
    """The IDs of one tick of a generator with one worker id (``base``: the tick's
    first ID, sequence 0)."""

    __slots__ = ("base",)

    def __init__(self, tick: int, base: int, start: int, top: int, step: int) -> None:
        self.base = base
        self._open(tick, start, top, step)


class RunDraws(Draws):
    """Draws that carry the deadline they may be issued until (``workers = N``: the
    earliest lease deadline of the ids behind them when they were opened)."""

    __slots__ = ("deadline",)

    deadline: int


class TickClock:
    """A layout's ticks on one clock, for one generator: the slow path's time rules.

    ``read()`` gives (monotonic now, tick); the monotonic reading is what lease
    deadlines are compared with.
    """

    read: Callable[[], tuple[int, int]]

    def __init__(self, layout: BitLayout, clock: Clock, events: Events, name: str,
                 max_start_wait_ns: int) -> None:
        self.layout, self.clock, self.events, self.name = layout, clock, events, name
        self.unit, self.epoch_ns = layout.unit_ns, layout.epoch_ns
        self.time_max = layout.max_value("time")
        self.max_start_wait_ns = max_start_wait_ns
        self.read = self._reader()

    def _reader(self) -> Callable[[], tuple[int, int]]:
        mono, wall, offset = self.clock.monotonic_ns, self.clock.time_ns, self.clock.offset_ns
        unit, epoch_ns = self.unit, self.epoch_ns
        if offset is not None:
            shift = offset - epoch_ns

            def read() -> tuple[int, int]:
                now = mono()
                return now, (now + shift) // unit
            return read

        def read_wall() -> tuple[int, int]:
            t = (wall() - epoch_ns) // unit
            return mono(), t
        return read_wall

    def tick_bound(self, stamp_until_ns: int | None) -> int:
        """The last tick a lease lets its holder stamp (its ``stamp_until``)."""
        return NEVER if stamp_until_ns is None else (stamp_until_ns - self.epoch_ns) // self.unit

    def wait_for_tick_after(self, t: int) -> None:
        """Tick ``t`` is used up: wait until the clock reads a later one."""
        clock, offset = self.clock, self.clock.offset_ns
        target = (t + 1) * self.unit + self.epoch_ns
        while True:
            left = target - (clock.time_ns() if offset is None else clock.monotonic_ns() + offset)
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

    def behind(self, t: int, now_tick: int) -> None:
        """The clock reads ``now_tick``, before tick ``t`` already used: wait out a step
        back up to the clock's ``max_backward``, refuse a larger one."""
        layout, clock = self.layout, self.clock
        if now_tick < 0:
            raise LayoutError(
                "epoch", f"layout {layout.name!r}: the clock ({clock.name}) reads "
                f"{-now_tick * self.unit / 1e9:.3f} s before the layout's epoch "
                f"({layout.time_of_tick(0).isoformat()}); no ID can be stamped before "
                "it: use a layout with an earlier epoch"
            )
        behind_ns = (t - now_tick) * self.unit
        if behind_ns <= clock.max_backward_ns:
            self.events.clock_moved_backwards(self.name, clock.name, behind_ns, True)
            self.wait_for_tick_after(t - 1)
            return
        self.events.clock_moved_backwards(self.name, clock.name, behind_ns, False)
        raise ClockMovedBackwardsError(clock.name, behind_ns, clock.max_backward_ns)

    def check_stampable(self, t: int, last_tick: int, worker: int | None = None) -> None:
        """Tick ``t`` fits the time field and the lease's ``stamp_until`` (``last_tick``)."""
        if t > last_tick:
            raise self.past_stamp_bound(last_tick, worker)
        if t > self.time_max:
            raise TimeOverflowError(
                f"layout {self.layout.name!r}: the time field is full since "
                f"{self.layout.time_of_tick(self.time_max + 1).isoformat()}; use a layout "
                "with a later epoch or more time bits"
            )

    def past_stamp_bound(self, last_tick: int, worker: int | None = None) -> LeaseExpiredError:
        """The wall clock ran ahead of what the lease lets its holder stamp (it jumped
        forward); a renewal moves the bound on."""
        lease = "lease" if worker is None else f"lease on worker {worker}"
        return LeaseExpiredError(
            f"{self.name}: the clock ({self.clock.name}) reads past the last instant the "
            f"{lease} allows stamping ({self.layout.time_of_tick(last_tick).isoformat()}); "
            "it jumped forward since the last renewal. IDs resume after the next one"
        )

    def wait_for_mark(self, lease: WorkerLease) -> int:
        """Wait until this host's clock passes the previous holder's mark
        (``lease.not_before_ns``); refuse a mark further ahead than ``max_start_wait``.
        Returns the tick holding the mark (-1: no mark), used up: while held, the mark is
        the holder's last permitted instant (its deadline is inclusive)."""
        mark = lease.not_before_ns
        if not mark:
            return -1
        wall = self.clock.time_ns
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
        return (mark - self.epoch_ns) // self.unit
