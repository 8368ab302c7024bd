"""Built-in segment store ``sql`` (Leaf's ``leaf_alloc``) and the ``flakekit segments`` commands."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import ConfigError, UnknownNameError
from flakekit.pluginhost.markers import hookimpl, registers
from flakekit.sql.settings import SqlStoreSettings  # not sql.leaf: --help needs no SQLAlchemy
from flakekit.values.keys import key_problem

if TYPE_CHECKING:
    import click

    from flakekit.assembly.config import Config
    from flakekit.sql.leaf import SqlSegmentStore

__all__ = ["StoreTarget", "segments_report", "store_targets"]


@attrs.frozen
class SqlStoreOptions(SqlStoreSettings):
    """``store = {type = "sql", ...}``: the table, plus ``keys``: ``"one"`` (default) serves
    the generator's own key; ``"all"`` makes ``flakekit serve`` answer every ``biz_tag`` of
    the table on Leaf's URL, keys added while it runs included (as a Leaf server does)."""

    keys: str = attrs.field(default="one", validator=attrs.validators.in_(("one", "all")))


def _build_sql_store(settings: SqlStoreSettings, context: Any) -> SqlSegmentStore:
    """Factory registered as ``sql``; imports SQLAlchemy only when a config uses it."""
    from flakekit.sql.leaf import SqlSegmentStore

    return SqlSegmentStore.from_settings(settings, context)


flakekit_register_segment_stores = registers(
    "sql", _build_sql_store, settings=SqlStoreOptions,
    description="Leaf's leaf_alloc table (PostgreSQL, MariaDB/MySQL, SQLite)",
)


@attrs.frozen
class StoreTarget:
    """One (backend, table) the config's segment generators use, and which keys they serve."""

    backend: str
    table: str
    generators: dict[str, str] = attrs.field(factory=dict)  # key -> generator name


@attrs.frozen
class SqlStoreRef:
    """A generator of the config whose segment store is this plugin's ``sql``."""

    generator: str
    key: str
    settings: SqlStoreOptions
    strict: bool = False   # order = "strict": the store also needs the key-owner table


def sql_store_refs(config: Config) -> list[SqlStoreRef]:
    """The config's references to the ``sql`` store, parsed once by the plugin host (the
    strategy's settings say which key; no raw table is read here)."""
    from flakekit.assembly.kit import typed_generators
    from flakekit.assembly.settings import build_settings
    from flakekit.generators.segment import SegmentSettings
    from flakekit.pluginhost.contracts import OrdersKeys
    from flakekit.pluginhost.host import get_host

    out = []
    for name, spec in typed_generators(config, get_host()).items():
        for ref in spec.refs:
            if ref.kind == "segment store" and ref.type == "sql":
                key = spec.settings.key if isinstance(spec.settings, SegmentSettings) else None
                out.append(SqlStoreRef(name, str(key or name),
                                       build_settings(SqlStoreOptions, ref.settings, ref.path),
                                       isinstance(spec.settings, OrdersKeys)
                                       and spec.settings.order == "strict"))
    return out


def store_targets(config: Config, backend: str | None = None) -> list[StoreTarget]:
    """The ``sql`` segment tables named by ``config`` (or ``backend``'s ``leaf_alloc``).

    With no segment generator in the config, the ``default`` backend is used (the
    embedded SQLite file), so ``flakekit segments create`` works with no config at all.
    """
    found: dict[tuple[str, str], dict[str, str]] = {}
    for target in sql_store_refs(config):
        where = (target.settings.backend, target.settings.table)
        found.setdefault(where, {})[target.key] = target.generator
    if backend is not None:
        if backend not in config.backends:
            raise UnknownNameError("--backend", "backend", backend, config.backends)
        mine = {w: g for w, g in found.items() if w[0] == backend} or {(backend, "leaf_alloc"): {}}
        found = mine
    if not found:
        if "default" not in config.backends:
            raise ConfigError(
                "--backend", "the config has no segment generator and no 'default' backend; "
                f"name one of: {', '.join(sorted(config.backends)) or '(none)'}"
            )
        found = {("default", "leaf_alloc"): {}}
    return [StoreTarget(b, t, g) for (b, t), g in found.items()]


def segments_report(
    store: SqlSegmentStore, target: StoreTarget, running: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One table's rows, plus each running generator's buffers (``running``: key → generator).

    Used by ``flakekit segments`` (which runs no generator itself) and by servers that do.
    """
    from flakekit.values.periods import PERIOD_KEY

    running = running or {}
    keys = []
    for info in store.info():
        row = info.to_dict()
        period = PERIOD_KEY.match(info.key)   # a periodic counter's row: its generator's
        bad_key = key_problem(period.group("base") if period else info.key)
        if bad_key and not row.get("problem"):  # no URL can name it: never served
            row["problem"] = bad_key
        row["generator"] = target.generators.get(info.key) or (
            target.generators.get(period.group("base")) if period else None)
        gen = running.get(info.key)
        row["buffers"] = ([b.as_dict() for b in gen.stats().buffers]
                          if gen is not None else None)
        keys.append(row)
    return {"backend": target.backend, "table": target.table, "keys": keys}


def _store(pool: Any, target: StoreTarget) -> SqlSegmentStore:
    from flakekit.sql.leaf import SqlSegmentStore

    return SqlSegmentStore(pool.engine(target.backend, f"backends.{target.backend}"), target.table)


def _store_reports(config_path: str | None, backend: str | None,
                   report: Callable[[SqlSegmentStore, StoreTarget], dict[str, Any] | None]
                   ) -> list[dict[str, Any]]:
    """``report`` on the store of each (backend, table) the config's segment generators
    use (or ``backend``'s), the pool disposed after; a None report is left out."""
    from flakekit.assembly.config import load_config

    config = load_config(config_path)
    pool = config.pool()
    try:
        return [r for target in store_targets(config, backend)
                if (r := report(_store(pool, target), target)) is not None]
    finally:
        pool.dispose()


def _show(reports: list[dict[str, Any]], as_json: bool,
          show: Callable[[dict[str, Any]], None]) -> None:
    """The reports as ``{"stores": [...]}`` JSON, or each as ``show`` prints it."""
    if as_json:
        from flakekit.cli import echo_json

        echo_json({"stores": reports})
        return
    for report in reports:
        show(report)


def _print_report(report: dict[str, Any], echo: Any) -> None:
    echo(f"{report['table']} on backend {report['backend']!r}:")
    if not report["keys"]:
        echo("  (no keys; create one with `flakekit segments create KEY --step 1000`)")
        return
    header = ("key", "max_id", "step", "generator", "updated", "description")
    rows = [
        (k["key"], str(k["max_id"]), str(k["step"]), k["generator"] or "-",
         (k["update_time"] or "-")[:19], k["description"] or "")
        for k in report["keys"]
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    echo("  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for row in rows:
        echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for k in report["keys"]:
        if k.get("problem"):  # listed anyway: one bad row must not hide the others
            echo(f"  ! {k['key']}: cannot serve a segment: {k['problem']}")
    for k in report["keys"]:
        for buf in k["buffers"] or []:
            state = (f"[{buf['start']}, {buf['end']}) at {buf['position']} step {buf['step']}"
                     if buf["ready"] else "not ready")
            echo(f"    {k['key']} {buf['slot']}: {state}")


@hookimpl
def flakekit_register_commands(cli: click.Group) -> None:
    import click

    from flakekit.cli import config_option, echo_json, json_option

    backend_option = click.option(
        "--backend", default=None,
        help="Backend holding leaf_alloc. Default: those of the config's segment generators, else "
             "'default'.",
    )

    @cli.group("segments", invoke_without_command=True)
    @config_option
    @backend_option
    @json_option
    @click.pass_context
    def segments(ctx: click.Context, config_path: str | None, backend: str | None,
                 as_json: bool) -> None:
        """Segment keys (Leaf's leaf_alloc): max_id, step, and who serves them."""
        if ctx.invoked_subcommand is not None:
            return
        _show(_store_reports(config_path, backend, segments_report), as_json,
              lambda report: _print_report(report, click.echo))

    @segments.command("create")
    @click.argument("key")
    @click.option("--step", type=int, required=True,
                  help="IDs per fetch (Leaf: ~10 min of peak traffic).")
    @click.option("--start", type=int, default=1, show_default=True, help="The first ID.")
    @click.option("--description", default=None, help="Free text (Leaf's description column).")
    @config_option
    @backend_option
    @json_option
    def create(
        key: str, step: int, start: int, description: str | None, config_path: str | None,
        backend: str | None, as_json: bool,
    ) -> None:
        """Create KEY in leaf_alloc (and the table itself if it is missing). KEY follows
        the server's rule: 1 to 128 of A-Z a-z 0-9 _ . : - (not starting with . : -)."""
        from flakekit.assembly.config import load_config

        problem = key_problem(key)
        if problem:
            raise click.BadParameter(problem, param_hint="KEY")

        config = load_config(config_path)
        targets = store_targets(config, backend)
        if len(targets) > 1:
            names = ", ".join(f"{t.backend}/{t.table}" for t in targets)
            raise ConfigError("--backend",
                              f"the config's segment generators use several tables ({names}); "
                              "choose one with --backend")
        target = targets[0]
        pool = config.pool()
        try:
            info = _store(pool, target).create(key, step, start, description)
        finally:
            pool.dispose()
        if as_json:
            echo_json({"backend": target.backend, "table": target.table, **info.to_dict()})
        else:
            click.echo(
                f"created segment key {key!r} in {target.table} on backend {target.backend!r}: "
                f"first ID {info.max_id}, step {info.step}"
            )

    @segments.command("prune")
    @click.option("--keep", type=click.IntRange(min=0), default=None,
                  help="Keep the N newest periods of each periodic key.")
    @click.option("--older-than", "older_than", default=None,
                  help="Only periods that ended more than this long ago by the database's "
                  "clock, e.g. 400d.")
    @click.option("--key", "base", default=None, help="Only the periods of this key.")
    @click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
    @config_option
    @backend_option
    @json_option
    def prune(keep: int | None, older_than: str | None, base: str | None, dry_run: bool,
              config_path: str | None, backend: str | None, as_json: bool) -> None:
        """Delete old period rows of periodic keys (reset = ...): KEY@20261201 and the like.

        A period is only pruned once it has been over for an hour by the database's clock;
        rows flakekit did not create are never touched.
        """
        _prune(keep, older_than, base, dry_run, config_path, backend, as_json)


def _prune(keep: int | None, older_than: str | None, base: str | None, dry_run: bool,
           config_path: str | None, backend: str | None, as_json: bool) -> None:
    import datetime as dt

    import click

    from flakekit.sql.periods import delete_period_rows, period_rows, prunable
    from flakekit.values.timeunits import parse_duration_ns

    if keep is None and older_than is None:
        raise click.UsageError("say what to keep: --keep N (newest periods per key) and/or "
                               "--older-than DURATION (e.g. 400d)")
    age = None
    if older_than is not None:
        try:
            age = dt.timedelta(microseconds=parse_duration_ns(older_than, default_unit="s") // 1000)
        except ValueError as exc:
            raise ConfigError("--older-than", str(exc)) from None

    def prune(store: SqlSegmentStore, target: StoreTarget) -> dict[str, Any] | None:
        if not store.has_table():
            return None
        now = store.db_now()
        rows = period_rows(store, base)
        doomed = prunable(rows, now, keep, age)
        deleted = 0 if dry_run else delete_period_rows(store, doomed)
        return {
            "backend": target.backend, "table": target.table,
            "database_time": now.isoformat(), "dry_run": dry_run,
            "periods": len(rows), "prune": [r.to_dict() for r in doomed],
            "deleted": deleted,
        }

    _show(_store_reports(config_path, backend, prune), as_json, _print_prune)


def _print_prune(rep: dict[str, Any]) -> None:
    import click

    dry_run = rep["dry_run"]
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{rep['table']} on backend {rep['backend']!r}: {rep['periods']} period "
               f"row(s); {verb} {len(rep['prune']) if dry_run else rep['deleted']}")
    for row in rep["prune"]:
        click.echo(f"  {row['key']}  max_id {row['max_id']}  ended {row['ends'][:19]}")
