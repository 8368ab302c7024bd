"""``flakekit serve``: the command the plugin adds to the flakekit CLI."""

from __future__ import annotations

import ipaddress
import logging
import os

import click

from flakekit.plugin import config_option

__all__ = ["serve_command"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False   # a host name: it may resolve to anything


def exposure_warning(host: str, token_file: str | None) -> str | None:
    """The one line ``serve`` prints when anyone on the network could take IDs."""
    if token_file is not None or _loopback(host):
        return None
    return (f"warning: serving on {host} without --token-file: anyone who can reach this "
            "address can take IDs; pass --token-file (or bind 127.0.0.1)")


#: the variables `serve` reads besides its options' own (shown as [env var: ...] above)
SERVE_ENV_EPILOG = (
    "Environment: FLAKEKIT_CONFIG (the config file), FLAKEKIT_NODE and FLAKEKIT_ADVERTISE "
    "(cluster mode: this node's id and URL; --node / --advertise win), "
    "FLAKEKIT_DISABLE_PLUGINS, FLAKEKIT_LOAD_PLUGINS, FLAKEKIT_TRACE_PLUGINS, FLAKEKIT_DEBUG "
    "(tracebacks); each option's own variable is listed with it."
)


@click.command("serve", epilog=SERVE_ENV_EPILOG)
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, envvar="FLAKEKIT_SERVER_HOST",
              show_envvar=True,
              help="Address to bind. 0.0.0.0 / :: expose the server to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              envvar="FLAKEKIT_SERVER_PORT", show_envvar=True,
              help="Port (0: any free port, printed at start).")
@click.option("--workers", "-w", default=1, show_default=True, type=click.IntRange(0, 256),
              envvar="FLAKEKIT_SERVER_WORKERS", show_envvar=True,
              help="Processes, each with its own worker lease (0: one per core); in cluster mode "
              "each is a member of its own (see --member-port).")
@click.option("--max-count", default=100_000, show_default=True, type=click.IntRange(1, 10_000_000),
              envvar="FLAKEKIT_SERVER_MAX_COUNT", show_envvar=True,
              help="Largest batch (count=) one request may ask for.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              envvar="FLAKEKIT_SERVER_TOKEN_FILE", show_envvar=True,
              help="Bearer tokens: lines of 'GENERATOR TOKEN' ('*' = every generator).")
@click.option("--snowflake-default", default=None, metavar="NAME",
              help="Serve /api/snowflake/get/ANY-KEY from generator NAME, as Leaf ignores the key.")
@click.option("--max-connections", default=1024, show_default=True,
              type=click.IntRange(1, 1_000_000),
              help="Open connections per process; more get 503 and are closed.")
@click.option("--idle-timeout", default=30.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds an idle keep-alive connection is kept.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Seconds a client has to send a complete request.")
@click.option("--grace", default=10.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds a process has to shut down before it is killed.")
@click.option("--loop", type=click.Choice(["auto", "uvloop", "asyncio"]), default="auto",
              show_default=True, help="Event loop (auto: uvloop if installed).")
@click.option("--offload-count", default=None, type=click.IntRange(0, 10_000_000), hidden=True,
              envvar="FLAKEKIT_SERVER_OFFLOAD_COUNT", show_envvar=True,
              help="Batches of at least this many IDs are made in a worker thread (0: never; "
              "for benchmarks).")
@click.option("--node", default=None, metavar="ID",
              help="Cluster mode: this node's id (overrides $FLAKEKIT_NODE and [cluster] node).")
@click.option("--advertise", default=None, metavar="URL",
              help="Cluster mode: the URL peers and clients reach this node at, e.g. "
              "http://10.0.0.5:8080 (overrides $FLAKEKIT_ADVERTISE and [cluster] advertise).")
@click.option("--member-port", default=None, type=click.IntRange(1, 65535), metavar="PORT",
              help="Cluster mode with --workers N: process i is member NODE.i, listens on "
              "PORT+i as well and advertises that port (default: --port + 1).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="warning", show_default=True, envvar="FLAKEKIT_SERVER_LOG_LEVEL",
              show_envvar=True)
def serve_command(
    config_path: str | None, host: str, port: int, workers: int, max_count: int,
    token_file: str | None, snowflake_default: str | None, max_connections: int,
    idle_timeout: float, header_timeout: float, grace: float, loop: str,
    offload_count: int | None, node: str | None, advertise: str | None,
    member_port: int | None, log_level: str,
) -> None:
    """Serve IDs over HTTP: Leaf's /api/segment/get/KEY and /api/snowflake/get/KEY, a JSON
    API with batches, /metrics, /health, /ready and a monitor page at /."""
    from flakekit.embed import load_config
    from flakekit_server.auth import load_tokens
    from flakekit_server.options import ServerOptions
    from flakekit_server.runner import serve

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    config = load_config(config_path)
    warning = exposure_warning(host, token_file)
    if warning is not None:
        click.echo(warning, err=True)
    from flakekit_server.options import OFFLOAD_COUNT

    offload = OFFLOAD_COUNT if offload_count is None else (offload_count or 10**9)
    options = ServerOptions(
        host=host, port=port, workers=workers or _cores(), max_count=max_count,
        tokens=load_tokens(token_file, config.generators), snowflake_default=snowflake_default,
        max_connections=max_connections, idle_timeout=idle_timeout,
        header_timeout=header_timeout, grace=grace, loop=loop, offload_count=offload,
        node=node, advertise=advertise, member_port=member_port,
    )
    # check everything that can be checked before any process starts or lease is taken
    from flakekit.embed import build_kit, get_host

    kit = build_kit(config, get_host(), as_member=False)
    kit.pool.dispose()
    del kit
    status = serve(config, options)
    if status:
        raise click.exceptions.Exit(status)
