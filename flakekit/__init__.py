"""flakekit: unique, time-ordered 64-bit IDs across many machines."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("flakekit")

from flakekit.api import layout, load, snowflake  # noqa: E402
from flakekit.errors import (  # noqa: E402
    ClockMovedBackwardsError,
    ConfigError,
    FlakekitError,
    LayoutError,
    LeaseError,
    LeaseExpiredError,
    LeaseLostError,
    SegmentUnavailableError,
)
from flakekit.layout import BitLayout  # noqa: E402

__all__ = [
    "BitLayout",
    "ClockMovedBackwardsError",
    "ConfigError",
    "FlakekitError",
    "LayoutError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseLostError",
    "SegmentUnavailableError",
    "hookimpl",
    "layout",
    "load",
    "snowflake",
]
