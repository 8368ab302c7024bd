"""The clock fixtures of the contract suites: ``OnWallClock``, the contracts' own (real
time: a test sleeps), and ``OnManualClock`` for a binding whose stores run on a
:class:`~flakekit.testing.clock.ManualClock` (the in-memory fakes, and SQL stores whose
lease deadlines are on the node's clock)::

    class TestMyMembership(OnManualClock, MembershipContract):
        @pytest.fixture
        def make_membership(self, clock, closing): ...

The contract's ``monotonic_ns`` and ``pass_time`` are then the clock's, so a test moves
time instead of sleeping. Needs pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from flakekit.testing.clock import ManualClock

__all__ = ["OnManualClock", "OnWallClock"]


class OnWallClock:
    """Base of the contract classes: ``monotonic_ns`` and ``pass_time`` on the real
    clock (a binding whose backend keeps time of its own overrides them)."""

    @pytest.fixture
    def monotonic_ns(self) -> Callable[[], int]:
        """The stores' clock's monotonic time (deadlines are on it)."""
        return time.monotonic_ns

    @pytest.fixture
    def pass_time(self) -> Callable[[float], None]:
        """``pass_time(seconds)``: let time go by on the stores' clock."""
        return time.sleep


class OnManualClock:
    """Mixin (before the contract class): ``clock`` (a ManualClock at the current wall
    time), and the contract's ``monotonic_ns`` and ``pass_time`` on it."""

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(wall_ns=time.time_ns())

    @pytest.fixture
    def monotonic_ns(self, clock: ManualClock) -> Callable[[], int]:
        return clock.monotonic_ns

    @pytest.fixture
    def pass_time(self, clock: ManualClock) -> Callable[[float], None]:
        return clock.advance
