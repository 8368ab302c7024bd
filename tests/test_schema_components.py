"""Schema components and migrations (issue 11 item 6), on PostgreSQL, MariaDB and SQLite.

``workers`` (system_nodes) is at version 2 (index system_nodes_service_seen); a database
made by the version-1 code upgrades with ``flakekit db upgrade`` and keeps its rows;
``segments`` is Leaf's ``leaf_alloc`` and a Leaf database is never altered; a newer
database is refused; two upgrades at once run one after the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    inspect,
    select,
    text,
)

from flakekit.errors import SchemaError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql import schema
from flakekit.sql.leaf import LEAF_MYSQL_DDL, leaf_alloc_table
from flakekit.sql.schema import Component, Migration
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok
from flakekit.values.clock import SystemClock

ROOT = Path(__file__).resolve().parent.parent


# -- the version-1 DDL, as flakekit before versions 2 existed created it ----------------------
def _v1_tables() -> tuple[Table, Table]:
    """Version 2 added only the index ``system_nodes_service_seen``: version 1 is today's
    two tables without it (spell version 1 out here when a later version changes them)."""
    md = MetaData()
    version_table = schema.schema_table.to_metadata(md)
    nodes = schema.system_nodes.to_metadata(md)
    nodes.indexes.clear()
    return version_table, nodes


def make_v1(url: str) -> list[tuple]:
    """A database as the version-1 code left it: tables, its version row, an acquire lock
    row and two leases. Returns the system_nodes rows."""
    version_table, nodes = _v1_tables()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            version_table.metadata.create_all(conn)
            conn.execute(version_table.insert(), [{"component": "workers", "version": 1},
                                                  {"component": "workers:orders", "version": 0}])
            conn.execute(nodes.insert(), [
                {"service": "orders", "machine_id": i, "host": f"10.0.0.{i + 1}", "port": 80,
                 "version": 3 + i, "holder": f"tok{i}", "issued_until": 1000 + i}
                for i in range(2)])
        return _rows(engine)
    finally:
        engine.dispose()


def _rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            text("SELECT service, machine_id, host, port, slot, version, holder, "
                 "issued_until FROM system_nodes ORDER BY machine_id"))]


def versions(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        if not inspect(engine).has_table("flakekit_schema"):
            return {}
        with engine.connect() as conn:
            return dict(conn.execute(text("SELECT component, version FROM flakekit_schema")).all())
    finally:
        engine.dispose()


def index_names(url: str, table: str = "system_nodes") -> set[str]:
    engine = create_engine(url)
    try:
        return {ix["name"] for ix in inspect(engine).get_indexes(table)}
    finally:
        engine.dispose()




def config(tmp_path: Path, url: str, workers: bool = True, segments: bool = True) -> str:
    body = f'[backends.main]\nurl = "{url}"\n'
    if workers:
        body += ('\n[generators.orders]\nallocator = { type = "sql", backend = "main", '
                 'service = "orders" }\n')
    if segments:
        body += ('\n[generators.invoice]\nstrategy = "segment"\n'
                 'store = { type = "sql", backend = "main" }\n')
    path = tmp_path / "flakekit.toml"
    path.write_text(body)
    return str(path)


def db(capsys, command: str, cfg: str) -> str:
    """``flakekit db COMMAND -c CFG``, which must succeed; what it printed."""
    return run_ok(capsys, "db", command, "-c", cfg)


def config_after(capsys, tmp_path: Path, url: str, command: str) -> str:
    """:func:`config` on ``url`` (both components), once ``flakekit db COMMAND`` on it
    succeeded."""
    cfg = config(tmp_path, url)
    db(capsys, command, cfg)
    return cfg


def allocator(url: str, create_schema: bool = False):
    engine = create_engine(url)
    return engine, SqlWorkerAllocator(engine=engine, service="orders", clock=SystemClock(),
                                      host="10.0.0.9", port=80, create_schema=create_schema)


# -- workers ----------------------------------------------------------------------------------
class TestWorkers:
    def test_fresh_init_is_the_latest_version(self, capsys, tmp_path, db_url):
        """`db init` on an empty database creates system_nodes at version 2 (with its
        index) and Leaf's leaf_alloc; `db upgrade` right after has nothing to do."""
        cfg = config(tmp_path, db_url)
        out = db(capsys, "init", cfg)
        assert "workers schema ready (version 2; created system_nodes)" in out
        assert "segments schema ready (version 1; created leaf_alloc)" in out
        assert versions(db_url) == {"workers": schema.WORKERS_SCHEMA_VERSION} == {"workers": 2}
        assert "system_nodes_service_seen" in index_names(db_url)
        out = db(capsys, "upgrade", cfg)
        assert "workers schema up to date (version 2; system_nodes)" in out
        assert "segments schema up to date (version 1; leaf_alloc)" in out

    def test_v1_database_refuses_start_then_upgrades_keeping_its_rows(
            self, capsys, tmp_path, db_url):
        """A database of the version-1 code: start-up says to run `db upgrade`; `db init`
        leaves it alone and says the same; `db upgrade` adds the index, records 2 and
        keeps every row (and the acquire lock row); then acquire works."""
        before = make_v1(db_url)
        engine, alloc = allocator(db_url)
        try:
            with pytest.raises(SchemaError) as info:
                alloc.acquire(LeaseRequest(generator="orders", max_worker_id=1023, host="10.0.0.9",
                                           port=80))
            assert "workers schema" in str(info.value) and "version 1" in str(info.value)
            assert "run `flakekit db upgrade -c CONFIG`" in str(info.value)

            cfg = config(tmp_path, db_url, segments=False)
            out = db(capsys, "init", cfg)
            assert (f"workers schema is version 1, this flakekit uses 2: run `flakekit db "
                    f"upgrade -c {cfg}`") in out
            assert versions(db_url)["workers"] == 1
            assert "system_nodes_service_seen" not in index_names(db_url)

            out = db(capsys, "upgrade", cfg)
            assert ("workers schema upgraded from version 1 to 2: index "
                    "system_nodes_service_seen (service, last_seen)") in out
            assert versions(db_url) == {"workers": 2, "workers:orders": 0}
            assert "system_nodes_service_seen" in index_names(db_url)
            assert _rows(engine) == before

            lease = alloc.acquire(LeaseRequest(generator="orders", max_worker_id=1023,
                                               host="10.0.0.9", port=80))
            assert lease.worker_id == 2  # 0 and 1 are held by the v1 leases
            alloc.release(lease, 0)
        finally:
            engine.dispose()

    def test_upgrade_twice_changes_nothing(self, capsys, tmp_path, db_url):
        """The second `db upgrade` prints "up to date" and leaves versions, indexes and
        rows exactly as the first left them."""
        make_v1(db_url)
        cfg = config_after(capsys, tmp_path, db_url, "upgrade")
        engine = create_engine(db_url)
        try:
            state = (versions(db_url), index_names(db_url), _rows(engine))
            out = db(capsys, "upgrade", cfg)
            assert out.count("up to date") == 2 and "upgraded" not in out, out
            assert (versions(db_url), index_names(db_url), _rows(engine)) == state
        finally:
            engine.dispose()

    def test_embedded_default_upgrades_at_start(self, db_url):
        """create_schema = true (the SQLite default) upgrades an older schema at start-up
        instead of refusing, so the embedded registry survives a flakekit upgrade."""
        before = make_v1(db_url)
        engine, alloc = allocator(db_url, create_schema=True)
        try:
            lease = alloc.acquire(LeaseRequest(generator="orders", max_worker_id=1023,
                                               host="10.0.0.9", port=80))
            assert versions(db_url)["workers"] == 2
            assert _rows(engine)[:2] == before
            alloc.release(lease, 0)
        finally:
            engine.dispose()

    @pytest.mark.parametrize("component", ["workers", "segments"])
    def test_newer_database_is_one_clear_line(self, capsys, tmp_path, db_url, component):
        """A version this code does not know: `db init`, `db upgrade` and start-up all fail
        with one line naming the component, the database's version and the code's."""
        cfg = config_after(capsys, tmp_path, db_url, "init")
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:
                schema.schema_table.create(conn, checkfirst=True)
                if component == "segments":
                    conn.execute(schema.schema_table.insert().values(component="segments",
                                                                    version=7))
                else:
                    conn.execute(text("UPDATE flakekit_schema SET version = 7 "
                                      "WHERE component = 'workers'"))
            state = (versions(db_url), index_names(db_url))
            code_ = {"workers": 2, "segments": 1}[component]
            for command in ("init", "upgrade"):
                code, out, err = run(capsys, "db", command, "-c", cfg)
                assert code == 1, (out, err)
                assert err.count("\n") == 1 and "Traceback" not in err, err
                assert f"the {component} schema in " in err
                assert "is version 7, newer than this flakekit" in err
                assert f"(version {code_})" in err
            assert (versions(db_url), index_names(db_url)) == state
            code, out, err = run(capsys, "next", "orders" if component == "workers" else
                                 "invoice", "-c", cfg)
            assert code != 0 and f"the {component} schema" in err and "version 7" in err, err
        finally:
            engine.dispose()


# -- segments (Leaf's table) --------------------------------------------------------------------
class TestSegments:
    def test_a_leaf_database_is_version_1_and_never_altered(self, capsys, tmp_path, db_url):
        """Only Leaf's leaf_alloc (its own DDL on MariaDB) and no flakekit_schema: `db init`
        and `db upgrade` report segments version 1 and write nothing -- no flakekit_schema
        table, the same DDL, the same rows."""
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "mysql":
                    conn.execute(text(LEAF_MYSQL_DDL.format(table="leaf_alloc")))
                else:
                    table = leaf_alloc_table()
                    table.create(conn)
                conn.execute(text("INSERT INTO leaf_alloc (biz_tag, max_id, step, description) "
                                  "VALUES ('leaf-tag', 5001, 1000, 'from Leaf')"))

            def snapshot():
                with engine.connect() as conn:
                    rows = conn.execute(text("SELECT biz_tag, max_id, step, description, "
                                             "update_time FROM leaf_alloc")).all()
                    ddl = (conn.execute(text("SHOW CREATE TABLE leaf_alloc")).one()[1]
                           if engine.dialect.name == "mysql" else
                           json.dumps(inspect(engine).get_columns("leaf_alloc"), default=str))
                return rows, ddl, set(inspect(engine).get_table_names())

            before = snapshot()
            cfg = config(tmp_path, db_url, workers=False)
            for command in ("init", "upgrade", "upgrade"):
                out = db(capsys, command, cfg)
                assert "segments schema up to date (version 1; leaf_alloc)" in out, out
            assert snapshot() == before
            assert before[2] == {"leaf_alloc"}
            code, out, err = run(capsys, "next", "invoice", "-c", cfg)
            assert code == 2 and "segments create invoice" in err  # served, just no such key
        finally:
            engine.dispose()


# -- the machinery, with a test-only component of two migrations ----------------------------
def _log_table(md: MetaData) -> Table:
    return Table("fk_test_log", md, Column("step", String(32), primary_key=True))


_SLOW_COMPONENT = """
import sys, time
from pathlib import Path
from sqlalchemy import Column, MetaData, String, Table, create_engine, text
from flakekit.sql import schema

md = MetaData()
log = Table("fk_test_log", md, Column("step", String(32), primary_key=True))

def step(name):
    def run(conn):
        time.sleep(0.5)  # long enough for the other process to arrive meanwhile
        conn.execute(log.insert().values(step=name))
    return run

comp = schema.Component(name="test-log", version=3, tables=(log,), unrecorded=1,
    migrations=(schema.Migration(2, 3, {"*": (step("2-3"),)}, "second"),
                schema.Migration(1, 2, {"*": (step("1-2"),)}, "first")))
url, me, other = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
engine = create_engine(url)
me.touch()
deadline = time.monotonic() + 60
while not other.exists() and time.monotonic() < deadline:  # start together
    time.sleep(0.01)
print(schema.upgrade_schema(engine, comp).describe())
engine.dispose()
"""


class TestMachinery:
    def test_migrations_run_in_order_from_the_recorded_version(self, db_url):
        """A component registered by the test, migrations given out of order: from
        version 1 both run, 1->2 first; from 2 only the second; the version follows."""
        ran: list[str] = []
        md = MetaData()
        log = _log_table(md)

        def step(name):
            def apply(conn):
                ran.append(name)
                conn.execute(log.insert().values(step=name))
            return apply

        comp = schema.register_component(Component(
            name="test-two", version=3, tables=(log,), unrecorded=1,
            migrations=(Migration(2, 3, {"*": (step("2-3"),)}, "second"),
                        Migration(1, 2, {"sqlite": (step("1-2"),), "postgresql": (step("1-2"),),
                                         "mysql": (step("1-2"),)}, "first"))))
        engine = create_engine(db_url)
        try:
            assert schema.get_component("test-two") is comp
            with engine.begin() as conn:
                log.create(conn)  # tables from before versions: version 1 (unrecorded)
            with pytest.raises(SchemaError, match="version 1, this flakekit needs 3"):
                schema.check_schema(engine, "test-two")
            change = schema.upgrade_schema(engine, "test-two")
            assert (change.before, change.after, ran) == (1, 3, ["1-2", "2-3"])
            assert versions(db_url)["test-two"] == 3
            with engine.begin() as conn:
                conn.execute(text("UPDATE flakekit_schema SET version = 2 "
                                  "WHERE component = 'test-two'"))
                conn.execute(text("DELETE FROM fk_test_log WHERE step = '2-3'"))
            assert schema.upgrade_schema(engine, "test-two").applied == (comp.migrations[1],)
            assert ran == ["1-2", "2-3", "2-3"]
            assert schema.upgrade_schema(engine, "test-two").changed is False
            schema.check_schema(engine, "test-two")
        finally:
            schema.unregister_component("test-two")
            engine.dispose()

    def test_two_upgrades_at_once_apply_each_migration_once(self, tmp_path, db_url):
        """Two processes upgrade the same database at the same moment; the schema lock
        makes one wait, so each (slow) migration step ran exactly once and the version
        is 3. Without the lock both see version 1 and apply the steps twice."""
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:
                _log_table(MetaData()).create(conn)
        finally:
            engine.dispose()
        script = tmp_path / "upgrade.py"
        script.write_text(_SLOW_COMPONENT)
        a, b = tmp_path / "a", tmp_path / "b"
        procs = [subprocess.Popen([sys.executable, str(script), db_url, str(me), str(other)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for me, other in ((a, b), (b, a))]
        results = [p.communicate(timeout=120) for p in procs]
        for proc, (_out, err) in zip(procs, results, strict=True):
            assert proc.returncode == 0, err
        outs = sorted(out.strip() for out, _ in results)
        assert outs == ["test-log schema up to date (version 3; fk_test_log)",
                        "test-log schema upgraded from version 1 to 3: first; second "
                        "(fk_test_log)"], outs
        assert versions(db_url)["test-log"] == 3
        engine = create_engine(db_url)
        try:
            with engine.connect() as conn:
                steps = sorted(conn.execute(select(_log_table(MetaData()).c.step)).scalars())
        finally:
            engine.dispose()
        assert steps == ["1-2", "2-3"]

    def test_two_cli_upgrades_of_a_v1_database(self, tmp_path, db_url):
        """`flakekit db upgrade` from two processes at once on a version-1 database: both
        exit 0, the rows survive, the version is 2."""
        before = make_v1(db_url)
        cfg = config(tmp_path, db_url)
        exe = str(Path(sys.executable).with_name("flakekit"))
        procs = [subprocess.Popen([exe, "db", "upgrade", "-c", cfg], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], results
        joined = "".join(out for out, _ in results)
        assert joined.count("workers schema upgraded from version 1 to 2") == 1, joined
        assert versions(db_url)["workers"] == 2
        engine = create_engine(db_url)
        try:
            assert _rows(engine) == before
        finally:
            engine.dispose()

    def test_a_broken_migration_chain_is_refused_when_declared(self):
        t = Table("t", MetaData(), Column("a", Integer))
        with pytest.raises(ValueError, match="follow each other"):
            Component(name="x", version=3, tables=(t,),
                      migrations=(Migration(1, 2, {"*": ()}), Migration(3, 4, {"*": ()})))
        with pytest.raises(ValueError, match="end at version 2"):
            Component(name="x", version=3, tables=(t,), migrations=(Migration(1, 2, {"*": ()}),))
        with pytest.raises(SchemaError, match="no steps for sqlite"):
            Migration(1, 2, {"postgresql": ("SELECT 1",)}).steps_for("sqlite")

    def test_plugins_register_components_through_flakekit_plugin(self):
        import flakekit.plugin as surface

        assert surface.Component is Component and surface.Migration is Migration
        assert surface.register_component is schema.register_component
        assert surface.check_schema is schema.check_schema
        assert {"Component", "Migration", "check_schema",
                "register_component"} <= set(surface.__all__)


def test_docs_name_the_commands():
    """The pages that explain versions and upgrades say `db upgrade`."""
    for page in ("workers-sql.md", "segments.md", "cli.md", "operations.md"):
        assert "db upgrade" in (ROOT / "docs" / page).read_text(), page


