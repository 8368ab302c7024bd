"""Fail-over detection: which primary wrote a scope last, checked in the writing transaction.

A promoted replica of an asynchronously replicated database lacks the last commits of
the old primary: ``max_id`` updates (its next fetch would hand the same range out
again) and worker rows (its next grant would give a held id to a second node). Process
memory cannot tell: a process started after the fail-over remembers nothing. So every
segment fetch, worker acquire and renewal reads, in its own transaction, a row of
``flakekit_primary`` that holds the identity of the primary that last wrote that scope
(``segments:TABLE:KEY``; ``workers``, one per database); the row is replicated with the
data it guards. When the identity differs the scope's last writes may be lost:
:func:`check_primary` records the new primary and the detection time (in the same
transaction) and returns the :class:`PrimaryChange`; the caller then skips ``max_id``
ahead (:mod:`flakekit.sql.leaf`) or quarantines grants (:mod:`flakekit.sql.workers`).

Identity: PostgreSQL ``system_identifier`` and the current timeline (the first 8 hex
digits of ``pg_walfile_name(pg_current_wal_lsn())``: a promoted standby keeps the system
identifier and starts a new timeline at once); MariaDB/MySQL ``@@server_id`` (distinct per
server in any replication set). SQLite is one file: nothing to detect.

Cluster mode's membership (``members:CLUSTER``, :mod:`flakekit.sql.membership`) and
key-owner table (``key-owners``, :mod:`flakekit.sql.key_owner`) use the same function:
on a change, or while :func:`quarantine_end` is not None, they admit no new member and
no new owner.

A scope whose row was first written within the replication lag has no row on the
promoted replica, and its change would go unseen. So the worker registry and the key
owners have one scope per database (made at the first grant or claim ever), a cluster
one per cluster, and a key's scope lives under its table's (``segments:TABLE``, made at
the table's first fetch or key): :func:`prepare` (``under`` the table's) starts a key's
missing row as written by the *old* primary when the table's row shows a fail-over, so the
key's first fetch skips ahead too (it may have been first fetched on the old primary within the
lag). A key *created* within the lag is not on the replica at all; re-created there, it
starts again at its start (docs/replicated-databases.md says what an operator does).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import Column, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from flakekit.sql.dbclock import aware_utc, db_now, db_now_minus, dialect_of
from flakekit.sql.schema import Component, init_schema, register_component
from flakekit.sql.schema import _Timestamp as Timestamp
from flakekit.values.events import NO_EVENTS, Events

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = [
    "FAILOVERS",
    "FAILOVER_COMPONENT",
    "PrimaryChange",
    "WORKERS_SCOPE",
    "announce",
    "check_primary",
    "check_primary_reading",
    "detection_ready",
    "primary_identity",
    "prepare",
    "primary_marker",
    "mark_written",
    "quarantine_end",
]

log = logging.getLogger("flakekit.failover")

FAILOVER_COMPONENT = "failover"

#: one row per scope: the primary that last wrote it, and when a change was detected
primary_marker = Table(
    "flakekit_primary",
    MetaData(),
    Column("scope", String(255), primary_key=True),
    Column("writer", String(100), nullable=False),
    Column("previous", String(100), nullable=True),
    Column("detected_at", Timestamp, nullable=True),
)

FAILOVER = Component(name=FAILOVER_COMPONENT, version=1, tables=(primary_marker,))
register_component(FAILOVER)

#: the worker registry's scope: one per database (a service first used within the
#: replication lag is covered by it)
WORKERS_SCOPE = "workers"

#: detected fail-overs per database (for ``/metrics``)
FAILOVERS: Counter[str] = Counter()


@attrs.frozen
class PrimaryChange:
    """A scope last written by another primary than the one answering now."""

    scope: str
    old: str
    new: str


#: the identity columns of the answering server, by dialect (two: PostgreSQL's system
#: identifier and timeline, MariaDB's server_id and nothing)
_IDENTITY = {
    "postgresql": "(SELECT system_identifier FROM pg_control_system())::text, "
                  "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
    "mysql": "@@server_id, NULL",
}


def _identity(dialect: str, first: Any, second: Any) -> str:
    if dialect == "postgresql":
        return f"system {first} timeline {int(second, 16)}"
    return f"server_id {first}"


def primary_identity(conn: Connection) -> str | None:
    """The answering primary's identity (None: SQLite, or a server flakekit cannot ask)."""
    dialect = dialect_of(conn)
    if dialect not in _IDENTITY:
        return None
    row = conn.execute(text(f"SELECT {_IDENTITY[dialect]}")).one()
    return _identity(dialect, row[0], row[1])


_READY: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_READY_LOCK = threading.Lock()


def detection_ready(engine: Engine) -> bool:
    """Create ``flakekit_primary`` once per engine when missing (it holds no user data).

    False (logged once) where the role may not create it: detection is then off until
    ``flakekit db upgrade`` has run.
    """
    if engine.dialect.name == "sqlite":
        return False
    with _READY_LOCK:
        if engine in _READY:
            return _READY[engine]
        try:
            init_schema(engine, FAILOVER)
            _READY[engine] = True
        except (SQLAlchemyError, Exception) as exc:  # noqa: BLE001  # reported, then off
            log.warning("fail-over detection is off for %s: cannot create table "
                        "flakekit_primary (%s); start flakekit once with a role that may "
                        "create tables (it holds one row per key and service)",
                        engine.url.render_as_string(hide_password=True),
                        str(getattr(exc, "orig", exc)).splitlines()[0])
            _READY[engine] = False
        return _READY[engine]


_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def prepare(engine: Engine, scope: str, under: str | None = None) -> None:
    """Before the first transaction of ``scope``: make its row in a transaction of its
    own (concurrent first inserts inside the fetch transactions deadlock on MariaDB).

    ``under``: the scope's parent (a key's table), prepared first. When the parent's
    row shows a fail-over (another primary wrote it, or one was detected on it) and
    ``scope`` has no row, the row starts as written by the old primary: the key may have
    been first fetched there within the replication lag, so its first fetch here must
    detect the change and skip ahead. The cost: one skip for a key first fetched after a
    fail-over (a key made by ``create`` gets its row with the key's).
    """
    if under is not None:
        prepare(engine, under)
    with _READY_LOCK:
        if scope in _PREPARED.setdefault(engine, set()):
            return
    t = primary_marker
    with engine.connect() as conn:
        found = conn.execute(select(t.c.writer).where(t.c.scope == scope)).first()
        conn.rollback()
    if found is None:
        with engine.begin() as conn:
            me = primary_identity(conn)
            if me is not None:
                old = None
                if under is not None:
                    above = conn.execute(select(t.c.writer, t.c.previous)
                                         .where(t.c.scope == under)).first()
                    old = None if above is None else (
                        above[0] if above[0] != me else above[1])
                _insert_if_absent(conn, scope, old or me)
    with _READY_LOCK:
        _PREPARED[engine].add(scope)


def mark_written(conn: Connection, scope: str) -> None:
    """In the transaction that creates what ``scope`` guards (a key's row): its marker
    row too, so both reach a replica together and a fail-over after it is detected."""
    if dialect_of(conn) in _IDENTITY:
        me = primary_identity(conn)
        if me is not None:
            _insert_if_absent(conn, scope, me)


def check_primary(conn: Connection, scope: str) -> PrimaryChange | None:
    """Inside a writing transaction: record the answering primary for ``scope`` and
    return the change when another primary wrote it last (None: same one, or first use).

    The row is locked only when it must change, so concurrent fetches of one key and
    renewals of one service do not queue behind each other in the common case.
    """
    return check_primary_reading(conn, scope)[0]


def check_primary_reading(conn: Connection, scope: str, also: str = "NULL",
                          params: dict[str, Any] | None = None,
                          ) -> tuple[PrimaryChange | None, Any]:
    """:func:`check_primary`, reading the SQL expression ``also`` in the same round trip
    (a segment fetch reads the key's ``max_id`` so): (change, value of ``also``)."""
    dialect = dialect_of(conn)
    if dialect not in _IDENTITY:
        return None, None
    row = conn.execute(text(
        f"SELECT {_IDENTITY[dialect]}, (SELECT writer FROM {primary_marker.name} "
        f"WHERE scope = :fk_scope), {also}"), {"fk_scope": scope, **(params or {})}).one()
    me = _identity(dialect, row[0], row[1])
    if row[2] == me:
        return None, row[3]
    t = primary_marker
    where = t.c.scope == scope
    found = conn.execute(select(t.c.writer).where(where).with_for_update()).first()
    if found is None:  # first use: concurrent first writers insert once
        _insert_if_absent(conn, scope, me)
        found = conn.execute(select(t.c.writer).where(where).with_for_update()).one()
    if found[0] == me:  # another session recorded it while we waited for the lock
        return None, row[3]
    conn.execute(update(t).where(where).values(writer=me, previous=found[0],
                                               detected_at=db_now(dialect)))
    return PrimaryChange(scope, found[0], me), row[3]


def _insert_if_absent(conn: Connection, scope: str, me: str) -> None:
    t = primary_marker
    if dialect_of(conn) == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        conn.execute(pg_insert(t).values(scope=scope, writer=me).on_conflict_do_nothing())
    else:
        conn.execute(insert(t).prefix_with("IGNORE").values(scope=scope, writer=me))


def quarantine_end(conn: Connection, scope: str, quarantine_ns: int) -> dt.datetime | None:
    """When the quarantine after ``scope``'s last detected fail-over ends (database
    time, UTC), or None when there is none running."""
    if dialect_of(conn) == "sqlite":
        return None
    t = primary_marker
    found = conn.execute(select(t.c.detected_at).where(
        t.c.scope == scope, t.c.detected_at.is_not(None),
        t.c.detected_at > db_now_minus(dialect_of(conn), quarantine_ns))).first()
    when = aware_utc(found[0]) if found is not None else None
    return None if when is None else when + dt.timedelta(microseconds=quarantine_ns // 1000)


_ANNOUNCED: set[tuple[str, str, str]] = set()


def announce(change: PrimaryChange, where: str, what: str,
             events: Events = NO_EVENTS) -> None:
    """The log line (every scope), the metric and one ``database-failover`` alert per
    database and change (not one per key)."""
    log.error("database fail-over detected on %s for %s: the primary was %s, now %s; %s",
              where, change.scope, change.old, change.new, what)
    pair = (where, change.old, change.new)
    with _READY_LOCK:
        first = pair not in _ANNOUNCED
        _ANNOUNCED.add(pair)
        if first:
            FAILOVERS[where] += 1
    if first:
        events.alert("database-failover",
                     f"database fail-over on {where}: the primary was {change.old}, now "
                     f"{change.new}; {what}",
                     {"database": where, "old": change.old, "new": change.new,
                      "scope": change.scope})
