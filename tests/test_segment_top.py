"""Segments near the top of the BIGINT range and bad ``leaf_alloc`` rows (issue 9, item 3).

On SQLite an overflowing ``max_id + step`` became a REAL that ``int()`` accepted: a key
created with ``--start 9223372036854774308 --step 1000`` issued 500 IDs twice and 1,000
above 2**63-1. Every test here runs on PostgreSQL, MariaDB and SQLite with the default
generator settings.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, text

from flakekit.errors import ConfigError, SegmentRowError
from flakekit.generators.segment import SegmentGenerator
from flakekit.sql.leaf import MAX_ID, SqlSegmentStore
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok, write_segment_toml

ISSUE_START = 9223372036854774308  # from the report: 1,499 IDs below the column's maximum


@pytest.fixture
def store(sql_store):
    """This module's name for the shared ``sql_store``."""
    return sql_store


def row(store: SqlSegmentStore, key: str) -> tuple:
    with store.engine.connect() as conn:
        return tuple(conn.execute(
            text("SELECT max_id, step FROM leaf_alloc WHERE biz_tag = :k"), {"k": key}
        ).one())


def execute(store: SqlSegmentStore, sql: str, **params) -> None:
    with store.engine.begin() as conn:
        conn.execute(text(sql), params)


def make_column_real(store: SqlSegmentStore, column: str) -> None:
    """Let ``column`` hold non-integers, as a hand-edited or foreign table may
    (SQLite stores whatever it is given; the servers need the column type changed)."""
    dialect = store.engine.dialect.name
    if dialect == "postgresql":
        execute(store, f"ALTER TABLE leaf_alloc ALTER COLUMN {column} TYPE double precision")
    elif dialect in ("mysql", "mariadb"):
        execute(store, f"ALTER TABLE leaf_alloc MODIFY {column} DOUBLE NOT NULL")
    store._checked = False


def drain(gen: SegmentGenerator, limit: int) -> tuple[list[int], BaseException | None]:
    """Every ID the generator gives until it raises (at most ``limit``)."""
    ids: list[int] = []
    while len(ids) < limit:
        try:
            ids.append(gen.next_id())
        except Exception as exc:  # noqa: BLE001 - the test checks which one
            return ids, exc
    return ids, None


class TestNearTheTop:
    def test_store_refuses_a_fetch_past_the_column_before_any_update(self, store):
        store.create("k", 1000, start=ISSUE_START)
        first = store.fetch("k")
        assert (first.start, first.max_id) == (ISSUE_START, ISSUE_START + 1000)
        for step in (None, 2000, 500):
            with pytest.raises(SegmentRowError, match=r"used up.*only 499 IDs left") as caught:
                store.fetch("k", step)
            assert caught.value.room == 499 and "\n" not in str(caught.value)
            assert row(store, "k") == (ISSUE_START + 1000, 1000)  # nothing moved
        last = store.fetch("k", 499)
        assert last.max_id == MAX_ID
        with pytest.raises(SegmentRowError,
                           match=r"used up: max_id is 9223372036854775807") as caught:
            store.fetch("k", 1)
        assert caught.value.room == 0
        assert row(store, "k") == (MAX_ID, 1000)

    @pytest.mark.parametrize("room", [1499, 2500])
    def test_generator_hands_out_the_rest_once_then_fails_cleanly(self, store, room):
        """1499: the table's step no longer fits; 2500: the doubled (dynamic) step 2000
        does not fit after two fetches of 1000. Either way the last IDs are used once."""
        start = MAX_ID - room
        store.create("k", 1000, start=start)
        gen = SegmentGenerator(store, "k").start()
        try:
            ids, error = drain(gen, room + 5000)
        finally:
            gen.close()
        assert ids == list(range(start, MAX_ID))  # each once, in order, none past the top
        assert isinstance(error, SegmentRowError) and "used up" in str(error)
        assert row(store, "k")[0] == MAX_ID

    def test_cli_next_on_the_reported_key(self, store, db_url, tmp_path, capsys):
        """The report's commands: IDs from consecutive runs never repeat, never pass the
        top, and the run that cannot be served says so in one line (exit 1)."""
        config = write_segment_toml(tmp_path, db_url, "k")
        code, _, err = run(capsys, "segments", "create", "k", "--step", "1000",
                           "--start", str(ISSUE_START), "-c", str(config))
        assert code == 0, err
        printed: list[int] = []
        failures = []
        for _ in range(4):
            code, out, err = run(capsys, "next", "k", "-n", "600", "-c", str(config))
            if code == 0:
                printed += [int(line) for line in out.split()]
            else:
                failures.append((code, err))
        assert len(printed) == len(set(printed)) >= 1200
        assert ISSUE_START <= min(printed) and max(printed) < MAX_ID
        assert failures, "1,499 IDs cannot serve four runs of 600"
        for code, err in failures:
            assert code == 1 and err.count("\n") == 1 and "used up" in err, err
            assert "Traceback" not in err and "OverflowError" not in err


def refused_both_ways(store, key: str, match: str) -> None:
    """The row of ``key`` is refused (``match``) with its own step and with a dynamic one."""
    for step in (None, 100):
        with pytest.raises(SegmentRowError, match=match):
            store.fetch(key, step)


class TestBadRows:
    def test_negative_max_id_is_refused(self, store):
        store.create("k", 1000)
        execute(store, "UPDATE leaf_alloc SET max_id = -5000 WHERE biz_tag = 'k'")
        with pytest.raises(SegmentRowError, match=r"max_id -5000 is negative.*Fix: UPDATE"):
            store.fetch("k")
        with pytest.raises(SegmentRowError, match=r"negative"):
            store.fetch("k", 10)
        assert row(store, "k") == (-5000, 1000)

    @pytest.mark.parametrize(("column", "value"), [("max_id", 10.5), ("step", 2.5)])
    def test_non_integer_values_are_refused_not_coerced(self, store, column, value):
        store.create("k", 1000, start=10)
        make_column_real(store, column)
        execute(store, f"UPDATE leaf_alloc SET {column} = :v WHERE biz_tag = 'k'", v=value)
        before = row(store, "k")
        refused_both_ways(store, "k", rf"{column} {value} is not an integer")
        assert row(store, "k") == before  # rolled back

    def test_text_in_an_integer_column_is_refused(self, sqlite_url):
        """SQLite keeps text it cannot convert, even in an INTEGER column (the servers'
        BIGINT cannot hold text)."""
        store = SqlSegmentStore(create_engine(sqlite_url))
        store.create("k", 1000)
        execute(store, "UPDATE leaf_alloc SET max_id = '12abc' WHERE biz_tag = 'k'")
        refused_both_ways(store, "k", r"max_id '12abc' is not an integer")
        assert row(store, "k") == ("12abc", 1000)
        store.create("s", 1000, start=5)
        execute(store, "UPDATE leaf_alloc SET step = 'lots' WHERE biz_tag = 's'")
        refused_both_ways(store, "s", r"step 'lots' is not an integer")
        assert row(store, "s") == (5, "lots")

    def test_segments_lists_a_table_with_one_bad_row_and_flags_it(self, store, db_url, tmp_path,
                                                                  capsys):
        store.create("good", 1000)
        store.create("bad", 1000)
        store.create("full", 1000, start=MAX_ID - 1000)
        store.fetch("full")
        execute(store, "UPDATE leaf_alloc SET max_id = -7 WHERE biz_tag = 'bad'")
        if store.engine.dialect.name == "sqlite":  # the servers' BIGINT cannot hold text
            store.create("text", 1000)
            execute(store, "UPDATE leaf_alloc SET max_id = '12abc' WHERE biz_tag = 'text'")
        config = tmp_path / "flakekit.toml"
        config.write_text(f'[backends.default]\nurl = "{db_url}"\n')
        out = run_ok(capsys, "segments", "-c", str(config))
        lines = out.splitlines()
        assert any(line.split()[:1] == ["good"] for line in lines)
        flagged = [line for line in lines if "cannot serve" in line]
        assert len(flagged) == (3 if "text" in out else 2), out
        assert any("bad" in line and "max_id -7 is negative" in line for line in flagged)
        assert any("full" in line and "used up" in line for line in flagged)
        assert "text" not in out or any("'12abc' is not an integer" in f for f in flagged)
        out = run_ok(capsys, "segments", "--json", "-c", str(config))
        keys = {k["key"]: k for k in json.loads(out)["stores"][0]["keys"]}
        assert keys["good"]["problem"] is None
        assert "negative" in keys["bad"]["problem"] and keys["bad"]["max_id"] == -7
        assert "used up" in keys["full"]["problem"]

    def test_keys_follow_the_servers_rule(self, store, db_url, tmp_path, capsys):
        """`segments create 'bad key'` is refused (exit 2, the rule named, no row) as the
        server would refuse its URL; a row written behind flakekit's back with such a key
        is listed, flagged, and not served."""
        config = tmp_path / "flakekit.toml"
        config.write_text(f'[backends.default]\nurl = "{db_url}"\n')
        code, out, err = run(capsys, "segments", "create", "bad key", "--step", "10", "-c",
                             str(config))
        assert code == 2 and "'bad key' is not a valid segment key: use 1 to 128 of" in err
        assert not store.has_table() or not store.exists("bad key")
        code, _, err = run(capsys, "segments", "create", "good.key:1", "--step", "10", "-c",
                           str(config))
        assert code == 0, err
        execute(store, "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) "
                       "VALUES ('.hidden', 1, 10, '')")
        code, out, err = run(capsys, "segments", "--json", "-c", str(config))
        keys = {k["key"]: k for k in json.loads(out)["stores"][0]["keys"]}
        assert keys["good.key:1"]["problem"] is None
        assert "not a valid segment key" in keys[".hidden"]["problem"]
        code, out, _ = run(capsys, "segments", "-c", str(config))
        assert "! .hidden: cannot serve a segment: '.hidden' is not a valid segment key" in out


class TestCreate:
    def test_start_no_fetch_could_serve_is_refused(self, store):
        with pytest.raises(ConfigError, match=r"^start: .*from 0 to 9223372036854774807"):
            store.create("k", 1000, start=MAX_ID - 999)
        assert not store.has_table() or not store.exists("k")
        info = store.create("k", 1000, start=MAX_ID - 1000)
        assert store.fetch("k").max_id == MAX_ID and info.problem is None

    def test_cli_create_says_which_field(self, db_url, tmp_path, capsys):
        config = tmp_path / "flakekit.toml"
        config.write_text(f'[backends.default]\nurl = "{db_url}"\n')
        code, _, err = run(capsys, "segments", "create", "k", "--step", "1000",
                           "--start", str(MAX_ID - 10), "-c", str(config))
        assert code == 2 and err.startswith("error: start: ") and err.count("\n") == 1


