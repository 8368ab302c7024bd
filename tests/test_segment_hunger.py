"""Segments that ride out bursts (issue 15 item 3): CosId's hunger and the segment TTL.

The burst runs as a discrete-event simulation on a manual clock: every millisecond the
consumer asks for that millisecond's IDs with ``try_next_id()`` (once a call finds
nothing, it and the rest of that millisecond's calls would have waited for a refill), and
the store's round trip completes only once the manual clock has moved past its latency.
Every step waits (for real) until the fetcher thread is idle or blocked in the store, so the
counts are exact: counted, not timed.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from flakekit.assembly.settings import build_settings
from flakekit.errors import ConfigError
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import Allocation, SqlSegmentStore
from flakekit.testing import ManualClock, proxied
from flakekit.testing.waiting import wait_until

MS = 1_000_000


class SlowStore:
    """The SQLite store behind a round trip of ``latency_ns`` on the manual clock; counts
    round trips and the step each asked for."""

    def __init__(self, inner: SqlSegmentStore, clock: ManualClock, latency_ns: int) -> None:
        self.inner, self.clock, self.latency_ns = inner, clock, latency_ns
        self.asked: list[int | None] = []
        self.cond = threading.Condition()
        self.due: int | None = None   # manual ns at which the fetch in flight completes
        self.released = False
        self.auto = True   # answer at once (start()'s first fetch)

    @property
    def round_trips(self) -> int:
        return len(self.asked)

    def fetch(self, key: str, step: int | None = None) -> Allocation:
        if self.auto:
            self.asked.append(step)
            return self.inner.fetch(key, step)
        with self.cond:
            self.due = self.clock.monotonic_ns() + self.latency_ns
            self.cond.notify_all()
            while not self.released:
                self.cond.wait(0.01)
            self.released = False
            self.due = None
        self.asked.append(step)
        return self.inner.fetch(key, step)

    def give_back(self, key: str, expected: int, new: int) -> bool:
        return self.inner.give_back(key, expected, new)


class Sim:
    """Drive one generator through a traffic schedule, one manual millisecond a step."""

    def __init__(self, tmp_path, hunger: bool, *, step: int = 1000, latency_ms: int = 10,
                 **settings: object) -> None:
        self.clock = ManualClock()
        inner = SqlSegmentStore(create_engine(f"sqlite:///{tmp_path / f'h{hunger}.db'}"))
        inner.create("k", step)
        self.store = SlowStore(inner, self.clock, 0)
        self.gen = SegmentGenerator(self.store, "k", SegmentSettings(
            hunger=hunger, **settings), clock=self.clock).start()  # type: ignore[arg-type]
        self.store.auto = False
        self.store.latency_ns = latency_ms * MS
        self.ids: list[int] = []
        self.waits = 0
        self.distances: list[int] = []
        self.settle()

    def settle(self) -> None:
        """Let the fetcher either block in the store or go idle; complete a round trip
        whose latency has passed (and wait until its segment is in a buffer)."""
        gen, store = self.gen, self.store
        while True:
            with gen._cond:
                wanted = gen._fetch_wanted
            if wanted and store.due is None:
                wait_until(lambda: store.due is not None or not gen._fetch_wanted, 10,
                           what="the fetch")
                continue
            if store.due is not None and self.clock.monotonic_ns() >= store.due:
                installed = gen.installed
                with store.cond:
                    store.released = True
                    store.cond.notify_all()
                wait_until(lambda before=installed: gen.installed > before, 10,
                           what="the new segment")
                continue
            return

    def run(self, schedule: list[tuple[int, int]]) -> Sim:
        for ms, per_ms in schedule:
            for _ in range(ms):
                for served in range(per_ms):
                    value = self.gen.try_next_id()
                    if value is None:   # this and the rest of this ms's calls wait
                        self.waits += per_ms - served
                        break
                    self.ids.append(value)
                self.settle()
                self.clock.advance(ns=MS)
                self.settle()
                self.distances.append(self.gen.prefetch_distance)
        return self

    def close(self) -> None:
        with self.store.cond:   # a fetch in flight: let it finish
            self.store.released = True
            self.store.cond.notify_all()
        self.gen.close()
        self.store.inner.engine.dispose()


BURST = [(200, 5), (300, 2000), (100, 5)]


def test_a_burst_waits_less_with_hunger(tmp_path):
    """5k to 2M IDs/s against a store 10 ms away: with hunger the fetches ask for
    several steps at once, so fewer calls find the buffers empty, in fewer round trips."""
    off = Sim(tmp_path, hunger=False, max_step=4000).run(BURST)
    on = Sim(tmp_path, hunger=True, max_step=4000).run(BURST)
    try:
        assert on.waits < off.waits
        assert on.waits * 2 <= off.waits   # not a rounding effect
        assert max(on.distances) > 1 and set(off.distances) == {1}
        assert max(s or 0 for s in on.store.asked) > 4000   # step x distance, one trip
        for sim in (on, off):
            assert len(set(sim.ids)) == len(sim.ids)
            assert all(a < b for a, b in zip(sim.ids, sim.ids[1:]))
        assert len(on.ids) > len(off.ids)   # the same schedule: more calls answered
    finally:
        on.close()
        off.close()


def test_calm_shrinks_the_distance_again(tmp_path):
    sim = Sim(tmp_path, hunger=True, max_step=2000, hunger_max=8)
    try:
        sim.run([(100, 2000)])
        peak = sim.gen.prefetch_distance
        assert peak > 1
        sim.run([(1500, 40)])   # 40k IDs/s: a 16k segment lasts 400 ms > 8 x 10 ms
        assert sim.gen.prefetch_distance < peak
        assert sim.distances[-1] == 1
        assert all(a < b for a, b in zip(sim.ids, sim.ids[1:]))
    finally:
        sim.close()


def test_leaf_step_still_follows_its_own_rule(tmp_path):
    """Hunger multiplies the fetch, not Leaf's step: the in-memory step still doubles
    per fetch within 15 min and stays under max_step."""
    sim = Sim(tmp_path, hunger=True, max_step=4000)
    try:
        sim.run([(60, 2000)])
        assert sim.gen.stats().step <= 4000
        assert sim.gen.stats().step > 1000   # Leaf's doubling happened
    finally:
        sim.close()


def test_without_latency_hunger_never_grows(tmp_path):
    """A store that answers at once (on the clock the generator reads) gives no signal:
    behaviour is Leaf's as before."""
    sim = Sim(tmp_path, hunger=True, latency_ms=0, max_step=4000)
    try:
        sim.run([(50, 2000)])
        assert set(sim.distances) == {1}
    finally:
        sim.close()


# -- TTL -----------------------------------------------------------------------------------
def ttl_gen(tmp_path, **settings):
    clock = ManualClock()
    store = SqlSegmentStore(create_engine(f"sqlite:///{tmp_path / 'ttl.db'}"))
    store.create("k", 100)
    gen = SegmentGenerator(store, "k", SegmentSettings(segment_ttl="10s", **settings),
                           clock=clock).start()
    return gen, store, clock


def test_an_idle_range_past_its_ttl_is_dropped_and_never_served(tmp_path):
    gen, store, clock = ttl_gen(tmp_path, prefetch_at=0.0)   # the next one comes at once
    try:
        first = gen.next_id()
        wait_until(lambda: gen.stats().buffers[1].ready, 10, what="the prefetched segment")
        held = [(b.start, b.end) for b in gen.stats().buffers]
        clock.advance(11)   # both ranges idle past their TTL
        later = [gen.next_id() for _ in range(250)]
        assert gen.dropped == 2
        assert all(not any(lo <= v < hi for lo, hi in held) for v in later)
        assert all(a < b for a, b in zip([first, *later], later))
        assert len(set(later)) == len(later)
        batch = gen.next_ids(5)
        assert min(batch.ranges[0]) > later[-1]
    finally:
        gen.close()
        store.engine.dispose()


def test_within_its_ttl_a_range_is_served(tmp_path):
    gen, store, clock = ttl_gen(tmp_path)
    try:
        a = gen.next_id()
        clock.advance(9)
        assert gen.next_id() == a + 1
        assert gen.try_next_id() == a + 2
        clock.advance(2)   # now past it: try_next_id drops it too
        value = gen.try_next_id()
        assert value is None or value >= 101   # 4..100 were dropped
        assert gen.dropped == 1
    finally:
        gen.close()
        store.engine.dispose()


def test_ttl_off_keeps_the_plain_hot_path(tmp_path):
    store = SqlSegmentStore(create_engine(f"sqlite:///{tmp_path / 'p.db'}"))
    store.create("k", 100)
    gen = SegmentGenerator(store, "k", SegmentSettings(), clock=ManualClock())
    assert "next_id" not in vars(gen)   # the class's own next_id, no clock read
    gen.close()
    store.engine.dispose()


@pytest.mark.parametrize(("table", "message"), [
    ({"segment_ttl": "soon"}, r"^generators\.g\.segment_ttl: expected a duration"),
    ({"segment_ttl": "10us"}, r"^generators\.g\.segment_ttl: segment_ttl must be at least 1ms"),
    ({"hunger_max": 0}, r"^generators\.g\.hunger_max: must be at least 1"),
    ({"hunger": "yes"}, r"^generators\.g\.hunger: "),
])
def test_bad_settings_are_one_line(table, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_settings(SegmentSettings, table, "generators.g")
    assert "\n" not in str(info.value)


# -- a real database 50 ms away --------------------------------------------------------------
@pytest.mark.postgresql
def test_postgresql_behind_a_slow_link_grows_the_distance(pg_url, tcp_proxy):
    """A burst against PostgreSQL behind a proxy adding 50 ms per round trip: segments
    run out far faster than a fetch takes, so the distance grows and one fetch asks for
    several steps (Leaf's step cannot grow here: max_step = step)."""
    setup = SqlSegmentStore(create_engine(pg_url))
    setup.create("k", 100)
    setup.engine.dispose()
    proxy = tcp_proxy(make_url(pg_url).port or 5432)
    engine = create_engine(proxied(pg_url, proxy), pool_pre_ping=True)
    store = SqlSegmentStore(engine)
    gen = SegmentGenerator(store, "k", SegmentSettings(max_step=100, wait_budget="10s")).start()
    try:
        proxy.delay_s = 0.05
        got = [gen.next_id() for _ in range(6000)]
        stats = gen.stats()
        assert gen.prefetch_distance > 1
        assert len(set(got)) == len(got) and all(a < b for a, b in zip(got, got[1:]))
        assert stats.step == 100   # Leaf's step: capped
        # without hunger every fetch is 100 IDs; with it some asked for several steps
        assert (stats.max_id or 0) - 1 > stats.fetches * 100
    finally:
        gen.close()
        engine.dispose()
