"""What a commit survives (flakekit/sql/durability.py) and the commit whose synchronous
wait was cancelled (flakekit/sql/backends.py), on real servers."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from sqlalchemy import create_engine, text

from flakekit.errors import BackendError
from flakekit.sql import failover
from flakekit.sql.backends import BackendPool, BackendSettings
from flakekit.sql.durability import Durability, DurabilityWatch, probe, watch_for
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import EventRecorder
from flakekit.testing.cli import run_cli
from flakekit.testing.databases import PG_ADMIN_URL, fresh_server_database
from flakekit.testing.replicas import (
    MariaServer,
    PgServer,
    mariadb_binaries_missing,
    pg_binaries_missing,
    private_base,
)


@pytest.fixture(scope="module")
def sync_pg():
    """A private PostgreSQL whose commits wait for a standby that never comes
    (``synchronous_standby_names = 'nobody'``)."""
    missing = pg_binaries_missing()
    if missing:
        pytest.skip(missing)
    base = private_base("flakekit-syncpg-")
    server = PgServer(base, "data", ("synchronous_standby_names=nobody",)).initdb().start()
    try:
        yield server.url
    finally:
        stopping = server.stop()
        if stopping is not None:
            stopping.wait()
        shutil.rmtree(base, ignore_errors=True)


def _local(url: str):
    """An engine whose commits do not wait for the standby (to set a test up)."""
    return create_engine(url, connect_args={"options": "-c synchronous_commit=local"})


def test_verdicts_of_the_test_servers(tmp_path):
    with fresh_server_database("postgresql") as pg, fresh_server_database("mariadb") as my:
        for url, dialect in ((pg, "postgresql"), (my, "mysql"),
                             (f"sqlite:///{tmp_path / 'x.db'}", "sqlite")):
            engine = create_engine(url)
            with engine.connect() as conn:
                found = probe(conn)
            engine.dispose()
            assert found.dialect == dialect
            assert found.verdict == ("local-disk" if dialect == "sqlite" else "single")
            assert not found.synchronous


@pytest.mark.slow
def test_a_commit_whose_synchronous_wait_was_cancelled_is_a_failure(sync_pg):
    admin = _local(sync_pg)
    SqlSegmentStore(admin).create("k", step=100)
    assert failover.detection_ready(admin)
    failover.prepare(admin, "segments:leaf_alloc:k")  # only the fetch's commit waits
    with admin.connect() as conn:  # its own session commits locally: it says so
        assert probe(conn).verdict == "single"
    pool = BackendPool({"r": BackendSettings(sync_pg)})
    with pool.engine("r").connect() as conn:
        assert probe(conn).verdict == "synchronous"
    store = SqlSegmentStore(pool.engine("r"))
    outcome: list[BaseException | object] = []
    worker = threading.Thread(target=lambda: outcome.append(_call(store.fetch, "k")))
    worker.start()
    cancelled = 0
    deadline = time.monotonic() + 20
    while not cancelled and time.monotonic() < deadline:  # the stuck COMMIT, then cancel it
        with admin.connect() as conn:
            cancelled = conn.execute(text(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity "
                "WHERE wait_event = 'SyncRep'")).scalar_one()
        time.sleep(0.05)
    worker.join(20)
    pool.dispose()
    assert cancelled == 1
    (result,) = outcome
    assert isinstance(result, BackendError), result
    assert "not made durable" in str(result)
    assert "\n" not in str(result)
    with admin.connect() as conn:  # PostgreSQL kept it locally: the range is never used
        assert conn.execute(text("SELECT max_id FROM leaf_alloc")).scalar_one() == 101
    admin.dispose()


def _call(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001  # handed to the test thread
        return exc


def test_db_check_prints_one_line_per_backend(sync_pg, tmp_path, capsys):
    config = tmp_path / "f.toml"
    config.write_text(f'[backends.sync]\nurl = "{sync_pg}"\n'
                      f'[backends.single]\nurl = "{PG_ADMIN_URL}"\nreplication = "synchronous"\n'
                      f'[backends.lite]\nurl = "sqlite:///{tmp_path / "l.db"}"\n')
    code, out, err = run_cli(capsys, "db", "check", "-c", str(config))
    lines = out.splitlines()
    assert code == 1, out + err                      # "single" is not synchronous
    assert [line.split(" ")[0] for line in lines] == [
        "backends.sync", "backends.single", "backends.lite"]
    assert ": synchronous: " in lines[0]
    assert "now the commit is waiting for the synchronous standby (synchronous_standby_names" \
        " = 'nobody'): no standby confirms" in lines[0]     # what a stuck fetch says too
    assert "synchronous_standby_names" in lines[1] and "refused" in lines[1]
    code, out, err = run_cli(capsys, "db", "check", "-c", str(config), "--json")
    assert [e["verdict"] for e in json.loads(out)] == [
        "synchronous", "single", "local-disk"]


def test_replication_synchronous_refuses_with_the_setting_to_fix():
    with fresh_server_database("postgresql") as url:
        pool = BackendPool({"main": BackendSettings(url, replication="synchronous")})
        store = SqlSegmentStore(pool.engine("main"))
        store.create("k", step=10)
        with pytest.raises(BackendError, match="refusing to fetch a segment of key 'k': "
                           "replication = \"synchronous\".*synchronous_standby_names"):
            store.fetch("k")
        pool.dispose()


def test_a_verdict_that_gets_worse_raises_one_alert():
    recorder = EventRecorder()
    with fresh_server_database("postgresql") as url:
        engine = create_engine(url)
        watch = DurabilityWatch("main", events=[recorder.events],
                                last=Durability("postgresql", "synchronous", "was fine"))
        watch.read(engine)
        watch.read(engine)
        engine.dispose()
    assert recorder.alerts() == ["database-durability"]


@pytest.mark.slow
def test_mariadb_semi_sync_falling_back_is_seen_alerted_and_refused():
    missing = mariadb_binaries_missing()
    if missing:
        pytest.skip(missing)
    server = MariaServer(options=("--rpl-semi-sync-master-enabled=ON",
                                  "--rpl-semi-sync-master-timeout=300")).start()
    recorder = EventRecorder()
    try:
        pool = BackendPool({"main": BackendSettings(server.url, replication="synchronous")})
        engine = pool.engine("main")
        watch = watch_for(engine)
        watch.listen(recorder.events)
        assert watch.read(engine).verdict == "synchronous"   # no commit has waited yet
        store = SqlSegmentStore(engine)
        store.create("k", step=10)   # waits 0.3 s for a replica that is not there
        found = watch.read(engine)
        assert found.verdict == "fallen-back"
        assert "rpl_semi_sync_master_timeout" in (found.fix or "")
        assert recorder.alerts() == ["database-durability"]
        with pytest.raises(BackendError, match="refusing to fetch.*fallen-back"):
            store.fetch("k")
        pool.dispose()
    finally:
        server.stop()
