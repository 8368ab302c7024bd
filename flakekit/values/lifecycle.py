"""``with obj:`` for what starts and closes: the one ``__enter__``/``__exit__`` pair of the
generators, the segment service, the cluster node and the Kit; the close that runs once;
and the background thread a ``start()`` leaves running."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["ClosesOnce", "StartsInWith", "started_daemon"]


class _Startable(Protocol):
    def start(self) -> Any: ...

    def close(self) -> Any: ...


S = TypeVar("S", bound=_Startable)


class _Closable(Protocol):
    _closed: bool


class StartsInWith:
    """Mixin: ``with obj:`` calls ``obj.start()`` on entry (and gives ``obj``) and
    ``obj.close()`` on exit."""

    __slots__ = ()

    def __enter__(self: S) -> S:
        self.start()
        return self

    def __exit__(self: _Startable, *exc: object) -> None:
        self.close()


class ClosesOnce:
    """Mixin: ``close()`` does its work once, however many threads call it; the others
    return at once (the generators and the segment service keep ``_closed`` as a plain flag,
    read without the lock on their own paths)."""

    __slots__ = ()

    def _claim_close(self: _Closable) -> bool:
        """True for the first caller only, which then closes; call it holding the lock
        that guards ``_closed``."""
        if self._closed:
            return False
        self._closed = True
        return True


def started_daemon(target: Callable[..., object], name: str, *args: Any) -> threading.Thread:
    """A daemon thread already running ``target(*args)``: background work never keeps the
    process alive at exit (``close()`` stops and joins it)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
