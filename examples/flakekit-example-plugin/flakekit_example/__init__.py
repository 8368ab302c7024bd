"""flakekit-example-plugin: the smallest complete third-party flakekit plugin.

It registers

* a layout, ``js-safe``: 53 bits, so every ID is an exact JavaScript number
  (``Number.MAX_SAFE_INTEGER`` is 2^53 - 1): 41 time bits (1 ms, epoch
  2024-01-01T00:00:00Z, good until 2093) / 4 worker bits (16 workers) / 8 sequence bits
  (256 IDs per ms, 256,000 IDs/s per worker);
* a clock, ``offset``: the monotonic clock shifted by a configured number of
  milliseconds, e.g. ``clock = {type = "offset", offset_ms = -250}`` on a host whose
  system clock is known to run 250 ms fast;
* a strategy, ``counter``: ``strategy = "counter"`` in a ``[generators.NAME]`` table gives
  consecutive integers from ``start`` (default 1). It shows the whole generator contract
  (``start``, ``next_id``, ``next_ids``, ``close``) and nothing else. Demo only: it keeps
  no state, so each process starts again at ``start`` -- never use it where IDs must be
  unique across processes or restarts.

The package name (``flakekit_example``) is what the ``flakekit`` entry point names in
``pyproject.toml``; pluggy registers the module itself, so the ``@hookimpl`` functions
below are the whole plugin.
"""

from __future__ import annotations

import threading
import time

import attrs

from flakekit import hookimpl
from flakekit.plugin import BitLayout

__all__ = ["JS_SAFE", "CounterGenerator", "CounterSettings", "OffsetClock", "OffsetSettings"]

JS_SAFE = BitLayout(
    name="js-safe",
    fields=[["time", 41], ["worker", 4], ["sequence", 8]],
    unit_ns="1ms",
    epoch_ms="2024-01-01T00:00:00Z",
    total_bits=53,
    description="JavaScript-safe: 41 time (1 ms, epoch 2024) / 4 worker / 8 sequence, 53 bits",
)


@attrs.frozen
class OffsetSettings:
    """``clock = {type = "offset", offset_ms = ...}``.

    Attributes:
        offset_ms: milliseconds added to the wall time (negative moves it back).
            Default 0. Rejected unless it is an integer within +-1 day.
    """

    offset_ms: int = attrs.field(
        default=0,
        validator=[
            attrs.validators.instance_of(int),
            attrs.validators.ge(-86_400_000),
            attrs.validators.le(86_400_000),
        ],
    )


@attrs.define
class OffsetClock:
    """Wall time read once at start, shifted by ``offset_ms``, then advanced by the
    monotonic clock: it never runs backwards inside a process.

    It satisfies :class:`flakekit.values.clock.Clock`. Because its wall time is always the
    monotonic reading plus a constant, it sets ``offset_ns`` and generators read it once
    per ID.
    """

    offset_ms: int = 0
    name: str = "offset"
    max_backward_ns: int = 0
    offset_ns: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns() + self.offset_ms * 1_000_000

    monotonic_ns = staticmethod(time.monotonic_ns)

    def time_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns

    sleep = staticmethod(time.sleep)

    @classmethod
    def from_settings(cls, settings: OffsetSettings) -> OffsetClock:
        return cls(offset_ms=settings.offset_ms)


@hookimpl
def flakekit_register_layouts(register):
    """Add the ``js-safe`` layout."""
    register("js-safe", JS_SAFE, description=JS_SAFE.description)


@hookimpl
def flakekit_register_clocks(register):
    """Add the ``offset`` clock, configured by :class:`OffsetSettings`."""
    register(
        "offset", OffsetClock.from_settings, settings=OffsetSettings,
        description="monotonic wall time shifted by offset_ms (never goes back)",
    )


@attrs.frozen
class CounterSettings:
    """``strategy = "counter"``: the generator table's other keys.

    Attributes:
        start: the first ID. Default 1. Rejected unless it is a positive integer.
    """

    start: int = attrs.field(default=1, validator=attrs.validators.ge(1))


@attrs.define
class CounterGenerator:
    """Consecutive integers from ``start``, for one process (demo only, see above)."""

    start_at: int = 1
    _next: int = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self._next = self.start_at

    def start(self) -> CounterGenerator:
        return self

    def next_id(self) -> int:
        return self.next_ids(1)[0]

    def next_ids(self, n: int) -> range:
        with self._lock:  # one contiguous block, even with other threads drawing
            first, self._next = self._next, self._next + n
        return range(first, first + n)

    def close(self) -> None:
        pass

    @classmethod
    def from_settings(cls, settings: CounterSettings, context: object) -> CounterGenerator:
        return cls(settings.start)


@hookimpl
def flakekit_register_strategies(register):
    """Add the ``counter`` strategy, configured by :class:`CounterSettings`."""
    register(
        "counter", CounterGenerator.from_settings, settings=CounterSettings,
        description="consecutive integers from `start`, one process only (demo)",
    )
