"""Kit: every generator of a config, built from the plugin registries.

``flakekit.load()`` returns one. Building resolves every name and checks every setting,
so a config error surfaces before any lease is taken; ``start()`` (or ``with kit:``)
acquires the leases and starts the background threads; ``close()`` releases them.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import attrs

from flakekit.backends import BackendPool
from flakekit.clock import Clock
from flakekit.config import Config, GeneratorSpec
from flakekit.context import BuildContext
from flakekit.errors import ConfigError, UnknownNameError
from flakekit.host import PluginHost
from flakekit.layout import BitLayout
from flakekit.registry import Registry
from flakekit.settings import build_settings, check_keys
from flakekit.snowflake import SnowflakeGenerator
from flakekit.timeunits import parse_duration_ns

__all__ = ["Generator", "Identity", "Kit", "build_kit", "default_identity"]

ON_LEASE_LOST = ("stop", "exit", "restart")
SNOWFLAKE_KEYS = {"layout", "clock", "allocator", "nodes", "on_lease_lost",
                  "max_start_wait", "description"}


class Generator(Protocol):
    """What every strategy's generator offers."""

    name: str

    def start(self) -> Any: ...
    def close(self) -> None: ...
    def next_id(self) -> int: ...
    def next_ids(self, n: int) -> Any: ...
    def stats(self) -> dict[str, Any]: ...


@attrs.frozen
class Identity:
    """Who this process is, for allocators: host, port and instance (which of several
    processes sharing a host:port, e.g. a server's workers)."""

    host: str
    port: int = 0
    instance: int = 0


def default_identity() -> Identity:
    """``FLAKEKIT_HOST`` / ``FLAKEKIT_PORT`` / ``FLAKEKIT_INSTANCE``, else the host name,
    port 0 and instance 0."""
    host = os.environ.get("FLAKEKIT_HOST") or socket.gethostname()
    numbers = []
    for var in ("FLAKEKIT_PORT", "FLAKEKIT_INSTANCE"):
        raw = os.environ.get(var, "0")
        try:
            numbers.append(int(raw))
        except ValueError:
            raise ConfigError(var, f"{raw!r} is not a whole number") from None
    return Identity(host, *numbers)


def resolve_layout(config: Config, host: PluginHost, name: Any, path: str) -> BitLayout:
    if not isinstance(name, str):
        raise ConfigError(path, f"expected a layout name, got {name!r}")
    if name in config.layouts:
        return config.layouts[name]
    if name in host.layouts:
        return host.layout(name, path)
    raise UnknownNameError(path, "layout", name, [*config.layouts, *host.layouts.names()])


def _typed(table: Any, path: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``{type = "name", ...}`` → (name, settings table)."""
    if isinstance(table, str):
        return table, {}
    if isinstance(table, dict):
        rest = dict(table)
        kind = rest.pop("type", None)
        if not isinstance(kind, str):
            raise ConfigError(f"{path}.type", "is required (e.g. type = \"sql\")")
        return kind, rest
    raise ConfigError(path, f"expected a name or a table with a type, got {table!r}")


def build_plugin(
    registry: Registry, table: Any, path: str, *args: Any, default_type: str | None = None
) -> Any:
    """Build a plugin strategy from ``"name"`` or ``{type = "name", settings...}``:
    ``factory(settings, *args)`` with settings checked against its attrs class."""
    if default_type is not None and isinstance(table, dict) and "type" not in table:
        table = {"type": default_type, **table}
    kind, rest = _typed(table, path)
    reg = registry.get(kind, path if isinstance(table, str) else f"{path}.type")
    return reg.create(build_settings(reg.settings, rest, path), *args)


def build_clock(host: PluginHost, table: Any, path: str) -> Clock:
    return build_plugin(host.clocks, table, path)


def build_snowflake(
    spec: GeneratorSpec, config: Config, host: PluginHost, pool: BackendPool,
    identity: Identity,
) -> SnowflakeGenerator:
    table, path = spec.table, spec.path
    check_keys(table, SNOWFLAKE_KEYS, path)
    layout = resolve_layout(config, host, table.get("layout", "snowflake"), f"{path}.layout")
    clock = build_clock(host, table.get("clock", "monotonic"), f"{path}.clock")
    events = host.events()
    alloc_path = f"{path}.allocator"
    if "allocator" not in table:
        raise ConfigError(
            alloc_path, "is required: e.g. allocator = {type = \"sql\", backend = \"main\"} "
            "or allocator = {type = \"static\", worker_id = 1}"
        )
    ctx = BuildContext(spec.name, alloc_path, layout, clock, events, pool, host,
                       identity.host, identity.port, identity.instance)
    allocator = build_plugin(host.allocators, table["allocator"], alloc_path, ctx)
    # an allocator may prefer another default (ZooKeeper lease mode re-acquires)
    on_lost = table.get("on_lease_lost", getattr(allocator, "default_on_lease_lost", "stop"))
    if on_lost not in ON_LEASE_LOST:
        raise ConfigError(f"{path}.on_lease_lost",
                          f"expected one of {', '.join(map(repr, ON_LEASE_LOST))}, got {on_lost!r}")
    nodes = table.get("nodes", {})
    if not isinstance(nodes, dict):
        raise ConfigError(f"{path}.nodes", "expected a table such as nodes = {region = 1}")
    try:
        wait_s = parse_duration_ns(table.get("max_start_wait", 10)) / 1e9
    except ValueError as exc:
        raise ConfigError(f"{path}.max_start_wait", str(exc)) from None
    from flakekit.errors import LayoutError

    try:
        return SnowflakeGenerator(
            layout, clock, allocator, name=spec.name, events=events, on_lease_lost=on_lost,
            host=identity.host, port=identity.port, instance=identity.instance, nodes=nodes,
            max_start_wait_s=wait_s,
        )
    except LayoutError as exc:
        field = f"nodes.{exc.field}" if exc.field in nodes else exc.field
        raise ConfigError(f"{path}.{field}", str(exc).split(": ", 1)[-1]) from None


def build_segment(
    spec: GeneratorSpec, config: Config, host: PluginHost, pool: BackendPool,
    identity: Identity,
) -> Generator:
    from flakekit.clock import MonotonicClock
    from flakekit.segment import build_segment_generator

    ctx = BuildContext(spec.name, spec.path, None, MonotonicClock(), host.events(), pool, host,
                       identity.host, identity.port, identity.instance)
    return build_segment_generator(spec.name, dict(spec.table), spec.path, ctx)


BUILDERS = {"snowflake": build_snowflake, "segment": build_segment}


@attrs.define(eq=False)
class Kit:
    """The generators of one config. ``kit["name"]`` starts that generator on first use."""

    config: Config
    generators: dict[str, Generator]
    pool: BackendPool
    _started: set[str] = attrs.Factory(set)
    _lock: threading.RLock = attrs.Factory(threading.RLock)

    def __getitem__(self, name: str) -> Any:
        gen = self.get(name)
        if name not in self._started:
            with self._lock:  # threads racing to first use start it once
                if name not in self._started:
                    gen.start()
                    self._started.add(name)
        return gen

    def get(self, name: str) -> Any:
        """The generator without starting it."""
        try:
            return self.generators[name]
        except KeyError:
            raise UnknownNameError("generators", "generator", name, self.generators) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.generators)

    def __len__(self) -> int:
        return len(self.generators)

    def __contains__(self, name: object) -> bool:
        return name in self.generators

    @property
    def default(self) -> Any:
        """The default generator (started)."""
        return self[self.config.generator(None).name]

    def start(self) -> Kit:
        """Start every generator (acquire leases, fetch segments)."""
        for name in self.generators:
            self[name]
        return self

    def close(self) -> None:
        """Stop every started generator, release leases, close connections."""
        with self._lock:
            for name in list(self._started):
                try:
                    self.generators[name].close()
                finally:
                    self._started.discard(name)
            self.pool.dispose()

    def __enter__(self) -> Kit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> Mapping[str, dict[str, Any]]:
        return {name: self.generators[name].stats() for name in self._started}


_OPEN: weakref.WeakSet[Kit] = weakref.WeakSet()


@atexit.register
def _close_open_kits() -> None:
    for kit in list(_OPEN):
        try:
            kit.close()
        except Exception:
            pass


def build_kit(
    config: Config, host: PluginHost, identity: Identity | tuple[Any, ...] | None = None
) -> Kit:
    """Build (but do not start) every generator of ``config``.

    ``identity`` defaults to :func:`default_identity`; a ``(host, port[, instance])``
    tuple is accepted too.
    """
    for name in config.layouts:
        if name in host.layouts:
            reg = host.layouts.get(name)
            raise ConfigError(
                f"layouts.{name}", f"a layout named {name!r} is already registered by plugin "
                f"{reg.plugin!r}; give yours another name"
            )
    if identity is None:
        identity = default_identity()
    elif not isinstance(identity, Identity):
        identity = Identity(*identity)
    pool = config.pool()
    generators = {
        name: BUILDERS[spec.strategy](spec, config, host, pool, identity)
        for name, spec in config.generators.items()
    }
    kit = Kit(config, generators, pool)
    _OPEN.add(kit)
    return kit
