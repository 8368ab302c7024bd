"""FetchPool: a few threads that run the background fetches of many segment keys.

A thread per key (what a generator had) cannot serve a Leaf table of 100,000 ``biz_tag``s:
each thread takes a process id (``kernel.pid_max`` bounds the whole host) and a stack.
Leaf itself updates segments from one shared pool, and so does this: a generator asks its
:class:`FetchJob` to run when it wants a segment, and one of at most ``max_workers``
threads runs it.

* At most one run per job at a time: a request while it runs makes it run once more
  after (the job itself decides whether there is anything to fetch), so a key's fetches
  stay one after another, as with its own thread.
* A failed fetch returns its back-off delay; the job waits on the pool's timer heap, which
  the idle workers watch (their wait ends at the earliest due time). No worker sleeps
  through a back-off, and no thread exists per key.
* Workers are daemon threads named ``flakekit-segment-fetch-N``, started only when queued
  jobs outnumber idle workers, and leave after ``idle_timeout`` with nothing to do.
* After ``fork()`` the child's pool is a fresh one: no threads, no jobs (the parent's
  generators refuse to serve in the child anyway).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from flakekit.values.forks import after_fork_in_child

__all__ = ["FetchJob", "FetchPool", "shared_pool"]

log = logging.getLogger("flakekit.segment")

#: one number per worker thread in the process: names stay unique across pools
_NUMBERS = itertools.count(1)
#: a job that raised (a bug: generators catch their errors) runs again after this long
_CRASH_DELAY = 1.0

_IDLE, _QUEUED, _RUNNING, _WAITING, _CANCELLED = range(5)


class FetchJob:
    """One generator's fetch, run by the pool. ``run()`` returns ``None`` (done), ``0``
    (run again, behind the other queued jobs) or a delay in seconds (a back-off)."""

    __slots__ = ("_again", "_cancelled", "_runner", "_state", "_token", "name", "pool", "run")

    def __init__(self, pool: FetchPool, run: Callable[[], float | None], name: str) -> None:
        self.pool, self.run, self.name = pool, run, name
        self._state = _IDLE
        self._again = False
        self._cancelled = False
        self._runner: int | None = None
        self._token = 0   # invalidates an older timer entry

    def request(self) -> None:
        """Run soon (no-op while queued or backing off; once more after a running one)."""
        self.pool._request(self)

    def cancel(self, timeout: float = 5.0) -> bool:
        """Never run again; wait up to ``timeout`` for a run in flight. False: still running."""
        return self.pool._cancel(self, timeout)

    @property
    def running(self) -> bool:
        return self._state == _RUNNING


class FetchPool:
    """At most ``max_workers`` threads running :class:`FetchJob`\\ s. Thread-safe.

    Args:
        max_workers: the most threads it starts (at least 1).
        name: thread name prefix (``NAME-N``).
        idle_timeout: seconds an idle worker stays before it exits.
    """

    def __init__(self, max_workers: int = 8, *, name: str = "flakekit-segment-fetch",
                 idle_timeout: float = 30.0) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be an integer of at least 1, got {max_workers!r}")
        self.max_workers = max_workers
        self.name = name
        self.idle_timeout = idle_timeout
        self._fresh()
        after_fork_in_child(self, FetchPool._fresh)

    def _fresh(self) -> None:
        """Empty state (also the child's after fork: the parent's threads are not there)."""
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)   # workers wait here for jobs
        self._done = threading.Condition(self._lock)   # cancel() waits here for a run
        self._ready: deque[FetchJob] = deque()
        self._timers: list[tuple[float, int, int, FetchJob]] = []
        self._seq = itertools.count()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._closed = False

    def job(self, run: Callable[[], float | None], name: str = "") -> FetchJob:
        """A job for one generator (idle until requested)."""
        return FetchJob(self, run, name)

    @property
    def threads(self) -> int:
        """Worker threads alive now."""
        with self._lock:
            return len(self._threads)

    # -- jobs (the lock is the pool's; never held while a job runs) -----------------------
    def _request(self, job: FetchJob) -> None:
        with self._lock:
            if self._closed or job.pool is not self:
                return
            if job._state == _IDLE:
                job._state = _QUEUED
                self._ready.append(job)
                self._wake_locked()
            elif job._state == _RUNNING:
                job._again = True

    def _cancel(self, job: FetchJob, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            # queued or timed entries are skipped when reached (no O(n) removal)
            job._cancelled, job._again = True, False
            if job._state != _RUNNING:
                job._state = _CANCELLED
                return True
            if job._runner == threading.get_ident():
                return True   # closed from inside its own fetch: nothing to wait for
            while job._state == _RUNNING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
            return True

    def _wake_locked(self) -> None:
        if len(self._ready) > self._idle and len(self._threads) < self.max_workers:
            thread = threading.Thread(target=self._worker, name=f"{self.name}-{next(_NUMBERS)}",
                                      daemon=True)
            self._threads.add(thread)
            self._idle += 1   # counted idle until it looks at the queue
            try:
                thread.start()
            except RuntimeError as exc:   # out of threads: the workers there are will do
                self._threads.discard(thread)
                self._idle -= 1
                log.warning("%s: cannot start a fetch thread (%s); %d running", self.name,
                            exc, len(self._threads))
                self._work.notify()
        else:
            self._work.notify()

    def _take_locked(self) -> FetchJob | None:
        now = time.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, token, job = heapq.heappop(timers)
            if job._state == _WAITING and job._token == token:
                job._state = _QUEUED
                self._ready.append(job)
        while self._ready:
            job = self._ready.popleft()
            if job._state == _QUEUED:
                return job
        return None

    def _worker(self) -> None:
        me = threading.current_thread()
        with self._lock:
            self._idle -= 1
            try:
                while not self._closed:
                    job = self._take_locked()
                    if job is None:
                        timeout = self.idle_timeout
                        if self._timers:
                            timeout = min(timeout, max(0.0, self._timers[0][0] - time.monotonic()))
                        self._idle += 1
                        try:
                            woke = self._work.wait(timeout)
                        finally:
                            self._idle -= 1
                        if not woke and not self._timers and not self._ready:
                            return   # idle for idle_timeout: a new request starts a worker
                        continue
                    self._run_locked(job)
            finally:
                self._threads.discard(me)
                self._done.notify_all()

    def _run_locked(self, job: FetchJob) -> None:
        job._state, job._runner, job._again = _RUNNING, threading.get_ident(), False
        self._lock.release()
        try:
            result: float | None = job.run()
        except Exception:  # a bug in the job: report it, keep the thread
            log.exception("%s: unexpected error in a segment fetch job", job.name or "fetch")
            result = _CRASH_DELAY
        finally:
            self._lock.acquire()
        job._runner = None
        if job._cancelled or self._closed:
            job._state = _CANCELLED
        elif result is None and not job._again:
            job._state = _IDLE
        elif result is None or result <= 0:
            job._state = _QUEUED
            self._ready.append(job)
        else:
            job._state = _WAITING
            job._token += 1
            heapq.heappush(self._timers, (time.monotonic() + result, next(self._seq),
                                          job._token, job))
            self._work.notify()   # an idle worker's wait may now end too late
        job._again = False
        self._done.notify_all()

    # -- shutdown -------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> bool:
        """Stop every worker (a run in flight finishes first, up to ``timeout``); jobs
        requested later never run. False: a worker was still busy at the deadline."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            self._ready.clear()
            self._timers.clear()
            self._work.notify_all()
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def __repr__(self) -> str:
        return f"FetchPool(name={self.name!r}, max_workers={self.max_workers})"


#: the pool of stand-alone generators (and cluster strict keys): bounded, started lazily
SHARED_WORKERS = 16
_shared: FetchPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> FetchPool:
    """The process-wide pool a generator uses when it is given none."""
    global _shared
    pool = _shared
    if pool is None:
        with _shared_lock:
            if _shared is None:
                _shared = FetchPool(SHARED_WORKERS)
            pool = _shared
    return pool


def _reset_shared_lock() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_shared_lock)
