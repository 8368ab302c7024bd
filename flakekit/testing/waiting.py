"""Polling instead of sleeping: a drill waits for the state it needs, not a fixed time.

A fixed ``time.sleep`` is either too short on a loaded machine (a flaky drill) or too long
on an idle one (a slow suite); ``wait_until`` returns as soon as the state is there and
fails with one line naming what it waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["seconds_until_raises", "wait_until"]


def wait_until(test: Callable[[], T], timeout: float = 10.0, *, what: str | None = None,
               interval: float = 0.02) -> T:
    """Call ``test`` every ``interval`` seconds until it returns something truthy, and
    return that; an AssertionError naming ``what`` (or ``test``) after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        got = test()
        if got:
            return got
        if time.monotonic() >= end:
            raise AssertionError(f"not within {timeout} s: {what or test}")
        time.sleep(interval)


def seconds_until_raises(call: Callable[[], object], error: type[BaseException] | tuple[
        type[BaseException], ...], since: float, timeout: float, *,
        interval: float = 0.002) -> float | None:
    """Call ``call`` every ``interval`` seconds until it raises ``error``; the seconds from
    ``since`` (a ``time.monotonic()`` reading) to then, or None if it still succeeds
    ``timeout`` s after ``since``: how long a generator went on issuing after its lease
    was taken away."""
    while time.monotonic() - since < timeout:
        try:
            call()
        except error:
            return time.monotonic() - since
        time.sleep(interval)
    return None
