"""``flakekit plugins`` and ``flakekit config check``: what is loaded and whether a config
builds."""

from __future__ import annotations

import click

from flakekit.cli.main import _host, cli, echo_json, json_option


@cli.command()
@json_option
def plugins(as_json: bool) -> None:
    """List loaded plugins and what they register."""
    infos = _host().plugins()
    if as_json:
        echo_json([
            {"name": p.name, "distribution": p.distribution, "version": p.version,
             "builtin": p.builtin, "hooks": list(p.hooks), "registers": list(p.registers),
             "commands": list(p.commands), "broken": p.broken}
            for p in infos
        ])
        return
    for p in infos:
        origin = "built-in" if p.builtin else f"{p.distribution or '?'} {p.version or ''}".strip()
        click.echo(f"{p.name}  ({origin}){'  BROKEN' if p.broken else ''}")
        if p.broken:
            click.echo(f"    {p.broken}")
            continue
        if p.registers:
            click.echo(f"    registers: {', '.join(p.registers)}")
        if p.commands:
            click.echo(f"    commands: {', '.join(p.commands)}")
        click.echo(f"    hooks: {', '.join(p.hooks)}")


@cli.group("config")
def config_group() -> None:
    """Check config files."""


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False), required=False)
def config_check(path: str | None) -> None:
    """Parse PATH (default: the config other commands would use) and build every generator
    without starting any and without connecting to a database."""
    from flakekit.assembly.config import find_config, load_config
    from flakekit.assembly.kit import build_kit

    choice = find_config(path)
    config = load_config(choice.path)
    kit = build_kit(config, _host())
    kit.pool.dispose()
    click.echo(f"{path or choice.describe()}: ok ({len(config.generators)} generators: "
               f"{', '.join(config.generators) or '-'}; {len(config.layouts)} layouts)")
    if kit.cluster is not None:  # resolved as a start-up would ($FLAKEKIT_NODE, ...)
        strict = [gen.key for gen in kit.strict_generators()]
        click.echo(f"{kit.cluster.describe()}; strict keys: {', '.join(strict) or '-'}")
