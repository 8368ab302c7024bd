"""``SegmentStoreContract``: the promises every Leaf-style segment store keeps, as tests.

Modelled on APScheduler 4's data-store suite: a test module subclasses the class and
provides ``make_store``: ``make_store({"key": step, ...})`` returns a store on a real
backend where those keys exist (``max_id`` at its initial value); the fixture closes or
disposes what it made.
"""

from __future__ import annotations

import threading

import pytest

from flakekit.errors import UnknownKeyError
from flakekit.testing.threads import assert_disjoint, in_threads

__all__ = ["SegmentStoreContract"]


def _range(allocation: object) -> range:
    max_id, step = allocation.max_id, allocation.step  # type: ignore[attr-defined]
    return range(max_id - step, max_id)


class SegmentStoreContract:
    """Subclass and provide the fixture ``make_store``."""

    #: fetches per thread and threads in the concurrency test
    threads: int = 4
    fetches_per_thread: int = 10

    def test_fetch_returns_disjoint_increasing_ranges_per_key(self, make_store):
        """Successive fetches of a key give adjacent, increasing ranges of its step;
        another key advances on its own."""
        store = make_store({"a": 7, "b": 3})
        got = [store.fetch("a") for _ in range(3)]
        assert [a.step for a in got] == [7, 7, 7]
        assert all(a.db_step == 7 for a in got)
        ranges = [_range(a) for a in got]
        assert ranges[0].stop == ranges[1].start and ranges[1].stop == ranges[2].start
        other = store.fetch("b")
        assert other.step == 3
        assert store.fetch("a").max_id == got[-1].max_id + 7  # "b" did not move "a"

    def test_concurrent_fetches_never_overlap(self, make_store):
        """Fetches racing from threads hand out every range once."""
        store = make_store({"k": 5})
        lock = threading.Lock()
        got: list[range] = []

        def work(_: int) -> None:
            for _ in range(self.fetches_per_thread):
                r = _range(store.fetch("k"))
                with lock:
                    got.append(r)

        in_threads(work, self.threads)
        assert len(got) == self.threads * self.fetches_per_thread
        assert_disjoint(got)
        assert sum(len(r) for r in got) == 5 * len(got)

    def test_unknown_key_raises(self, make_store):
        """Fetching a key the store does not have is UnknownKeyError (a LookupError)."""
        store = make_store({"k": 5})
        with pytest.raises(UnknownKeyError):
            store.fetch("nope")
        with pytest.raises(LookupError):
            store.fetch("nope")

    def test_give_back_only_when_untouched(self, make_store):
        """give_back lowers max_id when nobody fetched since (the next fetch starts at
        the given-back tail) and refuses when someone did."""
        store = make_store({"k": 10})
        a = store.fetch("k")
        tail = a.max_id - 4
        assert store.give_back("k", a.max_id, tail) is True
        b = store.fetch("k")
        assert b.max_id - b.step == tail
        c = store.fetch("k")
        assert store.give_back("k", b.max_id, b.max_id - 1) is False  # c moved the row
        d = store.fetch("k")
        assert d.max_id - d.step == c.max_id

    def test_give_back_refuses_a_raise(self, make_store):
        """give_back never moves max_id up (that would skip nothing but means a bug)."""
        store = make_store({"k": 10})
        a = store.fetch("k")
        assert store.give_back("k", a.max_id, a.max_id + 5) is False
        assert store.fetch("k").max_id == a.max_id + 10

    def test_fetch_respects_a_requested_step(self, make_store):
        """fetch(key, step) advances by that step (a dynamic step); db_step stays the
        key's own."""
        store = make_store({"k": 10})
        a = store.fetch("k", 25)
        assert a.step == 25 and a.db_step == 10
        b = store.fetch("k")
        assert b.step == 10 and b.max_id - b.step == a.max_id
