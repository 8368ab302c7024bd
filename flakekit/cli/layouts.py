"""``flakekit layout list/show/compose/decompose``: bit layouts, read-only."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import click

from flakekit.cli.main import _host, cli, config_option, echo_json, json_option


@cli.group()
def layout() -> None:
    """Inspect bit layouts: list, show, compose, decompose."""


def _layout(name: str, config_path: str | None, path: str = "layout") -> Any:
    if not config_path and isinstance(name, str) and name in _host().layouts:
        # the embedded default defines no layouts: a registered one needs no config built
        # (and no assembly, SQLAlchemy or contracts imported: decode starts fast)
        return _host().layout(name, path)
    from flakekit.assembly.kit import resolve_layout

    if config_path:
        from flakekit.assembly.config import load_config

        config = load_config(config_path)
    else:
        from flakekit.assembly.config import parse_config

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
        from flakekit.assembly.config import load_config

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
    end = info["overflows_at"] or "after 9999-12-31"  # never a clamped date
    click.echo(f"  overflows at    {end} ({info['years_left']} years left)")
    for warning in info["warnings"]:
        click.echo(f"  warning: {warning}")


def _parse_parts(lay: Any, parts: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        if not sep:
            raise click.UsageError(
                f"{part!r}: expected FIELD=VALUE (fields: {', '.join(lay.names)})")
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
@json_option
def layout_compose(name: str, parts: tuple[str, ...], config_path: str | None,
                   as_json: bool) -> None:
    """Build an ID from parts: flakekit layout compose snowflake time=2024-01-01T00:00:00Z worker=3
    sequence=1"""
    lay = _layout(name, config_path)
    value = lay.compose(**_parse_parts(lay, parts))
    if as_json:
        echo_json(_decoded(lay, str(value)))
        return
    click.echo(value)


def _decoded(lay: Any, raw: str, fmt: Any = None) -> dict[str, Any]:
    from flakekit.values.timeunits import iso_utc

    value = lay.check_id(raw, fmt)
    parts = lay.decompose(value)
    when = lay.timestamp(value)
    info = {"id": value, "id_str": str(value), "layout": lay.name, **parts,
            "timestamp": iso_utc(when)}
    if raw.strip() != str(value):
        info["input"] = raw.strip()  # the string form it was given in
    return info


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
    """Split an ID (decimal, 0x-hex or a prefixed string form) into its parts."""
    _print_decoded(_decoded(_layout(name, config_path), id_), as_json)
