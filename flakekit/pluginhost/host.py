"""PluginHost: loads plugins and collects what they register.

Loading order (as tox and llm do it): blocked names from ``FLAKEKIT_DISABLE_PLUGINS``,
entry points of group ``flakekit`` (optionally only those in ``FLAKEKIT_LOAD_PLUGINS``),
then the built-ins in :mod:`flakekit.builtin`, then ``check_pending()`` so a misspelt hook
name fails loudly. ``FLAKEKIT_TRACE_PLUGINS=1`` prints every hook call to stderr.

The built-ins are imported when what they register is first asked for
(:data:`BUILTIN_HOOKS` says which hooks each implements): ``flakekit decode`` needs the
layouts, not the allocators' settings classes, and builds none of them (issue 24).
Entry-point plugins are always imported at :meth:`PluginHost.load` (what they register
is only known by importing them). ``pm``, ``registries``, ``plugins()`` and
``events()`` load every built-in first, so code that reaches past the lookups sees the
full set.

An entry-point plugin that fails to import or to register does not take the host down:
it is recorded as :class:`BrokenPlugin` (entry point, distribution, the error and the
``FLAKEKIT_DISABLE_PLUGINS=...`` line that skips it), ``flakekit --help`` and
``flakekit plugins`` still work and show it, and building a config refuses with that
line (:meth:`PluginHost.check_broken`): a generator must never be built from half a
plugin set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from flakekit.errors import DuplicateRegistrationError, PluginLoadError
from flakekit.pluginhost import hookspecs
from flakekit.pluginhost.entrypoints import flakekit_entry_points
from flakekit.pluginhost.registry import Registry
from flakekit.values.layout import BitLayout

if TYPE_CHECKING:
    from flakekit.values.events import Events

__all__ = [
    "BUILTIN_PLUGINS", "ENTRY_POINT_GROUP", "BrokenPlugin", "PluginHost", "PluginInfo",
    "get_host",
]

ENTRY_POINT_GROUP = "flakekit"
BUILTIN_PLUGINS = (
    "flakekit.builtin.layouts",
    "flakekit.builtin.clocks",
    "flakekit.builtin.static",
    "flakekit.builtin.sql",
    "flakekit.builtin.http_lease",
    "flakekit.builtin.segments",
    "flakekit.builtin.strategies",
    "flakekit.builtin.cluster",
)
#: the hooks each built-in implements: a lookup imports only the built-ins it needs
#: (tests/test_startup_imports.py checks this table against the modules)
BUILTIN_HOOKS: dict[str, tuple[str, ...]] = {
    "flakekit.builtin.layouts": ("flakekit_register_layouts",),
    "flakekit.builtin.clocks": ("flakekit_register_clocks",),
    "flakekit.builtin.static": ("flakekit_register_allocators",),
    "flakekit.builtin.sql": ("flakekit_register_allocators", "flakekit_register_commands"),
    "flakekit.builtin.http_lease": ("flakekit_register_allocators",),
    "flakekit.builtin.segments": ("flakekit_register_segment_stores",
                                  "flakekit_register_commands"),
    "flakekit.builtin.strategies": ("flakekit_register_strategies",),
    "flakekit.builtin.cluster": ("flakekit_register_memberships",),
}
#: registration hook → registry kind
KINDS = {
    "flakekit_register_layouts": "layout",
    "flakekit_register_clocks": "clock",
    "flakekit_register_allocators": "allocator",
    "flakekit_register_segment_stores": "segment store",
    "flakekit_register_strategies": "strategy",
    "flakekit_register_memberships": "membership",
}
_HOOKS = {kind: hook for hook, kind in KINDS.items()}


@attrs.frozen
class PluginInfo:
    """One loaded plugin, for ``flakekit plugins``."""

    name: str
    distribution: str | None
    version: str | None
    builtin: bool
    hooks: tuple[str, ...]
    registers: tuple[str, ...]
    broken: str | None = None
    commands: tuple[str, ...] = ()  # CLI commands it adds (flakekit_register_commands)


@attrs.frozen
class BrokenPlugin:
    """An entry-point plugin that failed to import or to register."""

    name: str
    distribution: str | None
    version: str | None
    error: str

    @property
    def skip(self) -> str:
        return f"FLAKEKIT_DISABLE_PLUGINS={self.name}"

    def describe(self) -> str:
        dist = f"distribution {self.distribution} {self.version or ''}".strip()
        return (f"plugin {self.name!r} (entry point {ENTRY_POINT_GROUP}:{self.name}, "
                f"{dist if self.distribution else 'no distribution'}) is broken: "
                f"{self.error}; fix it, or skip it with {self.skip}")


def _env_list(name: str) -> list[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


class _RegistryOf:
    """``host.layouts`` and the like: the host's registry of one kind (its built-ins
    loaded first)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __get__(self, host: PluginHost, owner: type | None = None) -> Registry:
        return host._registry(self.kind)


@attrs.define
class PluginHost:
    """Wraps a pluggy ``PluginManager`` with flakekit's registries."""

    _pm: pluggy.PluginManager = attrs.Factory(lambda: pluggy.PluginManager("flakekit"))
    _registries: dict[str, Registry] = attrs.Factory(
        lambda: {kind: Registry(kind) for kind in KINDS.values()}
    )
    loaded: bool = False
    _broken: list[BrokenPlugin] = attrs.Factory(list)
    _origins: dict[str, tuple[str | None, str | None, str]] = attrs.Factory(dict)
    #: built-ins not imported yet (:meth:`_builtins`)
    _pending: list[str] = attrs.Factory(list)
    #: the entry points :meth:`load` registered (a clash of a built-in with one breaks it)
    _entrypoints: list[str] = attrs.Factory(list)
    #: the registration hooks those entry points implement (where a built-in may clash)
    _entry_hooks: list[str] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self._pm.add_hookspecs(hookspecs)

    @property
    def pm(self) -> pluggy.PluginManager:
        """The pluggy manager, every built-in registered."""
        self._builtins(None)
        return self._pm

    @property
    def registries(self) -> Mapping[str, Registry]:
        """Every registry, kind → :class:`Registry`; looking one kind up collects the
        built-ins of that kind (a build of the embedded default imports no membership
        or segment store), iterating collects them all."""
        return _Registries(self)

    # -- loading --------------------------------------------------------------------------
    def load(self, *, entrypoints: bool = True, extra: Iterable[Any] = ()) -> PluginHost:
        """Load plugins once: entry points, ``extra`` objects (tests), then built-ins."""
        if self.loaded:
            return self
        pm = self._pm
        for name in _env_list("FLAKEKIT_DISABLE_PLUGINS") or []:
            pm.set_blocked(name)
        loaded = self._load_entrypoints(_env_list("FLAKEKIT_LOAD_PLUGINS")) if entrypoints else []
        extra = list(extra)
        for plugin in extra:
            pm.register(plugin)
        pm.check_pending()
        if os.environ.get("FLAKEKIT_TRACE_PLUGINS"):
            pm.trace.root.setwriter(sys.stderr.write)
            pm.enable_tracing()
        for plugin_name, plugin in pm.list_name_plugin():
            if plugin_name in loaded:  # a third party's failure is its own, not the host's
                try:
                    self._collect(plugin_name, plugin)
                except Exception as exc:  # noqa: BLE001 - recorded and shown, never hidden
                    self._mark_broken(plugin_name, f"registering failed: {_one_line(exc)}")
            else:
                self._collect_builtin(plugin_name, plugin, loaded)
        self._entrypoints = loaded
        self._entry_hooks = [hook for hook in KINDS if any(
            impl.plugin_name in loaded for impl in getattr(pm.hook, hook).get_hookimpls())]
        self._pending = list(BUILTIN_PLUGINS)
        self.loaded = True
        if extra or os.environ.get("FLAKEKIT_TRACE_PLUGINS"):
            # tests and inline plugins: a clash with a built-in fails here; a trace shows
            # every registration
            self._builtins(None)
        return self

    def _builtins(self, hook: str | None) -> None:
        """Import, register and collect the built-ins not loaded yet that implement
        ``hook`` (None: all), in :data:`BUILTIN_PLUGINS` order."""
        if not self._pending:
            return
        for module in [m for m in self._pending if hook is None or hook in BUILTIN_HOOKS[m]]:
            self._pending.remove(module)
            if self._pm.is_blocked(module) or self._pm.get_plugin(module) is not None:
                continue
            plugin = importlib.import_module(module)
            self._pm.register(plugin, name=module)
            self._pm.check_pending()
            self._collect_builtin(module, plugin, self._entrypoints)

    def _collect_builtin(self, name: str, plugin: Any, loaded: list[str]) -> None:
        """Collect a built-in (or an ``extra``) plugin. A name of it that an entry-point
        plugin took first breaks that entry point, not the host (a built-in name is taken
        on purpose): it is recorded as broken with the duplicate's message, and the
        built-in registers."""
        while True:
            try:
                self._collect(name, plugin)
                return
            except DuplicateRegistrationError as exc:
                if exc.first not in loaded:
                    raise
                self._mark_broken(exc.first, f"registering failed: {exc}")
                for registry in self._registries.values():  # what it registered before
                    registry.remove_plugin(name)

    def _load_entrypoints(self, allow: list[str] | None) -> list[str]:
        """Import and register the ``flakekit`` entry points (pluggy's loader, but one
        failing plugin is recorded instead of stopping the others)."""
        names = []
        seen: set[str] = set()
        for ep in flakekit_entry_points(ENTRY_POINT_GROUP):
            if (ep.name in seen or (allow is not None and ep.name not in allow)
                    or self._pm.is_blocked(ep.name) or self._pm.has_plugin(ep.name)):
                continue
            seen.add(ep.name)
            self._origins[ep.name] = (ep.dist, ep.version, ep.value)
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - recorded and shown, never hidden
                self._mark_broken(ep.name, f"import failed: {_one_line(exc)}")
                continue
            try:
                self._pm.register(plugin, name=ep.name)
                self._pm.check_pending()
            except Exception as exc:  # noqa: BLE001 - e.g. a misspelt hook name
                if self._pm.has_plugin(ep.name):
                    self._pm.unregister(name=ep.name)
                self._mark_broken(ep.name, f"registering failed: {_one_line(exc)}")
                continue
            names.append(ep.name)
        return names

    def _mark_broken(self, name: str, error: str) -> None:
        dist, version, _ = self._origins.get(name, (None, None, ""))
        if self._pm.has_plugin(name):
            self.unregister(name)
        self._broken.append(BrokenPlugin(name, dist, version, error))

    @property
    def broken(self) -> list[BrokenPlugin]:
        """The plugins that failed to import or register. An entry point that took a
        built-in's name is only found out when that built-in loads, so the built-ins of
        every kind an entry point registers into load first (none for ``decode`` with
        no third-party layouts)."""
        for hook in self._entry_hooks:
            self._builtins(hook)
        return self._broken

    def check_broken(self) -> None:
        """Refuse to build generators while a plugin is broken (it may be the one that
        registers what the config names, or change what a name means)."""
        if self.broken:
            raise PluginLoadError(self.broken[0].describe())

    def origin(self, name: str) -> str:
        """``plugin 'x' (distribution d 1.0, module m)``, for error messages."""
        if name in self._origins:
            dist, version, module = self._origins[name]
            return f"plugin {name!r} (distribution {dist} {version}, module {module})"
        plugin = self._pm.get_plugin(name)
        module = plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__module__
        return f"plugin {name!r} (module {module})"

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register one more plugin after loading (tests, inline plugins); the built-ins
        are loaded first, so a clash with one fails here."""
        name = self.pm.register(plugin, name=name)
        assert name is not None
        self._pm.check_pending()
        self._collect(name, plugin)
        return name

    def unregister(self, name: str) -> None:
        self._pm.unregister(name=name)
        for registry in self._registries.values():
            registry.remove_plugin(name)

    def _collect(self, plugin_name: str, plugin: Any) -> None:
        """Call each registration hook of one plugin with a ``register`` bound to it."""
        others = [p for p in self._pm.get_plugins() if p is not plugin]
        for hook_name, kind in KINDS.items():
            caller = self._pm.subset_hook_caller(hook_name, remove_plugins=others)
            if caller.get_hookimpls():
                caller(register=self._registries[kind].binder(plugin_name,
                                                             self.origin(plugin_name)))

    # -- lookups --------------------------------------------------------------------------
    def _registry(self, kind: str) -> Registry:
        self._builtins(_HOOKS[kind])
        return self._registries[kind]

    #: each kind's registry, its built-ins loaded on first use
    layouts = _RegistryOf("layout")
    clocks = _RegistryOf("clock")
    allocators = _RegistryOf("allocator")
    segment_stores = _RegistryOf("segment store")
    strategies = _RegistryOf("strategy")
    memberships = _RegistryOf("membership")

    def layout(self, name: str, path: str = "layout") -> BitLayout:
        """Build the registered layout ``name``."""
        layout = self.layouts.get(name, path).create()
        if not isinstance(layout, BitLayout):
            raise TypeError(f"layout {name!r} factory returned {type(layout).__name__}, not "
                            "BitLayout")
        return layout

    def events(self) -> Events:
        from flakekit.values.events import Events  # logging: not for decode

        # the built-ins implement no event hook (BUILTIN_HOOKS), and the relay reaches
        # every plugin registered later too: no need to load them for this
        return Events(self._pm.hook)

    def add_commands(self, cli: Any) -> None:
        self._builtins("flakekit_register_commands")
        self._pm.hook.flakekit_register_commands(cli=cli)

    def commands_by_plugin(self) -> dict[str, tuple[str, ...]]:
        """The CLI commands each plugin's ``flakekit_register_commands`` adds, found by
        calling it on a throw-away group (registration only defines click commands)."""
        import click

        out: dict[str, tuple[str, ...]] = {}
        for impl in self.pm.hook.flakekit_register_commands.get_hookimpls():
            group = click.Group()
            try:
                impl.function(cli=group)
            except Exception:  # noqa: BLE001  a listing must not fail on one plugin
                continue
            out[impl.plugin_name] = tuple(sorted(group.commands))
        return out

    def plugins(self) -> list[PluginInfo]:
        """Loaded plugins, then broken ones (``broken`` says why)."""
        commands = self.commands_by_plugin()
        out = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            dist_name, version, _ = self._origins.get(name, (None, None, ""))
            hooks = tuple(sorted(c.name for c in self.pm.get_hookcallers(plugin) or []))
            registers = tuple(
                f"{reg.kind}:{reg.name}"
                for registry in self.registries.values() for reg in registry
                if reg.plugin == name
            )
            out.append(PluginInfo(
                name=name,
                distribution=dist_name, version=version,
                builtin=name in BUILTIN_PLUGINS,
                hooks=hooks, registers=registers, commands=commands.get(name, ()),
            ))
        out += [PluginInfo(b.name, b.distribution, b.version, False, (), (), broken=b.describe())
                for b in self.broken]
        return sorted(out, key=lambda p: (p.builtin, p.broken is None, p.name))


class _Registries(Mapping[str, Registry]):
    """:attr:`PluginHost.registries`: the built-ins of a kind loaded on lookup."""

    def __init__(self, host: PluginHost) -> None:
        self._host = host

    def __getitem__(self, kind: str) -> Registry:
        if kind not in self._host._registries:
            raise KeyError(kind)
        return self._host._registry(kind)

    def __iter__(self) -> Iterator[str]:
        self._host._builtins(None)
        return iter(self._host._registries)

    def __len__(self) -> int:
        return len(self._host._registries)


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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def distribution_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("flakekit")
    except metadata.PackageNotFoundError:
        return "0+unknown"
