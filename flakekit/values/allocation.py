"""Allocation: what one segment fetch hands back, the same value for every store.

Why a value of its own: the segment generator reads ``max_id``, ``step`` and
``db_step`` of whatever a store's ``fetch`` returns, so every store (``sql``, ``redis``,
a test's memory store) returns this one frozen class and mypy checks the reads.
"""

from __future__ import annotations

import attrs

from flakekit.errors import ConfigError

__all__ = ["Allocation", "check_new_range"]


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


def check_new_range(step: object, start: object, *, max_step: int, max_id: int,
                    why: str = "") -> None:
    """A new key's ``step`` (1 to ``max_step``) and first ID ``start`` (0 to
    ``max_id - step``: the first fetch must not pass ``max_id``), checked alike by every
    store's ``create``; ``why`` words the bound on ``start`` (" (a fetch ends ...)")."""
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= max_step:
        raise ConfigError("step", f"must be an integer from 1 to {max_step}, got {step!r}")
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= max_id - step:
        raise ConfigError("start", f"must be an integer from 0 to {max_id - step}{why}, "
                          f"got {start!r}")
