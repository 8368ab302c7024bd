"""The ``flakekit`` click group and what every command shares: ``--config``, ``--json``,
``-v`` log routing, and :func:`run` turning errors into one line and an exit status.

Wrong input prints one line on stderr and exits 2; a runtime failure (a database that is
down, a lease that is lost) prints one line and exits 1. Never a traceback, and no log
lines or alerts on stderr unless ``-v`` asks for them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from flakekit.__about__ import __version__
from flakekit.errors import (
    ConfigError,
    FlakekitError,
    InvalidIdError,
    LayoutError,
    UnknownKeyError,
    UnknownNameError,
)

__all__ = [
    "USAGE_ERRORS", "cli", "config_option", "echo_json", "json_option", "main", "run",
    "verbose_option",
]

#: errors that mean "the input was wrong" (exit 2) rather than "it failed" (exit 1)
USAGE_ERRORS = (ConfigError, LayoutError, InvalidIdError, UnknownNameError, UnknownKeyError)

_ROUTING = "flakekit.log_routing"
_CONFIG = "flakekit.assembly.config"


class _LogRouting:
    """Log records (warnings, ALERTs) and Python warnings off stderr unless ``-v``, so a
    failing command prints its one error line and nothing else.

    Records no handler takes go to :data:`logging.lastResort` (stderr, WARNING and up):
    the CLI points it at nothing, or with ``-v`` at stderr from INFO (``-vv``: DEBUG).
    Handlers a command sets up itself (``flakekit serve`` configures logging) keep working.
    """

    def __init__(self) -> None:
        self._saved = logging.lastResort
        self._logger = logging.getLogger("flakekit")
        self._saved_level = self._logger.level
        self.level = 0
        logging.lastResort = logging.NullHandler()
        logging.captureWarnings(True)

    def verbose(self, level: int) -> None:
        if level <= self.level:
            return
        self.level = level
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.DEBUG if level > 1 else logging.INFO)
        handler.setFormatter(logging.Formatter("flakekit: %(levelname)s %(name)s: %(message)s"))
        logging.lastResort = handler
        self._logger.setLevel(handler.level)

    def restore(self) -> None:
        logging.captureWarnings(False)
        logging.lastResort = self._saved
        self._logger.setLevel(self._saved_level)


def _verbosity(ctx: click.Context, _param: click.Parameter, value: int) -> int:
    root = ctx.find_root()
    routing = root.meta.get(_ROUTING)
    if routing is None:
        routing = root.meta[_ROUTING] = _LogRouting()
        root.call_on_close(routing.restore)
    routing.verbose(value)
    return value


#: on the group and on every command with --config: ``flakekit -v next`` = ``flakekit next -v``
verbose_option = click.option(
    "--verbose", "-v", count=True, is_eager=True, expose_value=False, callback=_verbosity,
    help="Show log lines, alerts and which config is used on stderr (-vv: debug).",
)


def _config_choice(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Resolve ``--config`` once per command line (a group and its command share it)."""
    from flakekit.assembly.choice import find_config  # not assembly.config: decode stays fast

    choice = ctx.meta.get(_CONFIG) if value is None else None
    if choice is None:
        choice = find_config(value)
        log = logging.getLogger("flakekit.cli")
        if ctx.meta.get(_CONFIG) != choice and log.isEnabledFor(logging.INFO):
            log.info("config: %s", choice.describe())
        ctx.meta[_CONFIG] = choice
    return choice.path


def config_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--config/-c`` (resolved: --config, $FLAKEKIT_CONFIG, ./flakekit.toml, the embedded
    default) and ``-v``."""
    func = click.option(
        "--config", "-c", "config_path", type=click.Path(dir_okay=False), default=None,
        callback=_config_choice,
        help="Config file (TOML). Default: $FLAKEKIT_CONFIG, else ./flakekit.toml, else the "
        "embedded default (a SQLite registry in the user's state directory).",
    )(func)
    return verbose_option(func)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def echo_json(data: Any) -> None:
    import json

    click.echo(json.dumps(data, indent=2, default=str))


def _host() -> Any:
    from flakekit.pluginhost.host import get_host

    return get_host()


#: the last lines of `flakekit --help` (no public docs host yet: the checkout's pages)
DOCS_EPILOG = (
    "Docs: docs/index.md in the flakekit checkout, or the site built from it with "
    "`mkdocs build` (site/index.html); shell completion: docs/cli.md."
)


class _Cli(click.Group):
    """The ``flakekit`` group: a command a bundled plugin adds says what to install."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            from flakekit.pluginhost.bundled import install_hint

            hint = install_hint("command", args[0]) if args else ""
            if hint and exc.message.startswith("No such command"):
                raise click.UsageError(f"No such command {args[0]!r}{hint}", ctx) from None
            raise


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]}, epilog=DOCS_EPILOG)
@click.version_option(__version__, prog_name="flakekit")  # flakekit/__about__.py
@verbose_option
def cli() -> None:
    """flakekit: unique, time-ordered 64-bit IDs across many machines."""


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
        click.echo(f"error: {type(exc).__name__}: {exc} (run with FLAKEKIT_DEBUG=1 for details)",
                   err=True)
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

