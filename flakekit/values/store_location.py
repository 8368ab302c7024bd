"""Where a coordination-service plugin finds its service and which namespace a
generator takes in it, resolved alike by every plugin (etcd, ZooKeeper, Redis): the
configured address, else the service's environment variable, else the local default;
the configured namespace, else the generator's name. Plugins reach these through
:mod:`flakekit.plugin`."""

from __future__ import annotations

import os
from collections.abc import Callable

from flakekit.errors import ConfigError

__all__ = ["address_from_env", "namespace_of"]


def address_from_env(configured: str | None, env: str, default: str, *, path: str = "",
                     check: Callable[[str], object] | None = None) -> str:
    """The configured address (the settings checked it), else ``$env``, else
    ``default``; one ``check`` rejects (ValueError) is a ConfigError at ``path``
    naming the variable it came from."""
    if configured:
        return configured
    address = os.environ.get(env) or default
    if check is None:
        return address
    try:
        check(address)
    except ValueError as exc:
        raise ConfigError(path, f"{env}: {exc}") from None
    return address


def namespace_of(configured: str | None, generator: str, *, path: str, field: str) -> str:
    """The namespace of a generator's ids: ``configured`` (the settings checked it), else
    the generator's name, which must then be one key segment (ConfigError at
    ``{path}.{field}`` otherwise)."""
    name = configured or generator
    if "/" in name:
        raise ConfigError(f"{path}.{field}", f"{name!r} contains '/'; set {field} = \"...\"")
    return name
