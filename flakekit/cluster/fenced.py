"""FencedStore: a segment store view that carries one key claim into every write.

A strict key's :class:`~flakekit.generators.segment.SegmentGenerator` knows nothing of
cluster mode; it is given this adapter as its store, so every fetch and give-back it makes
is checked against the key-owner row in the same transaction (tidb #46444: a deposed
owner's give-back must find the row no longer its own and change nothing).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from flakekit.cluster.store_contracts import KeyClaim, KeyFence
from flakekit.errors import FenceError
from flakekit.generators.stores import PeriodStore
from flakekit.values.allocation import Allocation

__all__ = ["FencedStore"]


class FencedStore:
    """``fetch(key, step)`` / ``give_back(...)`` of ``fence``, fenced by ``claim``.

    ``on_fenced(claim)`` is called once a fetch finds the claim gone (FenceError), so the
    node stops serving the key at once instead of at its next view change. A refused
    give-back says nothing (someone may simply have fetched after us).
    """

    __slots__ = ("claim", "fence", "fenced", "on_fenced")

    def __init__(self, fence: KeyFence, claim: KeyClaim,
                 on_fenced: Callable[[KeyClaim], None] | None = None) -> None:
        self.fence, self.claim, self.on_fenced = fence, claim, on_fenced
        self.fenced = False

    @property
    def where(self) -> str:
        return self.fence.where

    def fetch(self, key: str, step: int | None = None) -> Allocation:
        try:
            return self.fence.fetch(key, step, claim=self.claim)
        except FenceError:
            self._lost()
            raise

    def give_back(self, key: str, expected_max_id: int, new_max_id: int) -> bool:
        return bool(self.fence.give_back(key, expected_max_id, new_max_id, claim=self.claim))

    def db_now(self) -> dt.datetime:
        """The fence's database clock (a periodic strict key tells its period by it)."""
        return self._periods().db_now()

    def ensure_period_key(self, key: str, step: int, start: int, description: str) -> bool:
        """Create a period row of the claimed key (rows are created unfenced: an insert
        that may lose the race moves no ``max_id``; every fetch is fenced)."""
        return bool(self._periods().ensure_period_key(key, step, start, description))

    def _periods(self) -> PeriodStore:
        if not isinstance(self.fence, PeriodStore):  # a periodic key was refused at build
            raise TypeError(f"store {self.fence.where} cannot serve periodic counters")
        return self.fence

    def _lost(self) -> None:
        if not self.fenced:
            self.fenced = True
            if self.on_fenced is not None:
                self.on_fenced(self.claim)
