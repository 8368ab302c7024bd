"""BuildContext: what a strategy, allocator or store factory gets besides its settings.

It also builds what a factory refers to (:meth:`BuildContext.build`), so every plugin
reference goes through one path: look the name up, fill its settings class, call the
factory, check the result against its contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.assembly.settings import PluginRef, build_settings
from flakekit.errors import ConfigError, UnknownNameError
from flakekit.pluginhost.contracts import (
    Clock,
    Generator,
    Membership,
    SegmentStore,
    WorkerAllocator,
    check_contract,
)

if TYPE_CHECKING:
    from flakekit.pluginhost.host import PluginHost
    from flakekit.sql.backends import BackendPool
    from flakekit.values.events import Events
    from flakekit.values.layout import BitLayout

__all__ = ["CONTRACTS", "BuildContext", "Part"]

#: registry kind -> the protocol its factories' results must meet
CONTRACTS: dict[str, type] = {
    "clock": Clock,
    "allocator": WorkerAllocator,
    "segment store": SegmentStore,
    "strategy": Generator,
    "membership": Membership,
}


@attrs.frozen
class Part:
    """One thing built for a generator from a reference: the allocator, the store..."""

    ref: PluginRef
    settings: Any
    obj: Any


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
        layouts: the layouts defined in the config file (by name).
        parts: what :meth:`build` built for this generator, with its reference (shared by
            the copies :func:`attrs.evolve` makes, so the kit sees every part).
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
    layouts: Mapping[str, BitLayout] = attrs.field(factory=dict)
    parts: list[Part] = attrs.field(factory=list, eq=False, repr=False)

    def build(self, ref: PluginRef, *args: Any) -> Any:
        """Build what ``ref`` names: ``factory(settings, *args)``, checked against the
        contract of its kind (so a wrong object is refused now, naming its plugin)."""
        reg = self.plugins.registries[ref.kind].get(ref.type, ref.type_path)
        settings = build_settings(reg.settings, ref.settings, ref.path)
        obj = reg.create(settings, *args)
        contract = CONTRACTS.get(ref.kind)
        if contract is not None:
            check_contract(obj, contract, reg, ref.path)
        self.parts.append(Part(ref, settings, obj))
        return obj

    def resolve_layout(self, name: Any, path: str) -> BitLayout:
        """A layout by name: the config file's first, then the registered ones."""
        if not isinstance(name, str):
            raise ConfigError(path, f"expected a layout name, got {name!r}")
        if name in self.layouts:
            return self.layouts[name]
        if name in self.plugins.layouts:
            return self.plugins.layout(name, path)
        raise UnknownNameError(path, "layout", name,
                               [*self.layouts, *self.plugins.layouts.names()])
