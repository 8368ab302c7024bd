"""Run one function in many threads at once, and check that what they got is unique."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["assert_disjoint", "assert_unique", "in_threads"]

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
