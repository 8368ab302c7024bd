"""SnowflakeGenerator: uniqueness, order, overflow, rollback, leases, fork, batches."""

from __future__ import annotations

import os
import sys

import attrs
import pytest

from flakekit.builtin.layouts import SNOWFLAKE, SONYFLAKE
from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.errors import (
    ClockMovedBackwardsError,
    ForkedProcessError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
    TimeOverflowError,
    WaitTooLongError,
)
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.testing import ManualClock, in_threads
from flakekit.testing.forks import in_forked_child
from flakekit.testing.refusals import assert_issues_nothing
from flakekit.values.clock import MonotonicClock
from flakekit.values.layout import BitLayout

MS = 1_000_000


def static(worker: int = 5) -> StaticAllocator:
    return StaticAllocator(StaticSettings(worker_id=worker))


def manual_gen(worker: int = 5, layout: BitLayout = SNOWFLAKE, clock: ManualClock | None = None,
               **kw):
    clock = clock or ManualClock()
    return SnowflakeGenerator(layout, clock, static(worker), **kw).start(), clock


@attrs.define
class LeasedAllocator:
    """An allocator whose lease deadline the test controls."""

    clock: ManualClock
    ttl_ns: int = 1_000 * MS
    worker: int = 9
    not_before_ns: int = 0
    renew_interval: float | None = 3600.0
    fail: BaseException | None = None
    released: list[int] = attrs.Factory(list)
    acquired: int = 0
    pushed: object = None
    closed: bool = False
    during_renew: object = None  # called with the lease while a renewal is "in flight"

    def acquire(self, request: LeaseRequest) -> WorkerLease:
        self.acquired += 1
        return WorkerLease(self.worker + self.acquired - 1, self.acquired, "t", 1.0,
                           self.clock.monotonic_ns() + self.ttl_ns, self.not_before_ns,
                           stamp_until_ns=self.clock.time_ns() + self.ttl_ns)

    def watch(self, callback) -> None:
        self.pushed = callback

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        if self.fail is not None:
            raise self.fail
        if callable(self.during_renew):
            self.during_renew(lease)
        return attrs.evolve(lease, deadline_ns=self.clock.monotonic_ns() + self.ttl_ns,
                            stamp_until_ns=self.clock.time_ns() + self.ttl_ns)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        self.released.append(issued_until_ns)

    def records(self):
        return []

    def close(self) -> None:
        self.closed = True


def leased_gen(**kw) -> tuple[SnowflakeGenerator, ManualClock, LeasedAllocator]:
    """A started generator on a :class:`LeasedAllocator` (1 s leases) and a ManualClock."""
    clock = ManualClock()
    alloc = LeasedAllocator(clock)
    return SnowflakeGenerator(SNOWFLAKE, clock, alloc, **kw).start(), clock, alloc


class TestUniqueness:
    def test_increasing_in_one_thread(self):
        """IDs from one thread strictly increase, across many ticks."""
        gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(), static()).start()
        ids = [gen.next_id() for _ in range(50_000)]
        assert all(a < b for a, b in zip(ids, ids[1:]))
        assert {SNOWFLAKE.decompose(i)["worker"] for i in ids} == {5}

    def test_threads_with_tiny_switch_interval(self):
        """8 threads hammering one generator with a 1 µs switch interval: no duplicate."""
        gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(), static()).start()
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

        def work(_: int) -> list[int]:
            out: list[int] = []
            for i in range(20_000):
                out.append(gen.next_id())
                if i % 997 == 0:
                    out.extend(gen.next_ids(300))
            return out

        try:
            results = in_threads(work, 8)
        finally:
            sys.setswitchinterval(old)
        flat = [i for r in results for i in r]
        assert len(flat) == len(set(flat))
        for r in results:  # each thread sees its own IDs increase
            singles = [i for i in r]
            assert singles == sorted(singles)

    def test_sequence_overflow_waits_for_next_tick_and_never_touches_worker(self):
        """4096 IDs in one ms exhaust the sequence; the next waits for the next ms."""
        gen, clock = manual_gen(worker=1023)
        ids = [gen.next_id() for _ in range(4096 * 3 + 5)]
        parts = [SNOWFLAKE.decompose(i) for i in ids]
        assert {p["worker"] for p in parts} == {1023}
        assert len(set(ids)) == len(ids)
        assert [p["time"] for p in parts][4096] == parts[0]["time"] + 1
        assert max(p["sequence"] for p in parts) == 4095

    def test_sonyflake_overflow_sleeps_to_next_10ms_tick(self):
        """Sonyflake: 256 IDs per 10 ms tick; the machine field stays put."""
        gen, clock = manual_gen(worker=0xBEEF, layout=SONYFLAKE)
        start = clock.monotonic_ns()
        ids = [gen.next_id() for _ in range(256 * 4)]
        assert {SONYFLAKE.decompose(i)["machine"] for i in ids} == {0xBEEF}
        assert len(set(ids)) == len(ids) and ids == sorted(ids)
        assert clock.monotonic_ns() - start >= 3 * 10 * MS


    def test_the_spin_before_a_tick_hands_the_gil_over(self, monkeypatch):
        """With a clock whose wall time is monotonic time plus an offset (the default
        clock), the last millisecond before the next tick is a spin, and the spin yields
        the CPU (and the GIL) each turn: a spin that kept the GIL made a server's event
        loop wait out the 5 ms switch interval on every request beside a large batch."""
        from flakekit.generators import snowflake

        @attrs.define
        class OffsetClock(ManualClock):
            offset_ns: int | None = 0  # type: ignore[assignment]

        clock = OffsetClock()
        clock.offset_ns = clock.wall_ns - clock.mono_ns
        yields: list[int] = []

        def sched_yield() -> None:  # the spin's only way to see time move here
            yields.append(clock.monotonic_ns())
            clock.advance(ns=100_000)

        monkeypatch.setattr(snowflake.os, "sched_yield", sched_yield)
        gen, _ = manual_gen(worker=3, clock=clock)
        first = gen.next_ids(4096)   # the whole tick
        after = gen.next_id()        # waits for the next one, spinning
        assert SNOWFLAKE.decompose(after)["time"] == SNOWFLAKE.decompose(first[0])["time"] + 1
        assert 1 <= len(yields) <= 10

class TestBatches:
    def test_next_ids_are_ranges(self):
        """A batch is a few ranges: len, iteration, indexing, no duplicate with singles."""
        gen, clock = manual_gen()
        first = gen.next_id()
        batch = gen.next_ids(10_000)
        assert len(batch) == 10_000 and len(batch.ranges) == 3
        ids = list(batch)
        assert ids == sorted(ids) and len(set(ids)) == 10_000 and ids[0] > first
        assert batch[0] == ids[0] and batch[-1] == ids[-1] and batch[5000] == ids[5000]
        assert gen.next_id() > batch[-1]

    def test_sonyflake_batch_steps_over_machine_bits(self):
        """Sonyflake batches step by 2^16 (sequence above the machine id)."""
        gen, _ = manual_gen(worker=7, layout=SONYFLAKE)
        batch = gen.next_ids(600)
        assert all(r.step == 1 << 16 for r in batch.ranges)
        assert {SONYFLAKE.decompose(i)["machine"] for i in batch} == {7}
        assert len(set(batch)) == 600

    @pytest.mark.parametrize("n", [-1, 1.5, "3", True])
    def test_bad_counts(self, n):
        """A count that is not a non-negative int is a ValueError."""
        gen, _ = manual_gen()
        with pytest.raises(ValueError):
            gen.next_ids(n)


class TestClockRollback:
    def test_small_step_back_is_waited_out(self):
        """A 3 ms step back (under max_backward 5 ms) waits, then IDs continue upwards."""
        seen = []

        class Events:
            def clock_moved_backwards(self, generator, clock, behind_ns, waited):
                seen.append((behind_ns, waited))

            def __getattr__(self, name):
                return lambda *a, **k: None

        gen, clock = manual_gen(events=Events())
        before = gen.next_id()
        clock.step(ns=-3 * MS)
        after = gen.next_id()
        assert after > before
        assert seen and seen[0][1] is True and seen[0][0] <= 5 * MS

    def test_large_step_back_raises(self):
        """A 2 s step back raises ClockMovedBackwardsError and issues nothing."""
        gen, clock = manual_gen()
        gen.next_id()
        clock.step(-2.0)
        assert_issues_nothing(gen, ClockMovedBackwardsError, 10, match="moved backwards by 2000")
        clock.step(2.0)
        assert gen.next_id()

    def test_monotonic_clock_ignores_system_steps(self):
        """The default clock never reads backwards: it has no rollback to handle."""
        clock = MonotonicClock()
        readings = [clock.time_ns() for _ in range(1000)]
        assert readings == sorted(readings) and clock.max_backward_ns == 0


class TestLease:
    def test_not_started_raises(self):
        """A generator issues nothing before start()."""
        gen = SnowflakeGenerator(SNOWFLAKE, ManualClock(), static())
        assert_issues_nothing(gen, NotStartedError, 3)

    def test_closed_raises(self):
        """After close() the generator refuses until started again."""
        gen, _ = manual_gen()
        gen.next_id()
        gen.close()
        with pytest.raises(NotStartedError):
            gen.next_id()
        gen.start()
        assert gen.next_id()

    def test_deadline_stops_ids_and_renewal_resumes(self):
        """Past the lease deadline no ID is issued; a successful renewal resumes."""
        gen, clock, alloc = leased_gen()
        try:
            gen.next_id()
            clock.advance(0.999)
            assert gen.next_id()
            clock.advance(0.002)
            assert_issues_nothing(gen, LeaseExpiredError, 5)
            assert gen.keeper.renew_once()
            assert gen.next_id()
        finally:
            gen.close()

    def test_wall_clock_jump_past_the_lease_bound_is_refused(self):
        """A wall clock that jumps forward (system clock) may not stamp IDs past the mark
        the allocator persisted for a successor; the next renewal moves the bound on."""
        gen, clock, alloc = leased_gen()
        before = gen.next_id()
        clock.step(5.0)  # wall jumps 5 s ahead; monotonic time (the deadline) is fine
        assert_issues_nothing(gen, LeaseExpiredError, 10, match="jumped forward")
        assert gen.keeper.renew_once()
        after = gen.next_id()
        assert after > before
        assert SNOWFLAKE.timestamp(after) <= SNOWFLAKE.time_of_tick(
            SNOWFLAKE.tick(gen.lease.stamp_until_ns))
        gen.close()

    def test_renewal_failure_keeps_old_deadline(self):
        """A failed renewal counts, and IDs flow until the old deadline only."""
        gen, clock, alloc = leased_gen()
        alloc.fail = ConnectionError("database down")
        assert not gen.keeper.renew_once()
        assert gen.keeper.renew_failures == 1
        assert gen.next_id()
        clock.advance(1.5)
        with pytest.raises(LeaseExpiredError):
            gen.next_id()
        gen.close()

    def test_lost_lease_stops_for_good(self):
        """A renewal that finds the id taken revokes the generator (LeaseLostError)."""
        gen, clock, alloc = leased_gen()
        alloc.fail = LeaseLostError("version changed")
        assert not gen.keeper.renew_once()
        with pytest.raises(LeaseLostError, match="version changed"):
            gen.next_id()
        assert gen.stats().lost == "version changed"
        gen.close()

    def test_allocator_push_stops_at_once(self):
        """An allocator that learns of a loss itself (ZooKeeper LOST) stops IDs at once."""
        gen, clock, alloc = leased_gen()
        assert gen.next_id()
        alloc.pushed("lost", "session 0x1 expired")
        with pytest.raises(LeaseLostError, match="session 0x1 expired"):
            gen.next_id()
        gen.close()
        assert alloc.pushed is None

    def test_restart_on_loss_takes_a_new_lease(self):
        """on_lease_lost="restart": a lost lease is replaced in the background; IDs
        resume under the new worker id and epoch, above every earlier ID."""
        import time

        gen, clock, alloc = leased_gen(on_lease_lost="restart")
        before = gen.next_id()
        alloc.pushed("lost", "session expired")
        for _ in range(500):
            if gen.lease is not None and gen.lease.epoch == 2 and gen.keeper.lost is None:
                break
            time.sleep(0.01)
        after = gen.next_id()
        assert gen.worker_id == 10 and gen.lease.epoch == 2
        assert SNOWFLAKE.decompose(after)["worker"] == 10 and after > before
        gen.close()

    def test_high_water_mark_is_waited_for(self):
        """A lease with not_before in the near future waits; IDs are stamped after it."""
        clock = ManualClock()
        alloc = LeasedAllocator(clock, not_before_ns=clock.time_ns() + 50 * MS)
        gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc).start()
        first = gen.next_id()
        assert SNOWFLAKE.tick(alloc.not_before_ns) <= SNOWFLAKE.decompose(first)["time"]
        gen.close()
        assert alloc.released and alloc.released[-1] > alloc.not_before_ns

    def test_high_water_mark_too_far_ahead_refuses(self):
        """A previous holder far in this host's future means a broken clock: refuse, and
        close the allocator (nothing else would: the generator never started)."""
        clock = ManualClock()
        alloc = LeasedAllocator(clock, not_before_ns=clock.time_ns() + 60 * 1_000 * MS)
        with pytest.raises(WaitTooLongError, match="max_start_wait"):
            SnowflakeGenerator(SNOWFLAKE, clock, alloc, max_start_wait_s=5).start()
        assert alloc.closed
        assert alloc.released == [alloc.not_before_ns]  # given back, the mark kept

    def test_stats(self):
        """stats() counts IDs, singles and batches, and exposes the lease numbers."""
        clock = ManualClock()
        gen = SnowflakeGenerator(SNOWFLAKE, clock, LeasedAllocator(clock)).start()
        for _ in range(5000):
            gen.next_id()
        assert gen.stats().ids_drawn == 5000
        gen.next_ids(10_000)
        gen.next_id()
        clock.advance(0.01)
        gen.next_ids(3)
        stats = gen.stats()
        # a batch that takes over a tick's counter burns one draw of it
        assert 15_004 <= stats.ids_drawn <= 15_006
        assert stats.worker_id == 9 and stats.epoch == 1
        assert 0.9 < stats.lease_remaining_s <= 1.0
        gen.close()


class TestOverflowAndNodes:
    def test_time_overflow(self):
        """Past the last tick of the time field the generator raises."""
        short = BitLayout("short", [["time", 20], ["worker", 31], ["sequence", 12]],
                          epoch_ms="2026-01-01T00:00:00Z", unit_ns="1ms")
        clock = ManualClock()
        clock.advance(2 ** 20 / 1000 + 1)
        gen = SnowflakeGenerator(short, clock, static()).start()
        with pytest.raises(TimeOverflowError, match="time field is full"):
            gen.next_id()

    def test_region_node_field(self):
        """Fixed node fields from config go into every ID."""
        from flakekit.builtin.layouts import REGION_SPLIT

        gen = SnowflakeGenerator(REGION_SPLIT, ManualClock(), static(100),
                                 nodes={"region": 6}).start()
        parts = REGION_SPLIT.decompose(gen.next_id())
        assert parts["region"] == 6 and parts["worker"] == 100

    def test_worker_out_of_range(self):
        """A static worker id outside the layout's range names the field."""
        from flakekit.errors import ConfigError

        with pytest.raises(ConfigError, match="outside the layout's worker range 0..1023"):
            SnowflakeGenerator(SNOWFLAKE, ManualClock(), static(1024)).start()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
class TestFork:
    def test_child_refuses_until_restarted(self):
        """A forked child raises ForkedProcessError; restart() gives it its own lease."""
        gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(), static()).start()
        parent_ids = [gen.next_id() for _ in range(100)]

        def child() -> bytes:
            try:
                gen.next_id()
            except ForkedProcessError:
                return b"0"
            return b"3"

        assert in_forked_child(child) == b"0"
        assert gen.next_id() > parent_ids[-1]

    def test_restart_in_a_child_refuses_the_parents_static_id(self, monkeypatch):
        """A static worker id cannot be shared with the parent: restart() in the child
        refuses it, and works once the child names its own id."""
        monkeypatch.setenv("FLAKEKIT_WORKER_ID", "5")
        gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(),
                                 StaticAllocator(StaticSettings())).start()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                gen.restart()
                code = 3
            except ForkedProcessError as exc:
                code = 0 if "parent's fixed id" in str(exc) else 4
            if code == 0:
                os.environ["FLAKEKIT_WORKER_ID"] = "6"
                try:
                    gen.restart()
                    code = 0 if SNOWFLAKE.decompose(gen.next_id())["worker"] == 6 else 5
                except Exception:  # noqa: BLE001 - any failure is the test's failure
                    code = 6
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert SNOWFLAKE.decompose(gen.next_id())["worker"] == 5

    def test_child_refuses_even_if_a_parent_thread_held_the_lock(self):
        """fork() while another thread sits in the slow path: the child still raises
        (it gets a fresh lock) instead of hanging."""
        gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(), static()).start()
        gen._lock.acquire()  # as if a parent thread were inside the slow path
        try:
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    gen.next_id()
                except ForkedProcessError:
                    code = 0
                os._exit(code)
        finally:
            gen._lock.release()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_package_function_survives_module_import():
    """`flakekit.snowflake` stays the function even after the module is imported."""
    import importlib

    import flakekit

    module = importlib.import_module("flakekit.generators.snowflake")
    assert module is sys.modules["flakekit.generators.snowflake"]
    assert callable(flakekit.snowflake) and flakekit.snowflake is not module
    gen = flakekit.snowflake(worker_id=3)
    assert gen.next_id() > 0
    gen.close()


class TestLeaseRaces:
    def test_loss_pushed_while_a_renewal_is_in_flight_stays_lost(self):
        """The allocator pushes "lost" while a renewal is on the wire; the renewal then
        returns: its deadline must not bring the lost lease back."""
        gen, clock, alloc = leased_gen()
        alloc.during_renew = lambda lease: alloc.pushed("lost", "session expired")
        assert not gen.keeper.renew_once()
        with pytest.raises(LeaseLostError, match="session expired"):
            gen.next_id()
        gen.close()

    def test_stale_renewal_does_not_replace_a_reacquired_lease(self):
        """A renewal of the old lease that lands after the background re-acquire must not
        put the old lease back in place of the new one."""
        import time

        gen, clock, alloc = leased_gen(on_lease_lost="restart")
        old = gen.lease

        def during_renew(lease):
            alloc.pushed("lost", "session expired")  # the watcher fires meanwhile
            for _ in range(500):
                if gen.lease is not old and gen.keeper.lost is None:
                    break
                time.sleep(0.01)

        alloc.during_renew = during_renew
        assert not gen.keeper.renew_once()
        assert gen.lease is not old and gen.worker_id == 10
        assert SNOWFLAKE.decompose(gen.next_id())["worker"] == 10
        gen.close()
        assert alloc.released  # the new lease was given back


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_close_in_a_forked_child_keeps_the_parents_lease():
    """close() (e.g. a `with` block or Kit.close) in a forked child must not release the
    parent's worker id: the parent still issues IDs under it."""
    gen, clock, alloc = leased_gen()

    def child() -> bytes:
        gen.close()
        return b"%d" % len(alloc.released)

    assert in_forked_child(child) == b"0"
    assert gen.next_id()
    gen.close()


class _ScriptedClock:
    """A ManualClock that runs a queued action inside its next reading (to pin a
    thread switch to an exact point of the hot path)."""

    def __init__(self) -> None:
        self.inner = ManualClock()
        self.on_wall: list = []
        self.on_mono: list = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def time_ns(self) -> int:
        if self.on_wall:
            self.on_wall.pop(0)()
        return self.inner.time_ns()

    def monotonic_ns(self) -> int:
        if self.on_mono:
            self.on_mono.pop(0)()
        return self.inner.monotonic_ns()


def test_draw_after_a_loss_is_rejected_even_if_a_new_lease_is_bound_before_the_check():
    """Thread A reads the clock, the lease is lost (revoke), A draws from the tick's
    counter, a new lease (another worker id) is bound, A checks the deadline: A must not
    return an ID with the lost worker id, formed after the loss."""
    clock = _ScriptedClock()
    alloc = LeasedAllocator(clock.inner)
    gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc).start()
    assert SNOWFLAKE.decompose(gen.next_id())["worker"] == 9
    new_lease = WorkerLease(10, 2, "t", 1.0, clock.inner.monotonic_ns() + 10**9)
    clock.on_wall.append(lambda: gen.revoke("session expired"))   # before A's draw

    def rebind() -> None:  # before A's deadline check (not from inside A's slow path)
        if not gen._lock.locked():
            gen.bind(new_lease)

    clock.on_mono.append(rebind)
    try:
        got = gen.next_id()
    except LeaseLostError:
        return
    assert SNOWFLAKE.decompose(got)["worker"] == 10


def test_epoch_in_the_future_says_so():
    """A layout whose epoch is after the clock cannot stamp IDs: the error names the
    epoch instead of claiming the clock moved backwards."""
    from flakekit.errors import LayoutError

    future = BitLayout("future", [["time", 41], ["worker", 10], ["sequence", 12]],
                       epoch_ms="2099-01-01T00:00:00Z", unit_ns="1ms")
    gen, _ = manual_gen(layout=future)
    assert_issues_nothing(gen, LayoutError, 3, match="epoch")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_restart_in_child_even_if_a_parent_thread_was_starting():
    """fork() while a parent thread sits in start(): restart() in the child must not
    hang on the start lock it inherited held."""
    gen = SnowflakeGenerator(SNOWFLAKE, MonotonicClock(), static()).start()
    gen._starting.acquire()  # as if a parent thread were inside start()
    try:
        pid = os.fork()
        if pid == 0:
            import signal

            signal.alarm(3)  # a hang ends the child with SIGALRM
            code = 3
            try:
                gen.keeper.allocator.settings = StaticSettings(worker_id=6)  # its own id
                gen.restart()
                code = 0 if gen.next_id() else 4
            finally:
                os._exit(code)
    finally:
        gen._starting.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


class TestCounterWithoutPickling:
    """Issue 9 item 5: the counter was read through ``count.__reduce__`` (deprecated in
    3.12, gone in 3.14). Fails before the fix on 3.12 and 3.13 (``.ci/run`` runs both)."""

    @pytest.mark.parametrize("args", [(0,), (7,), (7, 4096), (-3, 2), (2**70, 1 << 22)])
    def test_peek_reads_without_drawing(self, args):
        import itertools
        import warnings

        from flakekit.values.counter import peek

        counter = itertools.count(*args)
        step = args[1] if len(args) > 1 else 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert peek(counter) == args[0]
            next(counter)
            assert peek(counter) == peek(counter) == args[0] + step
        assert next(counter) == args[0] + step

    def test_tick_changes_and_stats_raise_no_deprecation(self):
        import warnings

        gen, clock = manual_gen()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ids = []
            for _ in range(50):            # 50 tick changes, each closes a counter
                ids += [gen.next_id(), gen.next_id()]
                clock.advance(0.001)
            ids += gen.next_ids(5)
            assert ids == sorted(set(ids)) and len(ids) == 105
            assert 105 <= gen.stats().ids_drawn <= 106
