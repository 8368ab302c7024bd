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
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import Any

from flakekit.batch import IdBatch
from flakekit.clock import Clock
from flakekit.errors import (
    ClockMovedBackwardsError,
    ForkedProcessError,
    LayoutError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
    TimeOverflowError,
    WaitTooLongError,
)
from flakekit.events import NO_EVENTS, Events
from flakekit.forks import after_fork_in_child
from flakekit.keeper import LeaseKeeper
from flakekit.layout import SEQUENCE, TIME, BitLayout
from flakekit.lease import LeaseRequest, WorkerAllocator, WorkerLease

__all__ = ["SnowflakeGenerator"]

#: waits for the next tick sleep until this close to it, then spin (sleep overshoots)
_SPIN_NS = 1_000_000
_NEVER = 1 << 127
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


class _Tick:
    """The IDs of one tick: a counter of finished IDs and the last ID it may yield.

    ``limit`` is what draws are checked against: the tick's last ID (``top``) while the
    counter is open, -1 once it is closed.
    """

    __slots__ = ("base", "draw", "limit", "start", "step", "tick", "top")

    def __init__(self, tick: int, base: int, start: int, top: int, step: int) -> None:
        self.tick, self.base, self.start, self.top, self.step = tick, base, start, top, step
        self.limit = top
        self.draw = itertools.count(start, step).__next__

    def peek(self) -> int:
        """The value the next draw would yield (without drawing)."""
        return self.draw.__self__.__reduce__()[1][0]  # type: ignore[attr-defined]

    def drawn(self) -> int:
        """How many values were drawn within the tick (issued, or lost to a race)."""
        return max(0, (min(self.peek(), self.top + self.step) - self.start) // self.step)


class SnowflakeGenerator:
    """Time-ordered 64-bit IDs for one layout, one clock and one worker lease.

    Args:
        layout: the bit layout.
        clock: where time comes from.
        allocator: where the worker id and its lease come from.
        name: the generator's name (config key), for messages and hooks.
        events: where lease and clock events go.
        on_lease_lost: ``"stop"`` (raise from then on) or ``"exit"`` (end the process).
        host, port, instance: this process's identity for the allocator (instance: which
            of several cooperating processes on one host:port).
        nodes: values of node fields other than the worker field (e.g. ``{"region": 1}``).
        max_start_wait_s: how long start() may wait for the clock to pass the previous
            holder's last issued time before it raises :class:`WaitTooLongError`.
    """

    def __init__(
        self, layout: BitLayout, clock: Clock, allocator: WorkerAllocator, *,
        name: str = "default", events: Events = NO_EVENTS, on_lease_lost: str = "stop",
        host: str = "", port: int = 0, instance: int = 0, nodes: dict[str, int] | None = None,
        max_start_wait_s: float = 10.0,
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
        self.keeper = LeaseKeeper(
            allocator,
            LeaseRequest(name, layout.max_value(layout.worker_field), host, port, instance),
            clock, events, on_lease_lost,
        )
        # free-threaded CPython: the hot path takes the (re-entrant) lock too
        self._lock: Any = threading.Lock() if _GIL else threading.RLock()
        self._pid = os.getpid()
        self._starting = threading.Lock()
        self._issued = 0          # IDs drawn from finished ticks
        self._reason = "not started: call start() or use the generator in a `with` block"
        self._error: type[Exception] = NotStartedError
        self._build()
        after_fork_in_child(self, lambda gen: gen._forked())

    # -- the hot path ---------------------------------------------------------------------
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
        events, name = self.events, self.name

        state = _Tick(-1, 0, 0, -1, step)   # closed: every draw goes to _slow
        deadline = -1                      # monotonic ns; -1: not started / revoked
        last_tick = _NEVER                 # the lease's last tick (its stamp_until)
        node = 0

        def tick_bound(stamp_until_ns: int | None) -> int:
            return _NEVER if stamp_until_ns is None else (stamp_until_ns - epoch_ns) // unit

        if offset is not None:
            shift = offset - epoch_ns

            def read() -> tuple[int, int]:
                now = mono()
                return now, (now + shift) // unit

            def next_id() -> int:
                st = state
                now = mono()
                if (now + shift) // unit == st.tick:
                    i = st.draw()
                    if i <= st.limit and now <= deadline:
                        return i
                return slow()
        else:
            def read() -> tuple[int, int]:
                t = (wall() - epoch_ns) // unit
                return mono(), t

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
            old.limit = -1
            self._issued += old.drawn()
            state = new
            return new

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
                    wait_ns = lease.not_before_ns - wall()
                    if wait_ns > self.max_start_wait_ns:
                        raise WaitTooLongError(
                            f"{name}: worker {lease.worker_id} issued IDs up to "
                            f"{wait_ns / 1e9:.3f} s ahead of this host's clock; that is more "
                            f"than max_start_wait ({self.max_start_wait_ns / 1e9:g} s). Fix "
                            "the clock (NTP), or raise max_start_wait"
                        )
                    while wall() < lease.not_before_ns:
                        clock.sleep(max(lease.not_before_ns - wall(), 1_000) / 1e9)
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

    @staticmethod
    def _locked(fn: Any, lock: Any) -> Any:
        def next_id() -> int:
            with lock:
                return fn()
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
            if self.keeper.lease is None:
                self._pid = os.getpid()
                self.keeper.start(self)
        return self

    def close(self) -> None:
        """Stop issuing, stop renewing and release the worker id.

        In a forked child the lease is the parent's: it is forgotten, never released.
        """
        if os.getpid() != self._pid:
            self._forget_parent_lease()
        elif self.keeper.lease is not None:
            self.keeper.close()
        self.revoke("closed")

    def _forget_parent_lease(self) -> None:
        self.keeper = LeaseKeeper(
            self.keeper.allocator, self.keeper.request, self.clock, self.events,
            self.keeper.on_lease_lost,
        )

    def restart(self) -> SnowflakeGenerator:
        """Get a new lease (after a fork, in the child; or after the lease was lost).

        A forked child never releases its parent's lease: it only forgets it.
        """
        if os.getpid() != self._pid:
            parent = self.keeper.lease
            self._forget_parent_lease()
            self.start()
            lease = self.keeper.lease
            if (parent is not None and lease is not None and lease.deadline_ns is None
                    and lease.worker_id == parent.worker_id):
                # a fixed id (static) would be shared with the parent: certain duplicates
                self._forget_parent_lease()
                self.revoke("closed")
                raise ForkedProcessError(
                    f"{self.name}: the forked child got worker {lease.worker_id} again, the "
                    "parent's fixed id; give the child its own (e.g. set FLAKEKIT_WORKER_ID "
                    "in the child before restart()) or use an allocator that leases ids"
                )
            return self
        self.keeper.close()
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

    def stats(self) -> dict[str, Any]:
        """Numbers for metrics: IDs drawn, lease remaining, renew failures, epoch."""
        st, _ = self._current()
        return {
            "name": self.name,
            "strategy": "snowflake",
            "layout": self.layout.name,
            "clock": self.clock.name,
            "ids_drawn": self._issued + st.drawn(),
            **self.keeper.stats(),
        }

    def __repr__(self) -> str:
        return (f"<SnowflakeGenerator {self.name!r} layout={self.layout.name!r} "
                f"worker={self.worker_id}>")
