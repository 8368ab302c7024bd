"""``flakekit decode`` and ``flakekit next``: reading IDs and making new ones."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any

import click

from flakekit.cli.layouts import _decoded, _layout, _print_decoded
from flakekit.cli.main import _host, cli, config_option, echo_json, json_option
from flakekit.errors import ConfigError, InvalidIdError, UnknownKeyError


def _pick_format(encoding: str | None, prefix: str | None, configured: Any = None) -> Any:
    """``-f``/``--prefix`` over the generator's configured format (None: decimal)."""
    from flakekit.values.formats import DECIMAL, IdFormat

    base = configured or DECIMAL
    if encoding is None and prefix is None:
        return base
    try:
        if encoding is None:
            return IdFormat(base.encoding, prefix or "", base.pad)
        return IdFormat(encoding, prefix or "")
    except ConfigError as exc:  # name the option, not a config key
        option = "--prefix" if exc.path.endswith("prefix") else "--format"
        raise click.BadParameter(exc.message, param_hint=option) from None


format_option = click.option(
    "--format", "-f", "encoding", default=None, metavar="ENCODING",
    help="String form: decimal, hex, base62 or base32 (Crockford). Default: the generator's "
    "format in the config, else decimal.",
)
prefix_option = click.option(
    "--prefix", default=None, help="Prefix of the string form, e.g. ord_ (letters, digits, "
    "'_', ending with '_').",
)


def _read_ids(ids: Sequence[str]) -> list[str]:
    """The IDs of the arguments; ``-`` reads more from stdin, one per line."""
    out: list[str] = []
    for arg in ids:
        if arg == "-":
            text = sys.stdin.read()
            out += [line.strip() for line in text.splitlines() if line.strip()]
        else:
            out.append(arg)
    return out


def _all_readings(raw: str, layouts: Sequence[Any], fmt: Any) -> dict[str, Any]:
    """``raw`` under every layout, plausible readings (time between the layout's epoch and
    now + 1 day) first."""
    now = dt.datetime.now(dt.UTC)
    readings = []
    for lay in layouts:
        try:
            info = _decoded(lay, raw, fmt)
        except InvalidIdError as exc:
            readings.append({"layout": lay.name, "plausible": False, "fits": False,
                             "error": str(exc)})
            continue
        parts = {k: info[k] for k in lay.names}
        readings.append({"layout": lay.name, "plausible": lay.plausible(info["id"], now),
                         "fits": True, "timestamp": info["timestamp"], "parts": parts})
    readings.sort(key=lambda r: not r["plausible"])  # stable: listing order within each group
    return {"input": raw.strip(), "readings": readings}


def _print_all(result: dict[str, Any]) -> None:
    click.echo(f"{result['input']} under every layout (* = plausible: its time lies between "
               "the layout's epoch and now + 1 day)")
    width = max(len(r["layout"]) for r in result["readings"])
    for r in result["readings"]:
        mark = "*" if r["plausible"] else " "
        if not r["fits"]:
            click.echo(f"  {mark} {r['layout']:<{width}}  does not fit: {r['error']}")
            continue
        parts = " ".join(f"{k}={v}" for k, v in r["parts"].items() if k != "time")
        click.echo(f"  {mark} {r['layout']:<{width}}  {r['timestamp']:<27} {parts}")


@cli.command()
@click.argument("ids", metavar="ID...", nargs=-1)
@click.option("--layout", "-l", "layout_name", default=None, help="Layout name (default: the config's default generator's, else snowflake).")
@click.option("--all", "all_layouts", is_flag=True,
              help="Show each ID under every known layout and mark the plausible readings.")
@format_option
@prefix_option
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per ID and line.")
def decode(ids: tuple[str, ...], layout_name: str | None, all_layouts: bool,
           encoding: str | None, prefix: str | None, config_path: str | None,
           as_json: bool) -> None:
    """Decode IDs: time, node fields, sequence. IDs are arguments, or `-` to read them from
    stdin (one per line); decimal, 0x-hex, or a string form (the prefix and encoding are
    recognised; -f names the encoding)."""
    if as_json:
        import json  # only here: decode without --json starts without it
    raws = _read_ids(ids)
    if not raws:
        raise click.UsageError("give one or more IDs, or - to read them from stdin")
    path, configured, config = "layout", None, None
    if config_path:
        from flakekit.assembly.config import load_config

        config = load_config(config_path)
    if config is not None and config.default is not None:
        from flakekit.assembly.kit import typed_generators
        from flakekit.pluginhost.contracts import NamesLayout

        spec = typed_generators(config, _host())[config.generator(None).name]
        configured = spec.id_format
        if layout_name is None and isinstance(spec.settings, NamesLayout):
            layout_name = spec.settings.layout
            path = f"{spec.path}.layout"
    # nothing named: recognise each string's form (prefix, then encoding by its width)
    named = encoding is not None or prefix is not None or configured is not None
    fmt = _pick_format(encoding, prefix, configured) if named else None
    if all_layouts:
        host = _host()
        layouts = [host.layout(reg.name) for reg in host.layouts]
        layouts += list(config.layouts.values()) if config is not None else []
    else:
        layouts = [_layout(layout_name or "snowflake", config_path, path)]
    failed = 0
    for i, raw in enumerate(raws):
        try:
            if all_layouts:
                result = _all_readings(raw, layouts, fmt)
                if as_json:
                    click.echo(json.dumps(result))
                else:
                    _print_all(result)
                continue
            info = _decoded(layouts[0], raw, fmt)
        except InvalidIdError as exc:
            if len(raws) == 1:
                raise
            failed += 1
            click.echo(f"error: {exc}", err=True)
            continue
        if as_json:
            click.echo(json.dumps(info, default=str))
        else:
            if i:
                click.echo("")  # a blank line between IDs
            _print_decoded(info, False)
    if failed:
        raise InvalidIdError(f"{failed} of {len(raws)} IDs could not be decoded (see above)")


@cli.command("next")
@click.argument("name", required=False)
@click.option("-n", "count", type=click.IntRange(1, 10_000_000), default=1, show_default=True,
              help="How many IDs.")
@format_option
@prefix_option
@config_option
@json_option
def next_(name: str | None, count: int, encoding: str | None, prefix: str | None,
          config_path: str | None, as_json: bool) -> None:
    """Print new IDs from generator NAME (default: the config's default generator), as
    decimal or in a string form (-f base62 --prefix ord_, or the generator's format)."""
    import flakekit

    kit = flakekit.load(config_path)
    try:
        spec = kit.config.generator(name)
        fmt = _pick_format(encoding, prefix, kit.id_format(spec.name))
        gen = kit[spec.name]
        ids = list(gen.next_ids(count)) if count > 1 else [gen.next_id()]
    except UnknownKeyError as exc:  # found missing after start-up (preload = false)
        raise exc.for_config(kit.config.source) from None
    finally:
        kit.close()
    out: list[Any] = ids if fmt.encoding == "decimal" and not fmt.prefix and not fmt.pad \
        else fmt.encode_many(ids)
    if as_json:
        echo_json({"generator": spec.name, "ids": out})
    else:
        click.echo("\n".join(map(str, out)))
