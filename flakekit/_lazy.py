"""Lazy re-exports from one table (name -> module): ``__getattr__`` and ``__dir__`` for a
public module, so importing it stays cheap and its names are written once (the
``if TYPE_CHECKING:`` imports beside the table are checked against it by a test)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def table(by_module: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """``{module: names}`` (how a reader groups them) as ``{name: module}``; a name twice
    is an error."""
    out: dict[str, str] = {}
    for module, names in by_module.items():
        for name in names:
            if name in out:
                raise ValueError(f"{name!r} is exported from both {out[name]} and {module}")
            out[name] = module
    return out


def exports(
    owner: str, where: Mapping[str, str], namespace: dict[str, Any],
    fallback: Callable[[str], Any] | None = None, also: tuple[str, ...] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for module ``owner``: a name of ``where`` is imported on
    first use and cached in ``namespace``; any other goes to ``fallback`` (names kept
    importable but no longer advertised), else raises AttributeError. ``__dir__`` lists
    ``where`` and ``also`` (names defined in the module itself)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*where, *also})

    return __getattr__, __dir__
