"""The pluggy markers of project ``flakekit``: specs here, implementations anywhere.

A module of its own (importing nothing of flakekit) so a plugin or a built-in can take
``hookimpl`` without importing the package's public API first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from flakekit.pluginhost.registry import Register

__all__ = ["PROJECT", "hookimpl", "hookspec", "registers"]

PROJECT = "flakekit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


def registers(name: str, factory: Callable[..., Any], *, settings: type | None = None,
              description: str = "") -> Callable[[Register], None]:
    """A registration hook for one factory, so a plugin writes it as a line rather than a
    function: ``flakekit_register_allocators = registers("etcd", build, settings=S,
    description=...)`` (pluggy finds a hook by the module attribute's name)."""
    @hookimpl
    def register_one(register: Register) -> None:
        register(name, factory, settings=settings, description=description)
    return register_one
