"""The ``flakekit`` command line.

Wrong input prints one line on stderr and exits 2; a runtime failure (a database that is
down, a lease that is lost) prints one line and exits 1. Never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from flakekit.errors import (
    ConfigError,
    FlakekitError,
    InvalidIdError,
    LayoutError,
    UnknownKeyError,
    UnknownNameError,
)

__all__ = ["cli", "main"]

#: errors that mean "the input was wrong" (exit 2) rather than "it failed" (exit 1)
USAGE_ERRORS = (ConfigError, LayoutError, InvalidIdError, UnknownNameError, UnknownKeyError)

config_option = click.option(
    "--config", "-c", "config_path", type=click.Path(dir_okay=False), default=None,
    envvar="FLAKEKIT_CONFIG",
    help="Config file (TOML). Default: $FLAKEKIT_CONFIG, else the embedded SQLite default.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _host() -> Any:
    from flakekit.host import get_host

    return get_host()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flakekit", prog_name="flakekit")
def cli() -> None:
    """flakekit: unique, time-ordered 64-bit IDs across many machines."""


# -- layouts -------------------------------------------------------------------------------
@cli.group()
def layout() -> None:
    """Inspect bit layouts: list, show, compose, decompose."""


def _layout(name: str, config_path: str | None, path: str = "layout") -> Any:
    from flakekit.kit import resolve_layout

    if config_path:
        from flakekit.config import load_config

        config = load_config(config_path)
    else:
        from flakekit.config import parse_config

        config = parse_config({})
    return resolve_layout(config, _host(), name, path)


@layout.command("list")
@config_option
@json_option
def layout_list(config_path: str | None, as_json: bool) -> None:
    """List every layout (registered by plugins, or defined in the config)."""
    host = _host()
    rows = [(reg.name, reg.plugin, host.layout(reg.name)) for reg in host.layouts]
    if config_path:
        from flakekit.config import load_config

        rows += [(n, config_path, lay) for n, lay in load_config(config_path).layouts.items()]
    if as_json:
        echo_json([{**lay.describe(), "source": src} for _, src, lay in rows])
        return
    width = max(len(n) for n, _, _ in rows)
    for name, source, lay in rows:
        bits = "/".join(f"{b}" for _, b in lay.fields)
        click.echo(f"{name:<{width}}  {bits:<12} {lay.description or source}")


def bit_diagram(lay: Any) -> list[str]:
    """One box per field, MSB first, with its bit span."""
    cells = [("sign", "63")] if lay.total_bits == 63 else []
    pos = lay.total_bits
    for name, bits in lay.fields:
        hi, lo = pos - 1, pos - bits
        cells.append((f"{name} ({bits})", f"{hi}..{lo}" if bits > 1 else f"{hi}"))
        pos -= bits
    widths = [max(len(a), len(b)) + 2 for a, b in cells]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    names = "|" + "|".join(a.center(w) for (a, _), w in zip(cells, widths)) + "|"
    spans = "|" + "|".join(b.center(w) for (_, b), w in zip(cells, widths)) + "|"
    return [rule, names, spans, rule]


@layout.command("show")
@click.argument("name")
@config_option
@json_option
def layout_show(name: str, config_path: str | None, as_json: bool) -> None:
    """Show a layout: bit diagram, capacity, overflow date and warnings."""
    lay = _layout(name, config_path)
    info = lay.describe()
    if as_json:
        echo_json(info)
        return
    click.echo(f"{lay.name}: {lay.description}" if lay.description else lay.name)
    for line in bit_diagram(lay):
        click.echo("  " + line)
    click.echo(f"  unit            {info['unit']}")
    click.echo(f"  epoch           {info['epoch']} ({lay.epoch_ms} ms)")
    click.echo(f"  total bits      {lay.total_bits}")
    click.echo(f"  worker field    {lay.worker_field or '(none)'}")
    click.echo(f"  IDs per second  {info['ids_per_second_per_worker']:,.0f} per worker")
    click.echo(f"  max workers     {info['max_workers']:,} (all node fields)")
    click.echo(f"  overflows at    {info['overflows_at']} ({info['years_left']} years left)")
    for warning in info["warnings"]:
        click.echo(f"  warning: {warning}")


def _parse_parts(lay: Any, parts: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        if not sep:
            raise click.UsageError(f"{part!r}: expected FIELD=VALUE (fields: {', '.join(lay.names)})")
        key = key.strip()
        if key == "time" and not raw.strip().lstrip("-").isdigit():
            try:
                out[key] = dt.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
            except ValueError:
                raise click.UsageError(
                    f"time={raw!r}: expected ticks since the epoch or an ISO-8601 time"
                ) from None
            if out[key].tzinfo is None:
                out[key] = out[key].replace(tzinfo=dt.UTC)
            continue
        try:
            out[key] = int(raw, 0)
        except ValueError:
            raise click.UsageError(f"{key}={raw!r}: expected an integer") from None
    return out


@layout.command("compose")
@click.argument("name")
@click.argument("parts", nargs=-1, required=True)
@config_option
def layout_compose(name: str, parts: tuple[str, ...], config_path: str | None) -> None:
    """Build an ID from parts: flakekit layout compose snowflake time=2024-01-01T00:00:00Z worker=3 sequence=1"""
    lay = _layout(name, config_path)
    click.echo(lay.compose(**_parse_parts(lay, parts)))


def _decoded(lay: Any, raw: str) -> dict[str, Any]:
    parts = lay.decompose(raw)
    value = lay.check_id(raw)
    when = lay.timestamp(value)
    return {"id": value, "layout": lay.name, **parts,
            "timestamp": when.isoformat().replace("+00:00", "Z")}


def _print_decoded(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(info)
        return
    width = max(len(k) for k in info)
    for key, value in info.items():
        click.echo(f"{key:<{width}}  {value}")


@layout.command("decompose")
@click.argument("name")
@click.argument("id_", metavar="ID")
@json_option
@config_option
def layout_decompose(name: str, id_: str, as_json: bool, config_path: str | None) -> None:
    """Split an ID into its parts."""
    _print_decoded(_decoded(_layout(name, config_path), id_), as_json)


@cli.command()
@click.argument("id_", metavar="ID")
@click.option("--layout", "-l", "layout_name", default=None, help="Layout name (default: the config's default generator's, else snowflake).")
@config_option
@json_option
def decode(id_: str, layout_name: str | None, config_path: str | None, as_json: bool) -> None:
    """Decode an ID: time, node fields, sequence."""
    path = "layout"
    if layout_name is None:
        layout_name = "snowflake"
        if config_path:
            from flakekit.config import load_config

            config = load_config(config_path)
            if config.default is not None:  # no generators: snowflake, as the help says
                spec = config.generator(None)
                if spec.strategy == "snowflake":
                    layout_name = spec.table.get("layout", "snowflake")
                    path = f"{spec.path}.layout"
    _print_decoded(_decoded(_layout(layout_name, config_path, path), id_), as_json)


# -- generating ----------------------------------------------------------------------------
@cli.command("next")
@click.argument("name", required=False)
@click.option("-n", "count", type=click.IntRange(1, 10_000_000), default=1, show_default=True,
              help="How many IDs.")
@config_option
@json_option
def next_(name: str | None, count: int, config_path: str | None, as_json: bool) -> None:
    """Print new IDs from generator NAME (default: the config's default generator)."""
    import flakekit

    kit = flakekit.load(config_path)
    try:
        spec = kit.config.generator(name)
        gen = kit[spec.name]
        ids = list(gen.next_ids(count)) if count > 1 else [gen.next_id()]
    finally:
        kit.close()
    if as_json:
        echo_json({"generator": spec.name, "ids": ids})
    else:
        click.echo("\n".join(map(str, ids)))


# -- workers -----------------------------------------------------------------------------------
def _allocator_type(table: Any) -> str:
    if isinstance(table, str):
        return table
    return str(table.get("type", "?")) if isinstance(table, dict) else "?"


def _details(extra: dict[str, Any]) -> str:
    """The allocator-specific part of a record, short: ``host:port (name)`` or ``k=v``."""
    if "host" in extra and "port" in extra:
        where = f"{extra['host']}:{extra['port']}"
        return f"{where} ({extra['host_name']})" if extra.get("host_name") else where
    return " ".join(f"{k}={v}" for k, v in extra.items()
                    if v not in (None, "") and isinstance(v, (str, int)))[:60]


_RECORD_KEYS = {"generator", "allocator", "worker_id", "epoch", "state", "last_seen", "mine", "holder"}


@cli.group(invoke_without_command=True)
@config_option
@json_option
@click.pass_context
def workers(ctx: click.Context, config_path: str | None, as_json: bool) -> None:
    """List the worker ids every generator's allocator knows about (id, holder, epoch,
    last seen, lease state)."""
    if ctx.invoked_subcommand is not None:
        return
    import flakekit

    kit = flakekit.load(config_path)
    rows: list[dict[str, Any]] = []
    try:
        for name, spec in kit.config.generators.items():
            keeper = getattr(kit.get(name), "keeper", None)
            if keeper is None:
                continue
            try:
                records = keeper.allocator.records()
            finally:
                keeper.allocator.close()
            for rec in records:
                rows.append({
                    "generator": name, "allocator": _allocator_type(spec.table.get("allocator")),
                    "worker_id": rec.worker_id, "epoch": rec.epoch, "state": rec.state,
                    "last_seen": rec.last_seen.isoformat() if rec.last_seen else None,
                    "mine": rec.mine, "holder": rec.holder or None, **rec.extra,
                })
    finally:
        kit.close()
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no workers yet")
        return
    header = ("GENERATOR", "ALLOCATOR", "ID", "EPOCH", "STATE", "LAST SEEN (UTC)", "WHERE", "HOLDER")
    table = [header] + [
        (r["generator"], r["allocator"], str(r["worker_id"]), str(r["epoch"]), r["state"],
         (r["last_seen"] or "-")[:19].replace("T", " "),
         _details({k: v for k, v in r.items() if k not in _RECORD_KEYS}), r["holder"] or "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


# -- plugins and config ----------------------------------------------------------------------
@cli.command()
@json_option
def plugins(as_json: bool) -> None:
    """List loaded plugins and what they register."""
    infos = _host().plugins()
    if as_json:
        echo_json([
            {"name": p.name, "distribution": p.distribution, "version": p.version,
             "builtin": p.builtin, "hooks": list(p.hooks), "registers": list(p.registers)}
            for p in infos
        ])
        return
    for p in infos:
        origin = "built-in" if p.builtin else f"{p.distribution or '?'} {p.version or ''}".strip()
        click.echo(f"{p.name}  ({origin})")
        if p.registers:
            click.echo(f"    registers: {', '.join(p.registers)}")
        click.echo(f"    hooks: {', '.join(p.hooks)}")


@cli.group("config")
def config_group() -> None:
    """Check config files."""


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Parse PATH and build every generator without starting any."""
    from flakekit.config import load_config
    from flakekit.kit import build_kit

    config = load_config(path)
    kit = build_kit(config, _host())
    kit.pool.dispose()
    click.echo(f"{path}: ok ({len(config.generators)} generators: "
               f"{', '.join(config.generators) or '-'}; {len(config.layouts)} layouts)")


_COMMANDS_ADDED = False


def _add_plugin_commands() -> None:
    global _COMMANDS_ADDED
    if not _COMMANDS_ADDED:
        _COMMANDS_ADDED = True
        _host().add_commands(cli)


def run(func: Callable[[], Any]) -> int:
    """Run ``func`` turning flakekit errors into one line and an exit status."""
    try:
        func()
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort as exc:
        click.echo("Aborted!", err=True)
        return 130 if isinstance(exc.__context__, KeyboardInterrupt) else 1
    except USAGE_ERRORS as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except FlakekitError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unexpected backend error: still one line
        click.echo(f"error: {type(exc).__name__}: {exc} (run with FLAKEKIT_DEBUG=1 for details)", err=True)
        if _debug():
            raise
        return 1
    return 0


def _debug() -> bool:
    import os

    return bool(os.environ.get("FLAKEKIT_DEBUG"))


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    def invoke() -> None:
        _add_plugin_commands()
        cli.main(args=list(argv) if argv is not None else None, prog_name="flakekit",
                 standalone_mode=False)

    sys.exit(run(invoke))


if __name__ == "__main__":
    main()
