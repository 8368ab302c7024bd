"""flakekit: unique, time-ordered 64-bit IDs across many machines.

Every public name is imported on first use (:func:`__getattr__`): ``import flakekit``
(which ``flakekit --help`` and ``flakekit decode`` pay for) loads no plugin host,
SQLAlchemy or attrs until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from flakekit.__about__ import __version__

if TYPE_CHECKING:
    from flakekit.api import layout, load, snowflake
    from flakekit.errors import (
        ClockMovedBackwardsError,
        ConfigError,
        FlakekitError,
        LayoutError,
        LeaseError,
        LeaseExpiredError,
        LeaseLostError,
        SegmentUnavailableError,
    )
    from flakekit.pluginhost.markers import hookimpl
    from flakekit.values.formats import IdFormat
    from flakekit.values.layout import BitLayout

__all__ = [
    "BitLayout",
    "ClockMovedBackwardsError",
    "ConfigError",
    "FlakekitError",
    "IdFormat",
    "LayoutError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseLostError",
    "SegmentUnavailableError",
    "__version__",
    "hookimpl",
    "layout",
    "load",
    "snowflake",
]

# name -> module it lives in
_WHERE = {
    "layout": "flakekit.api",
    "load": "flakekit.api",
    "snowflake": "flakekit.api",
    "ClockMovedBackwardsError": "flakekit.errors",
    "ConfigError": "flakekit.errors",
    "FlakekitError": "flakekit.errors",
    "LayoutError": "flakekit.errors",
    "LeaseError": "flakekit.errors",
    "LeaseExpiredError": "flakekit.errors",
    "LeaseLostError": "flakekit.errors",
    "SegmentUnavailableError": "flakekit.errors",
    "hookimpl": "flakekit.pluginhost.markers",
    "IdFormat": "flakekit.values.formats",
    "BitLayout": "flakekit.values.layout",
}


def __getattr__(name: str) -> object:
    """The public names, and ``flakekit.aio`` / ``flakekit.sqlalchemy``, on first use:
    ``import flakekit`` stays cheap, and ``flakekit.sqlalchemy.default(...)`` works
    without a second import."""
    if name in ("aio", "sqlalchemy"):
        return importlib.import_module(f"flakekit.{name}")
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'flakekit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
