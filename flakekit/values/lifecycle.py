"""``with obj:`` for what starts and closes: the one ``__enter__``/``__exit__`` pair of the
generators, the segment service, the cluster node and the Kit."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

__all__ = ["StartsInWith"]


class _Startable(Protocol):
    def start(self) -> Any: ...

    def close(self) -> Any: ...


S = TypeVar("S", bound=_Startable)


class StartsInWith:
    """Mixin: ``with obj:`` calls ``obj.start()`` on entry (and gives ``obj``) and
    ``obj.close()`` on exit."""

    __slots__ = ()

    def __enter__(self: S) -> S:
        self.start()
        return self

    def __exit__(self: _Startable, *exc: object) -> None:
        self.close()
