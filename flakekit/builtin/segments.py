"""Built-in segment store ``sql`` (Leaf's ``leaf_alloc``) and the ``flakekit segments`` commands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit import hookimpl
from flakekit.errors import ConfigError, UnknownNameError
from flakekit.registry import Register
from flakekit.sql.leaf import SqlSegmentStore, SqlStoreSettings

if TYPE_CHECKING:
    import click

    from flakekit.config import Config

__all__ = ["StoreTarget", "segments_report", "store_targets"]


@hookimpl
def flakekit_register_segment_stores(register: Register) -> None:
    register(
        "sql", SqlSegmentStore.from_settings, settings=SqlStoreSettings,
        description="Leaf's leaf_alloc table (PostgreSQL, MariaDB/MySQL, SQLite)",
    )


@attrs.frozen
class StoreTarget:
    """One (backend, table) the config's segment generators use, and which keys they serve."""

    backend: str
    table: str
    generators: dict[str, str] = attrs.field(factory=dict)  # key -> generator name


def store_targets(config: Config, backend: str | None = None) -> list[StoreTarget]:
    """The ``sql`` segment tables named by ``config`` (or ``backend``'s ``leaf_alloc``).

    With no segment generator in the config, the ``default`` backend is used (the
    embedded SQLite file), so ``flakekit segments create`` works with no config at all.
    """
    found: dict[tuple[str, str], dict[str, str]] = {}
    for name, spec in config.generators.items():
        if spec.strategy != "segment":
            continue
        store = spec.table.get("store", {"type": "sql", "backend": "default"})
        if isinstance(store, str):
            store = {"type": store}
        if not isinstance(store, Mapping) or store.get("type", "sql") != "sql":
            continue
        where = (str(store.get("backend", "default")), str(store.get("table", "leaf_alloc")))
        key = spec.table.get("key") or name
        found.setdefault(where, {})[str(key)] = name
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
    running = running or {}
    keys = []
    for info in store.info():
        row = info.to_dict()
        row["generator"] = target.generators.get(info.key)
        gen = running.get(info.key)
        row["buffers"] = gen.stats()["buffers"] if gen is not None else None
        keys.append(row)
    return {"backend": target.backend, "table": target.table, "keys": keys}


def _store(pool: Any, target: StoreTarget) -> SqlSegmentStore:
    return SqlSegmentStore(pool.engine(target.backend, f"backends.{target.backend}"), target.table)


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
        help="Backend holding leaf_alloc. Default: those of the config's segment generators, else 'default'.",
    )

    @cli.group("segments", invoke_without_command=True)
    @config_option
    @backend_option
    @json_option
    @click.pass_context
    def segments(ctx: click.Context, config_path: str | None, backend: str | None, as_json: bool) -> None:
        """Segment keys (Leaf's leaf_alloc): max_id, step, and who serves them."""
        if ctx.invoked_subcommand is not None:
            return
        from flakekit.config import load_config

        config = load_config(config_path)
        pool = config.pool()
        try:
            reports = [
                segments_report(_store(pool, target), target)
                for target in store_targets(config, backend)
            ]
        finally:
            pool.dispose()
        if as_json:
            echo_json({"stores": reports})
            return
        for report in reports:
            _print_report(report, click.echo)

    @segments.command("create")
    @click.argument("key")
    @click.option("--step", type=int, required=True, help="IDs per fetch (Leaf: ~10 min of peak traffic).")
    @click.option("--start", type=int, default=1, show_default=True, help="The first ID.")
    @click.option("--description", default=None, help="Free text (Leaf's description column).")
    @config_option
    @backend_option
    @json_option
    def create(
        key: str, step: int, start: int, description: str | None, config_path: str | None,
        backend: str | None, as_json: bool,
    ) -> None:
        """Create KEY in leaf_alloc (and the table itself if it is missing)."""
        from flakekit.config import load_config

        config = load_config(config_path)
        targets = store_targets(config, backend)
        if len(targets) > 1:
            names = ", ".join(f"{t.backend}/{t.table}" for t in targets)
            raise ConfigError("--backend", f"the config's segment generators use several tables ({names}); choose one with --backend")
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
