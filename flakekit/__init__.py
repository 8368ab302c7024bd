"""flakekit: unique, time-ordered 64-bit IDs across many machines.

Every public name is imported on first use (:func:`__getattr__`): ``import flakekit``
(which ``flakekit --help`` and ``flakekit decode`` pay for) loads no plugin host,
SQLAlchemy or attrs until a name that needs them is touched. The names are written once,
in :data:`_FROM`; ``__all__`` and ``__dir__`` come from it and the ``TYPE_CHECKING``
imports (what mypy reads) are checked against it by ``tests/test_architecture.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flakekit.__about__ import __version__
from flakekit._lazy import exports, table

if TYPE_CHECKING:  # what mypy reads; the same names as _FROM (a test checks)
    from flakekit.api import layout, load, snowflake
    from flakekit.assembly.kit import Kit
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
    from flakekit.generators.segment import SegmentGenerator
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.pluginhost.markers import hookimpl
    from flakekit.values.formats import IdFormat
    from flakekit.values.layout import BitLayout

#: module -> the public names it gives the package
_FROM = {
    "flakekit.api": ("layout", "load", "snowflake"),
    "flakekit.assembly.kit": ("Kit",),
    "flakekit.errors": (
        "ClockMovedBackwardsError", "ConfigError", "FlakekitError", "LayoutError", "LeaseError",
        "LeaseExpiredError", "LeaseLostError", "SegmentUnavailableError",
    ),
    "flakekit.generators.segment": ("SegmentGenerator",),
    "flakekit.generators.snowflake": ("SnowflakeGenerator",),
    "flakekit.pluginhost.markers": ("hookimpl",),
    "flakekit.values.formats": ("IdFormat",),
    "flakekit.values.layout": ("BitLayout",),
}
_WHERE = table(_FROM)

__all__ = sorted([*_WHERE, "__version__"])


def _submodule(name: str) -> Any:
    """``flakekit.aio`` / ``flakekit.sqlalchemy`` without a second import, so that
    ``flakekit.sqlalchemy.default(...)`` works."""
    if name in ("aio", "sqlalchemy"):
        return importlib.import_module(f"flakekit.{name}")
    raise AttributeError(f"module 'flakekit' has no attribute {name!r}")


_getattr, __dir__ = exports(__name__, _WHERE, globals(), fallback=_submodule,
                           also=("__version__",))


def __getattr__(name: str) -> Any:
    """The public names on first use: ``import flakekit`` stays cheap."""
    return _getattr(name)
