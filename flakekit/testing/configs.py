"""Config builders and checks for tests: one strict segment generator on SQLite and a
``[cluster]`` section, with only what a test cares about spelled out, and the one-line
refusals a bad setting owes (``assert_build_refused``, ``assert_field_error``)::

    kit = build_kit(strict_config(cluster_table(membership={"type": "etcd"})), host)
"""

from __future__ import annotations

from typing import Any

from flakekit.assembly.config import parse_config

__all__ = ["ADVERTISE", "assert_build_refused", "assert_field_error", "cluster_table",
           "strict_config"]

#: the address a test node advertises (documentation-only, never dialled)
ADVERTISE = "http://10.0.0.5:8080"


def cluster_table(**keys: Any) -> dict[str, Any]:
    """A ``[cluster]`` table: cluster ``ids`` advertising ``ADVERTISE``, plus ``keys``."""
    return {"name": "ids", "advertise": ADVERTISE, **keys}


def strict_config(cluster: dict[str, Any] | None = None,
                  generators: dict[str, Any] | None = None, url: str = "sqlite:///ids.db",
                  **extra: Any) -> Any:
    """A parsed config: backend ``default`` on ``url``, ``generators`` (default: segment
    generator ``orders`` with ``order = "strict"``), the ``cluster`` table if given, and
    any other top-level tables."""
    data: dict[str, Any] = {
        "backends": {"default": {"url": url}},
        "generators": generators if generators is not None else {
            "orders": {"strategy": "segment", "order": "strict"}}}
    if cluster is not None:
        data["cluster"] = cluster
    return parse_config({**data, **extra})


def assert_build_refused(config: Any, host: Any, message: str) -> None:
    """Building a kit of ``config`` on plugin host ``host`` raises ConfigError matching
    ``message``, in one line (what every bad setting owes its user)."""
    import pytest

    from flakekit.assembly.kit import build_kit
    from flakekit.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as caught:
        build_kit(config, host)
    assert "\n" not in str(caught.value), caught.value


def assert_field_error(settings: Any, table: dict[str, Any], field: str, *,
                       starts: str | None = None) -> None:
    """``settings(**table)`` (a plugin's settings class) raises FieldError naming
    ``field``, its message starting with ``starts`` (default: the quoted field name; ""
    for any), so
    the config error's path comes from the error, not from its text."""
    import pytest

    from flakekit.errors import FieldError

    with pytest.raises(FieldError) as info:
        settings(**table)
    assert info.value.field == field
    prefix = f"'{field}'" if starts is None else starts
    assert info.value.message.startswith(prefix), info.value.message
