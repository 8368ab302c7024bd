"""Allocation: what one segment fetch hands back, the same value for every store.

Why a value of its own: the segment generator reads ``max_id``, ``step`` and
``db_step`` of whatever a store's ``fetch`` returns, so every store (``sql``, ``redis``,
a test's memory store) returns this one frozen class and mypy checks the reads.
"""

from __future__ import annotations

import attrs

__all__ = ["Allocation"]


@attrs.frozen
class Allocation:
    """One successful fetch: the key's row as it was right after the update.

    Attributes:
        key: the key (Leaf's ``biz_tag``).
        max_id: ``max_id`` after the update: the end (exclusive) of the new range.
        step: how far this fetch advanced ``max_id`` (the range length).
        db_step: the row's stored ``step`` (the floor of the dynamic step).
    """

    key: str
    max_id: int
    step: int
    db_step: int

    @property
    def start(self) -> int:
        """The first ID of the range."""
        return self.max_id - self.step
