"""Counters that start again every period (reset = "daily" | "monthly" | "yearly"): the
period by the database's clock, one leaf_alloc row per period, nothing of one period
issued in another, capacity checked, old periods pruned."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest
from sqlalchemy import create_engine

from flakekit.errors import ConfigError, FieldError, PeriodFullError, SegmentUnavailableError
from flakekit.generators.periodic import PeriodicSegment
from flakekit.generators.segment_settings import SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import ManualClock, in_threads
from flakekit.testing.cli import run_cli
from flakekit.testing.refusals import assert_issues_nothing
from flakekit.values.periods import PeriodFormat, PeriodRule

BERLIN = "Europe/Berlin"


class DbClock:
    """An injected database clock: ``at`` (aware) when made, then moving with ``clock``'s
    monotonic time, as a database's clock moves with real time."""

    def __init__(self, clock: ManualClock, at: dt.datetime) -> None:
        self.clock, self.at, self.mono0 = clock, at, clock.monotonic_ns()
        self.reads = 0

    def __call__(self) -> dt.datetime:
        self.reads += 1
        return self.at + dt.timedelta(microseconds=(self.clock.monotonic_ns() - self.mono0) // 1000)


def local(zone: str, *args: int) -> dt.datetime:
    from zoneinfo import ZoneInfo

    return dt.datetime(*args, tzinfo=ZoneInfo(zone)).astimezone(dt.UTC)


def periodic(store, clock, db_clock, key: str = "inv", **settings) -> PeriodicSegment:
    settings.setdefault("clock_sync", 0)   # the tests move the clock; no background reads
    settings.setdefault("period_step", 10)
    return PeriodicSegment(store, key, SegmentSettings(reset=settings.pop("reset", "daily"),
                                                       **settings),
                           clock=clock, db_clock=db_clock)


@pytest.fixture
def store(sql_store):
    """This module's name for the shared ``sql_store``."""
    return sql_store


class TestPeriodRule:
    @pytest.mark.parametrize(("reset", "zone", "instant", "digits"), [
        ("daily", BERLIN, dt.datetime(2026, 11, 30, 22, 59, 59, tzinfo=dt.UTC), "20261130"),
        ("daily", BERLIN, dt.datetime(2026, 11, 30, 23, 0, 0, tzinfo=dt.UTC), "20261201"),
        ("monthly", "UTC", dt.datetime(2027, 2, 28, 23, 59, 59, tzinfo=dt.UTC), "202702"),
        ("monthly", "UTC", dt.datetime(2027, 3, 1, tzinfo=dt.UTC), "202703"),
        ("yearly", "Asia/Kolkata", dt.datetime(2026, 12, 31, 18, 29, 59, tzinfo=dt.UTC), "2026"),
        ("yearly", "Asia/Kolkata", dt.datetime(2026, 12, 31, 18, 30, tzinfo=dt.UTC), "2027"),
    ], ids=["berlin-before-midnight", "berlin-midnight", "feb-end", "march", "kolkata-year-end",
            "kolkata-new-year"])
    def test_period_of(self, reset, zone, instant, digits):
        """The period is the zone's calendar period of the instant."""
        assert PeriodRule(reset, zone).period_of(instant).digits == digits

    def test_daylight_saving_day(self):
        """The day the clocks go back in Berlin lasts 25 hours."""
        period = PeriodRule("daily", BERLIN).period_of(local(BERLIN, 2026, 10, 25, 12))
        assert period.end - period.start == dt.timedelta(hours=25)

    @pytest.mark.parametrize(("template", "words"), [
        ("{date:%Y%m}-{seq:06d}", "the same"),
        ("{date:%Y%m%d}-{seq}", "zero-padded width"),
        ("{date:%Y%m%d}-{seq:6d}", "zero-padded width"),
        ("{seq:06d}", "needs both"),
        ("{date:%Y%m%d}{seq:011d}", "too wide"),
        ("{date:%Y%m%d}-{n:06d}", "unknown field"),
    ], ids=["daily-by-month", "no-width", "space-padded", "no-date", "too-wide", "unknown"])
    def test_bad_templates(self, template, words):
        """A template that could repeat a string or widen a number is refused, naming the field."""
        with pytest.raises(FieldError) as err:
            SegmentSettings(reset="daily", template=template)
        assert err.value.field == "template" and words in err.value.message

    def test_bad_reset_and_zone(self):
        """Unknown reset or time zone names the field."""
        with pytest.raises(FieldError) as err:
            SegmentSettings(reset="weekly")
        assert err.value.field == "reset"
        with pytest.raises(FieldError) as err:
            SegmentSettings(reset="daily", time_zone="Mars/Olympus")
        assert err.value.field == "time_zone"

    def test_int_and_string_forms(self):
        """The integer form is the period's digits then the padded number."""
        fmt = PeriodFormat("INV-{date:%Y-%m-%d}/{seq:04d}", PeriodRule("daily"))
        assert fmt.compose("20261201", 42) == 202612010042
        assert fmt.encode(202612010042) == "INV-2026-12-01/0042"


class TestRollover:
    def test_midnight_in_berlin(self, store):
        """Across the database's midnight (Berlin), buffers still holding the old day's
        numbers never issue them on the new day; the new day starts at 1 in its own row."""
        clock = ManualClock()
        db = DbClock(clock, local(BERLIN, 2026, 12, 1, 23, 59, 59))
        gen = periodic(store, clock, db, time_zone=BERLIN, period_step=1000).start()
        try:
            first = [gen.next_str() for _ in range(5)]
            assert first == [f"20261201-{n:06d}" for n in range(1, 6)]
            clock.advance(0.85)
            assert gen.next_str() == "20261201-000006"   # before the margin: still the day
            clock.advance(0.1)   # 50 ms before midnight: inside the boundary margin
            after = gen.next_str()   # waits for the database's midnight, never issues day 1
            assert after == "20261202-000001"
            assert db() >= local(BERLIN, 2026, 12, 2)
            assert gen.period_key == "inv@20261202"
            assert [gen.next_id() for _ in range(3)] == [20261202000000 + n for n in (2, 3, 4)]
            rows = {i.key: i for i in store.info()}
            assert set(rows) == {"inv@20261201", "inv@20261202"}
            assert rows["inv@20261201"].description.startswith("flakekit daily period 2026-12-01")
        finally:
            gen.close()

    def test_month_end_monthly(self, store):
        """A monthly counter rolls at the end of February (database time), not before."""
        clock = ManualClock()
        db = DbClock(clock, dt.datetime(2027, 2, 28, 23, 59, 58, tzinfo=dt.UTC))
        gen = periodic(store, clock, db, reset="monthly", template="{date:%Y-%m}/{seq:05d}",
                       key="bill").start()
        try:
            assert gen.next_str() == "2027-02/00001"
            clock.advance(1.5)
            assert gen.next_str() == "2027-02/00002"
            clock.advance(0.5)
            assert gen.next_str() == "2027-03/00001"
            batch = gen.next_ids(20)   # spans two segments of 10, all of March
            assert list(batch) == [202703 * 100_000 + n for n in range(2, 22)]
        finally:
            gen.close()

    def test_two_nodes_race_at_midnight(self, db_url):
        """Two nodes (own engines) crossing midnight together: one row per period,
        created once, and not one duplicate."""
        stores = [SqlSegmentStore(create_engine(db_url)) for _ in range(2)]
        clock = ManualClock()
        db = DbClock(clock, dt.datetime(2026, 12, 31, 23, 59, 59, 500_000, tzinfo=dt.UTC))
        # a race, not a deadline: a starved thread on a busy machine waits for its segment
        gens = [periodic(s, clock, db, reset="yearly", wait_budget=60).start() for s in stores]
        seen: list[int] = []
        lock = threading.Lock()
        try:
            before = [g.next_id() for g in gens for _ in range(15)]
            clock.advance(0.6)

            def draw(i: int) -> None:
                mine = [gens[i % 2].next_id() for _ in range(40)]
                with lock:
                    seen.extend(mine)

            in_threads(draw, 4)
            assert all(v // 10**6 == 2026 for v in before)
            assert all(v // 10**6 == 2027 for v in seen)
            assert len(set(seen + before)) == len(seen) + len(before)
            assert [i.key for i in stores[0].info()] == ["inv@2026", "inv@2027"]
        finally:
            for g in gens:
                g.close()
            for s in stores:
                s.engine.dispose()

    def test_capacity_is_the_width(self, store):
        """{seq:02d} holds 99 numbers a period: the 100th is an error, never 3 digits."""
        clock = ManualClock()
        db = DbClock(clock, dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC))
        gen = periodic(store, clock, db, template="{date:%Y%m%d}-{seq:02d}").start()
        try:
            ids = [gen.next_str() for _ in range(99)]
            assert ids[-1] == "20261201-99" and len(set(ids)) == 99
            assert_issues_nothing(gen, PeriodFullError, 3, match="full")
            fetches = gen.stats().fetches
            for _ in range(50):   # callers past the end cost no fetch, and still no number
                with pytest.raises(PeriodFullError):
                    gen.next_id()
            assert gen.stats().fetches == fetches
            clock.advance(12 * 3600)   # the next day starts again
            assert gen.next_str() == "20261202-01"
        finally:
            gen.close()

    def test_database_clock_is_used(self, store):
        """Without an injected clock, the period is the database's own date."""
        gen = PeriodicSegment(store, "real", SegmentSettings(reset="daily", clock_sync=0))
        with gen:
            value = gen.next_id()
            today = store.db_now().strftime("%Y%m%d")
        assert str(value).startswith(today) or store.db_now().strftime("%H%M") == "0000"

    def test_foreign_row_refused(self, store):
        """A row of a period's name that flakekit did not create is refused, not shared."""
        from flakekit.sql.periods import ensure_period_key

        store.create("placeholder", 10)
        with store.engine.begin() as conn:   # a row someone made by hand (Leaf allows it)
            conn.execute(store._table.insert().values(biz_tag="inv@20261201", max_id=5, step=10,
                                                      description="by hand"))
        clock = ManualClock()
        gen = periodic(store, clock, DbClock(clock, dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)))
        with pytest.raises(ConfigError, match="not this counter's period row"):
            gen.start()
        assert ensure_period_key(store, "inv@20261202", 10, 1, "x") is True
        with pytest.raises(ConfigError, match="periodic counter's row"):
            store.create("orders@20261201", 10)

    def test_database_clock_back_across_a_boundary(self, store):
        """A database clock stepped back into the previous period stops the counter."""
        clock = ManualClock()
        db = DbClock(clock, dt.datetime(2026, 12, 2, 0, 0, 1, tzinfo=dt.UTC))
        gen = periodic(store, clock, db, wait_budget="50ms").start()
        try:
            assert gen.next_str() == "20261202-000001"
            db.at -= dt.timedelta(seconds=5)
            gen._cur.deadline = 0   # force a read of the clock now
            with pytest.raises(SegmentUnavailableError, match="went back"):
                gen.next_id()
        finally:
            gen.close()


class TestPrune:
    def test_prune(self, tmp_path, sqlite_url, capsys):
        """`segments prune` lists (dry run, --json) and deletes only periods long over,
        keeping the newest N; the current period and foreign rows stay."""
        store = SqlSegmentStore(create_engine(sqlite_url))
        clock = ManualClock()
        now = store.db_now()
        for days in (40, 3, 2, 0):
            gen = periodic(store, clock, DbClock(clock, now - dt.timedelta(days=days)))
            gen.start().next_id()
            gen.close()
        store.create("plain", 10)
        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(f'[backends.default]\nurl = "{sqlite_url}"\n')
        code, out, err = run_cli(capsys, "segments", "prune", "--keep", "2", "--dry-run",
                                 "--json", "-c", str(cfg))
        assert code == 0, err
        report = json.loads(out)["stores"][0]
        doomed = {r["key"] for r in report["prune"]}
        expected = {f"inv@{(now - dt.timedelta(days=d)).strftime('%Y%m%d')}" for d in (40, 3)}
        assert doomed == expected and report["deleted"] == 0 and report["periods"] == 4
        code, out, err = run_cli(capsys, "segments", "prune", "--older-than", "10d",
                                 "-c", str(cfg))
        assert code == 0 and "deleted 1" in out, err
        left = set(store.keys())
        assert "plain" in left and f"inv@{now.strftime('%Y%m%d')}" in left and len(left) == 4
        code, out, err = run_cli(capsys, "segments", "prune", "-c", str(cfg))
        assert code == 2 and "--keep" in err and "Traceback" not in err
        store.engine.dispose()


class TestConfig:
    def test_kit_builds_a_periodic_generator(self, tmp_path, sqlite_url):
        """A config with reset builds a periodic generator whose next_str is the template."""
        import flakekit

        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(
            f'[backends.default]\nurl = "{sqlite_url}"\n'
            '[generators.invoice]\nstrategy = "segment"\nreset = "daily"\n'
            'time_zone = "Asia/Tokyo"\ntemplate = "INV{date:%y%m%d}-{seq:05d}"\n'
        )
        with flakekit.load(str(cfg)) as kit:
            text = kit["invoice"].next_str()
        assert text.startswith("INV") and text.endswith("-00001") and len(text) == 15

    def test_format_refused(self, tmp_path, sqlite_url):
        """format on a periodic counter is refused (its template writes it)."""
        import flakekit

        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(f'[backends.default]\nurl = "{sqlite_url}"\n'
                       '[generators.invoice]\nstrategy = "segment"\nreset = "daily"\n'
                       'format = "base62"\n')
        with pytest.raises(ConfigError, match="generators.invoice.format"):
            flakekit.load(str(cfg))


class TestStrict:
    def test_owner_serves_each_period_under_its_claim(self, db_url):
        """order = "strict": the key's owner serves its period rows, every fetch fenced by
        the claim on the base key; other nodes refuse; a deposed claim moves nothing."""
        from flakekit.cluster.node import ClusterNode
        from flakekit.cluster.settings import ClusterSettings
        from flakekit.cluster.store_contracts import KeyClaim
        from flakekit.errors import FenceError, NotOwnerError
        from flakekit.sql import schema
        from flakekit.testing.memory_cluster import MemoryClusterStore

        engine = create_engine(db_url)
        schema.upgrade_schema(engine, "cluster")
        store = SqlSegmentStore(engine)
        clock = ManualClock()
        members = MemoryClusterStore(clock)
        # the property is the fence on each period's row, not how fast a fetch answers:
        # a budget a loaded CI lane cannot run out of (200 ms did, in a fresh-clone run)
        settings = SegmentSettings(reset="daily", clock_sync=0, period_step=10,
                                   wait_budget="30s")
        nodes = {}
        try:
            for name in "ab":
                node = ClusterNode(ClusterSettings("c", name, f"http://{name}:8080", lease=3.0,
                                                   debounce=0.5),
                                   members.membership(name), clock, threads=False)
                node.add_strict("inv", store, settings)
                nodes[name] = node.start()
            for _ in range(4):
                clock.advance(0.6)
                for node in nodes.values():
                    node.upkeep()
            owner = nodes[nodes["a"].owner("inv").node]
            other = next(n for n in nodes.values() if n is not owner)
            day = store.db_now().strftime("%Y%m%d")
            values = [owner.next_id("inv")[0] for _ in range(25)]   # three fenced fetches
            assert values == sorted(set(values))
            assert (all(str(v).startswith(day) for v in values)
                    or store.db_now().strftime("%H%M") == "0000")
            with pytest.raises(NotOwnerError):
                other.next_id("inv")
            row = f"inv@{str(values[0])[:8]}"
            for node in nodes.values():   # no background prefetch moves max_id from here on
                node.close()
            before = store.info(row)[0].max_id
            with pytest.raises(FenceError):
                store.fetch(row, claim=KeyClaim("inv", other.member.node, 10**6))
            with pytest.raises(ValueError, match="claim is for key"):
                store.fetch(row, claim=KeyClaim("other", owner.member.node, 1))
            assert store.info(row)[0].max_id == before
        finally:
            for node in nodes.values():
                node.close()
            engine.dispose()


class TestMidnightDrill:
    @pytest.mark.slow
    def test_rollover_in_real_time_on_default_settings(self, store):
        """Default settings, real time, the real database's clock shifted to 2 s before
        midnight in New York: four threads draw across it; every ID's period contains the
        moment it was issued (between the database-clock reads around the call), the
        background sync rolls the day, and nothing repeats."""
        zone = "America/New_York"
        real = store.db_now()
        offset = local(zone, 2026, 12, 1, 23, 59, 58) - real   # 2 s: room for a loaded host
        db_clock = lambda: store.db_now() + offset   # noqa: E731 - the database, shifted
        rule = PeriodRule("daily", zone)
        gen = PeriodicSegment(store, "drill", SegmentSettings(reset="daily", time_zone=zone),
                              db_clock=db_clock).start()
        stop = local(zone, 2026, 12, 2, 0, 0, 0, 300_000)
        results: list[tuple[dt.datetime, int, dt.datetime]] = []
        lock = threading.Lock()

        def draw(i: int) -> None:
            mine = []
            while True:
                before = db_clock()
                value = gen.next_id()
                after = db_clock()
                mine.append((before, value, after))
                if before > stop:
                    break
            with lock:
                results.extend(mine)

        try:
            in_threads(draw, 4)
        finally:
            gen.close()
        values = [v for _, v, _ in results]
        assert len(values) == len(set(values))
        days = set()
        for before, value, after in results:
            period = rule.period_starting(rule.day_of_digits(str(value // 10**6)))
            days.add(period.digits)
            assert before < period.end and after >= period.start, (before, value, after)
        assert days == {"20261201", "20261202"}
        assert gen.rolled == 1


class TestCli:
    def test_next_prints_the_template_and_check_names_the_field(self, tmp_path, capsys):
        """`flakekit next` prints the template's strings (-f decimal the integers); a bad
        template fails `config check` in one line naming its dotted path (exit 2)."""
        cfg = tmp_path / "flakekit.toml"
        cfg.write_text(f'[backends.default]\nurl = "sqlite:///{tmp_path / "ids.db"}"\n'
                       '[generators.inv]\nstrategy = "segment"\nreset = "monthly"\n'
                       'time_zone = "Pacific/Auckland"\n')
        code, out, err = run_cli(capsys, "next", "inv", "-n", "2", "-c", str(cfg))
        assert code == 0, err
        first, second = out.split()
        assert first[:6].isdigit() and first[6:] == "-000001" and second.endswith("-000002")
        code, out, err = run_cli(capsys, "next", "inv", "-f", "decimal", "-c", str(cfg))
        assert code == 0 and out.strip() == first[:6] + "000003", err
        cfg.write_text(cfg.read_text() + 'template = "{date:%Y}-{seq:06d}"\n')
        code, out, err = run_cli(capsys, "config", "check", str(cfg))
        assert code == 2 and "generators.inv.template:" in err and "Traceback" not in err

    def test_a_service_never_serves_a_period_row(self, store):
        """A table served with keys = "all" refuses a period row by name: only its periodic
        generator knows when the period ends."""
        from flakekit.errors import UnknownKeyError
        from flakekit.generators.segment_service import SegmentService

        clock = ManualClock()
        gen = periodic(store, clock, DbClock(clock, dt.datetime(2026, 12, 1, tzinfo=dt.UTC)))
        gen.start().close()
        with SegmentService(store) as service, pytest.raises(UnknownKeyError, match="period row"):
            service.get("inv@20261201")


class TestAsyncio:
    def test_loop_never_waits_at_the_boundary(self, store):
        """flakekit.aio: from memory on the loop; at the boundary the non-blocking path
        gives nothing and next_id runs in a thread, still never an old day's number."""
        import asyncio

        from flakekit.aio import wrap

        clock = ManualClock()
        db = DbClock(clock, dt.datetime(2026, 12, 1, 23, 59, 59, tzinfo=dt.UTC))
        gen = periodic(store, clock, db).start()
        try:
            ids = wrap(gen)
            assert gen.try_next_id() == 20261201000001
            assert asyncio.run(ids.anext_str()) == "20261201-000002"
            assert list(asyncio.run(ids.anext_ids(2))) == [20261201000003, 20261201000004]
            clock.advance(0.95)   # inside the margin: nothing from memory
            assert gen.try_next_id() is None and gen.try_next_ids(1) is None
            assert asyncio.run(ids.anext_str()) == "20261202-000001"
        finally:
            gen.close()
