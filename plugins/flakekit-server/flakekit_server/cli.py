"""``flakekit serve``: the command the plugin adds to the flakekit CLI."""

from __future__ import annotations

import logging
import os

import click

from flakekit.cli import config_option

__all__ = ["serve_command"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@click.command("serve")
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, envvar="FLAKEKIT_SERVER_HOST",
              help="Address to bind. 0.0.0.0 / :: expose the server to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              envvar="FLAKEKIT_SERVER_PORT", help="Port (0: any free port, printed at start).")
@click.option("--workers", "-w", default=1, show_default=True, type=click.IntRange(0, 256),
              envvar="FLAKEKIT_SERVER_WORKERS",
              help="Processes, each with its own worker lease (0: one per core).")
@click.option("--max-count", default=100_000, show_default=True, type=click.IntRange(1, 10_000_000),
              envvar="FLAKEKIT_SERVER_MAX_COUNT", help="Largest batch (count=) one request may ask for.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              envvar="FLAKEKIT_SERVER_TOKEN_FILE",
              help="Bearer tokens: lines of 'GENERATOR TOKEN' ('*' = every generator).")
@click.option("--snowflake-default", default=None, metavar="NAME",
              help="Serve /api/snowflake/get/ANY-KEY from generator NAME, as Leaf ignores the key.")
@click.option("--max-connections", default=1024, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Open connections per process; more get 503 and are closed.")
@click.option("--idle-timeout", default=30.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds an idle keep-alive connection is kept.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Seconds a client has to send a complete request.")
@click.option("--grace", default=10.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds a process has to shut down before it is killed.")
@click.option("--loop", type=click.Choice(["auto", "uvloop", "asyncio"]), default="auto",
              show_default=True, help="Event loop (auto: uvloop if installed).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="warning", show_default=True, envvar="FLAKEKIT_SERVER_LOG_LEVEL")
def serve_command(
    config_path: str | None, host: str, port: int, workers: int, max_count: int,
    token_file: str | None, snowflake_default: str | None, max_connections: int,
    idle_timeout: float, header_timeout: float, grace: float, loop: str, log_level: str,
) -> None:
    """Serve IDs over HTTP: Leaf's /api/segment/get/KEY and /api/snowflake/get/KEY, a JSON
    API with batches, /metrics, /health, /ready and a monitor page at /."""
    from flakekit.config import load_config
    from flakekit_server.app import ServerOptions
    from flakekit_server.auth import load_tokens
    from flakekit_server.runner import serve

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    config = load_config(config_path)
    options = ServerOptions(
        host=host, port=port, workers=workers or _cores(), max_count=max_count,
        tokens=load_tokens(token_file, config.generators), snowflake_default=snowflake_default,
        max_connections=max_connections, idle_timeout=idle_timeout,
        header_timeout=header_timeout, grace=grace, loop=loop,
    )
    # check everything that can be checked before any process starts or lease is taken
    from flakekit.host import get_host
    from flakekit.kit import build_kit

    kit = build_kit(config, get_host())
    kit.pool.dispose()
    del kit
    status = serve(config, options)
    if status:
        raise click.exceptions.Exit(status)
