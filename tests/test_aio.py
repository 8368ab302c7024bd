"""flakekit.aio (issue 14, item 7): awaiting an ID never blocks the event loop, even while
a segment refill waits on a slow database; an ID already in memory comes without a thread
hop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

import flakekit
from flakekit import aio
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import proxied, wait_until

DELAY_S = 0.2  # per chunk towards the server: a fetch takes several of these


class NoThreads(concurrent.futures.ThreadPoolExecutor):
    """An executor that refuses work: the fast path must not need one."""

    def submit(self, fn, /, *args, **kwargs):
        raise AssertionError("the fast path went to a thread")


async def _ticks_during(coro) -> tuple[object, int, float]:
    """Run ``coro`` beside a task that ticks every 5 ms; (result, ticks during it, seconds)."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)  # the ticker is running
    ticks = 0
    t0 = time.monotonic()
    result = await coro
    elapsed = time.monotonic() - t0
    seen = ticks
    stop.set()
    await task
    return result, seen, elapsed


@pytest.fixture
def slow_segments(pg_url, tcp_proxy):
    """A started segment generator (step 10) on PostgreSQL behind a proxy, and the proxy."""
    SqlSegmentStore(create_engine(pg_url)).create("orders", 10)
    proxy = tcp_proxy(make_url(pg_url).port)
    engine = create_engine(proxied(pg_url, proxy))
    settings = SegmentSettings(dynamic_step=False, wait_budget="30s")
    gen = SegmentGenerator(SqlSegmentStore(engine), "orders", settings).start()
    deadline = time.monotonic() + 15
    first = [gen.next_id(), gen.next_id()]  # past 10%: the next buffer is fetched
    while not gen.stats().buffers[1].ready:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield gen, proxy, first
    gen.close()
    engine.dispose()


def _drain(gen: SegmentGenerator) -> list[int]:
    """Take every ID in memory without waiting."""
    out = []
    while (value := gen.try_next_id()) is not None:
        out.append(value)
    return out


@pytest.mark.postgresql
def test_loop_keeps_ticking_while_a_refill_waits(slow_segments):
    gen, proxy, first = slow_segments
    ids = first + _drain(gen)
    assert len(ids) == 20  # both buffers of 10
    proxy.delay_s = DELAY_S
    ids_async = aio.wrap(gen)

    async def main():
        return await _ticks_during(ids_async.anext_id())

    value, ticks, elapsed = asyncio.run(main())
    assert value == 21
    assert elapsed >= DELAY_S  # the caller really waited for the slow database
    assert ticks >= 3, f"the loop stood still for {elapsed:.2f}s while the refill waited"

    # a batch that needs more than memory holds waits in a thread too
    proxy.delay_s = 0.0
    wait_until(lambda: gen.stats().buffers[1].ready, 15, what="the next buffer",
               interval=0.01)
    ids = [value] + _drain(gen)
    proxy.delay_s = DELAY_S

    async def batch():
        return await _ticks_during(ids_async.anext_ids(25))

    got, ticks, elapsed = asyncio.run(batch())
    assert ticks >= 3, f"the loop stood still for {elapsed:.2f}s during anext_ids"
    ids += list(got)
    assert len(got) == 25 and ids == sorted(ids) and len(set(ids)) == len(ids)


@pytest.mark.postgresql
def test_blocking_call_is_what_the_check_catches(slow_segments):
    """The control: a plain next_id() on the loop stops the ticker (the check can fail)."""
    gen, proxy, _ = slow_segments
    _drain(gen)
    proxy.delay_s = DELAY_S

    async def blocking():
        return gen.next_id()

    async def main():
        return await _ticks_during(blocking())

    _, ticks, elapsed = asyncio.run(main())
    assert elapsed >= DELAY_S and ticks == 0


def test_fast_path_takes_no_thread(sqlite_url):
    store = SqlSegmentStore(create_engine(sqlite_url))
    store.create("orders", 1000)
    gen = SegmentGenerator(store, "orders", SegmentSettings(dynamic_step=False)).start()
    snow = flakekit.snowflake(worker_id=3)
    try:
        ids, snow_ids = aio.wrap(gen), aio.wrap(snow)

        async def main():
            asyncio.get_running_loop().set_default_executor(NoThreads())
            got = [await ids.anext_id() for _ in range(50)]
            batch = await ids.anext_ids(100)
            flakes = [await snow_ids.anext_id() for _ in range(50)]
            return got, batch, flakes, await ids.anext_str()

        got, batch, flakes, text = asyncio.run(main())
        assert got == list(range(1, 51))
        assert list(batch) == list(range(51, 151))
        assert text == "151"
        assert flakes == sorted(flakes) and len(set(flakes)) == 50
    finally:
        gen.close()
        snow.close()
        store.engine.dispose()


def test_try_next_ids_takes_nothing_when_memory_is_short(sqlite_url):
    store = SqlSegmentStore(create_engine(sqlite_url))
    store.create("k", 10)
    gen = SegmentGenerator(store, "k", SegmentSettings(dynamic_step=False, preload=True)).start()
    try:
        assert gen.try_next_ids(10_000) is None
        assert gen.next_id() == 1  # nothing was taken
        with pytest.raises(ValueError):
            gen.try_next_ids(-1)
    finally:
        gen.close()
        store.engine.dispose()
