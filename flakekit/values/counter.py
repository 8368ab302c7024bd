"""Reading an ``itertools.count`` without drawing from it.

Both generators count through ``itertools.count`` because its ``__next__`` is atomic under
the GIL (the lock-free hot path). Peeking at the next value used to go through pickling
(``count.__reduce__``), which is deprecated since Python 3.12 and gone in 3.14; the repr
(``count(N)`` or ``count(N, STEP)``) is the public, stable way to read it.
"""

from __future__ import annotations

import itertools

__all__ = ["peek"]


def peek(counter: itertools.count[int]) -> int:
    """The value ``next(counter)`` would give now (without taking it)."""
    text = repr(counter)  # "count(7)" or "count(7, 4096)"
    end = text.find(",")
    return int(text[6:end if end > 0 else -1])
