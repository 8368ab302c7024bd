"""A manual clock: time moves only when a test says so."""

from __future__ import annotations

import threading

import attrs

__all__ = ["ManualClock"]

_START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


@attrs.define
class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instead of waiting.

    ``advance()`` moves wall and monotonic time together; ``set()`` and ``step()`` move
    the wall clock alone, the way NTP or an operator steps a real one.
    """

    wall_ns: int = _START_NS
    mono_ns: int = 1_000_000_000
    name: str = "manual"
    max_backward_ns: int = 5_000_000
    offset_ns: None = None
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def time_ns(self) -> int:
        return self.wall_ns

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        delta = round(seconds * 1e9) + ns
        if delta < 0:
            raise ValueError("advance() goes forward only; use step() to move the wall clock back")
        with self._lock:
            self.wall_ns += delta
            self.mono_ns += delta

    def set(self, wall_ns: int) -> None:
        """Set the wall clock (monotonic time does not move)."""
        self.wall_ns = wall_ns

    def step(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        """Step the wall clock by a signed amount (monotonic time does not move)."""
        self.wall_ns += round(seconds * 1e9) + ns

    def sleep(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0) or 1e-6)
