"""``flakekit decode`` and ``flakekit next``: reading IDs and making new ones."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from flakekit.cli.layouts import _decoded, _layout, _print_decoded
from flakekit.cli.main import _host, cli, config_option, echo_json, json_option
from flakekit.errors import ConfigError, InvalidIdError, UnknownKeyError

if TYPE_CHECKING:
    from flakekit.values.layout import BitLayout


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


def _one_off(lay: Any, epoch: str | None, unit: str | None, bits: str | None) -> Any:
    """The layout with ``--epoch/--unit/--bits`` applied (errors name the option)."""
    from flakekit.errors import LayoutError

    if epoch is None and unit is None and bits is None:
        return lay
    try:
        return lay.one_off(epoch=epoch, unit=unit, bits=bits)
    except LayoutError as exc:
        option = {"epoch": "--epoch", "unit": "--unit"}.get(exc.field, "--bits")
        raise click.BadParameter(exc.message, param_hint=option) from None


def _inline_layout(spec: str) -> Any:
    """``--layout '{fields = [["time", 41], ...], epoch = "2015-01-01T00:00:00Z"}'``: a
    layout table as in a config file, inline."""
    import tomllib

    from flakekit.errors import LayoutError
    from flakekit.values.layout import BitLayout

    try:
        table = tomllib.loads(f"layout = {spec}")["layout"]
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"not a TOML inline table ({exc}); e.g. "
                                 "'{fields = [[\"time\", 41], [\"worker\", 10], "
                                 "[\"sequence\", 12]], epoch = \"2015-01-01T00:00:00Z\"}'",
                                 param_hint="--layout") from None
    if not isinstance(table, dict):
        raise click.BadParameter("expected an inline table {fields = ..., epoch = ...}",
                                 param_hint="--layout")
    try:
        return BitLayout.from_mapping("inline", table)
    except LayoutError as exc:
        raise click.BadParameter(str(exc), param_hint="--layout") from None


def _all_readings(raw: str, layouts: Sequence[Any], fmt: Any, now: dt.datetime) -> dict[str, Any]:
    """``raw`` under every layout, ranked by evidence (:mod:`flakekit.values.readings`)."""
    from flakekit.values.readings import rank

    widest = max(layouts, key=lambda lay: lay.total_bits)
    value = widest.check_id(raw, fmt)
    verdict = rank(value, layouts, now)
    return {"input": raw.strip(), "id": value, "id_str": str(value), "verdict": verdict.kind,
            "summary": verdict.summary, "readings": [r.as_dict() for r in verdict.readings]}


def _print_all(result: dict[str, Any]) -> None:
    click.echo(f"{result['input']}: {result['summary']}")
    click.echo("  (* = plausible: a date in the layout's era, from its epoch or first IDs to "
               "now; strongest evidence first)")
    width = max(len(r["layout"]) for r in result["readings"])
    for r in result["readings"]:
        mark = "*" if r["plausible"] else " "
        if not r["fits"]:
            click.echo(f"  {mark} {r['layout']:<{width}}  {r['evidence']}")
            continue
        parts = " ".join(f"{k}={v}" for k, v in r["parts"].items() if k != "time")
        when = r["timestamp"] or "(no date)"
        why = "" if r["plausible"] else f"  ({r['evidence']})"
        click.echo(f"  {mark} {r['layout']:<{width}}  {when:<24}  {parts}{why}")


def _decode_one(lay: Any, raw: str, fmt: Any, now: dt.datetime) -> dict[str, Any]:
    """One ID under one layout; a time past any date is no reading (exit 1), an
    implausible one is printed with a warning that suggests --all."""
    from flakekit.errors import NoReadingError
    from flakekit.values.readings import read

    value = lay.check_id(raw, fmt)
    reading = read(lay, value, now)
    shown = raw.strip()
    if reading.timestamp is None:
        raise NoReadingError(
            f"id {shown} is no {lay.name} ID: {reading.evidence} (time field "
            f"{reading.parts['time']}); try `flakekit decode {shown} --all`"
        )
    info = _decoded(lay, raw, fmt)
    info["plausible"] = reading.plausible
    if not reading.plausible:
        click.echo(f"warning: {shown} does not look like a {lay.name} ID: {reading.evidence} "
                   f"({info['timestamp']}); try `flakekit decode {shown} --all`", err=True)
    return info


@cli.command()
@click.argument("ids", metavar="ID...", nargs=-1)
@click.option("--layout", "-l", "layout_name", default=None, metavar="NAME|TABLE",
              help="Layout name (default: the config's default generator's, else snowflake), "
              "or an inline table: '{fields = [[\"time\", 41], [\"worker\", 10], "
              "[\"sequence\", 12]], unit = \"1ms\", epoch = \"2015-01-01T00:00:00Z\"}'.")
@click.option("--epoch", default=None, help="One-off: this epoch (ISO-8601 or Unix ms) "
              "instead of the layout's.")
@click.option("--unit", default=None, help="One-off: this time unit (1ms, 10ms, 1s).")
@click.option("--bits", default=None, metavar="SPEC", help="One-off: these fields, most "
              "significant first: 41/10/12 (time/worker/sequence) or "
              "time=39,sequence=8,machine=16.")
@click.option("--all", "all_layouts", is_flag=True,
              help="Read each ID under every known layout, ranked by evidence; says "
              "'ambiguous' when readings with different times fit; exit 1 if none does.")
@format_option
@prefix_option
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per ID and line.")
def decode(ids: tuple[str, ...], layout_name: str | None, epoch: str | None, unit: str | None,
           bits: str | None, all_layouts: bool, encoding: str | None, prefix: str | None,
           config_path: str | None, as_json: bool) -> None:
    """Decode IDs: time, node fields, sequence. IDs are arguments, or `-` to read them from
    stdin (one per line); decimal, 0x-hex, or a string form (the prefix and encoding are
    recognised; -f names the encoding). An ID whose time is implausible for the layout
    gets a warning; one that no layout fits exits 1."""
    from flakekit.errors import NoReadingError

    raws = _read_ids(ids)
    if not raws:
        raise click.UsageError("give one or more IDs, or - to read them from stdin")
    chosen, fmt, config = _decode_choices(layout_name, epoch, unit, bits, encoding, prefix,
                                          config_path)
    layouts = _ranked_layouts(chosen, config) if all_layouts else None
    now = dt.datetime.now(dt.UTC)
    failed = none = 0
    for i, raw in enumerate(raws):
        try:
            _decode_and_print(raw, i, chosen, layouts, fmt, now, as_json)
        except (InvalidIdError, NoReadingError) as exc:
            if len(raws) == 1:
                raise
            if isinstance(exc, InvalidIdError):
                failed += 1
            else:
                none += 1
            click.echo(f"error: {exc}", err=True)
    if failed:
        raise InvalidIdError(f"{failed} of {len(raws)} IDs could not be decoded (see above)")
    if none:
        raise NoReadingError(f"{none} of {len(raws)} IDs fit no layout (see above)")


def _decode_choices(layout_name: str | None, epoch: str | None, unit: str | None,
                    bits: str | None, encoding: str | None, prefix: str | None,
                    config_path: str | None) -> tuple[BitLayout, Any, Any]:
    """The layout ``decode`` reads with, the string form it expects (None: recognise each
    string's form), and the config (None without ``--config``)."""
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
    if isinstance(layout_name, str) and layout_name.lstrip().startswith("{"):
        chosen = _one_off(_inline_layout(layout_name), epoch, unit, bits)
    else:
        chosen = _one_off(_layout(layout_name or "snowflake", config_path, path), epoch, unit,
                          bits)
    return chosen, fmt, config


def _ranked_layouts(chosen: BitLayout, config: Any) -> list[BitLayout]:
    """Every layout ``decode --all`` reads an ID under: the registered ones, the config's,
    and an inline or one-off layout."""
    host = _host()
    layouts = [host.layout(reg.name) for reg in host.layouts]
    layouts += list(config.layouts.values()) if config is not None else []
    if chosen.name not in {lay.name for lay in layouts}:
        layouts.append(chosen)  # an inline or one-off layout joins the ranking
    return layouts


def _decode_and_print(raw: str, i: int, chosen: BitLayout, layouts: list[BitLayout] | None,
                      fmt: Any, now: dt.datetime, as_json: bool) -> None:
    """Decode one ID (under every layout with ``--all``) and print it."""
    if as_json:
        import json  # only here: decode without --json starts without it
    if layouts is not None:
        from flakekit.errors import NoReadingError

        result = _all_readings(raw, layouts, fmt, now)
        if as_json:
            click.echo(json.dumps(result))
        if result["verdict"] == "none":
            raise NoReadingError(
                f"id {result['input']} fits no known layout: no reading has a date in "
                "its layout's era; name its layout with --layout, or --epoch/--unit/--bits"
            )
        if not as_json:
            _print_all(result)
        return
    info = _decode_one(chosen, raw, fmt, now)
    if as_json:
        click.echo(json.dumps(info, default=str))
        return
    if i:
        click.echo("")  # a blank line between IDs
    _print_decoded(info, False)


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
