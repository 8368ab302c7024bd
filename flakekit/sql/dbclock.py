"""The database's clock and the database's errors, as every SQL lease store reads them
(the worker registry, the cluster membership, the key-owner fence).

Leases in SQL are timed on the database's clock (``last_seen``), never a client's; the
holder's own deadline counts from the send time of the write that succeeded.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, literal, literal_column
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.sql.elements import ColumnElement

__all__ = [
    "LOCK_WAIT_WORDS",
    "aware_utc",
    "db_message",
    "db_now",
    "db_now_minus",
    "dialect_of",
    "lease_deadline_ns",
    "ns_of",
    "retry_kind",
    "retry_pause",
]

NS = 1_000_000_000


def dialect_of(engine_or_conn: Engine | Connection) -> str:
    name = engine_or_conn.dialect.name
    return "mysql" if name in ("mysql", "mariadb") else name


def db_now(dialect: str) -> ColumnElement[Any]:
    """The database's current time, in the form ``last_seen`` is stored in.

    MariaDB uses ``UTC_TIMESTAMP(6)``: ``NOW()`` is session-local time and would jump
    at daylight-saving changes. SQLite keeps milliseconds (``CURRENT_TIMESTAMP`` has
    whole seconds only), in the same text form SQLAlchemy reads back.
    """
    if dialect == "postgresql":
        return func.now()
    if dialect == "mysql":
        return func.utc_timestamp(6)
    return func.strftime("%Y-%m-%d %H:%M:%f", "now")


def db_now_minus(dialect: str, age_ns: int) -> ColumnElement[Any]:
    """The database's current time minus ``age_ns`` (for "older than" conditions)."""
    if dialect == "postgresql":
        return func.now() - literal(dt.timedelta(microseconds=age_ns // 1000))
    if dialect == "mysql":
        us = int(age_ns // 1000)
        return literal_column(f"(UTC_TIMESTAMP(6) - INTERVAL {us} MICROSECOND)")
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", f"-{age_ns / NS:.3f} seconds")


def lease_deadline_ns(send_mono_ns: int, lease_ns: int, safety_ns: int) -> int:
    """The holder's own deadline (monotonic ns): the lease counted from the *send* time
    of the write that succeeded (the database stamped ``last_seen`` after it), less a
    safety window, so the holder stops before anyone may take over -- even paused or cut
    off. Shared by the worker registry and the SQL membership."""
    return send_mono_ns + lease_ns - safety_ns


def aware_utc(value: Any) -> dt.datetime | None:
    """Rows come back naive on MariaDB/SQLite (stored as UTC) and aware on PostgreSQL."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:  # a zero date (MariaDB) or any text (SQLite): unreadable
            return None
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value


def ns_of(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000


#: how each server words "waited for a lock too long" (PostgreSQL lock_timeout and
#: statement_timeout, MariaDB 1205 and max_statement_time, SQLite's busy timeout)
LOCK_WAIT_WORDS = ("lock timeout", "lock wait timeout", "database is locked",
                    "statement timeout", "max_statement_time")


def retry_kind(exc: SQLAlchemyError) -> str | None:
    """``"conflict"`` (unique race, deadlock, serialisation), ``"lock"`` (a lock wait
    timed out: someone holds a lock we need) or None (not worth retrying)."""
    if not isinstance(exc, DBAPIError):  # e.g. the pool's TimeoutError
        return None
    if isinstance(exc, IntegrityError):
        return "conflict"
    text_ = str(exc.orig or exc).lower()
    if any(word in text_ for word in LOCK_WAIT_WORDS):
        return "lock"
    if any(word in text_ for word in ("deadlock", "serializ")):
        return "conflict"
    return None


def retry_pause(attempt: int, longest_s: float = 0.1) -> float:
    """Seconds to pause before retry ``attempt + 1`` of a conflicted transaction: grows
    with the attempt up to ``longest_s``, jittered (0.5-1.5x) so the sessions that lost
    one round do not collide again in lockstep."""
    return min(0.002 * (attempt + 1), longest_s) * (0.5 + random.random())


def db_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    if orig is exc and isinstance(exc, SQLAlchemyError) and exc.args:
        orig = exc.args[0]  # without SQLAlchemy's "(Background on this error ...)"
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__
