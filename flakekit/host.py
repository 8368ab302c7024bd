"""PluginHost: loads plugins and collects what they register.

Loading order (as tox and llm do it): blocked names from ``FLAKEKIT_DISABLE_PLUGINS``,
entry points of group ``flakekit`` (optionally only those in ``FLAKEKIT_LOAD_PLUGINS``),
then the built-ins in :mod:`flakekit.builtin`, then ``check_pending()`` so a misspelt hook
name fails loudly. ``FLAKEKIT_TRACE_PLUGINS=1`` prints every hook call to stderr.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import attrs
import pluggy

from flakekit import hookspecs
from flakekit.events import Events
from flakekit.layout import BitLayout
from flakekit.registry import Registry

__all__ = ["BUILTIN_PLUGINS", "ENTRY_POINT_GROUP", "PluginHost", "PluginInfo", "get_host"]

ENTRY_POINT_GROUP = "flakekit"
BUILTIN_PLUGINS = (
    "flakekit.builtin.layouts",
    "flakekit.builtin.clocks",
    "flakekit.builtin.static",
    "flakekit.builtin.sql",
    "flakekit.builtin.segments",
)
#: registration hook → registry kind
KINDS = {
    "flakekit_register_layouts": "layout",
    "flakekit_register_clocks": "clock",
    "flakekit_register_allocators": "allocator",
    "flakekit_register_segment_stores": "segment store",
}


@attrs.frozen
class PluginInfo:
    """One loaded plugin, for ``flakekit plugins``."""

    name: str
    distribution: str | None
    version: str | None
    builtin: bool
    hooks: tuple[str, ...]
    registers: tuple[str, ...]


def _env_list(name: str) -> list[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


@attrs.define
class PluginHost:
    """Wraps a pluggy ``PluginManager`` with flakekit's registries."""

    pm: pluggy.PluginManager = attrs.Factory(lambda: pluggy.PluginManager("flakekit"))
    registries: dict[str, Registry] = attrs.Factory(
        lambda: {kind: Registry(kind) for kind in KINDS.values()}
    )
    loaded: bool = False

    def __attrs_post_init__(self) -> None:
        self.pm.add_hookspecs(hookspecs)

    # -- loading --------------------------------------------------------------------------
    def load(self, *, entrypoints: bool = True, extra: Iterable[Any] = ()) -> PluginHost:
        """Load plugins once: entry points, ``extra`` objects (tests), then built-ins."""
        if self.loaded:
            return self
        for name in _env_list("FLAKEKIT_DISABLE_PLUGINS") or []:
            self.pm.set_blocked(name)
        if entrypoints:
            allow = _env_list("FLAKEKIT_LOAD_PLUGINS")
            if allow is None:
                self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            else:
                for name in allow:
                    self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
        for plugin in extra:
            self.pm.register(plugin)
        for module in BUILTIN_PLUGINS:
            if not self.pm.is_blocked(module) and self.pm.get_plugin(module) is None:
                self.pm.register(importlib.import_module(module), name=module)
        self.pm.check_pending()
        if os.environ.get("FLAKEKIT_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        for plugin_name, plugin in self.pm.list_name_plugin():
            self._collect(plugin_name, plugin)
        self.loaded = True
        return self

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register one more plugin after loading (tests, inline plugins)."""
        name = self.pm.register(plugin, name=name)
        assert name is not None
        self.pm.check_pending()
        self._collect(name, plugin)
        return name

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        for registry in self.registries.values():
            registry.remove_plugin(name)

    def _collect(self, plugin_name: str, plugin: Any) -> None:
        """Call each registration hook of one plugin with a ``register`` bound to it."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        for hook_name, kind in KINDS.items():
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
            if caller.get_hookimpls():
                caller(register=self.registries[kind].binder(plugin_name))

    # -- lookups --------------------------------------------------------------------------
    @property
    def layouts(self) -> Registry:
        return self.registries["layout"]

    @property
    def clocks(self) -> Registry:
        return self.registries["clock"]

    @property
    def allocators(self) -> Registry:
        return self.registries["allocator"]

    @property
    def segment_stores(self) -> Registry:
        return self.registries["segment store"]

    def layout(self, name: str, path: str = "layout") -> BitLayout:
        """Build the registered layout ``name``."""
        layout = self.layouts.get(name, path).create()
        if not isinstance(layout, BitLayout):
            raise TypeError(f"layout {name!r} factory returned {type(layout).__name__}, not BitLayout")
        return layout

    def events(self) -> Events:
        return Events(self.pm.hook)

    def add_commands(self, cli: Any) -> None:
        self.pm.hook.flakekit_register_commands(cli=cli)

    def plugins(self) -> list[PluginInfo]:
        dists = {id(plugin): dist for plugin, dist in self.pm.list_plugin_distinfo()}
        out = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            dist = dists.get(id(plugin))
            hooks = tuple(sorted(c.name for c in self.pm.get_hookcallers(plugin) or []))
            registers = tuple(
                f"{reg.kind}:{reg.name}"
                for registry in self.registries.values() for reg in registry
                if reg.plugin == name
            )
            out.append(PluginInfo(
                name=name,
                distribution=dist.project_name if dist else None,
                version=dist.version if dist else None,
                builtin=name in BUILTIN_PLUGINS,
                hooks=hooks, registers=registers,
            ))
        return sorted(out, key=lambda p: (p.builtin, p.name))


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide host, loaded on first use (never at import time)."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost().load()
    return _HOST


def reset_host() -> None:
    """Forget the process-wide host (tests)."""
    global _HOST
    _HOST = None


def distribution_version() -> str:
    try:
        return metadata.version("flakekit")
    except metadata.PackageNotFoundError:
        return "0+unknown"
