"""A SQLAlchemy column default that draws the ID from a flakekit generator.

    import flakekit.sqlalchemy

    orders = sa.Table("orders", meta,
        sa.Column("id", sa.BigInteger, primary_key=True,
                  default=flakekit.sqlalchemy.default("orders")))

The name is a generator of the config file :func:`flakekit.load` finds (or of ``config``).
The kit is built on the first insert, in the process that inserts: a kit inherited
through ``fork()`` refuses to issue IDs (its leases and buffers belong to the parent), so
a pre-forking server (gunicorn) gets one kit per worker without any hook. SQLAlchemy calls
the default once per row, for ``executemany`` too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flakekit.assembly.kit import Kit

__all__ = ["default"]

_lock = threading.Lock()
_kits: dict[tuple[int, str | None], Kit] = {}  # (pid, config path) -> this process's kit


def _kit(config: str | os.PathLike[str] | None) -> Kit:
    from flakekit.api import load

    key = (os.getpid(), None if config is None else os.fspath(config))
    with _lock:
        kit = _kits.get(key)
        if kit is None:
            kit = _kits[key] = load(config)
        return kit


def default(
    generator: str | Any | None = None, *, kit: Kit | None = None,
    config: str | os.PathLike[str] | None = None,
) -> Callable[[], int]:
    """A zero-argument callable for ``Column(default=...)`` returning the next ID.

    Args:
        generator: a generator name (``None``: the config's default generator), or a
            generator object itself (anything with ``next_id()``).
        kit: the kit to take the named generator from (default: one built lazily per
            process from ``config``).
        config: the config file for the lazy kit (default: the same lookup as the CLI).
    """
    from flakekit.pluginhost.contracts import IssuesIds

    if generator is not None and not isinstance(generator, str):
        gen = generator
        if not isinstance(gen, IssuesIds):
            raise TypeError(f"default() needs a generator name or a generator, got {gen!r}")
        return lambda: int(gen.next_id())

    def next_id() -> int:
        the_kit = kit if kit is not None else _kit(config)
        gen = the_kit.default if generator is None else the_kit[generator]
        return int(gen.next_id())

    return next_id
