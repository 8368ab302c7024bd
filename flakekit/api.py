"""The small library API: ``snowflake()``, ``load()``, ``layout()``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from flakekit.pluginhost.host import get_host

if TYPE_CHECKING:
    from flakekit.assembly.kit import Kit
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.values.layout import BitLayout

__all__ = ["layout", "load", "snowflake"]


def layout(name: str) -> BitLayout:
    """A registered layout by name (``"snowflake"``, ``"sonyflake"``, ``"region-split"``...)."""
    return get_host().layout(name, "layout")


def snowflake(
    worker_id: int | None = None, *, layout: str = "snowflake", clock: str = "monotonic",
    nodes: dict[str, int] | None = None, name: str = "default",
) -> SnowflakeGenerator:
    """A started in-process generator with a static worker id.

    The worker id defaults to ``$FLAKEKIT_WORKER_ID``. You must make sure no other live
    process uses the same id; use :func:`load` with a ``sql`` allocator to lease one.
    """
    from flakekit.assembly.kit import build_clock
    from flakekit.builtin.static import StaticAllocator, StaticSettings
    from flakekit.generators.snowflake import SnowflakeGenerator

    host = get_host()
    the_layout = host.layout(layout, "layout")
    allocator = StaticAllocator(StaticSettings(worker_id=worker_id), path="worker_id")
    gen = SnowflakeGenerator(
        the_layout, build_clock(host, clock, "clock"), allocator, name=name,
        events=host.events(), nodes=nodes,
    )
    return gen.start()


def load(path: str | os.PathLike[str] | None = None) -> Kit:
    """Build every generator of a config file.

    With no ``path``, the same lookup as the CLI: ``$FLAKEKIT_CONFIG``, else
    ``./flakekit.toml`` if present, else the embedded default (a SQLite registry in the
    user's state directory).
    """
    from flakekit.assembly.config import find_config, load_config
    from flakekit.assembly.kit import build_kit

    return build_kit(load_config(find_config(path).path), get_host())
