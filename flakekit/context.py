"""BuildContext: what an allocator or store factory gets besides its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from flakekit.backends import BackendPool
    from flakekit.clock import Clock
    from flakekit.events import Events
    from flakekit.host import PluginHost
    from flakekit.layout import BitLayout

__all__ = ["BuildContext"]


@attrs.frozen
class BuildContext:
    """Attributes:
        generator: the generator's name in config.
        path: the dotted config path of the thing being built (for error messages).
        layout: the generator's layout (None for segment generators).
        clock: the generator's clock.
        events: where to report events.
        backends: the named database engines.
        plugins: the plugin host (registries of layouts, clocks, allocators, stores).
        host: this process's host identity.
        port: this process's port identity (0 when it serves none).
        instance: which of several cooperating processes on this host:port (0, 1, ...).
    """

    generator: str
    path: str
    layout: BitLayout | None
    clock: Clock
    events: Events
    backends: BackendPool
    plugins: PluginHost
    host: str = ""
    port: int = 0
    instance: int = 0
