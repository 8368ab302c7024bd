"""Built-in ``sql`` worker allocator and its commands (``db init``, ``workers``).

``allocator = {type = "sql", backend = "main", service = "orders"}`` leases worker ids
from the ``system_nodes`` table of ``[backends.main]`` (see :mod:`flakekit.sql.workers`
and docs/workers-sql.md). It is the embedded default too, on a SQLite file in the user's
state directory -- which is safe for the processes of ONE host (and one user) only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import click
from attrs.validators import instance_of, optional

from flakekit.errors import BackendError, ConfigError, FieldError, FlakekitError
from flakekit.pluginhost.markers import hookimpl, registers
from flakekit.values.timeunits import Duration, duration_field, format_unit, to_duration

if TYPE_CHECKING:  # annotations only: the plugin host loads this module for --help
    from flakekit.assembly.context import BuildContext

__all__ = ["SqlAllocatorSettings", "build_sql_allocator", "durability_report"]



def _tiers(value: Any) -> tuple[Duration, ...]:
    """``["7d", "1d", "1h"]`` → ns, longest first; at least one, strictly decreasing."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"reclaim_after must be a list of ages such as [\"7d\", \"1d\", \"1h\"], got {value!r}"
        )
    tiers = tuple(to_duration(item, minimum=1) for item in value)
    if any(a <= b for a, b in zip(tiers, tiers[1:], strict=False)):
        raise ValueError(
            "reclaim_after must go from the longest age to the shortest (e.g. "
            f"[\"7d\", \"1d\", \"1h\"]), got {list(value)!r}"
        )
    return tiers


def _port(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"port must be an integer 0..65535, got {value!r}")
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0..65535, got {value!r}")
    return value


@attrs.frozen(kw_only=True)
class SqlAllocatorSettings:
    """``allocator = {type = "sql", ...}``.

    Attributes:
        backend: the ``[backends.NAME]`` to use (default ``"default"``).
        service: the row namespace in ``system_nodes`` (default: the generator's name).
            Generators sharing a layout on one database must not share a service.
        host: this node's identity: an IP address, or a name that resolves (default:
            ``FLAKEKIT_HOST`` or the host name).
        port: this node's port identity (default ``FLAKEKIT_PORT`` or 0).
        heartbeat: how often the lease is renewed (default ``"10s"``; seed 000's
            ``"5m"`` works with the default tiers).
        reclaim_after: the reclaim tiers, longest first (default ``["7d", "1d", "1h"]``);
            a reclaim from the last one raises an alert, and the shortest one bounds every
            lease.
        safety_window: a lease ends this long before its row may be reclaimed (default
            ``"5s"``); it must leave room for at least one heartbeat.
        create_schema: create missing tables and apply schema migrations at start-up
            (default: yes on SQLite, no on database servers, where ``flakekit db init``
            and ``flakekit db upgrade`` are expected).
        max_start_wait: the longest a start-up may wait for the clock to pass the last
            time the id was used (default ``"10s"``); more fails start-up.
    """

    backend: str = attrs.field(default="default", validator=instance_of(str))
    service: str | None = attrs.field(
        default=None, validator=optional([instance_of(str),  # type: ignore[arg-type]
                                          attrs.validators.min_len(1),
                                          attrs.validators.max_len(64)]))
    host: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    port: int | None = attrs.field(default=None, converter=_port)
    heartbeat: Duration = duration_field("10s", minimum=1)
    reclaim_after: tuple[Duration, ...] = attrs.field(
        default=("7d", "1d", "1h"), converter=_tiers)
    safety_window: Duration = duration_field(
        "5s", validator=lambda _s, _a, v: _at_least_10ms(v))
    create_schema: bool | None = attrs.field(default=None, validator=optional(instance_of(bool)))
    max_start_wait: Duration = duration_field("10s")

    def __attrs_post_init__(self) -> None:
        shortest = min(self.reclaim_after)
        if shortest - self.safety_window <= self.heartbeat:
            raise FieldError(
                "heartbeat",
                f"heartbeat ({format_unit(self.heartbeat)}) must be shorter than the "
                f"shortest of reclaim_after ({format_unit(shortest)}) minus safety_window "
                f"({format_unit(self.safety_window)}), or every lease lapses between "
                "heartbeats"
            )


def _at_least_10ms(value: int) -> None:
    if value < 10_000_000:
        raise ValueError(
            f"safety_window must be at least 10ms (it absorbs clock-rate differences between "
            f"this node and the database over a lease, and SQLite's millisecond "
            f"timestamps); got {format_unit(value)}"
        )


def build_sql_allocator(settings: SqlAllocatorSettings | None, ctx: BuildContext) -> Any:
    """Factory registered as ``sql``: the allocator on the configured backend."""
    from flakekit.sql.workers import SqlWorkerAllocator

    s = settings or SqlAllocatorSettings()
    engine = ctx.backends.engine(s.backend, f"{ctx.path}.backend")
    try:
        return SqlWorkerAllocator(
            engine=engine, service=s.service or ctx.generator, clock=ctx.clock,
            host=s.host if s.host is not None else ctx.host,
            port=s.port if s.port is not None else ctx.port,
            heartbeat_ns=s.heartbeat, tiers_ns=s.reclaim_after,
            safety_window_ns=s.safety_window,
            create_schema=(engine.dialect.name == "sqlite" if s.create_schema is None
                           else s.create_schema),
            max_start_wait_ns=s.max_start_wait, events=ctx.events,
        )
    except ValueError as exc:
        raise ConfigError(f"{ctx.path}.host" if "host" in str(exc) else ctx.path,
                          str(exc)) from None


flakekit_register_allocators = registers(
    "sql", build_sql_allocator, settings=SqlAllocatorSettings,
    description="leased worker ids in a database table (PostgreSQL, MariaDB, SQLite)",
)


# -- commands ------------------------------------------------------------------------------
from flakekit.cli import config_option, json_option  # noqa: E402  (one --config lookup for every command)


@attrs.frozen
class _SqlGenerator:
    """A generator of the config whose allocator is ``sql``, with its settings."""

    name: str
    path: str
    settings: SqlAllocatorSettings


def _sql_generators(config: Any) -> Iterator[_SqlGenerator]:
    from flakekit.assembly.kit import typed_generators
    from flakekit.assembly.settings import build_settings
    from flakekit.pluginhost.host import get_host

    refs = [(spec, ref) for spec in typed_generators(config, get_host()).values()
            for ref in spec.refs if ref.kind == "allocator" and ref.type == "sql"]
    for spec, ref in refs:
        path = ref.path
        settings = build_settings(SqlAllocatorSettings, ref.settings, path)
        if settings.backend not in config.backends:
            from flakekit.errors import UnknownNameError

            raise UnknownNameError(f"{path}.backend", "backend", settings.backend,
                                   config.backends)
        yield _SqlGenerator(spec.name, path, settings)


def _engine(pool: Any, gen: _SqlGenerator) -> Any:
    return pool.engine(gen.settings.backend, f"{gen.path}.backend")


def _db_error(exc: Exception, engine: Any) -> BackendError:
    """One line naming the database (password hidden) and the driver's first line."""
    from flakekit.sql.backends import describe_engine
    from flakekit.sql.leaf import driver_message

    return BackendError(f"database {describe_engine(engine)}: {driver_message(exc)}")


def register_commands(cli: click.Group) -> None:
    """Add ``db init`` and ``workers release`` (split out so tests can add them to any
    group). ``workers`` itself is the core's listing of every allocator's records."""
    if "db" not in cli.commands:
        cli.add_command(db)
    group = cli.commands.get("workers")
    if isinstance(group, click.Group) and "release" not in group.commands:
        group.add_command(workers_release)


@hookimpl
def flakekit_register_commands(cli: click.Group) -> None:
    register_commands(cli)


@click.group()
def db() -> None:
    """Database schema of the SQL backends (versioned components)."""


def _schema_targets(config: Any) -> list[tuple[str, Any]]:
    """(backend, component) for every table the config needs, in a stable order: the
    ``workers`` registry of each sql allocator, the ``segments`` table of each sql store,
    and what plugins' components ask for."""
    from flakekit.builtin.segments import store_targets
    from flakekit.sql import schema
    from flakekit.sql.leaf import segments_component

    wanted: dict[tuple[str, str], Any] = {}
    for gen in _sql_generators(config):
        wanted.setdefault((gen.settings.backend, schema.WORKERS_COMPONENT), schema.WORKERS)
    from flakekit.builtin.segments import sql_store_refs

    if sql_store_refs(config):
        try:
            stores = [t for t in store_targets(config) if t.generators]
        except ConfigError:  # no sql segment store, and no default backend to fall back to
            stores = []
        for target in stores:
            comp = segments_component(target.table)
            wanted.setdefault((target.backend, comp.name), comp)
        for ref in sql_store_refs(config):   # strict keys: the fence beside their rows
            if ref.strict:
                wanted.setdefault((ref.settings.backend, schema.CLUSTER.name), schema.CLUSTER)
    for comp in schema.components():
        for backend in (comp.backends(config) if comp.backends is not None else ()):
            if backend not in config.backends:
                from flakekit.errors import UnknownNameError

                raise UnknownNameError(f"schema component {comp.name}", "backend", backend,
                                       config.backends)
            wanted.setdefault((backend, comp.name), comp)
    if not wanted:
        default = "default" if "default" in config.backends else next(iter(config.backends), None)
        if default is None:
            raise ConfigError("backends", "the config has no backends to initialise")
        wanted[(default, schema.WORKERS_COMPONENT)] = schema.WORKERS
    return [(backend, comp) for (backend, _), comp in wanted.items()]


def _schema_command(config_path: str | None, upgrade: bool, as_json: bool = False) -> None:
    from sqlalchemy.exc import DBAPIError

    from flakekit.assembly.config import load_config
    from flakekit.sql import schema
    from flakekit.sql.backends import describe_engine

    config = load_config(config_path)
    targets = _schema_targets(config)
    apply = schema.upgrade_schema if upgrade else schema.init_schema
    shown = config_path or config.source or ""  # "": the embedded default, no -c
    pool = config.pool()
    report: list[dict[str, Any]] = []
    try:
        for backend, comp in targets:
            engine = pool.engine(backend, f"backends.{backend}")
            try:
                change = apply(engine, comp)
            except DBAPIError as exc:
                raise _db_error(exc, engine) from None
            line = f"backends.{backend} ({describe_engine(engine)}): {change.describe(shown)}"
            if as_json:
                report.append({
                    "backend": backend, "database": describe_engine(engine),
                    "component": change.component, "before": change.before,
                    "after": change.after, "latest": change.latest,
                    "created": list(change.created), "changed": change.changed,
                    "pending": change.pending, "line": line})
            else:
                click.echo(line)
    finally:
        pool.dispose()
    if as_json:
        from flakekit.cli.main import echo_json

        echo_json(report)


@db.command("init")
@config_option
@json_option
def db_init(config_path: str | None, as_json: bool) -> None:
    """Create the tables every generator of the config needs (idempotent).

    Existing tables are left as they are; an older schema is reported with the `db
    upgrade` to run.
    """
    _schema_command(config_path, upgrade=False, as_json=as_json)


@db.command("upgrade")
@config_option
@json_option
def db_upgrade(config_path: str | None, as_json: bool) -> None:
    """Create what is missing and apply the schema migrations in order (idempotent).

    Two upgrades of one database at once run one after the other (a database lock). A
    database newer than this flakekit is refused.
    """
    _schema_command(config_path, upgrade=True, as_json=as_json)


def durability_report(config: Any) -> list[dict[str, Any]]:
    """Every backend's durability verdict (``flakekit db check``, the server's status)."""
    from flakekit.sql.backends import describe_engine
    from flakekit.sql.durability import watch_for
    from flakekit.sql.failover import FAILOVERS

    pool = config.pool()
    out: list[dict[str, Any]] = []
    try:
        for name, settings in config.backends.items():
            engine = pool.engine(name, f"backends.{name}")
            where = describe_engine(engine)
            entry: dict[str, Any] = {"backend": name, "database": where,
                                     "replication": settings.replication}
            try:
                verdict = watch_for(engine, name, settings.replication).read(engine)
            except Exception as exc:  # noqa: BLE001  # one backend down: report, go on
                entry.update(verdict="unreachable", ok=False,
                             line=str(_db_error(exc, engine)))
            else:
                ok = verdict.synchronous or settings.replication == "any"
                entry.update(verdict.to_dict(), ok=ok, line=verdict.line(name, where),
                             failovers=FAILOVERS.get(where, 0))
                if not ok:
                    entry["line"] += ' (replication = "synchronous": fetches and grants refused)'
            out.append(entry)
    finally:
        pool.dispose()
    return out


@db.command("check")
@config_option
@json_option
def db_check(config_path: str | None, as_json: bool) -> None:
    """What a commit survives on each backend, one line each (docs/replicated-databases.md).

    Exits 1 when a backend cannot be reached or one with replication = "synchronous"
    does not replicate synchronously.
    """
    from flakekit.assembly.config import load_config
    from flakekit.cli.main import echo_json

    report = durability_report(load_config(config_path))
    if as_json:
        echo_json(report)
    else:
        for entry in report:
            click.echo(entry["line"])
    if not all(entry["ok"] for entry in report):
        raise SystemExit(1)


@click.command("release")
@click.argument("worker_id", type=int)
@config_option
@click.option("--generator", "-g", "generator", default=None,
              help="Which generator's service (default: the config's default generator).")
@click.option("--force", is_flag=True,
              help="Release even a lease that still looks live (you know the holder is dead).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def workers_release(ctx: click.Context, worker_id: int, config_path: str | None,
                    generator: str | None, force: bool, as_json: bool) -> None:
    """Free worker WORKER_ID so the next start-up may take it (operators)."""
    from sqlalchemy.exc import DBAPIError

    from flakekit.assembly.config import load_config
    from flakekit.sql.schema import WORKERS_COMPONENT, check_schema
    from flakekit.sql.workers import release_worker

    parent = (ctx.parent and ctx.parent.params) or {}
    config = load_config(config_path or parent.get("config_path"))
    gens = {g.name: g for g in _sql_generators(config)}
    if not gens:
        raise ConfigError("generators", "no generator uses allocator type \"sql\"")
    name = generator or (config.default if config.default in gens else next(iter(gens)))
    if name not in gens:
        from flakekit.errors import UnknownNameError

        raise UnknownNameError("--generator", "generator with a sql allocator", name, gens)
    gen = gens[name]
    pool = config.pool()
    try:
        engine = _engine(pool, gen)
        try:
            check_schema(engine, WORKERS_COMPONENT)
            message = release_worker(
                engine, gen.settings.service or gen.name, worker_id, force=force,
                tiers_ns=gen.settings.reclaim_after, safety_window_ns=gen.settings.safety_window,
            )
        except DBAPIError as exc:
            raise _db_error(exc, engine) from None
        except LookupError as exc:  # no such worker: wrong input (exit 2)
            raise ConfigError("WORKER_ID", str(exc)) from None
        except RuntimeError as exc:
            raise _OperatorError(str(exc)) from None
    finally:
        pool.dispose()
    if as_json:
        from flakekit.cli import echo_json

        echo_json({"generator": name, "service": gen.settings.service or gen.name,
                   "worker_id": worker_id, "released": True, "forced": force,
                   "message": message})
        return
    click.echo(message)


class _OperatorError(FlakekitError):
    """``workers release`` refused (unknown id, live lease, concurrent change)."""
