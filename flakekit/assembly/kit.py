"""Kit: every generator of a config, built from the plugin registries.

``flakekit.load()`` returns one. Building resolves every name and checks every setting,
so a config error surfaces before any lease is taken; ``start()`` (or ``with kit:``)
acquires the leases and starts the background threads; ``close()`` releases them.

With a ``[cluster]`` section the kit also holds the membership store (built and checked
against :class:`~flakekit.cluster.store_contracts.Membership`, not connected) and this node's
resolved identity; :meth:`Kit.cluster_node` builds the runtime that serves the
``order = "strict"`` generators (``flakekit serve`` calls it).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.assembly.cluster_spec import ClusterSpec, ResolvedCluster, resolve_cluster
from flakekit.assembly.config import Config
from flakekit.assembly.context import BuildContext, Part
from flakekit.assembly.settings import PluginRef, build_settings, refs
from flakekit.assembly.strict import StrictSegment
from flakekit.errors import ConfigError, UnknownKeyError, UnknownNameError
from flakekit.pluginhost import contracts
from flakekit.pluginhost.contracts import Generator
from flakekit.pluginhost.host import PluginHost
from flakekit.pluginhost.registry import Registration
from flakekit.sql.backends import BackendPool
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.events import Events
from flakekit.values.formats import DECIMAL, IdFormat
from flakekit.values.layout import BitLayout
from flakekit.values.lifecycle import StartsInWith
from flakekit.values.timeunits import format_unit

if TYPE_CHECKING:
    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.settings import ClusterSettings

__all__ = [
    "Generator", "Identity", "Kit", "TypedGenerator", "build_kit", "default_identity",
    "typed_generators",
]


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


def _context(config: Config | None, host: PluginHost, name: str, path: str,
             identity: Identity, pool: BackendPool | None = None) -> BuildContext:
    return BuildContext(
        name, path, None, MonotonicClock(), host.events(),
        pool if pool is not None else BackendPool({}), host,
        identity.host, identity.port, identity.instance,
        layouts=dict(config.layouts) if config else {},
    )


def resolve_layout(config: Config, host: PluginHost, name: Any, path: str) -> BitLayout:
    """A layout by name: the config file's first, then the registered ones."""
    return _context(config, host, "", path, Identity("")).resolve_layout(name, path)


def build_clock(host: PluginHost, table: Any, path: str) -> Clock:
    """A clock from ``"name"`` or ``{type = "name", ...}``, checked against its contract."""
    ctx = _context(None, host, "", path, Identity(""))
    clock: Clock = ctx.build(PluginRef.parse("clock", table, path))
    return clock


@attrs.frozen
class TypedGenerator:
    """One ``[generators.NAME]`` table parsed against its strategy's settings class.

    Attributes:
        name, path: as in config.
        strategy: the strategy's registration.
        settings: its settings (references to plugins are :class:`PluginRef`).
        id_format: the ``format`` key (every strategy's string form).
    """

    name: str
    path: str
    strategy: Registration
    settings: Any
    id_format: IdFormat
    format_given: bool = False

    @property
    def refs(self) -> list[PluginRef]:
        """Every plugin this generator refers to (its allocator, store, clock...)."""
        return refs(self.settings)


def typed_generators(config: Config, host: PluginHost) -> dict[str, TypedGenerator]:
    """Every generator table of ``config`` parsed once, without building anything (for
    tools such as ``db init`` that need the references but no objects)."""
    host.check_broken()
    out = {}
    for name, spec in config.generators.items():
        table = dict(spec.table)
        raw_format = table.pop("format", None)
        id_format = IdFormat.from_config(raw_format, f"{spec.path}.format")
        reg = host.strategies.get(spec.strategy, f"{spec.path}.strategy")
        settings = build_settings(reg.settings, table, spec.path)
        out[name] = TypedGenerator(name, spec.path, reg, settings, id_format,
                                   raw_format is not None)
    return out


@attrs.define(eq=False)
class Kit(StartsInWith):
    """The generators of one config. ``kit["name"]`` starts that generator on first use."""

    config: Config
    generators: dict[str, Any]
    pool: BackendPool
    specs: dict[str, TypedGenerator] = attrs.Factory(dict)
    parts: dict[str, list[Part]] = attrs.Factory(dict)
    #: this node in ``[cluster]`` (None: no cluster section, or built with as_member=False)
    cluster: ResolvedCluster | None = None
    #: the ``[cluster]`` membership store (built, not connected), else None
    membership: contracts.Membership | None = None
    _started: set[str] = attrs.Factory(set)
    _lock: threading.RLock = attrs.Factory(threading.RLock)
    _node: ClusterNode | None = None
    _events: Events | None = None

    def __getitem__(self, name: str) -> Any:
        gen = self.get(name)
        if name not in self._started:
            with self._lock:  # threads racing to first use start it once
                if name not in self._started:
                    try:
                        gen.start()
                    except UnknownKeyError as exc:  # say which config to create it with
                        raise exc.for_config(self.config.source) from None
                    self._started.add(name)
        return gen

    def get(self, name: str) -> Any:
        """The generator without starting it."""
        try:
            return self.generators[name]
        except KeyError:
            raise UnknownNameError("generators", "generator", name, self.generators) from None

    def describe(self, name: str) -> contracts.GeneratorInfo:
        """What generator ``name`` is, from its capabilities and the parts it was built
        from (the server and the CLI ask this instead of switching on names)."""
        gen = self.get(name)
        if isinstance(gen, contracts.Describes):
            return gen.describe()
        parts = self.parts.get(name, [])
        kinds = {part.ref.kind: part.ref.type for part in parts}
        spec = self.specs.get(name)
        return contracts.GeneratorInfo(
            strategy=spec.strategy.name if spec else self.config.generators[name].strategy,
            layout=gen.layout if isinstance(gen, contracts.HasLayout) else None,
            key=str(gen.key) if isinstance(gen, contracts.HasKey) else None,
            allocator=kinds.get("allocator"), store=kinds.get("segment store"),
            fixed_worker=any(isinstance(part.obj, contracts.FixedWorker) and part.obj.fixed_worker
                             for part in parts),
        )

    def parts_of(self, name: str, kind: str) -> list[Part]:
        """What generator ``name`` was built from, of one registry kind ("allocator"...)."""
        return [part for part in self.parts.get(name, []) if part.ref.kind == kind]

    def id_format(self, name: str) -> IdFormat:
        """The string form of ``name``'s IDs (its ``format``; decimal by default), for any
        strategy, whether or not its generators have ``next_str()``."""
        gen = self.get(name)
        if isinstance(gen, contracts.FormatsIds):
            return gen.id_format
        return self.specs[name].id_format if name in self.specs else DECIMAL

    # -- cluster mode -------------------------------------------------------------------------
    def strict_generators(self) -> list[StrictSegment]:
        """The ``order = "strict"`` segment generators (key, fencing store, settings), in
        config order."""
        return [gen for gen in self.generators.values() if isinstance(gen, StrictSegment)]

    def _spec(self) -> ClusterSpec:
        spec = self.config.cluster
        if spec is None:
            raise ConfigError("cluster", "the config has no [cluster] section; add one with "
                              "name and advertise (see docs/config.md)")
        return spec

    def cluster_settings(self, node: str | None = None,
                         advertise: str | None = None) -> ClusterSettings:
        """This node's :class:`~flakekit.cluster.settings.ClusterSettings`. ``node`` /
        ``advertise`` (the server's ``--node`` / ``--advertise``) override
        ``$FLAKEKIT_NODE`` / ``$FLAKEKIT_ADVERTISE``, which override the file."""
        resolved = self.cluster
        if resolved is None or node is not None or advertise is not None:
            resolved = resolve_cluster(self._spec(), node=node, advertise=advertise)
        return resolved.settings()

    def cluster_node(
        self, clock: Clock | None = None, events: Events | None = None, *,
        node: str | None = None, advertise: str | None = None, threads: bool = True,
    ) -> ClusterNode:
        """The runtime that serves this config's strict keys (built once, not started;
        ``threads=False`` for tests that drive its upkeep): every strict generator is
        added to it and served through it from now on (``kit["name"].next_id()`` asks the
        node). :meth:`close` closes it, and with it the membership."""
        from flakekit.cluster.node import ClusterNode

        with self._lock:
            if self._node is not None:
                return self._node
            settings = self.cluster_settings(node=node, advertise=advertise)
            assert self.membership is not None  # built with the kit when [cluster] exists
            events = events if events is not None else self._events
            runtime = ClusterNode(settings, self.membership, clock or MonotonicClock(),
                                  events if events is not None else Events(),
                                  threads=threads)
            for gen in self.strict_generators():
                runtime.add_strict(gen.key, gen.store, gen.settings)
                gen.bind(runtime)
            self._node = runtime
            return runtime

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
        """Stop every generator, release leases, close connections. Every generator is
        closed, not only those started through ``kit[name]``: one started with
        ``kit.get(name).start()`` holds a lease too (closing a never-started one is a no-op).
        One failing close does not keep the others' leases."""
        error: BaseException | None = None
        with self._lock:
            runtime, self._node = self._node, None
            # claims and membership first (a node closes the membership it was given)
            closeable = runtime if runtime is not None else self.membership
            parts = [closeable] if closeable is not None else []
            for part in [*parts, *self.generators.values()]:
                try:
                    part.close()
                except Exception as exc:  # noqa: BLE001 - closed the rest first, then raised
                    error = error or exc
            self._started.clear()
            self.pool.dispose()
        if error is not None:
            raise error

    def stats(self) -> Mapping[str, contracts.StatsRecord]:
        """The stats record of every started generator that keeps them (:class:`HasStats`)."""
        return {name: gen.stats() for name in self._started
                if isinstance(gen := self.generators[name], contracts.HasStats)}


_OPEN: weakref.WeakSet[Kit] = weakref.WeakSet()


@atexit.register
def _close_open_kits() -> None:
    for kit in list(_OPEN):
        try:
            kit.close()
        except Exception:  # noqa: BLE001 - at exit: one kit's failure must not keep the others open
            pass


def _check_orders(config: Config, typed: Mapping[str, TypedGenerator]) -> None:
    """``order = "strict"`` needs a ``[cluster]``: say so at the generator's key."""
    if config.cluster is not None:
        return
    for spec in typed.values():
        if isinstance(spec.settings, contracts.OrdersKeys) and spec.settings.order == "strict":
            raise ConfigError(
                f"{spec.path}.order", "\"strict\" needs a [cluster] section (name, advertise, "
                "membership) so that one node owns the key; add [cluster], or set "
                "order = \"node\""
            )


def _build_membership(config: Config, host: PluginHost, identity: Identity,
                      pool: BackendPool) -> contracts.Membership | None:
    """The ``[cluster]`` membership store, checked against its contract; the lease must
    span three of the store's lease steps (etcd grants whole seconds), so it is renewed
    before it lapses."""
    spec = config.cluster
    if spec is None:
        return None
    ctx = _context(config, host, "", spec.membership.path, identity, pool)
    membership: contracts.Membership = ctx.build(spec.membership, ctx)
    if isinstance(membership, contracts.LeaseGranularity):
        step = membership.lease_granularity
        if spec.lease_ns < 3 * step * 1e9:
            raise ConfigError(
                f"{spec.path}.lease", f"{format_unit(spec.lease_ns)} is less than 3 x the lease "
                f"granularity of membership {spec.membership.type!r} ({step:g}s): a lease "
                "would lapse between renewals; raise lease"
            )
    return membership


def build_kit(
    config: Config, host: PluginHost, identity: Identity | tuple[Any, ...] | None = None,
    *, as_member: bool = True, node: str | None = None, advertise: str | None = None,
) -> Kit:
    """Build (but do not start) every generator of ``config``: each strategy's factory
    with its checked settings, its result checked against the generator contract.

    ``identity`` defaults to :func:`default_identity`; a ``(host, port[, instance])``
    tuple is accepted too. With ``[cluster]``, the membership store is built too and this
    node's id and ``advertise`` URL are resolved (``$FLAKEKIT_NODE``,
    ``$FLAKEKIT_ADVERTISE``, or ``node`` / ``advertise`` given here: the server's
    ``--node`` / ``--advertise``, which win); ``as_member=False`` skips the latter, for
    tools that read the cluster without joining it (``flakekit cluster status``).
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
    typed = typed_generators(config, host)
    _check_orders(config, typed)
    resolved = (resolve_cluster(config.cluster, node=node, advertise=advertise)
                if config.cluster is not None and as_member else None)
    pool = config.pool()
    membership = _build_membership(config, host, identity, pool)
    generators, parts = {}, {}
    for name, spec in typed.items():
        ctx = _context(config, host, name, spec.path, identity, pool)
        parts[name] = ctx.parts
        gen = contracts.check_contract(spec.strategy.create(spec.settings, ctx), Generator,
                             spec.strategy, spec.path)
        if isinstance(gen, contracts.FormatsIds):
            gen.id_format = spec.id_format
        elif spec.format_given:
            raise ConfigError(f"{spec.path}.format", f"strategy {spec.strategy.name!r} has no "
                              "string form (its generators have no next_str()); remove format")
        generators[name] = gen
    kit = Kit(config, generators, pool, typed, parts, resolved, membership,
              events=host.events())
    _OPEN.add(kit)
    return kit
