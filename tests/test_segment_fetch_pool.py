"""Background fetches on a shared, bounded FetchPool instead of one thread per key."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, event, func, insert

from flakekit.assembly.settings import build_settings
from flakekit.errors import BackendError, ConfigError
from flakekit.generators import fetcher
from flakekit.generators.fetcher import FetchPool, shared_pool
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.generators.segment_service import SegmentService
from flakekit.sql.leaf import SqlSegmentStore, leaf_alloc_table
from flakekit.testing import in_threads
from flakekit.testing.forks import in_forked_child
from flakekit.testing.waiting import wait_until

PREFIX = "flakekit-segment-fetch-"


def fetch_threads(exclude: frozenset[int] = frozenset()) -> list[str]:
    """Fetch-pool threads alive now (but those in ``exclude``: other tests' idle ones)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith(PREFIX) and t.ident not in exclude]


def per_key_threads() -> list[str]:
    """Threads of the old design (``flakekit-segment-<key>``), never started now."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("flakekit-segment-") and not t.name.startswith(PREFIX)
            and t.name != "flakekit-segment-keys"]


def sqlite_store(tmp_path, keys: int, step: int = 10) -> SqlSegmentStore:
    """A real SQLite store with ``keys`` rows; commits are not flushed to disk (these
    tests count threads, not durability: a flushed commit per fetch took 30-40 ms)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'keys.db'}", connect_args={"timeout": 30})
    event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous=OFF"))
    store = SqlSegmentStore(engine)
    store.create("k000000", step)
    rows = [{"biz_tag": f"k{i:06d}", "max_id": 1, "step": step, "description": None}
            for i in range(1, keys)]
    with store.engine.begin() as conn:
        for i in range(0, len(rows), 5000):
            conn.execute(insert(leaf_alloc_table(store.table_name)).values(
                update_time=func.current_timestamp()), rows[i:i + 5000])
    return store


class GatedStore:
    """A real store whose fetches of some keys wait on a gate or fail (a slow or a broken
    database for those keys only)."""

    def __init__(self, inner: SqlSegmentStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.slow: set[str] = set()
        self.failing: set[str] = set()
        self.blocked = 0
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def where(self) -> str:
        return "sqlite (gated)"

    def fetch(self, key: str, step: int | None = None):
        with self.lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
        if key in self.failing:
            raise BackendError(f"database down for {key}")
        if key in self.slow:
            with self.lock:
                self.blocked += 1
            self.gate.wait(60)
        return self.inner.fetch(key, step)

    def give_back(self, key: str, expected: int, new: int) -> bool:
        return self.inner.give_back(key, expected, new)

    def keys(self) -> list[str]:
        return self.inner.keys()

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)


def serve_first_ids(service: SegmentService, keys: int, before: frozenset[int],
                    clients: int = 8) -> tuple[list[int], int]:
    """The first ID of every key, from ``clients`` threads; and the most fetch threads seen."""
    peak = [0]

    def client(w: int) -> list[int]:
        got = []
        for i in range(w, keys, clients):
            got.append(service.next_id(f"k{i:06d}"))
            if i % 50 == 0:
                peak[0] = max(peak[0], len(fetch_threads(before)))
        return got

    results = in_threads(client, clients)
    return [x for r in results for x in r], peak[0]


def check_many_keys(tmp_path, keys: int) -> None:
    store = sqlite_store(tmp_path, keys)
    settings = SegmentSettings(preload=False, fetch_threads=2, wait_budget="60s")
    before = frozenset(t.ident for t in threading.enumerate() if t.ident is not None)
    with SegmentService(store, settings) as service:
        ids, peak = serve_first_ids(service, keys, before)
        # every key's first ID is the first of its row: each was fetched by the pool
        assert ids == [1] * keys
        assert len(service.stats()) == keys
        assert peak <= 2 and service.pool is not None and service.pool.threads <= 2
        new = [t for t in threading.enumerate() if t.ident not in before]
        # the pool's 2 workers and the key refresher: nothing per key
        assert len(new) <= 3, [t.name for t in new]
        assert per_key_threads() == []
    assert service.pool.threads == 0   # closed with the service
    store.engine.dispose()


def test_many_keys_in_one_service_need_only_the_pool_threads(tmp_path):
    """500 keys (the server's mode: first segments fetched in the background) on two
    fetch threads."""
    check_many_keys(tmp_path, 500)


@pytest.mark.slow
def test_thousands_of_keys_on_a_small_pool(tmp_path):
    """3,000 keys in one SegmentService serve their first IDs with a bounded number of
    threads (the old design needed 3,000; benchmarks/bench_cost_keys.py goes to 100,000)."""
    check_many_keys(tmp_path, 3_000)


def test_a_slow_key_blocks_at_most_one_worker(tmp_path):
    """Two keys whose fetches hang hold two of three workers; every other key is still
    served by the third; once released, the slow keys are served too."""
    store = GatedStore(sqlite_store(tmp_path, 60))
    store.slow = {"k000000", "k000001"}
    settings = SegmentSettings(preload=False, fetch_threads=3, wait_budget="60s")
    with SegmentService(store, settings) as service:   # type: ignore[arg-type]
        slow_ids: list[int] = []
        waiting = [threading.Thread(target=lambda k=k: slow_ids.append(service.next_id(k)))
                   for k in sorted(store.slow)]
        for t in waiting:
            t.start()
        wait_until(lambda: store.blocked == 2, 30, what="both slow fetches to hang")
        for i in range(2, 60):
            assert service.next_id(f"k{i:06d}") == 1
        assert slow_ids == []
        assert service.pool is not None and service.pool.threads <= 3
        store.gate.set()
        for t in waiting:
            t.join(30)
        assert slow_ids == [1, 1]
    store.inner.engine.dispose()


def test_back_off_per_key_without_a_thread_per_key(tmp_path):
    """100 keys whose database fails back off each on its own (the delay doubles per key
    up to retry_max) on one worker, healthy keys are served meanwhile, and every key
    recovers by itself when the database does."""
    store = GatedStore(sqlite_store(tmp_path, 110))
    failing = {f"k{i:06d}" for i in range(100)}
    store.failing = set(failing)
    settings = SegmentSettings(preload=False, fetch_threads=1, wait_budget="60s",
                               retry_min="1ms", retry_max="8ms")
    pool = FetchPool(1)
    service = SegmentService(store, settings, pool=pool).start()   # type: ignore[arg-type]
    try:
        for key in sorted(failing):
            service.get(key)
        wait_until(lambda: all(store.attempts.get(k, 0) >= 5 for k in failing), 30,
                   what="five tries each")
        for key in sorted(failing):
            gen = service.get(key)
            # after 5+ failures the next delay is capped at retry_max
            assert gen._backoff == pytest.approx(0.008)
            assert gen.stats().fetch_failures >= 5
        for i in range(100, 110):   # served between the retries on the same worker
            assert service.next_id(f"k{i:06d}") == 1
        assert pool.threads == 1 and per_key_threads() == []
        store.failing.clear()
        for key in sorted(failing):
            assert service.next_id(key) == 1
            assert service.get(key)._backoff == pytest.approx(0.001)   # reset by the success
    finally:
        service.close()
        assert pool.close()
        store.inner.engine.dispose()


def test_close_cancels_a_pending_retry(tmp_path):
    """close() during a back-off returns at once and the retry never runs."""
    store = GatedStore(sqlite_store(tmp_path, 1))
    store.failing = {"k000000"}
    pool = FetchPool(1)
    gen = SegmentGenerator(store, "k000000", SegmentSettings(  # type: ignore[arg-type]
        preload=False, retry_min="300ms", retry_max="1s"), pool=pool).start()
    wait_until(lambda: store.attempts.get("k000000") == 1, 30, what="the first try")
    wait_until(lambda: gen._job is not None and not gen._job.running, 30, what="the failure")
    gen.close(timeout=30)
    time.sleep(0.6)   # past the back-off: a retry would have run by now
    assert store.attempts["k000000"] == 1
    assert pool.close()
    store.inner.engine.dispose()


def test_close_waits_for_a_fetch_in_flight_then_gives_it_back(tmp_path):
    """close() while a fetch is in flight waits for it (bounded) and gives back the segment
    it brought; with a deadline that passes first it gives nothing back, as before."""
    store = GatedStore(sqlite_store(tmp_path, 2, step=10))
    store.slow = {"k000000", "k000001"}
    pool = FetchPool(2)

    def started(key: str) -> SegmentGenerator:
        return SegmentGenerator(store, key, SegmentSettings(preload=False),  # type: ignore[arg-type]
                                pool=pool).start()

    gen = started("k000000")
    wait_until(lambda: store.blocked == 1, 30, what="the fetch to hang")
    closing = threading.Thread(target=gen.close, kwargs={"timeout": 30})
    closing.start()
    wait_until(lambda: gen._closed, 30, what="close() to begin")
    assert closing.is_alive()   # waiting for the fetch in flight
    store.gate.set()
    closing.join(30)
    assert not closing.is_alive()
    # the fetched segment [1, 11) was never served: given back
    assert store.inner.fetch("k000000", 1).max_id == 2
    # the bounded case: the deadline passes while the fetch still hangs
    store.gate.clear()
    gen2 = started("k000001")
    wait_until(lambda: store.blocked == 2, 30, what="the second fetch to hang")
    gen2.close(timeout=0.05)
    store.gate.set()
    wait_until(lambda: gen2.installed == 1, 30, what="the late segment")
    assert gen2.stats().gave_back == 0
    assert store.inner.fetch("k000001", 1).max_id == 12   # nothing given back
    assert pool.close()
    store.inner.engine.dispose()


def test_standalone_generators_share_the_process_pool(tmp_path):
    """Generators built without a pool use the process-wide one: 200 keys that prefetch
    at once never take more than its workers."""
    store = sqlite_store(tmp_path, 200)
    gens = [SegmentGenerator(store, f"k{i:06d}", SegmentSettings(prefetch_at=0.0)).start()
            for i in range(200)]
    try:
        wait_until(lambda: all(g.stats().buffers[1].ready for g in gens), 30, what="every prefetch")
        assert all(g._job is not None and g._job.pool is shared_pool() for g in gens)
        assert shared_pool().threads <= fetcher.SHARED_WORKERS
        assert per_key_threads() == []
        assert [g.next_id() for g in gens] == [1] * 200
    finally:
        for g in gens:
            g.close()
        store.engine.dispose()


def test_idle_workers_leave_and_come_back(tmp_path):
    """A pool keeps no thread while there is nothing to fetch; the next request starts one."""
    store = sqlite_store(tmp_path, 1, step=10)
    pool = FetchPool(2, idle_timeout=0.05)
    with SegmentGenerator(store, "k000000", SegmentSettings(prefetch_at=0.0), pool=pool) as gen:
        wait_until(lambda: gen.stats().buffers[1].ready, 30, what="the prefetch")
        wait_until(lambda: pool.threads == 0, 30, what="the idle worker to leave")
        assert [gen.next_id() for _ in range(11)] == list(range(1, 12))
        # the switch to the next segment asked for the one after: a new worker fetched it
        wait_until(lambda: gen.stats().fetches == 3, 30, what="the next prefetch")
        assert gen.next_id() == 12
    assert pool.close()
    store.engine.dispose()


def test_fork_child_gets_a_fresh_pool(tmp_path):
    """After fork the child's pools have no threads and no jobs; a generator built in the
    child fetches through them; the parent's generator is refused there, as before."""
    store = sqlite_store(tmp_path, 2, step=10)
    pool = FetchPool(2)
    parent = SegmentGenerator(store, "k000000", SegmentSettings(prefetch_at=0.0), pool=pool).start()
    wait_until(lambda: parent.stats().buffers[1].ready, 30, what="the parent's prefetch")
    assert pool.threads >= 1

    def child() -> bytes:
        store.engine.dispose(close=False)   # the parent's connections stay the parent's
        if pool.threads != 0 or fetch_threads():
            return b"inherited threads"
        own = SegmentGenerator(store, "k000001", SegmentSettings(
            preload=False, give_back=False), pool=pool).start()
        first = own.next_id()   # fetched by the child's fresh pool
        shared = SegmentGenerator(store, "k000001", SegmentSettings(preload=False)).start()
        second = shared.next_id()   # and by the process pool
        # (the child's first segment, and the prefetch it started, were not given back)
        code = b"ok" if first == 1 and second > 10 and pool.threads >= 1 else b"bad"
        own.close()
        shared.close()
        try:
            parent.next_id()
            return b"parent served"
        except Exception as exc:  # noqa: BLE001
            if "fork" not in str(exc):
                return b"other"
        return code

    assert in_forked_child(child) == b"ok"
    assert parent.next_id() == 1
    parent.close()
    assert pool.close()
    store.engine.dispose()


def test_fetch_threads_is_checked():
    with pytest.raises(ConfigError) as info:
        build_settings(SegmentSettings, {"fetch_threads": 0}, "generators.inv")
    assert info.value.path == "generators.inv.fetch_threads"
    with pytest.raises(ConfigError):
        build_settings(SegmentSettings, {"fetch_threads": "8"}, "generators.inv")
    assert SegmentSettings().fetch_threads == 8
    with pytest.raises(ValueError, match="max_workers"):
        FetchPool(0)
