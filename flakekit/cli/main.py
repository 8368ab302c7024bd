"""The ``flakekit`` click group and what every command shares: ``--config``, ``--json``,
``-v`` log routing, and :func:`run` turning errors into one line and an exit status.

Wrong input prints one line on stderr and exits 2; a runtime failure (a database that is
down, a lease that is lost) prints one line and exits 1. Never a traceback, and no log
lines or alerts on stderr unless ``-v`` asks for them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    import importlib.machinery
    import logging
    from types import ModuleType

_ROUTING = "flakekit.log_routing"
_CONFIG = "flakekit.assembly.config"


class _LogRouting:
    """Log records (warnings, ALERTs) and Python warnings off stderr unless ``-v``, so a
    failing command prints its one error line and nothing else.

    Records no handler takes go to :data:`logging.lastResort` (stderr, WARNING and up):
    the CLI points it at nothing, or with ``-v`` at stderr from INFO (``-vv``: DEBUG).
    Handlers a command sets up itself (``flakekit serve`` configures logging) keep working.

    ``decode``, ``layout`` and ``--help`` never import :mod:`logging` (its import chain
    costs a tenth of ``import click``): until something imports it, nothing can log, a
    Python warning imports it first (and is routed), and :class:`_AfterImport` sets the
    routing up the moment a command imports it.
    """

    def __init__(self) -> None:
        self.level = 0
        self._logging: Any = None  # the logging module, once imported
        self._saved: logging.Handler | None = None
        self._saved_level = 0
        self._showwarning = warnings.showwarning
        self._hook: _AfterImport | None = None
        if "logging" in sys.modules:
            self._install(sys.modules["logging"])
        else:
            self._hook = _AfterImport("logging", self._install)
            sys.meta_path.insert(0, self._hook)
            warnings.showwarning = self._warn

    def _logging_module(self) -> Any:
        """:mod:`logging`, imported now if need be, with the routing set up."""
        import logging as module  # the hook, if still there, calls _install

        if self._logging is None:
            self._install(module)
        return module

    def _warn(self, *args: Any, **kwargs: Any) -> None:
        """A Python warning before anything imported logging: route it as logging would."""
        self._logging_module()
        warnings.showwarning(*args, **kwargs)

    def _unhook(self) -> None:
        """Take back the import hook and the early warning route (either may be gone)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if warnings.showwarning == self._warn:
            warnings.showwarning = self._showwarning

    def _install(self, module: Any) -> None:
        self._unhook()
        self._logging = module
        self._saved = module.lastResort
        self._saved_level = module.getLogger("flakekit").level
        module.lastResort = module.NullHandler()
        module.captureWarnings(True)
        level, self.level = self.level, 0
        self.verbose(level)

    def verbose(self, level: int) -> None:
        if level <= self.level:
            return
        self.level = level
        lg = self._logging_module()
        handler = lg.StreamHandler(sys.stderr)
        handler.setLevel(lg.DEBUG if level > 1 else lg.INFO)
        handler.setFormatter(lg.Formatter("flakekit: %(levelname)s %(name)s: %(message)s"))
        lg.lastResort = handler
        lg.getLogger("flakekit").setLevel(handler.level)

    def restore(self) -> None:
        self._unhook()
        lg = self._logging
        if lg is None:
            return
        lg.captureWarnings(False)
        lg.lastResort = self._saved
        lg.getLogger("flakekit").setLevel(self._saved_level)


class _AfterImport:
    """A :data:`sys.meta_path` finder that calls ``then(module)`` right after module
    ``name`` is first imported (once; it takes itself off the path when it fires)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        self.remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader, then = spec.loader, self.then
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # not a loader instance of its own: the routing waits for -v
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
        routing = ctx.find_root().meta.get(_ROUTING)
        if ctx.meta.get(_CONFIG) != choice and routing is not None and routing.level:
            import logging

            logging.getLogger("flakekit.cli").info("config: %s", choice.describe())
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


class _PluginAware(click.Group):
    """A built-in group: its built-in commands run without the plugins' commands (no
    plugin CLI module imported); a listing, or a name it does not have, adds them first
    (a plugin may add subcommands to a built-in group: ``workers release``)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and _add_plugin_commands():
            command = super().get_command(ctx, cmd_name)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        _add_plugin_commands()
        return super().list_commands(ctx)


class _Cli(_PluginAware):
    """The ``flakekit`` group (its groups are :class:`_PluginAware` too); a command a
    bundled plugin adds says what to install."""

    group_class = _PluginAware

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


def _add_plugin_commands() -> bool:
    """Add the plugins' commands to :data:`cli` once; True when this call added them.

    A built-in command keeps its name: a plugin command that would replace one is put
    back (the built-ins are resolved without loading the plugins' commands, so a
    replacement would work for some command lines and not others)."""
    global _COMMANDS_ADDED
    if _COMMANDS_ADDED:
        return False
    _COMMANDS_ADDED = True
    builtin = dict(cli.commands)
    _host().add_commands(cli)
    cli.commands.update(builtin)
    return True


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


#: how long a command's process runs before the cyclic garbage collector is back on
COLLECTOR_PAUSE_S = 1.0


def _pause_collector() -> None:
    """Starting a command allocates many objects and frees almost none (modules, classes,
    the methods attrs generates): the collector's full passes over them are start-up time
    spent for nothing (a tenth of ``flakekit next``, benchmarks/bench_startup.py). Pause it;
    a command still running after :data:`COLLECTOR_PAUSE_S` (``serve``, a watch) and every
    process it forks get it back."""
    import gc
    import os
    import threading

    gc.disable()
    os.register_at_fork(after_in_child=gc.enable)
    timer = threading.Timer(COLLECTOR_PAUSE_S, gc.enable)
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (``argv`` given: called in-process, e.g. by a test,
    whose process keeps its collector as it is)."""
    if argv is None:
        _pause_collector()

    def invoke() -> None:  # plugin commands: when asked for (_Cli.get_command)
        cli.main(args=list(argv) if argv is not None else None, prog_name="flakekit",
                 standalone_mode=False)

    sys.exit(run(invoke))

