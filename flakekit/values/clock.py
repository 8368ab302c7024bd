"""Clocks: where generators get time from.

A clock gives two readings in nanoseconds: ``monotonic_ns()`` (for lease deadlines and
waits; never goes back) and ``time_ns()`` (wall time since the Unix epoch; what IDs carry).
A clock whose wall time is a fixed offset from its monotonic reading sets ``offset_ns``;
generators then read the clock once per ID instead of twice.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import attrs

from flakekit.values.timeunits import Duration, duration_field

__all__ = ["Clock", "MonotonicClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What a generator needs from a clock. Plugins return objects of this shape."""

    @property
    def name(self) -> str:
        """The registered name, for messages and hooks."""

    @property
    def max_backward_ns(self) -> int:
        """How far the wall clock may step back before generators refuse (0: never)."""

    @property
    def offset_ns(self) -> int | None:
        """When not None, ``time_ns() == monotonic_ns() + offset_ns`` always."""

    def monotonic_ns(self) -> int: ...
    def time_ns(self) -> int: ...
    def sleep(self, seconds: float) -> None: ...


@attrs.frozen
class MonotonicSettings:
    """The ``monotonic`` clock has no settings."""


@attrs.define
class MonotonicClock:
    """Wall time read once, then advanced by the monotonic clock (the default).

    It cannot run backwards inside a process, whatever NTP or an operator does to the
    system clock (like Go's sonyflake). Its wall time drifts from the system clock by
    whatever the system clock is stepped after start; restarts re-read it.
    """

    name: str = "monotonic"
    max_backward_ns: int = 0
    offset_ns: int = attrs.field(factory=lambda: time.time_ns() - time.monotonic_ns())

    monotonic_ns = staticmethod(time.monotonic_ns)

    def time_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns

    sleep = staticmethod(time.sleep)

    @classmethod
    def from_settings(cls, settings: MonotonicSettings | None = None) -> MonotonicClock:
        return cls()


@attrs.frozen
class SystemSettings:
    """Settings of the ``system`` clock.

    Attributes:
        max_backward: how far back the wall clock may step before generators raise
            ``ClockMovedBackwardsError`` instead of waiting (default 5 ms).
    """

    # a bare number in config is milliseconds
    max_backward: Duration = duration_field("5ms", unit="ms")


@attrs.define
class SystemClock:
    """The host's wall clock (``time.time_ns``), with the rollback policy.

    Generators wait out a step back of up to ``max_backward`` and raise beyond it; the
    ``flakekit_clock_moved_backwards`` hook fires either way.
    """

    name: str = "system"
    max_backward_ns: int = 5_000_000
    offset_ns: None = None

    monotonic_ns = staticmethod(time.monotonic_ns)
    time_ns = staticmethod(time.time_ns)
    sleep = staticmethod(time.sleep)

    @classmethod
    def from_settings(cls, settings: SystemSettings | None = None) -> SystemClock:
        settings = settings or SystemSettings()
        return cls(max_backward_ns=settings.max_backward)
