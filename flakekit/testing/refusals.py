"""The last step of a drill whose holder must refuse: the call raises, then the holder is
closed, so a refusal test leaves no session, lease or thread behind::

    assert_refused_and_close(gen, LeaseLostError, gen.next_id)
    assert_refused_and_close(alloc, BackendError, alloc.acquire, request, match="cache")

and the check that a generator which must refuse refuses both ways of drawing IDs::

    assert_issues_nothing(gen, LeaseExpiredError, 10, match="jumped forward")

Needs pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["assert_issues_nothing", "assert_refused_and_close"]


def assert_refused_and_close(holder: Any, error: type[BaseException],
                             call: Callable[..., object], *args: Any,
                             match: str | None = None) -> None:
    """``call(*args)`` raises ``error`` (its message matching ``match``, if given); then
    ``holder`` is closed."""
    import pytest

    with pytest.raises(error, match=match):
        call(*args)
    holder.close()


def assert_issues_nothing(gen: Any, error: type[BaseException], n: int,
                          match: str | None = None) -> None:
    """``gen.next_id()`` and ``gen.next_ids(n)`` both raise ``error`` (its message matching
    ``match``, if given): a refusal only one of them honoured would still hand out IDs."""
    import pytest

    with pytest.raises(error, match=match):
        gen.next_id()
    with pytest.raises(error, match=match):
        gen.next_ids(n)
