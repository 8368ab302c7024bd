"""Run one function in many threads at once, and check that what they got is unique; run
one call in a thread of its own (:class:`Call`), to see whether it hangs; keep loops
running in threads until told to stop (:class:`Loops`), as a drill's clients do."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["Call", "Loops", "assert_disjoint", "assert_unique", "in_threads"]

T = TypeVar("T")


def in_threads(fn: Callable[[int], T], count: int, *, timeout: float = 300.0) -> list[T]:
    """``fn(0) ... fn(count - 1)`` in ``count`` threads released together by a barrier;
    their results in index order. The first exception a thread raised is re-raised here
    (a race that fails in a thread must fail the test, not print a warning)."""
    barrier = threading.Barrier(count)
    results: list[T | None] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if any(thread.is_alive() for thread in threads):
        raise AssertionError(f"in_threads: a thread was still running after {timeout:g} s")
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


def assert_unique(values: Iterable[object]) -> None:
    """Fail naming the duplicates (a duplicate ID is the bug flakekit exists to prevent)."""
    seen: set[object] = set()
    dupes: list[object] = []
    count = 0
    for value in values:
        count += 1
        if value in seen:
            dupes.append(value)
        seen.add(value)
    if dupes:
        raise AssertionError(f"{len(dupes)} duplicate(s) among {count} values: {dupes[:10]}")


def assert_disjoint(ranges: Iterable[range]) -> None:
    """Fail when any two ranges overlap (segments handed out twice)."""
    ordered = sorted((r for r in ranges if len(r)), key=lambda r: r.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.stop:
            raise AssertionError(f"ranges overlap: {before} and {after}")


class Call:
    """``fn()`` in a daemon thread, started at once: ``join()`` says whether it finished
    (``thread`` is there to look while it runs)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc

    def error_after(self, timeout: float = 120.0, what: str | None = None) -> BaseException | None:
        """Wait up to ``timeout`` s, failing with ``what`` (default: how long it waited)
        unless the call finished; the error it raised, or None."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), what or f"still waiting after {timeout} s"
        return self.error

    def join(self, timeout: float = 120.0) -> Any:
        """Wait up to ``timeout`` s (failing unless the call finished); what it returned,
        or its error raised here."""
        error = self.error_after(timeout)
        if error is not None:
            raise error
        return self.result


class Loops:
    """``target(arg)`` for each of ``args``, each in a daemon thread of its own, once
    started; the targets loop until ``stopping`` is set, which :meth:`stop` does."""

    def __init__(self, target: Callable[[Any], None], args: Iterable[Any]) -> None:
        self.stopping = threading.Event()
        self._threads = [threading.Thread(target=target, args=(arg,), daemon=True)
                         for arg in args]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float) -> None:
        """Set ``stopping``, then wait for each running thread, ``timeout`` s at most each
        (before :meth:`start` there is none to wait for)."""
        self.stopping.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
