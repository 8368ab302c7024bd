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
@click.option("--node", default=None, help="Check as this node (as `flakekit serve --node`); "
              "default: $FLAKEKIT_NODE, the file, the host name.")
@click.option("--advertise", default=None, help="Check with this URL (as `flakekit serve "
              "--advertise`); default: $FLAKEKIT_ADVERTISE, the file.")
@json_option
def config_check(path: str | None, node: str | None, advertise: str | None, as_json: bool) -> None:
    """Parse PATH (default: the config other commands would use) and build every generator
    without starting any and without connecting to a database. A shared cluster config
    (no advertise in it: each node gives its own) is checked as `cluster status` reads it,
    unless --node/--advertise say which node to check it as."""
    from flakekit.assembly.config import find_config, load_config
    from flakekit.assembly.kit import build_kit
    from flakekit.errors import ConfigError

    choice = find_config(path)
    config = load_config(choice.path)
    shared = False
    try:
        kit = build_kit(config, _host(), node=node, advertise=advertise)
    except ConfigError as exc:
        # docs/cluster.md's shared file leaves advertise to each node: check the rest
        if (config.cluster is None or advertise is not None
                or exc.path != f"{config.cluster.path}.advertise"):
            raise
        kit = build_kit(config, _host(), as_member=False)
        shared = True
    kit.pool.dispose()
    strict = [gen.key for gen in kit.strict_generators()]
    where = path or choice.describe()
    cluster: dict[str, object] | None = None
    if kit.cluster is not None:  # resolved as a start-up would ($FLAKEKIT_NODE, ...)
        cluster = {"name": kit.cluster.spec.name, "shared": False, "node": kit.cluster.node,
                   "advertise": kit.cluster.advertise, "strict_keys": strict,
                   "summary": kit.cluster.describe()}
    elif shared:
        assert config.cluster is not None
        cluster = {"name": config.cluster.name, "shared": True, "node": None,
                   "advertise": None, "strict_keys": strict,
                   "summary": f"cluster {config.cluster.name!r}: a shared config: no advertise "
                   "here, each node gives its own (`flakekit serve --node NODE --advertise URL`, "
                   "or $FLAKEKIT_NODE and $FLAKEKIT_ADVERTISE); check one node with "
                   "--node/--advertise"}
    if as_json:
        echo_json({"config": where, "ok": True, "generators": list(config.generators),
                   "layouts": list(config.layouts), "cluster": cluster})
        return
    click.echo(f"{where}: ok ({len(config.generators)} generators: "
               f"{', '.join(config.generators) or '-'}; {len(config.layouts)} layouts)")
    if cluster is not None:
        click.echo(f"{cluster['summary']}; strict keys: {', '.join(strict) or '-'}")
