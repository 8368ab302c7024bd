"""flakekit-example-plugin: the smallest complete third-party flakekit plugin.

It registers

* a layout, ``js-safe``: 53 bits, so every ID is an exact JavaScript number
  (``Number.MAX_SAFE_INTEGER`` is 2^53 - 1): 41 time bits (1 ms, epoch
  2024-01-01T00:00:00Z, good until 2093) / 4 worker bits (16 workers) / 8 sequence bits
  (256 IDs per ms, 256,000 IDs/s per worker);
* a clock, ``offset``: the monotonic clock shifted by a configured number of
  milliseconds, e.g. ``clock = {type = "offset", offset_ms = -250}`` on a host whose
  system clock is known to run 250 ms fast.

The package name (``flakekit_example``) is what the ``flakekit`` entry point names in
``pyproject.toml``; pluggy registers the module itself, so the ``@hookimpl`` functions
below are the whole plugin.
"""

from __future__ import annotations

import time

import attrs

from flakekit import hookimpl
from flakekit.layout import BitLayout

__all__ = ["JS_SAFE", "OffsetClock", "OffsetSettings"]

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

    It satisfies :class:`flakekit.clock.Clock`. Because its wall time is always the
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
