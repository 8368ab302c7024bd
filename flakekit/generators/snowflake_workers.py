"""``workers = N`` (N > 1): the slow path of a generator that holds N worker ids.

A tick's IDs are handed out in numeric order as *runs*: arithmetic progressions of
finished IDs (one id's whole sequence when the worker field lies above the sequence
field, as in Snowflake; one sequence value across consecutive ids when it lies below, as
in Sonyflake). A run carries the earliest lease deadline of its ids, taken when it is
opened and never raised, so the check after the draw is per id: a run is closed the
moment one of its ids is revoked, an id whose lease ran out is skipped (and comes back on
a renewal), and a lost id is never used again. Within a tick the position only moves
forward, so IDs stay strictly increasing whatever ids come and go.
"""

from __future__ import annotations

import bisect
from typing import Any

from flakekit.errors import (
    ForkedProcessError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
    WorkerExhaustedError,
)
from flakekit.leases.lease import WorkerLease
from flakekit.values.layout import SEQUENCE, TIME

from .snowflake_core import NOT_STARTED, Core, expired_reason, lease_node, run_hot_loop
from .ticks import NEVER, RunDraws, TickClock

__all__ = ["ManyWorkers", "Slot", "SlotTarget"]


class Slot:
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
        self.last_tick = NEVER
        self.error: type[Exception] = NotStartedError
        self.reason = NOT_STARTED

    def usable(self, now: int, t: int) -> bool:
        return now <= self.deadline and self.first_tick <= t <= self.last_tick


class Run(RunDraws):
    """Finished IDs ``start, start + step, ...`` (``count`` of them) of one tick, from the
    ids in ``slots``; ``major`` / ``minor0`` place it in the tick's order. ``deadline`` is
    the earliest lease deadline of those ids when the run was opened."""

    __slots__ = ("count", "major", "minor0", "slots")

    def __init__(self, tick: int, start: int, step: int, count: int, slots: list[Slot],
                 major: int, minor0: int, deadline: int | None = None) -> None:
        self.count, self.slots, self.major, self.minor0 = count, slots, major, minor0
        self.deadline = min((s.deadline for s in slots), default=-1) if deadline is None \
            else deadline
        self._open(tick, start, start + (count - 1) * step, step)
        if count == 0:
            self.limit = -1


class Group:
    """Usable ids with consecutive worker values (and equal other node fields): in a
    Sonyflake-like layout one sequence value across them is one run."""

    __slots__ = ("deadline", "first", "last", "node", "rest", "slots")

    def __init__(self, slot: Slot) -> None:
        self.slots = [slot]
        self.first = self.last = slot.worker
        self.node, self.rest, self.deadline = slot.node, slot.rest, slot.deadline

    def add(self, slot: Slot) -> None:
        self.slots.append(slot)
        self.last = slot.worker
        self.deadline = min(self.deadline, slot.deadline)


class SlotTarget:
    """The lease target of one id's keeper: routes bind/extend/revoke to its slot."""

    def __init__(self, core: ManyWorkers, slot: Slot) -> None:
        self.core, self.slot = core, slot

    def bind(self, lease: WorkerLease) -> None:
        self.core.bind_slot(self.slot, lease)

    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None:
        self.core.extend_slot(self.slot, deadline_ns, stamp_until_ns)

    def revoke(self, reason: str) -> None:
        if reason == "closed":
            self.core.revoke_slot(self.slot, "closed: the generator was closed; start() it "
                                  "again", NotStartedError)
        else:
            self.core.revoke_slot(self.slot, reason, LeaseLostError)

    def issued_until_ns(self) -> int:
        return self.core.issued_until_ns()


class ManyWorkers(Core):
    """The slow path for ``workers = N > 1``: runs across the usable ids, in order."""

    def __init__(self, ticks: TickClock, fixed_nodes: int, n: int) -> None:
        layout = ticks.layout
        self.layout, self.fixed_nodes = layout, fixed_nodes
        self.tshift = layout.shift(TIME)
        self.sshift = layout.shift(SEQUENCE)
        self.wshift = layout.shift(layout.worker_field)  # type: ignore[arg-type]
        self.seq_top = layout.max_value(SEQUENCE)
        #: the worker field above the sequence (Snowflake): a run is one id's sequence;
        #: below it (Sonyflake): a run is one sequence value across consecutive ids
        self.worker_major = self.wshift > self.sshift
        self.slots = [Slot(k) for k in range(n)]
        self.nobody = Slot(-1)
        self.order: list[Slot] = []   # bound slots by worker id
        self.keys: list[int] = []     # their worker ids (for bisect)
        self.group_cache: list[tuple[int, list[Group], list[int]]] = []
        empty = Run(-1, 0, 1, 0, [self.nobody], 0, 0)   # every draw goes to slow()
        super().__init__(ticks, empty, *run_hot_loop(layout, ticks.clock, self.slow, empty))

    # -- the slow path --------------------------------------------------------------------
    def draw_at(self, now: int, t: int, st: Run) -> int | None:
        if t == st.tick:
            i = st.draw()
            if i <= st.limit and now <= st.deadline:
                return i
        run = self.advance(t, now)
        if run is not None:
            return run.draw()
        self.refuse_or_wait(now, t)
        return None

    def take(self, now: int, t: int, st: Run, left: int, ranges: list[range],
             used: dict[int, Any]) -> int:
        run = self.advance(t, now, install=False)   # never seen by next_id()
        if run is None:
            self.refuse_or_wait(now, t)
            return 0
        take = min(run.count, left)
        ranges.append(range(run.start, run.start + take * run.step, run.step))
        for s in run.slots[:1] if self.worker_major else run.slots[:take]:
            used[id(s)] = s
        self.issued += take
        self.install(self.rest_of(run, take))
        return take

    def check_batch(self, used: dict[int, Any]) -> None:
        now = self.ticks.clock.monotonic_ns()
        for s in used.values():
            if now > s.deadline:
                raise s.error(s.reason)

    def advance(self, t: int, now: int, install: bool = True) -> Run | None:
        """Close the current run and open the next one of tick ``t`` (lock held);
        ``install=False`` (a batch) leaves the closed one in place."""
        old = self.state
        drawn = old.close()
        self.issued += drawn
        major, minor = (old.major, old.minor0 + drawn) if old.tick == t else (0, 0)
        run = self.next_run(t, major, minor, now)
        if run is None:   # nothing left in this tick: stay closed, remember the spot
            self.install(Run(t, 0, 1, 0, [self.nobody], major, minor))
            return None
        if install:
            self.install(run)
        return run

    def rest_of(self, run: Run, taken: int) -> Run:
        """What is left of ``run`` after its first ``taken`` values (a batch)."""
        left = run.slots if self.worker_major else run.slots[taken:]
        return Run(run.tick, run.start + taken * run.step, run.step, run.count - taken,
                   left or [self.nobody], run.major, run.minor0 + taken)

    def next_run(self, t: int, major: int, minor: int, now: int) -> Run | None:
        """The first run of tick ``t`` at or after position (major, minor)."""
        self.ticks.check_stampable(t, NEVER)   # each id's bound: usable()
        if self.worker_major:
            return self._run_of_one_id(t, major, minor, now)
        return self._run_across_ids(t, major, minor, now)

    def _run_of_one_id(self, t: int, worker: int, seq: int, now: int) -> Run | None:
        """Position (worker, sequence): the rest of one id's sequence."""
        if seq > self.seq_top:
            worker, seq = worker + 1, 0
        for s in self.order[bisect.bisect_left(self.keys, worker):]:
            if s.usable(now, t):
                first = seq if s.worker == worker else 0
                return Run(t, t << self.tshift | s.node | first << self.sshift,
                           1 << self.sshift, self.seq_top + 1 - first, [s], s.worker, first)
        return None

    def _run_across_ids(self, t: int, seq: int, worker: int, now: int) -> Run | None:
        """Position (sequence, worker): one sequence value across a group of consecutive
        ids. The groups are the same for every sequence value of a tick: worked out once
        per tick (and again when one of them is revoked, rebound or found expired)."""
        while seq <= self.seq_top:
            groups, firsts = self.groups_in(t, now)
            if not groups:
                return None
            at = bisect.bisect_right(firsts, worker) - 1
            if at < 0 or groups[at].last < worker:
                at += 1
                if at == len(groups):
                    seq, worker = seq + 1, 0
                    continue
                worker = groups[at].first
            g = groups[at]
            if now > g.deadline:   # one of its ids expired meanwhile: look again
                self.group_cache.clear()
                continue
            off = worker - g.first
            return Run(t, t << self.tshift | (g.node + (off << self.wshift)) | seq << self.sshift,
                       1 << self.wshift, len(g.slots) - off, g.slots[off:] if off else g.slots,
                       seq, worker, g.deadline)
        return None

    def groups_in(self, t: int, now: int) -> tuple[list[Group], list[int]]:
        cache = self.group_cache
        if cache and cache[0][0] == t:
            return cache[0][1], cache[0][2]
        groups: list[Group] = []
        for s in self.order:
            if not s.usable(now, t):
                continue
            last = groups[-1] if groups else None
            if last is not None and s.worker == last.last + 1 and s.rest == last.rest:
                last.add(s)
            else:
                groups.append(Group(s))
        cache[:] = [(t, groups, [g.first for g in groups])]
        return groups, cache[0][2]

    def refuse_or_wait(self, now: int, t: int) -> None:
        """No run left in tick ``t``: wait for the next tick if some id can go on, else
        raise why none can."""
        if any(now <= s.deadline and t <= s.last_tick for s in self.slots):
            self.ticks.wait_for_tick_after(t)
            return
        live = [s for s in self.slots if now <= s.deadline]
        if live:
            raise self.ticks.past_stamp_bound(live[0].last_tick, live[0].worker)
        raise self._none_left()

    def _none_left(self) -> Exception:
        """Why no id may issue: forked, not started, expired, or lost."""
        slots, name = self.slots, self.name
        errors = [s.error for s in slots]
        if ForkedProcessError in errors:
            return ForkedProcessError()
        if all(e is NotStartedError for e in errors):
            reason = slots[0].reason
            return NotStartedError(reason if reason.startswith(name) else f"{name}: {reason}")
        expired = [s for s in slots if s.error is LeaseExpiredError]
        if expired:
            return LeaseExpiredError(
                f"{name}: the leases on all {len(slots)} worker ids expired or were "
                f"lost (first: {expired[0].reason}); IDs resume when a renewal succeeds")
        lost = [s for s in slots if s.error is LeaseLostError]
        return LeaseLostError(f"{name}: all {len(slots)} worker ids are lost"
                              + (f" (first: {lost[0].reason})" if lost else ""))

    # -- lease targets (one per id, called by its LeaseKeeper) --------------------------------
    def bind_slot(self, slot: Slot, lease: WorkerLease) -> None:
        worker, rest = lease_node(self.layout, self.fixed_nodes, lease)
        first = self.ticks.wait_for_mark(lease) + 1   # wait out the previous holder, unlocked
        with self.lock:
            self._refuse_twice(slot, worker)
            st = self.state
            if slot in st.slots:
                st.limit = -1
            slot.worker, slot.rest, slot.node = worker, rest, rest | worker << self.wshift
            slot.first_tick = first
            slot.last_tick = self.ticks.tick_bound(lease.stamp_until_ns)
            slot.error = LeaseExpiredError
            slot.reason = expired_reason(self.name, lease.worker_id)
            slot.deadline = NEVER if lease.deadline_ns is None else lease.deadline_ns
            self.reorder()

    def _refuse_twice(self, slot: Slot, worker: int) -> None:
        for other in self.slots:
            if other is not slot and other.worker == worker and other.deadline >= 0:
                raise WorkerExhaustedError(
                    f"{self.name}: the allocator handed out worker {worker} twice to one "
                    "generator; it cannot serve workers > 1 (give one allocator per id)")

    def reorder(self) -> None:
        self.order[:] = sorted((s for s in self.slots if s.worker >= 0), key=lambda s: s.worker)
        self.keys[:] = [s.worker for s in self.order]
        self.group_cache.clear()

    def extend_slot(self, slot: Slot, new_deadline: int | None,
                    stamp_until_ns: int | None = None) -> None:
        """Lock-free like the one-id extend: a run keeps the deadline it was opened with
        (never raised), so a renewal only matters for the runs after it."""
        slot.last_tick = self.ticks.tick_bound(stamp_until_ns)
        slot.deadline = NEVER if new_deadline is None else new_deadline

    def revoke_slot(self, slot: Slot, reason: str, error: type[Exception]) -> None:
        with self.lock:
            slot.error = error
            slot.reason = reason if reason.startswith(f"{self.name}:") else f"{self.name}: {reason}"
            slot.deadline = -1
            self.group_cache.clear()
            st = self.state
            if slot in st.slots:
                st.limit = -1   # the run in use has this id: closed at once
                st.deadline = -1

    def revoke(self, reason: str, error: type[Exception] = LeaseLostError) -> None:
        for slot in self.slots:
            self.revoke_slot(slot, reason, error)

    def refuse_forked(self) -> None:
        for slot in self.slots:
            slot.error, slot.deadline = ForkedProcessError, -1
        self.state.limit = -1
