"""flakekit: unique, time-ordered 64-bit IDs across many machines."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("flakekit")

# Import the generator module before binding the function of the same name: a later
# `import flakekit.snowflake` then finds it loaded and leaves `flakekit.snowflake` alone.
import flakekit.snowflake  # noqa: E402,F401  isort: skip
from flakekit.api import layout, load, snowflake  # noqa: E402  isort: skip
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
