"""IdBatch: many IDs as a few ``range`` objects.

IDs with one timestamp and consecutive sequence numbers form an arithmetic progression,
so a batch costs O(ticks) to build and store, not O(n).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["IdBatch"]


class IdBatch(Sequence[int]):
    """An immutable sequence of IDs backed by ranges (``len``, iteration, indexing)."""

    __slots__ = ("_ends", "ranges")

    def __init__(self, ranges: Sequence[range] = ()) -> None:
        self.ranges: tuple[range, ...] = tuple(r for r in ranges if len(r))
        self._ends = list(itertools.accumulate(len(r) for r in self.ranges))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self.ranges)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("IdBatch index out of range")
        part = bisect.bisect_right(self._ends, index)
        start = self._ends[part - 1] if part else 0
        return self.ranges[part][index - start]

    def __contains__(self, value: object) -> bool:
        return any(value in r for r in self.ranges)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdBatch):
            return list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdBatch({len(self)} ids in {len(self.ranges)} ranges)"
