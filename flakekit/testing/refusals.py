"""The last step of a drill whose holder must refuse: the call raises, then the holder is
closed, so a refusal test leaves no session, lease or thread behind::

    assert_refused_and_close(gen, LeaseLostError, gen.next_id)
    assert_refused_and_close(alloc, BackendError, alloc.acquire, request, match="cache")

Needs pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["assert_refused_and_close"]


def assert_refused_and_close(holder: Any, error: type[BaseException],
                             call: Callable[..., object], *args: Any,
                             match: str | None = None) -> None:
    """``call(*args)`` raises ``error`` (its message matching ``match``, if given); then
    ``holder`` is closed."""
    import pytest

    with pytest.raises(error, match=match):
        call(*args)
    holder.close()
