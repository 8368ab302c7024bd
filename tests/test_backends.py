"""Backends: network defaults so a database that stops answering fails a call instead
of hanging it; user options win."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Connection, text

from flakekit.errors import BackendError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql.backends import BackendPool, BackendSettings, connect_defaults
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import ManualClock, proxied
from flakekit.testing.threads import Call


@contextmanager
def connection(pool: BackendPool) -> Iterator[Connection]:
    """A connection of ``pool``'s backend ``b``; the pool disposed after."""
    try:
        with pool.engine("b").connect() as conn:
            yield conn
    finally:
        pool.dispose()


class TestDefaults:
    def test_per_driver(self):
        """libpq gets keepalives and a TCP user timeout, PyMySQL socket timeouts (a
        statement's limit and a margin), SQLite a lock wait; unknown drivers get nothing."""
        assert connect_defaults("postgresql+psycopg://u@h/db")["tcp_user_timeout"] == 30_000
        assert connect_defaults("postgresql+psycopg://u@h/db")["connect_timeout"] == 10
        assert connect_defaults("mysql+pymysql://u@h/db")["read_timeout"] == 35
        assert connect_defaults("sqlite:///x.db")["timeout"] == 15
        assert connect_defaults("mssql+pyodbc://u@h/db") == {}

    @pytest.mark.postgresql
    def test_reach_the_postgresql_connection(self, pg_url):
        """The live libpq connection carries the defaults."""
        with connection(BackendPool({"b": BackendSettings(pg_url)})) as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()
        assert params["keepalives"] == "1" and params["tcp_user_timeout"] == "30000"

    @pytest.mark.mariadb
    def test_user_options_win(self, mariadb_url):
        """options.connect_args overrides a default and keeps the others."""
        settings = BackendSettings(mariadb_url, {"connect_args": {"read_timeout": 7}})
        with connection(BackendPool({"b": settings})) as conn:
            raw = conn.connection.dbapi_connection
            conn.execute(text("SELECT 1"))
        assert (raw._read_timeout, raw._write_timeout) == (7, 35)


class TestSessionLimits:
    """[backends.NAME] lock_timeout / idle_in_transaction_timeout / statement_timeout reach
    every session flakekit opens (issue 9, item 2)."""

    TABLE = {"lock_timeout": "3s", "idle_in_transaction_timeout": "4s",
             "statement_timeout": "20s", "connect_timeout": "5s"}

    def pool(self, url: str) -> BackendPool:
        from flakekit.assembly.config import parse_config

        table = {"url": url, **self.TABLE}
        return parse_config({"backends": {"b": table}}).pool()

    @pytest.mark.postgresql
    def test_postgresql(self, pg_url):
        with connection(self.pool(pg_url)) as conn:
            got = [conn.execute(text(f"SHOW {name}")).scalar() for name in (
                "lock_timeout", "idle_in_transaction_session_timeout", "statement_timeout")]
            params = conn.connection.dbapi_connection.info.get_parameters()
        assert got == ["3s", "4s", "20s"] and params["connect_timeout"] == "5"

    @pytest.mark.mariadb
    def test_mariadb(self, mariadb_url):
        with connection(self.pool(mariadb_url)) as conn:
            got = conn.execute(text(
                "SELECT @@innodb_lock_wait_timeout, @@idle_transaction_timeout, "
                "@@max_statement_time, @@tx_isolation")).one()
            raw = conn.connection.dbapi_connection
        assert tuple(got) == (3, 4, 20.0, "READ-COMMITTED")
        assert (raw.connect_timeout, raw._read_timeout, raw._write_timeout) == (5, 25, 25)

    def test_sqlite_busy_timeout_is_the_lock_timeout(self, tmp_path):
        assert connect_defaults(f"sqlite:///{tmp_path}/x.db",
                                BackendSettings("sqlite://", lock_timeout=3 * NS))["timeout"] == 3

    @pytest.mark.parametrize(("key", "value"), [("lock_timeout", "soon"),
                                                ("statement_timeout", "30d"),
                                                ("connect_timeout", "0s")])
    def test_bad_value_names_the_key(self, key, value):
        """Not a duration, more than PostgreSQL takes (~24 d), or a connect without one."""
        from flakekit.assembly.config import parse_config
        from flakekit.errors import ConfigError

        with pytest.raises(ConfigError) as info:
            parse_config({"backends": {"b": {"url": "sqlite:///x.db", key: value}}})
        assert info.value.path == f"backends.b.{key}"


NS = 1_000_000_000


@pytest.mark.mariadb
def _heartbeat_through_a_stall(settings: BackendSettings, proxy: object) -> BaseException:
    """Acquire through ``proxy``, stall it, renew in a thread: the renewal must fail (not
    hang) with one line; once unstalled, the next renewal must succeed. Returns the error."""
    pool = BackendPool({"b": settings})
    try:
        alloc = SqlWorkerAllocator(engine=pool.engine("b"), clock=ManualClock(),
                                   service="s", host="10.0.0.1", port=1, create_schema=True)
        lease = alloc.acquire(LeaseRequest("g", 1023, "", 0))
        proxy.stall()  # type: ignore[attr-defined]
        error = Call(lambda: alloc.renew(lease, 0)).error_after(
            60, "the heartbeat hung on a silent network")
        assert isinstance(error, BackendError) and "\n" not in str(error), error
        proxy.unstall()  # type: ignore[attr-defined]
        assert alloc.renew(lease, 0).worker_id == lease.worker_id
        return error
    finally:
        pool.dispose()


@pytest.mark.parametrize("options", [{}, {"pool_pre_ping": False}], ids=["defaults", "no-ping"])
def test_postgresql_request_swallowed_by_a_black_hole_fails_then_recovers(pg_url, tcp_proxy,
                                                                         options):
    """A middlebox acknowledges the heartbeat's packets and never forwards them (the proxy
    stalls; TCP stays healthy, so keepalives and tcp_user_timeout never fire, and libpq
    has no read timeout): the heartbeat fails with one line once no answer came for the
    statement limit plus 5 s, instead of blocking its thread for ever (it did before);
    the connection is given up, and the next heartbeat, on a new one, succeeds once
    traffic flows again. With the defaults the request swallowed is the pool's ping, and
    the new connection then times out connecting; without the ping it is the heartbeat."""
    proxy = tcp_proxy(5432)
    error = _heartbeat_through_a_stall(
        BackendSettings(proxied(pg_url, proxy), options, statement_timeout=NS), proxy)
    if options:
        assert "no answer from the server in 6 s" in str(error)


def test_heartbeat_on_a_silent_network_fails_then_recovers(mariadb_url, tcp_proxy):
    """The database stops answering (packets dropped, connection open): the heartbeat
    fails with one line instead of hanging, and succeeds once traffic flows again."""
    proxy = tcp_proxy(3306)
    _heartbeat_through_a_stall(
        BackendSettings(proxied(mariadb_url, proxy), {"connect_args": {"read_timeout": 2}}),
        proxy)


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        (BackendSettings("postgresql+psycopg://u:hunter2@h:notaport/x"), "backends.b.url"),
        (BackendSettings("postgresql+psycopg://u:hunter2@h/x", {"pool_size": "x"}),
         "backends.b.options"),
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
