"""Backends: network defaults so a database that stops answering fails a call instead
of hanging it; user options win."""

from __future__ import annotations

import threading

import pytest
from conftest import proxied
from sqlalchemy import text

from flakekit.backends import BackendPool, BackendSettings, connect_defaults
from flakekit.errors import BackendError
from flakekit.lease import LeaseRequest
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import ManualClock


class TestDefaults:
    def test_per_driver(self):
        """libpq gets keepalives and a TCP user timeout, PyMySQL socket timeouts, SQLite a
        lock wait; unknown drivers get nothing."""
        assert connect_defaults("postgresql+psycopg://u@h/db")["tcp_user_timeout"] == 30_000
        assert connect_defaults("mysql+pymysql://u@h/db")["read_timeout"] == 30
        assert connect_defaults("sqlite:///x.db")["timeout"] == 30
        assert connect_defaults("mssql+pyodbc://u@h/db") == {}

    @pytest.mark.postgresql
    def test_reach_the_postgresql_connection(self, pg_url):
        """The live libpq connection carries the defaults."""
        pool = BackendPool({"b": BackendSettings(pg_url)})
        try:
            with pool.engine("b").connect() as conn:
                params = conn.connection.dbapi_connection.info.get_parameters()
            assert params["keepalives"] == "1" and params["tcp_user_timeout"] == "30000"
        finally:
            pool.dispose()

    @pytest.mark.mariadb
    def test_user_options_win(self, mariadb_url):
        """options.connect_args overrides a default and keeps the others."""
        pool = BackendPool({"b": BackendSettings(mariadb_url, {"connect_args": {"read_timeout": 7}})})
        try:
            with pool.engine("b").connect() as conn:
                raw = conn.connection.dbapi_connection
                conn.execute(text("SELECT 1"))
            assert (raw._read_timeout, raw._write_timeout) == (7, 30)
        finally:
            pool.dispose()


@pytest.mark.mariadb
def test_heartbeat_on_a_silent_network_fails_then_recovers(mariadb_url, tcp_proxy):
    """The database stops answering (packets dropped, connection open): the heartbeat
    fails with one line instead of hanging, and succeeds once traffic flows again."""
    proxy = tcp_proxy(3306)
    pool = BackendPool({"b": BackendSettings(proxied(mariadb_url, proxy),
                                             {"connect_args": {"read_timeout": 2}})})
    try:
        alloc = SqlWorkerAllocator(engine=pool.engine("b"), clock=ManualClock(),
                                   service="s", host="10.0.0.1", port=1, create_schema=True)
        lease = alloc.acquire(LeaseRequest("g", 1023, "", 0))
        proxy.stall()
        outcome: list[BaseException | None] = []

        def renew() -> None:
            try:
                alloc.renew(lease, 0)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome.append(exc)

        worker = threading.Thread(target=renew, daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "the heartbeat hung on a silent network"
        assert isinstance(outcome[0], BackendError) and "\n" not in str(outcome[0])
        proxy.unstall()
        assert alloc.renew(lease, 0).worker_id == lease.worker_id
    finally:
        pool.dispose()


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        (BackendSettings("postgresql+psycopg://u:hunter2@h:notaport/x"), "backends.b.url"),
        (BackendSettings("postgresql+psycopg://u:hunter2@h/x", {"pool_size": "x"}), "backends.b.options"),
        (BackendSettings("nosuchdialect://u:hunter2@h/x"), "backends.b.url"),
    ],
    ids=["port", "option", "dialect"],
)
def test_bad_engine_settings_name_the_field_and_hide_the_password(settings, where):
    """A URL or an engine option SQLAlchemy refuses is a ConfigError at the field, with
    the password redacted."""
    from flakekit.errors import ConfigError

    pool = BackendPool({"b": settings})
    with pytest.raises(ConfigError) as info:
        pool.engine("b", "generators.g.allocator.backend")
    assert info.value.path == where and "hunter2" not in str(info.value)
