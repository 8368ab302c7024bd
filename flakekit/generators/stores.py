"""What a segment generator needs from a store, and the optional capabilities it may have.

Why here, beside the generators: they use these at run time (``isinstance`` against the
protocols, never ``getattr``); :mod:`flakekit.pluginhost.contracts` re-exports them for
plugin authors and checks the required one when a config is built.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

from flakekit.values.allocation import Allocation

__all__ = ["Allocation", "ListsKeys", "Locates", "PeriodStore", "SegmentStore", "TellsStalls"]


@runtime_checkable
class SegmentStore(Protocol):
    """What a segment generator needs from a store (``sql`` is the built-in one)."""

    def fetch(self, key: str, step: int | None = None) -> Allocation:
        """Advance the key by ``step`` (None: its stored step) and return the new range."""

    def give_back(self, key: str, expected_max_id: int, new_max_id: int) -> bool: ...


@runtime_checkable
class Locates(Protocol):
    """A store (or a fence) that names where it is, for messages (database, table)."""

    @property
    def where(self) -> str: ...


@runtime_checkable
class TellsStalls(Protocol):
    """A store that can tell why its commits wait now (a synchronous replica gone), without
    blocking: it checks in the background."""

    def stall_cause(self) -> str | None: ...


@runtime_checkable
class ListsKeys(SegmentStore, Protocol):
    """A segment store that lists its keys (``keys = "all"`` serves every key of the
    table: :class:`~flakekit.generators.segment_service.SegmentService`)."""

    def keys(self) -> list[str]: ...
    def exists(self, key: str) -> bool: ...


@runtime_checkable
class PeriodStore(SegmentStore, Protocol):
    """A segment store that can serve periodic counters (``reset = "daily"``...): it
    reads the database's clock (which decides the period) and creates period rows
    race-free."""

    def db_now(self) -> dt.datetime: ...
    def ensure_period_key(self, key: str, step: int, start: int, description: str) -> bool: ...
