"""flakekit.sqlalchemy.default (issue 14, item 7): a primary-key column default that draws
from a flakekit generator, on real PostgreSQL, MariaDB and SQLite, single inserts and
executemany alike."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

import flakekit
import flakekit.sqlalchemy
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing.cli import write_toml


def _config(tmp_path, url: str) -> str:
    return str(write_toml(tmp_path, f"""\
        default = "orders"
        [backends.main]
        url = "{url}"
        [generators.orders]
        strategy = "segment"
        store = {{type = "sql", backend = "main"}}
        [generators.events]
        strategy = "snowflake"
        allocator = {{type = "static", worker_id = 5}}
        """))


def _insert_rows(engine: sa.Engine, column_default) -> list[int]:
    meta = sa.MetaData()
    orders = sa.Table(
        "orders", meta,
        sa.Column("id", sa.BigInteger, primary_key=True, default=column_default),
        sa.Column("note", sa.String(20)),
    )
    meta.create_all(engine)
    with engine.begin() as conn:
        first = conn.execute(orders.insert().values(note="one")).inserted_primary_key[0]
        conn.execute(orders.insert(), [{"note": f"many {i}"} for i in range(50)])
        conn.execute(orders.insert().values(note="last"))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(orders.c.id, orders.c.note).order_by(orders.c.id)).all()
    assert rows[0] == (first, "one") and rows[-1][1] == "last"
    notes = [note for _, note in rows]
    assert notes[1:-1] == [f"many {i}" for i in range(50)]  # id order is insert order
    return [row_id for row_id, _ in rows]


@pytest.mark.parametrize("url_fixture", [
    pytest.param("pg_url", marks=pytest.mark.postgresql),
    pytest.param("mariadb_url", marks=pytest.mark.mariadb),
    "sqlite_url",
])
def test_segment_ids_as_column_default(url_fixture, request, tmp_path):
    url = request.getfixturevalue(url_fixture)
    # SQLite allows one writer per file: an insert's open transaction would block the
    # segment fetch on the same file (docs/recipes.md), so there the IDs get their own file
    ids_url = f"sqlite:///{tmp_path / 'ids.db'}" if url_fixture == "sqlite_url" else url
    engine, ids_engine = sa.create_engine(url), sa.create_engine(ids_url)
    # a small step, so the inserts span segments; a start no auto-increment would pick
    SqlSegmentStore(ids_engine).create("orders", 20, start=5000)
    kit = flakekit.load(_config(tmp_path, ids_url))
    try:
        ids = _insert_rows(engine, flakekit.sqlalchemy.default("orders", kit=kit))
    finally:
        kit.close()
        engine.dispose()
        ids_engine.dispose()
    assert len(ids) == 52 == len(set(ids))
    assert ids == list(range(5000, 5052))  # the segment's dense IDs, none from the database


def test_lazy_kit_and_snowflake_generator(sqlite_url, tmp_path, monkeypatch):
    """With no kit, one is built on first insert from the config lookup (here
    $FLAKEKIT_CONFIG), once per process."""
    monkeypatch.setenv("FLAKEKIT_CONFIG", _config(tmp_path, sqlite_url))
    engine = sa.create_engine(sqlite_url)
    try:
        ids = _insert_rows(engine, flakekit.sqlalchemy.default("events"))
        kit = flakekit.sqlalchemy._kits[(os.getpid(), None)]
        again = flakekit.sqlalchemy.default("events")()
    finally:
        flakekit.sqlalchemy._kits.pop((os.getpid(), None)).close()
        engine.dispose()
    assert len(ids) == 52 == len(set(ids)) and ids == sorted(ids)
    assert again > ids[-1]
    assert flakekit.layout("snowflake").decompose(ids[0])["worker"] == 5
    assert kit is not None


def test_generator_object_and_bad_argument(sqlite_url):
    gen = flakekit.snowflake(worker_id=9)
    engine = sa.create_engine(sqlite_url)
    try:
        ids = _insert_rows(engine, flakekit.sqlalchemy.default(gen))
    finally:
        gen.close()
        engine.dispose()
    assert len(set(ids)) == 52 and ids == sorted(ids)
    with pytest.raises(TypeError, match="generator name or a generator"):
        flakekit.sqlalchemy.default(42)


def test_reachable_from_import_flakekit_alone():
    """``flakekit.sqlalchemy.default(...)`` as the issue spells it, after ``import flakekit``."""
    import subprocess
    import sys

    code = "import flakekit; print(callable(flakekit.sqlalchemy.default('orders')), " \
           "callable(flakekit.aio.wrap))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
