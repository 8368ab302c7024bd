"""A write transaction that holds its lock from the first statement on, on every backend.

Cluster mode reads a row, decides, then writes (the fence check before ``max_id``
moves; the member row before a join). On PostgreSQL and MariaDB the read is ``SELECT
... FOR UPDATE`` inside an ordinary transaction. SQLite has no row locks, and pysqlite
begins a transaction only at the first INSERT/UPDATE, so the read would run outside it:
there the transaction starts with ``BEGIN IMMEDIATE`` (the database's write lock, waited
for up to the connection's busy timeout: the backend's ``lock_timeout``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["sqlite_immediate", "write_transaction"]


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction; committed on success, rolled back on error."""
    with engine.connect() as conn:
        if engine.dialect.name != "sqlite":
            if _autocommit(conn):  # a FOR UPDATE lock would end with its statement
                conn = conn.execution_options(
                    isolation_level=conn.default_isolation_level or "READ COMMITTED")
            with conn.begin():
                yield conn
            return
        with sqlite_immediate(conn) as locked:
            yield locked


@contextmanager
def sqlite_immediate(conn: Connection) -> Iterator[Connection]:
    """``conn`` (SQLite) inside ``BEGIN IMMEDIATE``: the database's write lock taken now,
    not at the first write (pysqlite must not begin on its own: autocommit); committed on
    success, rolled back on error."""
    conn = conn.execution_options(isolation_level="AUTOCOMMIT")  # no implicit BEGIN
    conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.exec_driver_sql("ROLLBACK")
        raise
    conn.exec_driver_sql("COMMIT")


def _autocommit(conn: Connection) -> bool:
    """Whether ``conn`` commits every statement (an engine made with AUTOCOMMIT)."""
    try:
        raw = conn.connection.dbapi_connection
        return bool(raw is not None and conn.dialect.detect_autocommit_setting(raw))
    except NotImplementedError:
        return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
