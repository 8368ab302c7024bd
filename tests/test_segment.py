"""Segment mode: the SQL store on real databases, and the generator's double buffer."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text

from flakekit.errors import (
    BackendError,
    ConfigError,
    NotStartedError,
    SchemaError,
    SegmentUnavailableError,
    UnknownKeyError,
)
from flakekit.generators.segment import Segment, SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import Allocation, SqlSegmentStore
from flakekit.testing import ManualClock, in_threads
from flakekit.testing.forks import in_forked_child
from flakekit.testing.waiting import wait_until

LEAF_DDL = """CREATE TABLE `leaf_alloc` (
  `biz_tag` varchar(128)  NOT NULL DEFAULT '',
  `max_id` bigint(20) NOT NULL DEFAULT '1',
  `step` int(11) NOT NULL,
  `description` varchar(256)  DEFAULT NULL,
  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (`biz_tag`)
) ENGINE=InnoDB"""


class MemoryStore:
    """An in-memory store with Leaf's semantics, a failure switch and a gate."""

    def __init__(self, step: int = 100, start: int = 1, key: str = "k") -> None:
        self.rows = {key: [start, step]}
        self.fetches: list[int] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def fetch(self, key: str, step: int | None = None) -> Allocation:
        self.gate.wait()
        if self.fail:
            raise BackendError("database down")
        with self.lock:
            if key not in self.rows:
                raise UnknownKeyError(key)
            row = self.rows[key]
            size = row[1] if step is None else step
            row[0] += size
            self.fetches.append(size)
            return Allocation(key, row[0], size, row[1])

    def give_back(self, key: str, expected: int, new: int) -> bool:
        with self.lock:
            if self.rows[key][0] != expected:
                return False
            self.rows[key][0] = new
            return True


def generator(store, **settings) -> SegmentGenerator:
    clock = settings.pop("clock", None) or ManualClock()
    return SegmentGenerator(store, "k", SegmentSettings(**settings), clock=clock)


def drain(gen: SegmentGenerator, n: int) -> None:
    """Take ``n`` IDs and drop them (a segment's worth, say)."""
    for _ in range(n):
        gen.next_id()


def disjoint_fetches(engine, threads: int, fetches: int) -> list[int]:
    """``threads`` threads each fetch key 'k' (step 7) ``fetches`` times at once: every ID
    of every range they got, in order of the threads."""
    store = SqlSegmentStore(engine)
    store.create("k", 7)
    got = in_threads(lambda _: [range(a.start, a.max_id)
                                for a in (store.fetch("k") for _ in range(fetches))], threads)
    return [i for mine in got for r in mine for i in r]


@pytest.fixture
def mariadb_engine(mariadb_url):
    """An engine on a fresh MariaDB database; disposed afterwards."""
    engine = create_engine(mariadb_url)
    yield engine
    engine.dispose()


# -- the SQL store ---------------------------------------------------------------------------
class TestSqlStore:
    def test_fetch_is_leaf_range(self, sql_store):
        """A fetch advances max_id by step and yields [max_id - step, max_id), as Leaf."""
        info = sql_store.create("orders", 1000, description="test")
        assert (info.max_id, info.step, info.description) == (1, 1000, "test")
        first = sql_store.fetch("orders")
        assert (first.start, first.max_id, first.step, first.db_step) == (1, 1001, 1000, 1000)
        custom = sql_store.fetch("orders", 5000)
        assert (custom.start, custom.max_id, custom.step, custom.db_step) == (1001, 6001, 5000,
                                                                              1000)
        assert sql_store.keys() == ["orders"]
        assert sql_store.info("orders")[0].max_id == 6001

    def test_unknown_key_and_missing_table(self, sql_store):
        """A missing table says how to create it; an unknown key says how to create the key."""
        with pytest.raises(SchemaError, match="flakekit segments create"):
            sql_store.fetch("nope")
        with pytest.raises(SchemaError, match="does not exist"):
            sql_store.check_schema()
        sql_store.create("orders", 10)
        sql_store.check_schema()
        with pytest.raises(UnknownKeyError, match="flakekit segments create nope"):
            sql_store.fetch("nope")
        with pytest.raises(ConfigError, match="already exists"):
            sql_store.create("orders", 10)
        with pytest.raises(ConfigError, match="step"):
            sql_store.create("other", 0)

    def test_give_back_is_compare_and_set(self, sql_store):
        """give_back lowers max_id only while it still equals the caller's last end."""
        sql_store.create("k", 100)
        a = sql_store.fetch("k")
        assert sql_store.give_back("k", a.max_id, a.start + 10)
        assert sql_store.info("k")[0].max_id == 11
        b = sql_store.fetch("k")
        assert b.start == 11
        sql_store.fetch("k")  # someone else advanced it
        assert not sql_store.give_back("k", b.max_id, b.start)
        assert sql_store.info("k")[0].max_id == 211

    def test_concurrent_fetches_are_disjoint(self, db_url):
        """Threads fetching the same key at once get disjoint ranges (row lock)."""
        engine = create_engine(db_url, **(
            {"connect_args": {"timeout": 30,
                              "check_same_thread": False}} if db_url.startswith("sqlite") else {}
        ))
        ids = disjoint_fetches(engine, 4, 20)
        assert len(ids) == len(set(ids)) == 4 * 20 * 7
        assert sorted(ids) == list(range(1, 1 + len(ids)))
        engine.dispose()

    def test_generators_give_back_on_a_real_database(self, db_url):
        """Give-back works on every backend, and is skipped when another node advanced."""
        engine = create_engine(db_url)
        store = SqlSegmentStore(engine)
        store.create("k", 100)
        a = SegmentGenerator(store, "k").start()
        assert a.next_id() == 1
        b = SegmentGenerator(store, "k").start()
        assert b.next_id() == 101
        a.close()                                   # b fetched after a: nothing given back
        assert store.info("k")[0].max_id == 201
        b.close()
        assert store.info("k")[0].max_id == 102
        c = SegmentGenerator(store, "k").start()
        assert c.next_id() == 102
        c.close()
        engine.dispose()

    def test_bad_step_in_the_table_never_moves_max_id(self, sql_store):
        """A step of 0 or below (an operator's typo) is refused without touching max_id:
        a fetch that lowered max_id before failing would make later fetches reissue IDs."""
        sql_store.create("k", 100)
        first = sql_store.fetch("k")
        with sql_store.engine.begin() as conn:
            conn.execute(text("UPDATE leaf_alloc SET step = -50 WHERE biz_tag = 'k'"))
        for _ in range(3):  # the fetcher retries
            with pytest.raises(SchemaError, match="step -50"):
                sql_store.fetch("k")
        assert sql_store.info("k")[0].max_id == first.max_id
        with sql_store.engine.begin() as conn:
            conn.execute(text("UPDATE leaf_alloc SET step = 100 WHERE biz_tag = 'k'"))
        assert sql_store.fetch("k").start == first.max_id

    @pytest.mark.mariadb
    def test_fetch_is_one_transaction_even_with_autocommit(self, mariadb_url):
        """An engine configured with isolation_level = AUTOCOMMIT (no RETURNING on MariaDB)
        must not split the UPDATE and the SELECT: another node's update in between would
        hand two nodes the same range."""
        engine = create_engine(mariadb_url, isolation_level="AUTOCOMMIT")
        ids = disjoint_fetches(engine, 6, 40)
        assert len(ids) == len(set(ids)) == 6 * 40 * 7
        engine.dispose()

    @pytest.mark.mariadb
    def test_leaf_ddl_on_mariadb(self, mariadb_engine):
        """A table made by Leaf's own DDL, with Leaf's example row, works unchanged."""
        engine = mariadb_engine
        with engine.begin() as conn:
            conn.execute(text(LEAF_DDL))
            conn.execute(text(
                "INSERT INTO leaf_alloc(biz_tag, max_id, step, description) "
                "VALUES('leaf-segment-test', 1, 2000, 'Test leaf Segment Mode Get Id')"
            ))
        store = SqlSegmentStore(engine)
        store.check_schema()
        gen = SegmentGenerator(store, "leaf-segment-test", SegmentSettings(give_back=False)).start()
        assert [gen.next_id() for _ in range(3)] == [1, 2, 3]
        batch = gen.next_ids(1997)
        assert batch[-1] == 2000
        gen.close()
        assert store.info("leaf-segment-test")[0].max_id >= 2001
        # a row Leaf would read back exactly: flakekit writes nothing else
        with engine.connect() as conn:
            ddl = conn.execute(text("SHOW CREATE TABLE leaf_alloc")).one()[1]
        assert "ON UPDATE current_timestamp()" in ddl

    @pytest.mark.mariadb
    def test_created_table_is_leafs_on_mariadb(self, mariadb_engine):
        """flakekit creates the table with Leaf's DDL on MariaDB."""
        SqlSegmentStore(mariadb_engine).create("x", 10)
        with mariadb_engine.connect() as conn:
            cols = conn.execute(text("SHOW COLUMNS FROM leaf_alloc")).all()
        assert [(c[0], c[1]) for c in cols] == [
            ("biz_tag", "varchar(128)"), ("max_id", "bigint(20)"), ("step", "int(11)"),
            ("description", "varchar(256)"), ("update_time", "timestamp"),
        ]


# -- the generator -----------------------------------------------------------------------------
class TestSegmentGenerator:
    def test_ids_increase_across_segments(self):
        """next_id counts through the segments in order, without gaps in one process."""
        store = MemoryStore(step=100)
        with generator(store) as gen:
            ids = [gen.next_id() for _ in range(1000)]
        assert ids == list(range(1, 1001))

    def test_not_started(self):
        """next_id before start() or after close() raises NotStartedError."""
        gen = generator(MemoryStore())
        with pytest.raises(NotStartedError, match="start"):
            gen.next_id()
        gen.start()
        gen.close()
        with pytest.raises(NotStartedError, match="closed"):
            gen.next_id()
        with pytest.raises(NotStartedError):
            gen.start()

    def test_unknown_key_on_start(self):
        """An unknown key fails start() with the command that creates it."""
        store = MemoryStore(key="other")
        with pytest.raises(UnknownKeyError, match="flakekit segments create k"):
            generator(store).start()

    def test_prefetch_at_ten_percent(self):
        """The next segment is fetched once 10% of the current one is used, not before."""
        store = MemoryStore(step=100)
        with generator(store) as gen:
            drain(gen, 10)
            time.sleep(0.05)
            assert len(store.fetches) == 1
            assert gen.stats().buffers[1].ready is False
            gen.next_id()  # the 11th ID crosses 10%
            wait_until(lambda: len(store.fetches) == 2)
            wait_until(lambda: gen.stats().buffers[1].ready)
            buffers = gen.stats().buffers
            assert buffers[0].as_dict() == {"slot": "current", "ready": True, "start": 1,
                                            "position": 12,
                                  "end": 101, "step": 100, "idle": 89}
            assert buffers[1].start == 101 and buffers[1].position == 101

    def test_prefetch_fraction_is_configurable(self):
        """prefetch_at = 0.5 waits for half of the segment."""
        store = MemoryStore(step=100)
        with generator(store, prefetch_at=0.5) as gen:
            drain(gen, 50)
            time.sleep(0.05)
            assert len(store.fetches) == 1
            gen.next_id()
            wait_until(lambda: len(store.fetches) == 2)

    def test_prefetch_at_zero_fetches_at_once(self):
        """prefetch_at = 0 keeps the next buffer filled from the start."""
        store = MemoryStore(step=10)
        with generator(store, prefetch_at=0) as gen:
            wait_until(lambda: gen.stats().buffers[1].ready)
            assert [gen.next_id() for _ in range(25)] == list(range(1, 26))

    def test_zero_budget_fails_fast(self):
        """wait_budget = 0 answers at once when both buffers are empty, like Leaf's -3."""
        store = MemoryStore(step=10)
        gen = generator(store, wait_budget=0).start()
        store.gate.clear()
        drain(gen, 10)
        started = time.monotonic()
        with pytest.raises(SegmentUnavailableError):
            gen.next_id()
        assert time.monotonic() - started < 1
        store.gate.set()
        wait_until(lambda: gen.stats().buffers[1].ready or gen.stats().buffers[0].ready)
        assert gen.next_id() == 11
        gen.close()

    def test_dynamic_step_grows_and_shrinks(self):
        """Leaf's rule: x2 under 15 min, /2 at 30 min or more, capped, floored at the DB step."""
        store = MemoryStore(step=100)
        clock = ManualClock()
        gen = generator(store, clock=clock, max_step=400).start()

        def next_fetch() -> int:
            count = len(store.fetches)
            while not gen.stats().fetching:  # consume up to the prefetch point
                gen.next_id()
            wait_until(lambda: not gen.stats().fetching)
            assert len(store.fetches) == count + 1
            return store.fetches[-1]

        assert store.fetches == [100]           # first load: the table's step
        assert next_fetch() == 100              # second load: table's step, timer starts
        clock.advance(60)
        assert next_fetch() == 200              # lasted 1 min -> double
        clock.advance(60)
        assert next_fetch() == 400              # double again
        clock.advance(60)
        assert next_fetch() == 400              # 800 > max_step: stays
        clock.advance(20 * 60)
        assert next_fetch() == 400              # 15..30 min: unchanged
        clock.advance(30 * 60)
        assert next_fetch() == 200              # >= 30 min: halve
        clock.advance(45 * 60)
        assert next_fetch() == 100
        clock.advance(45 * 60)
        assert next_fetch() == 100              # never below the table's step
        store.rows["k"][1] = 300                # an operator raises the step column
        clock.advance(45 * 60)
        next_fetch()
        clock.advance(45 * 60)
        assert next_fetch() == 300              # the new floor applies
        gen.close()
        assert gen.stats().step == 300

    def test_dynamic_step_off(self):
        """dynamic_step = false keeps the table's step."""
        store = MemoryStore(step=50)
        with generator(store, dynamic_step=False) as gen:
            drain(gen, 500)
        assert set(store.fetches) == {50}

    def test_outage_budget_then_recovery(self):
        """Buffers carry an outage; then SegmentUnavailableError after the budget; then recovery."""
        from flakekit.testing import EventRecorder

        recorder = EventRecorder()
        store = MemoryStore(step=100)
        gen = SegmentGenerator(
            store, "k", SegmentSettings(wait_budget="200ms", retry_min="10ms", retry_max="20ms"),
            clock=ManualClock(), events=recorder.events,
        ).start()
        store.fail = True
        ids = []
        with pytest.raises(SegmentUnavailableError, match="wait_budget") as info:
            while True:
                ids.append(gen.next_id())
        assert ids == list(range(1, 101))       # the whole buffer was served during the outage
        assert "database down" in str(info.value)
        started = time.monotonic()
        with pytest.raises(SegmentUnavailableError):
            gen.next_id()
        assert time.monotonic() - started >= 0.19  # it waited the budget (not Leaf's -3)
        assert gen.stats().unavailable == 2
        assert recorder.alerts() == ["segment-unavailable"]  # once per outage
        store.fail = False
        assert gen.next_id() == 101             # recovers on its own
        gen.close()

    def test_waits_for_a_slow_refill_within_budget(self):
        """When both buffers are empty but the refill lands within the budget, the caller waits."""
        store = MemoryStore(step=10)
        gen = generator(store, wait_budget="5s").start()
        store.gate.clear()
        drain(gen, 10)
        threading.Timer(0.1, store.gate.set).start()
        assert gen.next_id() == 11
        assert gen.stats().waits == 1
        gen.close()

    def test_deleted_key_raises_unknown_key(self):
        """A key removed from the table surfaces as UnknownKeyError once the buffers are
        empty, its message saying 'unknown segment key' once (not twice)."""
        store = MemoryStore(step=10)
        gen = generator(store, wait_budget="300ms").start()
        del store.rows["k"]
        drain(gen, 10)
        with pytest.raises(UnknownKeyError) as unknown:
            gen.next_id()
        assert str(unknown.value).count("unknown segment key") == 1
        gen.close()

    def test_next_ids_spans_segments(self):
        """next_ids returns ranges, continues where next_id stopped, and may span segments."""
        store = MemoryStore(step=100)
        with generator(store) as gen:
            assert gen.next_id() == 1
            batch = gen.next_ids(250)
            assert len(batch) == 250
            assert list(batch) == list(range(2, 252))
            assert len(batch.ranges) >= 2
            assert gen.next_id() == 252
            assert list(gen.next_ids(0)) == []
            with pytest.raises(ValueError):
                gen.next_ids(-1)

    def test_big_batch_fetches_one_big_segment(self):
        """A batch far larger than the step costs one extra round trip, not hundreds."""
        store = MemoryStore(step=10)
        with generator(store, dynamic_step=False) as gen:
            batch = gen.next_ids(100_000)
            assert len(batch) == 100_000
            assert len(set(batch)) == 100_000
        assert len(store.fetches) <= 4

    def test_threads_never_duplicate(self):
        """Many threads mixing next_id and next_ids on a small step: every ID once."""
        store = MemoryStore(step=37)
        gen = generator(store, wait_budget="5s").start()

        def work(i: int) -> list[int]:
            mine: list[int] = []
            for j in range(3000):
                if j % 100 == i:
                    mine.extend(gen.next_ids(i + 1))
                else:
                    mine.append(gen.next_id())
            return mine

        out = in_threads(work, 8)
        gen.close()
        ids = [i for mine in out for i in mine]
        assert len(ids) == len(set(ids))
        for mine in out:
            assert mine == sorted(mine)         # each thread sees increasing IDs

    def test_close_gives_back_the_tail(self):
        """A clean close returns the unused tail (and the unused next buffer): no waste."""
        store = MemoryStore(step=100)
        gen = generator(store).start()
        drain(gen, 20)
        wait_until(lambda: gen.stats().buffers[1].ready)
        gen.close()
        assert store.rows["k"][0] == 21
        assert gen.stats().gave_back == 180
        gen2 = generator(store).start()
        assert gen2.next_id() == 21             # dense across a clean restart
        gen2.close()

    def test_give_back_skipped_when_someone_advanced(self):
        """If another node fetched after us, max_id is left alone."""
        store = MemoryStore(step=100)
        a = generator(store, preload=True).start()
        a.next_id()
        b = generator(store).start()            # advanced max_id past a's segment
        b_first = b.next_id()
        a.close()
        assert store.rows["k"][0] == 201
        b.close()                               # b is on top: its tail goes back
        assert store.rows["k"][0] == b_first + 1

    def test_restart_never_reissues(self):
        """A generator dropped without close() (a crash) never sees its IDs again."""
        store = MemoryStore(step=100)
        a = generator(store).start()
        seen = {a.next_id() for _ in range(50)}
        # no close(): the process "died"; a new one starts from a fresh segment
        b = generator(store).start()
        later = {b.next_id() for _ in range(500)}
        assert not seen & later
        assert min(later) > max(seen)
        b.close()

    def test_stats_shape(self):
        """stats() is JSON-friendly and names both buffers."""
        import json

        store = MemoryStore(step=100)
        with generator(store) as gen:
            gen.next_id()
            stats = gen.stats()
        json.dumps(stats.as_dict())
        assert stats.key == "k" and stats.fetches >= 1
        assert [b.slot for b in stats.buffers] == ["current", "next"]

    def test_fork_child_cannot_reuse_buffers(self):
        """A forked child gets an error instead of the parent's IDs."""
        store = MemoryStore(step=100)
        gen = generator(store).start()
        gen.next_id()

        def child() -> bytes:
            try:
                gen.next_id()
                return b"issued"
            except NotStartedError as exc:
                return b"refused" if "fork" in str(exc) else b"other"

        assert in_forked_child(child) == b"refused"
        assert gen.next_id() == 2
        gen.close()

    def test_close_during_start_issues_nothing(self):
        """close() while start() is still fetching: the generator stays closed (it does
        not come alive with the fetched segment) and the segment goes back."""
        store = MemoryStore(step=100)
        gen = generator(store)
        store.gate.clear()
        errors: list[BaseException] = []

        def starting() -> None:
            try:
                gen.start()
            except NotStartedError as exc:
                errors.append(exc)

        t = threading.Thread(target=starting)
        t.start()
        time.sleep(0.05)                        # start() is inside the fetch
        gen.close()
        store.gate.set()
        t.join(5)
        with pytest.raises(NotStartedError, match="closed"):
            gen.next_id()
        assert errors and "closed" in str(errors[0])
        assert store.rows["k"][0] == 1          # the unused segment was given back

    def test_unavailable_message_is_one_clean_line(self):
        """A store failing with a multi-line message still gives a one-line error (a
        deleted key's message: test_deleted_key_raises_unknown_key)."""

        class Broken(MemoryStore):
            def fetch(self, key, step=None):
                if self.fail:
                    raise RuntimeError("boom\n[SQL: UPDATE leaf_alloc ...]\n(details)")
                return super().fetch(key, step)

        store = Broken(step=10)
        gen = generator(store, wait_budget="100ms", retry_min="5ms", retry_max="10ms").start()
        store.fail = True
        drain(gen, 10)
        with pytest.raises(SegmentUnavailableError) as info:
            gen.next_id()
        assert "\n" not in str(info.value) and "boom" in str(info.value)
        gen.close()

    def test_segment_value_object(self):
        """Segment checks its own consistency."""
        assert Segment(1, 101, 100).step == 100
        with pytest.raises(ValueError):
            Segment(1, 100, 100)


# -- many keys -------------------------------------------------------------------------------
class TestSegmentService:
    def test_new_key_usable_at_once(self, sqlite_url):
        """A key created after start works on first use (Leaf: -2 for up to a minute)."""
        from flakekit.generators.segment_service import SegmentService

        store = SqlSegmentStore(create_engine(sqlite_url))
        store.create("a", 10)
        clock = ManualClock()   # the unknown-key memory runs on the injected clock
        with SegmentService(store, unknown_ttl=0.05, clock=clock) as service:
            assert service.keys() == ["a"]
            assert service.next_id("a") == 1
            with pytest.raises(UnknownKeyError, match="flakekit segments create b"):
                service.next_id("b")
            store.create("b", 10, start=500)
            with pytest.raises(UnknownKeyError):  # remembered as unknown for a moment
                service.next_id("b")
            clock.advance(0.06)
            assert service.next_id("b") == 500
            assert set(service.stats()) == {"a", "b"}
        store.engine.dispose()

    def test_each_key_gets_the_service_settings_unchanged(self):
        """The durations reach every key's generator as they are (attrs.evolve re-ran
        the converters: grow_below's 15 min in ns was read as seconds)."""
        from flakekit.generators.segment_service import SegmentService

        settings = SegmentSettings(grow_below="1min", shrink_after="2min", wait_budget="2s")
        store = MemoryStore(key="a")
        store.exists = lambda key: key in store.rows
        store.keys = lambda: sorted(store.rows)
        with SegmentService(store, settings) as service:
            gen = service.get("a")
            assert gen.key == "a" and gen.next_id() == 1
            got = gen.settings
            assert (got.grow_below, got.shrink_after, got.wait_budget) == (
                60 * 10**9, 120 * 10**9, 2 * 10**9)

    def test_refresh_drops_vanished_keys(self, sqlite_url):
        """A key deleted from the table is dropped at the next refresh."""
        from flakekit.generators.segment_service import SegmentService

        store = SqlSegmentStore(create_engine(sqlite_url))
        store.create("a", 10)
        store.create("b", 10)
        with SegmentService(store) as service:
            service.next_id("a")
            with store.engine.begin() as conn:
                conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'a'"))
            service.refresh_keys()
            assert service.keys() == ["b"]
            assert service.stats() == {}
        store.engine.dispose()

    def test_refresh_keeps_a_key_created_during_the_refresh(self):
        """A key first used while a refresh is reading the key list is not dropped (and its
        live generator not closed under the caller) by that refresh's stale list."""
        from flakekit.generators.segment_service import SegmentService

        class KeyStore(MemoryStore):
            def __init__(self) -> None:
                super().__init__(step=10, key="a")
                self.keys_gate = threading.Event()
                self.keys_gate.set()
                self.listing = threading.Event()

            def keys(self) -> list[str]:
                listed = sorted(self.rows)
                self.listing.set()
                self.keys_gate.wait()
                return listed

            def exists(self, key: str) -> bool:
                return key in self.rows

        store = KeyStore()
        with SegmentService(store, refresh=3600) as service:
            store.keys_gate.clear()
            refresher = threading.Thread(target=service.refresh_keys)
            refresher.start()
            store.listing.wait(5)               # the list was read: no "b" yet
            store.rows["b"] = [1, 10]
            gen = service.get("b")
            assert gen.next_id() == 1
            store.keys_gate.set()
            refresher.join(5)
            assert gen.next_id() == 2           # not closed by the stale list
            assert service.keys() == ["a", "b"]
            service.refresh_keys()
            assert service.next_id("b") == 3

    def test_unknown_keys_are_not_remembered_forever(self):
        """Asking for many wrong keys does not grow memory without bound."""
        from flakekit.generators.segment_service import SegmentService

        class KeyStore(MemoryStore):
            def keys(self) -> list[str]:
                return sorted(self.rows)

            def exists(self, key: str) -> bool:
                return key in self.rows

        with SegmentService(KeyStore(key="a"), refresh=3600, unknown_ttl=0.01) as service:
            for i in range(20_000):
                with pytest.raises(UnknownKeyError):
                    service.get(f"nope-{i}")
            assert len(service._unknown) <= 10_000

    def test_preloads_recent_keys(self, sqlite_url, tmp_path):
        """Keys served before a restart are fetched at start; IDs never repeat."""
        from flakekit.generators.segment_service import SegmentService

        store = SqlSegmentStore(create_engine(sqlite_url))
        store.create("a", 10)
        store.create("b", 10)
        state = str(tmp_path / "keys.json")
        with SegmentService(store, state_file=state) as service:
            first = service.next_id("a")
        with SegmentService(store, state_file=state) as service:
            assert list(service.stats()) == ["a"]    # preloaded, "b" was never used
            assert service.next_id("a") == first + 1  # the tail was given back
        store.engine.dispose()


class TestKit:
    def test_config_file_to_ids(self, tmp_path, sqlite_url):
        """A [generators.X] table with strategy = "segment" builds through the Kit."""
        from flakekit.api import load

        SqlSegmentStore(create_engine(sqlite_url)).create("invoice", 10)
        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(
            f'[backends.main]\nurl = "{sqlite_url}"\n\n[generators.invoices]\n'
            'strategy = "segment"\nstore = { type = "sql", backend = "main" }\nkey = "invoice"\n'
        )
        with load(cfg) as kit:
            assert kit["invoices"].next_id() == 1
            assert list(kit["invoices"].next_ids(3)) == [2, 3, 4]
            assert kit.stats()["invoices"].key == "invoice"
        with load(cfg) as kit:
            assert kit["invoices"].next_id() == 5    # the tail came back on close

    def test_cli(self, tmp_path, sqlite_url):
        """flakekit segments create / list (table and JSON)."""
        import json

        from click.testing import CliRunner

        from flakekit.cli import _add_plugin_commands, cli

        _add_plugin_commands()
        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(
            f'[backends.main]\nurl = "{sqlite_url}"\n\n[generators.invoices]\n'
            'strategy = "segment"\nstore = { type = "sql", backend = "main" }\nkey = "invoice"\n'
        )
        runner = CliRunner()
        result = runner.invoke(cli,
                               ["segments", "create", "invoice", "--step", "50", "-c", str(cfg)])
        assert result.exit_code == 0, result.output
        result = runner.invoke(cli, ["segments", "--json", "-c", str(cfg)])
        assert result.exit_code == 0, result.output
        keys = json.loads(result.output)["stores"][0]["keys"]
        assert [(k["key"], k["max_id"], k["step"], k["generator"]) for k in keys] == [
            ("invoice", 1, 50, "invoices")]
        result = runner.invoke(cli, ["segments", "-c", str(cfg)])
        assert "invoice" in result.output and "invoices" in result.output
