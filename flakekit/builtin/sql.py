"""Built-in ``sql`` worker allocator and its commands (``db init``, ``workers``).

``allocator = {type = "sql", backend = "main", service = "orders"}`` leases worker ids
from the ``system_nodes`` table of ``[backends.main]`` (see :mod:`flakekit.sql.workers`
and docs/workers-sql.md). It is the embedded default too, on a SQLite file in the
working directory -- which is safe for the processes of ONE host only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import click
from attrs.validators import instance_of, optional

from flakekit import hookimpl
from flakekit.context import BuildContext
from flakekit.errors import BackendError, ConfigError, FlakekitError
from flakekit.registry import Register
from flakekit.timeunits import format_unit, parse_duration_ns

__all__ = ["SqlAllocatorSettings", "build_sql_allocator"]



def _duration(value: Any) -> int:
    ns = parse_duration_ns(value)
    if ns <= 0:
        raise ValueError(f"must be a positive duration such as '10s', got {value!r}")
    return ns


def _tiers(value: Any) -> tuple[int, ...]:
    """``["7d", "1d", "1h"]`` → ns, longest first; at least one, strictly decreasing."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"reclaim_after must be a list of ages such as [\"7d\", \"1d\", \"1h\"], got {value!r}"
        )
    tiers = tuple(_duration(item) for item in value)
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
        create_schema: create missing tables at start-up (default: yes on SQLite, no on
            database servers, where ``flakekit db init`` is expected).
        max_start_wait: the longest a start-up may wait for the clock to pass the last
            time the id was used (default ``"10s"``); more fails start-up.
    """

    backend: str = attrs.field(default="default", validator=instance_of(str))
    service: str | None = attrs.field(
        default=None, validator=optional([instance_of(str), attrs.validators.min_len(1),  # type: ignore[arg-type]
                                          attrs.validators.max_len(64)]))
    host: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    port: int | None = attrs.field(default=None, converter=_port)
    heartbeat: int = attrs.field(default="10s", converter=_duration)  # type: ignore[assignment]  # converted
    reclaim_after: tuple[int, ...] = attrs.field(
        default=("7d", "1d", "1h"), converter=_tiers)
    safety_window: int = attrs.field(default="5s", converter=parse_duration_ns,  # type: ignore[assignment]  # converted
                                     validator=lambda _s, _a, v: _at_least_10ms(int(v)))
    create_schema: bool | None = attrs.field(default=None, validator=optional(instance_of(bool)))
    max_start_wait: int = attrs.field(default="10s", converter=parse_duration_ns)  # type: ignore[assignment]  # converted

    def __attrs_post_init__(self) -> None:
        shortest = min(self.reclaim_after)
        if shortest - self.safety_window <= self.heartbeat:
            raise ValueError(
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


@hookimpl
def flakekit_register_allocators(register: Register) -> None:
    register(
        "sql", build_sql_allocator, settings=SqlAllocatorSettings,
        description="leased worker ids in a database table (PostgreSQL, MariaDB, SQLite)",
    )


# -- commands ------------------------------------------------------------------------------
config_option = click.option(
    "--config", "-c", "config_path", type=click.Path(dir_okay=False), default=None,
    envvar="FLAKEKIT_CONFIG",
    help="Config file (TOML). Default: $FLAKEKIT_CONFIG, else the embedded SQLite default.",
)


@attrs.frozen
class _SqlGenerator:
    """A generator of the config whose allocator is ``sql``, with its settings."""

    name: str
    path: str
    settings: SqlAllocatorSettings


def _sql_generators(config: Any) -> Iterator[_SqlGenerator]:
    from flakekit.settings import build_settings

    for spec in config.generators.values():
        table = spec.table.get("allocator")
        if isinstance(table, str):
            table = {"type": table}
        if not isinstance(table, dict) or table.get("type") != "sql":
            continue
        rest = {k: v for k, v in table.items() if k != "type"}
        path = f"{spec.path}.allocator"
        settings = build_settings(SqlAllocatorSettings, rest, path)
        if settings.backend not in config.backends:
            from flakekit.errors import UnknownNameError

            raise UnknownNameError(f"{path}.backend", "backend", settings.backend,
                                   config.backends)
        yield _SqlGenerator(spec.name, path, settings)


def _engine(pool: Any, gen: _SqlGenerator) -> Any:
    return pool.engine(gen.settings.backend, f"{gen.path}.backend")


def _db_error(exc: Exception) -> BackendError:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return BackendError(f"database error: {lines[0] if lines else type(orig).__name__}")


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
    """Database schema of the SQL backends."""


@db.command("init")
@config_option
def db_init(config_path: str | None) -> None:
    """Create the flakekit tables (idempotent) on every SQL backend the config uses."""
    from sqlalchemy.exc import DBAPIError

    from flakekit.config import load_config
    from flakekit.sql import schema

    try:  # the segment store declares its tables when imported
        import flakekit.sql.leaf  # noqa: F401
    except ImportError:
        pass
    config = load_config(config_path)
    targets: dict[str, set[str]] = {}
    for gen in _sql_generators(config):
        targets.setdefault(gen.settings.backend, set()).add(schema.WORKERS_COMPONENT)
    for spec in config.generators.values():
        store = spec.table.get("store")
        if isinstance(store, str):
            store = {"type": store}
        if isinstance(store, dict) and store.get("type") == "sql":
            backend = store.get("backend", "default")
            if backend in config.backends and "segments" in schema.components():
                targets.setdefault(backend, set()).add("segments")
    if not targets:
        default = "default" if "default" in config.backends else next(iter(config.backends), None)
        if default is None:
            raise ConfigError("backends", "the config has no backends to initialise")
        targets[default] = {schema.WORKERS_COMPONENT}
    pool = config.pool()
    try:
        for backend, comps in targets.items():
            engine = pool.engine(backend, f"backends.{backend}")
            for comp in sorted(comps):
                try:
                    schema.init_schema(engine, comp)
                except DBAPIError as exc:
                    raise _db_error(exc) from None
                click.echo(f"backends.{backend}: {comp} schema ready "
                           f"({engine.url.render_as_string(hide_password=True)})")
    finally:
        pool.dispose()


@click.command("release")
@click.argument("worker_id", type=int)
@config_option
@click.option("--generator", "-g", "generator", default=None,
              help="Which generator's service (default: the config's default generator).")
@click.option("--force", is_flag=True,
              help="Release even a lease that still looks live (you know the holder is dead).")
@click.pass_context
def workers_release(ctx: click.Context, worker_id: int, config_path: str | None,
                    generator: str | None, force: bool) -> None:
    """Free worker WORKER_ID so the next start-up may take it (operators)."""
    from sqlalchemy.exc import DBAPIError

    from flakekit.config import load_config
    from flakekit.sql.schema import WORKERS_COMPONENT, check_schema
    from flakekit.sql.workers import release_worker

    config = load_config(config_path or ((ctx.parent and ctx.parent.params) or {}).get("config_path"))
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
            raise _db_error(exc) from None
        except LookupError as exc:  # no such worker: wrong input (exit 2)
            raise ConfigError("WORKER_ID", str(exc)) from None
        except RuntimeError as exc:
            raise _OperatorError(str(exc)) from None
    finally:
        pool.dispose()
    click.echo(message)


class _OperatorError(FlakekitError):
    """``workers release`` refused (unknown id, live lease, concurrent change)."""
