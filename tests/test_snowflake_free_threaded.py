"""SnowflakeGenerator's free-threaded (no-GIL) path, forced on any build, and fork() while a
parent thread holds the generator's lock; and the shape of the measured hot loop."""

from __future__ import annotations

import dis
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from flakekit.builtin.layouts import SNOWFLAKE, SONYFLAKE
from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.errors import ForkedProcessError
from flakekit.generators import snowflake_core
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.testing import ManualClock, in_threads
from flakekit.values.clock import MonotonicClock, SystemClock

#: how long a child or a thread may take to answer before it counts as blocked (a bound
#: for a hang, never an assertion on speed)
BLOCKED_S = 60.0


@pytest.fixture(params=[True, False], ids=["gil", "no-gil"])
def gil(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Build generators as on a GIL build, or as on a free-threaded one (forced)."""
    monkeypatch.setattr(snowflake_core, "GIL_ENABLED", request.param)
    yield request.param


def started(workers: int) -> SnowflakeGenerator:
    ids = 5 if workers == 1 else f"5-{4 + workers}"
    return SnowflakeGenerator(SNOWFLAKE, MonotonicClock(),
                              StaticAllocator(StaticSettings(worker_id=ids)),
                              workers=workers).start()


class Holder:
    """A thread that takes the generator's lock and keeps it until released, as a
    parent thread inside the slow path at the moment of fork()."""

    def __init__(self, gen: SnowflakeGenerator) -> None:
        self.lock = gen._lock
        self.taken, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.taken.wait(BLOCKED_S)

    def _hold(self) -> None:
        with self.lock:
            self.taken.set()
            self.done.wait()

    def release(self) -> None:
        self.done.set()
        self.thread.join(BLOCKED_S)


def outcome_in_thread(call) -> BaseException | str:
    """Run ``call`` in a thread; what it raised, or why it did not."""
    got: list[BaseException | str] = []

    def run() -> None:
        try:
            call()
            got.append("returned an ID")
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BLOCKED_S)
    return got[0] if got else "blocked on the pre-fork lock"


@pytest.mark.parametrize("workers", [1, 4])
def test_forced_no_gil_path_locks_every_draw(gil: bool, workers: int) -> None:
    """The flag decides at build time: free-threaded, next_id holds a re-entrant lock
    around the hot loop; the IDs stay unique and increasing per thread either way."""
    gen = started(workers)
    assert gen._core.gil is gil
    assert (type(gen._lock) is type(threading.RLock())) is not gil
    chunks = in_threads(lambda _: [gen.next_id() for _ in range(2000)], 4)
    flat = [i for chunk in chunks for i in chunk]
    assert len(set(flat)) == len(flat)
    assert all(a < b for chunk in chunks for a, b in zip(chunk, chunk[1:]))
    gen.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_after_fork_hook_gives_a_fresh_lock_in_process(gil: bool, workers: int) -> None:
    """What the child runs after fork() (the at-fork hook), run here while another
    thread holds the lock: next_id and next_ids raise ForkedProcessError instead of
    waiting for a lock no thread of the child would ever release."""
    gen = started(workers)
    holder = Holder(gen)
    try:
        gen._forked()
        assert gen._lock is not holder.lock
        assert isinstance(outcome_in_thread(gen.next_id), ForkedProcessError)
        assert isinstance(outcome_in_thread(lambda: gen.next_ids(3)), ForkedProcessError)
    finally:
        holder.release()
    gen.close()


def wait_child(pid: int) -> int:
    """The child's exit code; a child still running after BLOCKED_S is killed and fails
    the test."""
    give_up = time.monotonic() + BLOCKED_S
    while time.monotonic() < give_up:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child blocked for {BLOCKED_S:g} s instead of raising "
                "ForkedProcessError")


def child_draws(gen: SnowflakeGenerator) -> int:
    """In the child: 0 when next_id raises ForkedProcessError."""
    signal.alarm(int(BLOCKED_S) * 2)   # a backstop if the parent is gone
    try:
        gen.next_id()
    except ForkedProcessError:
        return 0
    except BaseException:  # noqa: BLE001 - any other outcome fails the test
        return 2
    return 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_fork_while_a_parent_thread_holds_the_lock(gil: bool, workers: int) -> None:
    """os.fork() while another thread holds the generator's lock: the lock stays held
    for ever in the child, which must raise ForkedProcessError, not block."""
    gen = started(workers)
    first = gen.next_id()
    holder = Holder(gen)
    try:
        with warnings.catch_warnings():   # 3.12+: fork() of a multi-threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(child_draws(gen))
        assert wait_child(pid) == 0
    finally:
        holder.release()
    assert gen.next_id() > first   # the parent goes on
    gen.close()


@pytest.mark.parametrize("clock", [MonotonicClock(), SystemClock(), ManualClock()],
                         ids=["offset", "wall", "manual"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("layout", [SNOWFLAKE, SONYFLAKE], ids=["snowflake", "sonyflake"])
def test_the_hot_loop_is_a_clock_read_a_draw_and_two_compares(clock, workers, layout) -> None:
    """next_id's own code: no global, no attribute but the counter's, and no call but
    the clock, the draw and the slow path (a call added here costs every ID)."""
    gen = SnowflakeGenerator(layout, clock, StaticAllocator(StaticSettings(
        worker_id=5 if workers == 1 else "5-6")), workers=workers)
    ops = list(dis.get_instructions(gen.next_id))
    calls = [op for op in ops if op.opname in ("CALL", "CALL_FUNCTION")]
    attrs = {op.argval for op in ops if op.opname in ("LOAD_ATTR", "LOAD_METHOD")}
    assert not [op for op in ops if op.opname == "LOAD_GLOBAL"]
    assert attrs <= {"tick", "draw", "limit", "deadline"}
    assert len(calls) == (3 if clock.offset_ns is not None else 4)   # + the slow path
    compares = [op for op in ops if op.opname == "COMPARE_OP"]
    assert len(compares) == 3   # the tick, the counter's limit, the deadline
