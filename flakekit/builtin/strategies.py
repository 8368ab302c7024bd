"""The built-in strategies, ``snowflake`` and ``segment``, registered like any plugin's.

A ``[generators.NAME]`` table's keys other than ``strategy`` and ``format`` are the
strategy's settings: :class:`SnowflakeStrategySettings` or
:class:`SegmentStrategySettings`, checked field by field (unknown keys get a did-you-mean).
The references they hold (clock, allocator, store) are built through
:meth:`~flakekit.assembly.context.BuildContext.build`, which checks each result against
its contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from flakekit.assembly.settings import PluginRef, plugin_ref
from flakekit.assembly.strict import StrictSegment
from flakekit.errors import ConfigError, LayoutError
from flakekit.generators.segment_settings import SegmentSettings
from flakekit.pluginhost.markers import hookimpl
from flakekit.pluginhost.registry import Register, StrategyFactory
from flakekit.values.timeunits import Duration, duration_field

if TYPE_CHECKING:  # the generators and contracts load when a factory runs, not for --help
    from flakekit.assembly.context import BuildContext
    from flakekit.generators.periodic import PeriodicSegment
    from flakekit.generators.segment import SegmentGenerator
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.values.clock import Clock
    from flakekit.values.layout import BitLayout

__all__ = [
    "ON_LEASE_LOST",
    "SegmentStrategySettings",
    "SnowflakeStrategySettings",
    "build_segment",
    "build_snowflake",
    "check_clock_in_layout",
]

ON_LEASE_LOST = ("stop", "exit", "restart")
#: ``order`` of a segment generator: ``"node"`` (Leaf's: each process serves its own
#: segments, IDs increase per process) or ``"strict"`` (one owner per key in the cluster)
ORDERS = ("node", "strict")


@runtime_checkable
class PrefersOnLeaseLost(Protocol):
    """An allocator whose natural reaction to a lost lease is not ``"stop"`` (ZooKeeper
    lease mode re-acquires: ``"restart"``)."""

    default_on_lease_lost: str


@attrs.frozen
class SnowflakeStrategySettings:
    """``strategy = "snowflake"`` (the default).

    Attributes:
        layout: a layout name from the config file or a plugin (default ``snowflake``).
        clock: ``"name"`` or ``{type = "name", ...}`` (default ``monotonic``).
        allocator: where the worker id comes from; required.
        nodes: values of the layout's other node fields, e.g. ``{region = 1}``.
        on_lease_lost: ``"stop"``, ``"exit"`` or ``"restart"`` (default: the allocator's
            preference, else ``"stop"``).
        max_start_wait: how long start may wait for the clock to pass the previous
            holder's last issued time (default 10 s).
        workers: how many worker ids to lease (default 1; a static allocator's list or
            range sets it): the cap per tick grows N-fold.
        description: free text for listings.
    """

    layout: Any = "snowflake"  # checked by the resolver: "expected a layout name"
    clock: PluginRef = plugin_ref("clock", "monotonic")
    allocator: PluginRef | None = plugin_ref("allocator")
    nodes: Any = attrs.field(factory=dict)
    on_lease_lost: str | None = attrs.field(default=None)

    @on_lease_lost.validator
    def _check_on_lost(self, attribute: attrs.Attribute, value: str | None) -> None:
        if value is not None and value not in ON_LEASE_LOST:
            raise ValueError(f"expected one of {', '.join(map(repr, ON_LEASE_LOST))}, "
                             f"got {value!r}")
    max_start_wait: Duration = duration_field(10)
    description: str = ""
    workers: Any = None  # checked by build_snowflake against the layout's worker ids


def _check_order(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value not in ORDERS:
        raise ValueError(f"expected one of {', '.join(map(repr, ORDERS))} (\"strict\" needs a "
                         f"[cluster] section), got {value!r}")


@attrs.frozen
class SegmentStrategySettings(SegmentSettings):
    """``strategy = "segment"``: the fields of
    :class:`~flakekit.generators.segment.SegmentSettings` plus ``store`` (default
    ``{type = "sql", backend = "default"}``) and ``order``: ``"node"`` (default, Leaf's
    behaviour) or ``"strict"`` (IDs of the key strictly increase across the cluster: only
    the key's owner serves it; needs ``[cluster]``)."""

    store: PluginRef = plugin_ref("segment store", {"type": "sql", "backend": "default"},
                                  default_type="sql")
    order: str = attrs.field(default="node", validator=_check_order)


def check_clock_in_layout(layout: BitLayout, clock: Clock, path: str) -> None:
    """Refuse a layout whose time field cannot hold the clock's current reading (epoch in
    the future, or time bits used up): every ``next_id()`` would fail, so building (and
    ``flakekit config check``) fails instead."""
    now_ns = clock.time_ns()
    tick = layout.tick(now_ns)
    if tick < 0:
        raise ConfigError(
            path, f"layout {layout.name!r} starts at {layout.time_of_tick(0).isoformat()} (its "
            f"epoch), which is in the future by the clock ({clock.name}): no ID can be stamped "
            "before it; use a layout with an earlier epoch"
        )
    if tick >= 1 << layout.time_bits:
        raise ConfigError(
            path, f"layout {layout.name!r}: the time field is full since "
            f"{layout.time_of_tick(1 << layout.time_bits).isoformat()}; use a layout with a "
            "later epoch or more time bits"
        )


def _check_workers(value: Any, layout: BitLayout, path: str) -> int | None:
    """``workers``: None (unset) or 1..the layout's worker ids."""
    if value is None:
        return None
    top = layout.max_value(layout.worker_field) + 1 if layout.worker_field else 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise ConfigError(path, f"expected a whole number from 1 to {top} (the worker ids of "
                          f"layout {layout.name!r}), got {value!r}")
    return value


def build_snowflake(settings: SnowflakeStrategySettings, ctx: BuildContext) -> SnowflakeGenerator:
    """The ``snowflake`` strategy's factory."""
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.leases.lease import CountsWorkers, SeveralLeases

    path = ctx.path
    layout = ctx.resolve_layout(settings.layout, f"{path}.layout")
    clock: Clock = ctx.build(settings.clock)
    check_clock_in_layout(layout, clock, f"{path}.layout")
    alloc_path = f"{path}.allocator"
    if settings.allocator is None:
        raise ConfigError(
            alloc_path, "is required: e.g. allocator = {type = \"sql\", backend = \"main\"} "
            "or allocator = {type = \"static\", worker_id = 1}"
        )
    ctx = attrs.evolve(ctx, path=alloc_path, layout=layout, clock=clock)
    workers = _check_workers(settings.workers, layout, f"{path}.workers")
    base = ctx.instance * (workers or 1)   # id k of process p asks as instance p*N + k
    allocator = ctx.build(settings.allocator, attrs.evolve(ctx, instance=base))
    count = allocator.worker_count if isinstance(allocator, CountsWorkers) else None
    several = isinstance(allocator, SeveralLeases) and allocator.several_leases
    if several and isinstance(count, int) and (count > 1 or workers is not None):
        if workers is not None and workers != count:
            raise ConfigError(f"{path}.workers", f"is {workers} but {alloc_path}.worker_id "
                              f"names {count} id(s); list {workers} ids there, or drop workers")
        workers = count
    workers = workers or 1
    allocators: Any = allocator
    if workers > 1 and not several:
        # one lease per allocator (ZooKeeper...): one allocator per id, each its own
        # instance, so each has its own identity; listings show the first one only
        first_part = len(ctx.parts)
        allocators = [allocator] + [
            ctx.build(settings.allocator, attrs.evolve(ctx, instance=base + k))
            for k in range(1, workers)
        ]
        del ctx.parts[first_part:]
    on_lost = settings.on_lease_lost
    if on_lost is None:
        on_lost = (allocator.default_on_lease_lost
                   if isinstance(allocator, PrefersOnLeaseLost) else "stop")
        if on_lost not in ON_LEASE_LOST:
            raise ConfigError(f"{path}.on_lease_lost", f"the allocator prefers {on_lost!r}; "
                              f"set one of {', '.join(map(repr, ON_LEASE_LOST))}")
    nodes = settings.nodes
    if not isinstance(nodes, dict):
        raise ConfigError(f"{path}.nodes", "expected a table such as nodes = {region = 1}")
    wait_s = settings.max_start_wait / 1e9
    try:
        return SnowflakeGenerator(
            layout, clock, allocators, name=ctx.generator, events=ctx.events,
            on_lease_lost=on_lost, host=ctx.host, port=ctx.port, instance=ctx.instance,
            nodes=nodes, max_start_wait_s=wait_s, workers=workers,
        )
    except LayoutError as exc:
        field = f"nodes.{exc.field}" if exc.field in nodes else exc.field
        raise ConfigError(f"{path}.{field}", exc.message) from None


def build_segment(settings: SegmentStrategySettings,
                  ctx: BuildContext) -> SegmentGenerator | PeriodicSegment | StrictSegment:
    """The ``segment`` strategy's factory (Leaf's double buffer over a segment store; with
    ``order = "strict"`` a handle the cluster node serves, over a store that fences keys)."""
    from flakekit.generators.segment import SegmentGenerator
    from flakekit.pluginhost.contracts import KeyFence, check_contract

    store = ctx.build(settings.store, attrs.evolve(ctx, path=settings.store.path))
    key = settings.key or ctx.generator
    if settings.reset is not None:
        _check_periodic(store, key, settings, ctx)
    if settings.order == "strict":
        reg = ctx.plugins.segment_stores.get(settings.store.type, settings.store.type_path)
        check_contract(store, KeyFence, reg, settings.store.path)
        if _all_keys(ctx):
            raise ConfigError(f"{settings.store.path}.keys", "order = \"strict\" serves one key "
                              "per generator; remove keys (or use order = \"node\")")
        return StrictSegment(ctx.generator, key, store, settings, settings.store.type)
    if settings.reset is not None:
        from flakekit.generators.periodic import PeriodicSegment

        return PeriodicSegment(store, key, settings, clock=ctx.clock, events=ctx.events,
                               name=ctx.generator)
    return SegmentGenerator(store, key, settings, clock=ctx.clock, events=ctx.events,
                            name=ctx.generator)


def _check_periodic(store: Any, key: str, settings: SegmentStrategySettings,
                    ctx: BuildContext) -> None:
    """``reset``: the store must read the database's clock and create period rows, and
    serve one key (a table's every key has no period rule)."""
    from flakekit.generators.stores import PeriodStore

    path = f"{ctx.path}.reset"
    if "@" in key:
        raise ConfigError(f"{ctx.path}.key", f"{key!r}: a periodic counter's key may not "
                          "contain '@' (its period rows are named KEY@20261201)")
    if not isinstance(store, PeriodStore):
        raise ConfigError(path, f"segment store {settings.store.type!r} cannot tell the "
                          "period by the database's clock (it has no db_now() and "
                          "ensure_period_key()); use the sql store")
    if _all_keys(ctx):
        raise ConfigError(f"{settings.store.path}.keys", "a periodic counter (reset) serves "
                          "its own key's periods; remove keys = \"all\"")


def _all_keys(ctx: BuildContext) -> bool:
    """Whether the store just built serves every key of its table (``keys = "all"``)."""
    from flakekit.builtin.segments import SqlStoreOptions

    options = ctx.parts[-1].settings
    return isinstance(options, SqlStoreOptions) and options.keys != "one"


@hookimpl
def flakekit_register_strategies(register: Register[StrategyFactory]) -> None:
    register("snowflake", build_snowflake, settings=SnowflakeStrategySettings,
             description="time-ordered IDs: a bit layout, a clock and a leased worker id")
    register("segment", build_segment, settings=SegmentStrategySettings,
             description="Leaf-style ranges per key from a segment store, double-buffered")
