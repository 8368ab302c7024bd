"""flakekit-server: ``flakekit serve``, an HTTP ID server (Leaf-compatible API, batches,
Prometheus metrics, a monitor page). A plugin: its entry point registers the command and
counts lease, clock and alert events for ``/metrics``."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from flakekit import hookimpl

if TYPE_CHECKING:
    import click

__all__ = ["__version__", "otel_available"]

__version__ = "0.1.0"

_OTEL: list[bool] = []   # [whether opentelemetry is installed], looked up once


def otel_available() -> bool:
    """Whether ``opentelemetry`` is installed (looked up, not imported): without it
    :mod:`flakekit_server.otel` is never imported and tracing costs nothing."""
    if not _OTEL:
        _OTEL.append(importlib.util.find_spec("opentelemetry") is not None)
    return _OTEL[0]


@hookimpl
def flakekit_register_commands(cli: click.Group) -> None:
    from flakekit_server.cli import serve_command

    cli.add_command(serve_command)


@hookimpl
def flakekit_lease_lost(generator: str, lease: Any, reason: str) -> None:
    from flakekit_server.metrics import EVENTS  # not at import: `flakekit --help` loads this

    EVENTS.add(EVENTS.lease_lost, generator)


@hookimpl
def flakekit_operation(operation: str, generator: str, duration_ns: int,
                       attributes: dict[str, Any], error: str | None) -> None:
    if otel_available():   # a span (flakekit_server/otel.py); nothing without OpenTelemetry
        from flakekit_server.otel import record_operation

        record_operation(operation, generator, duration_ns, attributes, error)


@hookimpl
def flakekit_clock_moved_backwards(generator: str, clock: str, behind_ns: int,
                                   waited: bool) -> None:
    from flakekit_server.metrics import EVENTS

    EVENTS.add(EVENTS.clock_rollbacks, (generator, waited))


@hookimpl
def flakekit_alert(kind: str, message: str, details: dict[str, Any]) -> None:
    from flakekit_server.metrics import EVENTS

    EVENTS.add(EVENTS.alerts, kind)
