"""SqlSegmentStore: Leaf's ``leaf_alloc`` table, read and advanced with SQLAlchemy Core.

The table is Meituan Leaf's, column for column, so a Leaf MySQL database works unchanged
and a Leaf server can keep running next to flakekit during a migration: both advance
``max_id`` with the same single-row update, and the row lock serialises them.

A fetch is one transaction: ``UPDATE leaf_alloc SET max_id = max_id + step`` followed by
reading the row back (``RETURNING`` where the dialect has it). The new range is
``[max_id - step, max_id)``. Nothing else is ever written except by :meth:`create` and by
the compare-and-set of :meth:`give_back`, which only lowers ``max_id`` when it still equals
the end of the caller's own last range (so nobody handed anything out above it).

The UPDATE only matches a row that can serve it (``0 <= max_id <= MAX_ID - step``): near
the top of the BIGINT range an overflowing ``max_id + step`` would otherwise fail on
PostgreSQL, be clamped by a non-strict MariaDB and turn into a REAL on SQLite (which then
reissued IDs). Values read back must be integers of their own (no ``int()`` coercion).

Cluster mode's strict keys pass a ``claim`` to :meth:`SqlSegmentStore.fetch` and
:meth:`~SqlSegmentStore.give_back`: the same transaction then checks the key's row of
``flakekit_key_owner`` first (:mod:`flakekit.sql.key_owner`), so a deposed owner cannot
move ``max_id``. Without a claim nothing changes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    case,
    false,
    func,
    insert,
    inspect,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.exc import (
    IntegrityError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
    StatementError,
)

from flakekit.cluster.store_contracts import KeyClaim, KeyOwnerRecord
from flakekit.errors import (
    BackendError,
    ConfigError,
    FenceError,
    SchemaError,
    SegmentRowError,
    UnknownKeyError,
)
from flakekit.sql import failover, key_owner
from flakekit.sql.durability import stall_cause, watch_for, with_stall_cause
from flakekit.sql.schema import (
    Component,
    check_schema,
    init_schema,
    read_version,
    register_component,
)
from flakekit.sql.settings import DEFAULT_FAILOVER_SKIP, SqlStoreSettings
from flakekit.sql.transactions import write_transaction
from flakekit.values.allocation import Allocation, check_new_range
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.periods import PERIOD_KEY, is_period_key
from flakekit.values.timeunits import iso_utc

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from flakekit.assembly.context import BuildContext

__all__ = [
    "LEAF_MYSQL_DDL",
    "SEGMENTS_COMPONENT",
    "Allocation",
    "KeyInfo",
    "SqlSegmentStore",
    "SqlStoreSettings",
    "leaf_alloc_table",
    "row_problem",
    "segments_component",
]

log = logging.getLogger("flakekit.segment")

#: ``step`` is ``int(11)`` in Leaf's DDL
MAX_DB_STEP = 2**31 - 1
#: ``max_id`` is a signed 64-bit column; it holds the exclusive end of the last range, so
#: the last ID a key can ever hand out is ``MAX_ID - 1``
MAX_ID = 2**63 - 1

#: Leaf's own DDL (``scripts/leaf_alloc.sql``), used verbatim on MySQL and MariaDB so a
#: table flakekit creates is byte-for-byte what Leaf would have created.
LEAF_MYSQL_DDL = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    "biz_tag varchar(128) NOT NULL DEFAULT '', "
    "max_id bigint(20) NOT NULL DEFAULT '1', "
    "step int(11) NOT NULL, description varchar(256) DEFAULT NULL, "
    "update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, "
    "PRIMARY KEY (biz_tag)) ENGINE=InnoDB"
)


SEGMENTS_COMPONENT = "segments"


def _create_leaf_table(conn: Connection, table: Table) -> None:
    if conn.dialect.name in ("mysql", "mariadb"):
        conn.execute(text(LEAF_MYSQL_DDL.format(table=table.name)))
    else:
        table.create(conn, checkfirst=True)


def segments_component(table: str = "leaf_alloc") -> Component:
    """The ``segments`` schema component of one Leaf table (``segments:TABLE`` for a
    table of another name).

    Version 1 is Leaf's table: a Leaf database (no ``flakekit_schema`` row) is version 1
    and nothing is ever written to it for that. The columns stay Leaf's: data flakekit
    keeps about a key goes into tables of its own.
    """
    name = SEGMENTS_COMPONENT if table == "leaf_alloc" else f"{SEGMENTS_COMPONENT}:{table}"
    return Component(name=name[:64], version=1, tables=(leaf_alloc_table(table),),
                     unrecorded=1, create=_create_leaf_table)


def leaf_alloc_table(name: str = "leaf_alloc", metadata: MetaData | None = None) -> Table:
    """The ``leaf_alloc`` table as SQLAlchemy Core sees it (same columns as Leaf's DDL)."""
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column("biz_tag", String(128), primary_key=True, server_default=""),
        Column("max_id", BigInteger, nullable=False, server_default="1"),
        Column("step", Integer, nullable=False),
        Column("description", String(256), nullable=True),
        Column("update_time", DateTime, nullable=False, server_default=func.current_timestamp()),
    )


register_component(segments_component())


def _is_int(value: object) -> bool:
    return type(value) is int  # not bool, not a REAL SQLite made of an overflow, not text


def row_problem(max_id: object, step: object, increment: int | None = None) -> str | None:
    """Why a ``leaf_alloc`` row cannot serve a fetch of ``increment`` (None: its own step)
    IDs, or None when it can. Shared by :meth:`SqlSegmentStore.fetch` and the listings."""
    if not _is_int(step):
        return f"step {step!r} is not an integer"
    if not _is_int(max_id):
        return f"max_id {max_id!r} is not an integer"
    assert isinstance(max_id, int) and isinstance(step, int)
    if step < 1:
        return f"step {step} is below 1"
    if max_id < 0:
        return f"max_id {max_id} is negative (IDs are never negative)"
    increment = step if increment is None else increment
    if max_id >= MAX_ID:
        return f"used up: max_id is {MAX_ID}, the largest value of the BIGINT column"
    if max_id > MAX_ID - increment:
        return (f"used up: max_id {max_id} + step {increment} would pass {MAX_ID}, the "
                f"largest value of the BIGINT column (only {MAX_ID - max_id} IDs left)")
    return None


def _minus(value: Any, increment: Any) -> Any:
    """``max_id`` before an update that added ``increment`` (as read, if not a number)."""
    try:
        return value - increment
    except TypeError:
        return value


def _plain(value: object) -> object:
    """A database value as JSON can carry it (bad rows may hold REALs, text, decimals)."""
    return value if value is None or isinstance(value, (int, float, str)) else str(value)



def driver_message(exc: BaseException) -> str:
    """The first line of the driver's error behind a SQLAlchemy one (or of ``exc`` itself;
    its type's name when it has no text)."""
    orig = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__

@attrs.frozen
class KeyInfo:
    """One ``leaf_alloc`` row, for listings. ``problem`` says why no fetch can use it.

    ``max_id`` and ``step`` are the values as stored: integers unless the row is bad.
    """

    key: str
    max_id: Any
    step: Any
    description: str | None
    update_time: dt.datetime | None
    problem: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "max_id": _plain(self.max_id),
            "step": _plain(self.step),
            "description": self.description,
            "update_time": (iso_utc(self.update_time)
                            if isinstance(self.update_time, dt.datetime) else None),
            "problem": self.problem,
        }


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > 128:
        raise ConfigError("key",
                          "a segment key is a non-empty string of at most 128 characters, got "
                          f"{key!r}")
    if is_period_key(key):
        raise ConfigError("KEY", f"{key!r}: a name ending in '@' and 4, 6 or 8 digits is a "
                          "periodic counter's row (reset = ...), created on first use; "
                          "pick another name")
    return key


def _period_of(key: str, base: str) -> bool:
    """Whether ``key`` is a period row of ``base`` (a strict key's owner owns them too)."""
    found = PERIOD_KEY.match(key)
    return found is not None and found.group("base") == base


@attrs.define
class SqlSegmentStore:
    """Leaf-style ranges per key in one SQL table (PostgreSQL, MariaDB/MySQL, SQLite).

    Thread-safe: every method is one short transaction on a pooled connection.
    """

    engine: Engine
    table_name: str = "leaf_alloc"
    #: how far ``max_id`` jumps when a fetch finds the key last written by another
    #: primary (:mod:`flakekit.sql.failover`; docs/replicated-databases.md)
    failover_skip: int = DEFAULT_FAILOVER_SKIP
    events: Events = NO_EVENTS
    _table: Table = attrs.field(init=False)
    #: per key, the end of the last range this store handed out: a fetch never ends
    #: below it (a database that went back is raised to it first)
    _high: dict[str, int] = attrs.field(init=False, factory=dict)
    _checked: bool = attrs.field(init=False, default=False)
    _version_ok: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._table = leaf_alloc_table(self.table_name)

    @classmethod
    def from_settings(cls, settings: SqlStoreSettings, ctx: BuildContext) -> SqlSegmentStore:
        """The registered factory: ``factory(settings, context)``."""
        engine = ctx.backends.engine(settings.backend, f"{ctx.path}.backend")
        watch_for(engine, settings.backend).listen(ctx.events)
        return cls(engine, settings.table, settings.failover_skip, ctx.events)

    # -- naming for messages ------------------------------------------------------------
    @property
    def where(self) -> str:
        """The database, without password, for messages."""
        return f"{self.table_name} at {self.engine.url.render_as_string(hide_password=True)}"

    def _backend_error(self, action: str, exc: BaseException) -> BackendError:
        return BackendError(with_stall_cause(
            self.engine, f"segment store {self.where}: {action} failed: {driver_message(exc)}"))

    def stall_cause(self) -> str | None:
        """Why commits wait now (an away synchronous standby), without waiting: for the
        generator's "did not answer within wait_budget"."""
        return stall_cause(self.engine)

    # -- schema ---------------------------------------------------------------------------
    def has_table(self) -> bool:
        try:
            return inspect(self.engine).has_table(self.table_name)
        except SQLAlchemyError as exc:
            raise self._backend_error("looking for the table", exc) from None

    @property
    def component(self) -> Component:
        """This table's schema component (``segments``)."""
        return segments_component(self.table_name)

    def init_schema(self) -> bool:
        """Create the table if it is missing (Leaf's DDL on MySQL/MariaDB), under the
        schema lock (:func:`flakekit.sql.schema.init_schema`). True if created."""
        if self.has_table():
            return False
        created = bool(init_schema(self.engine, self.component).created)
        if created:
            log.info("created segment table %s", self.where)
        self._checked = False
        return created

    def check_schema(self) -> None:
        """Raise :class:`SchemaError` unless the table exists with Leaf's columns."""
        if self._checked:
            return
        if not self.has_table():
            raise SchemaError(
                f"segment store {self.where}: table {self.table_name!r} does not exist; "
                "create it and a first key with `flakekit segments create KEY --step 1000` "
                "(or `flakekit db init`)"
            )
        try:
            columns = {c["name"].lower() for c in inspect(self.engine).get_columns(self.table_name)}
        except SQLAlchemyError as exc:
            raise self._backend_error("reading the table's columns", exc) from None
        missing = [c.name for c in self._table.columns if c.name not in columns]
        if missing:
            raise SchemaError(
                f"segment store {self.where}: table {self.table_name!r} lacks column(s) "
                f"{', '.join(missing)}; it is not a Leaf leaf_alloc table (expected biz_tag, "
                "max_id, step, description, update_time)"
            )
        check_schema(self.engine, self.component)  # refuses a version newer than this code
        self._checked = True

    def _check_version(self) -> None:
        """Once per store: refuse a ``segments`` schema newer than this code (its row in
        ``flakekit_schema``; a Leaf database has none and is version 1)."""
        comp = self.component
        try:
            with self.engine.connect() as conn:
                found = read_version(conn, comp.name)
        except SQLAlchemyError as exc:
            raise self._translate("reading the schema version", exc) from None
        if found is not None and found != comp.version:
            check_schema(self.engine, comp)  # the one-line newer/older message
        self._version_ok = True

    @contextmanager
    def _translating(self, action: str) -> Iterator[None]:
        """Database errors inside the block raised as flakekit errors (:meth:`_translate`)."""
        try:
            yield
        except SQLAlchemyError as exc:
            raise self._translate(action, exc) from None

    def _translate(self, action: str, exc: SQLAlchemyError) -> Exception:
        """A database error as a flakekit error; a missing table becomes a SchemaError."""
        missing_table = isinstance(exc, ProgrammingError) or (
            isinstance(exc, OperationalError) and "no such table" in str(exc)
        )
        if missing_table:
            self._checked = False
            try:
                if not self.has_table():
                    return SchemaError(
                        f"segment store {self.where}: table {self.table_name!r} does not "
                        "exist; create it with `flakekit segments create KEY --step 1000` "
                        "(or `flakekit db init`)"
                    )
            except BackendError:
                pass
        return self._backend_error(action, exc)

    # -- the one hot database operation ----------------------------------------------------
    def fetch(self, key: str, step: int | None = None,
              claim: KeyClaim | None = None) -> Allocation:
        """Advance ``max_id`` of ``key`` by ``step`` (None: by the row's ``step`` column)
        in one transaction and return the new range.

        With a ``claim`` (cluster mode's strict keys) the same transaction first locks the
        key's ``flakekit_key_owner`` row and checks it is still the claim's (node, epoch,
        not released); without one this is Leaf's fetch, unchanged.

        Raises:
            FenceError: the claim no longer holds the key (``max_id`` is unchanged).
            UnknownKeyError: no row for ``key``.
            SchemaError: the table is missing.
            BackendError: the database failed (nothing was allocated, or the allocation is
                simply lost: ``max_id`` only grows, so a lost range is never reissued).
        """
        stmt = self._advance_statement(key, step)
        if not self._version_ok:
            self._check_version()
        watch_for(self.engine).require(self.engine, f"fetch a segment of key {key!r}")
        detect = failover.detection_ready(self.engine)
        if detect:
            try:
                failover.prepare(self.engine, self._scope(key), under=self._table_scope)
            except SQLAlchemyError as exc:
                raise self._translate(f"fetching a segment of key {key!r}", exc) from None
        floor = self._high.get(key, 0)
        try:
            with self._transaction(claim, self.engine.dialect.update_returning) as conn:
                if claim is not None:
                    self._fence(conn, key, claim, "fetch")  # before max_id moves
                change, raised = self._defend(conn, key, detect, floor)
                row = self._advance(conn, key, stmt, step)
        except SQLAlchemyError as exc:
            raise self._translate(f"fetching a segment of key {key!r}", exc) from None
        max_id, db_step = row[0], row[1]
        if change is not None:
            failover.announce(change, self.where, f"key {key!r}: max_id skipped ahead by "
                              f"{self.failover_skip} before this range (it starts at "
                              f"{max_id - (db_step if step is None else step)})", self.events)
        elif raised:
            log.error("segment store %s: key %r: max_id was below %d, the end of this "
                      "process's last range: the database went back (a fail-over, a "
                      "restore?); raised to it before this fetch", self.where, key, floor)
        self._high[key] = max(floor, max_id)
        return Allocation(key, max_id, db_step if step is None else step, db_step)

    def _advance_statement(self, key: str, step: int | None) -> Any:
        """The UPDATE that moves ``max_id`` of ``key`` by ``step`` (None: the row's)."""
        t = self._table
        if step is not None and (
            isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_ID
        ):
            raise ValueError(f"step must be an integer from 1 to {MAX_ID}, got {step!r}")
        # only a row that can serve the fetch matches: max_id + step is never computed
        # past the column's range (CASE: no `MAX_ID - step` overflow for a step below 1)
        room: Any
        if step is None:
            increment: Any = t.c.step
            room = case((t.c.step >= 1, t.c.max_id <= literal(MAX_ID, BigInteger) - t.c.step),
                        else_=false())
        else:
            increment = step
            room = (t.c.step >= 1) & (t.c.max_id <= MAX_ID - step)
        return (
            update(t)
            .where(t.c.biz_tag == key, t.c.max_id >= 0, room)
            .values(max_id=t.c.max_id + increment, update_time=func.current_timestamp())
        )

    def _defend(self, conn: Any, key: str, detect: bool,
                floor: int) -> tuple[failover.PrimaryChange | None, int]:
        """Inside the fetch's transaction, before ``max_id`` moves: a fail-over since the
        last write skips the key ahead; a ``max_id`` below this process's own high-water
        ``floor`` (the database went back) is raised to it. Returns the change seen and
        how many rows were raised."""
        t = self._table
        change: failover.PrimaryChange | None = None
        current = None
        if detect:  # one round trip: the primary, its marker and max_id
            change, current = failover.check_primary_reading(
                conn, self._scope(key),
                f"(SELECT max_id FROM {self.table_name} WHERE biz_tag = :fk_key)",
                {"fk_key": key})
            if change is not None:
                self._skip_ahead(conn, key)
                failover.check_primary(conn, self._table_scope)  # keys after it
        raised = 0
        if floor and (not detect or change is not None or (
                isinstance(current, int) and current < floor)):
            raised = conn.execute(update(t).where(
                t.c.biz_tag == key, t.c.max_id < floor).values(max_id=floor)).rowcount
        return change, raised

    def _advance(self, conn: Any, key: str, stmt: Any, step: int | None) -> Any:
        """Run the UPDATE and read ``(max_id, step)`` back; a missing key, or a row no
        fetch can use, raises inside the transaction (it rolls back)."""
        t = self._table
        read_back = select(t.c.max_id, t.c.step).where(t.c.biz_tag == key)
        if self.engine.dialect.update_returning:
            row = conn.execute(stmt.returning(t.c.max_id, t.c.step)).first()
        else:
            result = conn.execute(stmt)
            row = conn.execute(read_back).first() if result.rowcount else None
        if row is None:  # no such key, or a row no fetch can use: say which
            bad = conn.execute(read_back).first()
            if bad is None:
                raise UnknownKeyError(key, f" (no row in {self.where})")
            raise self._refusal(key, bad[0], bad[1], step)
        if not (_is_int(row[0]) and _is_int(row[1])):
            # raised inside the transaction, so it rolls back (SQLite keeps what it is
            # given: a REAL max_id would pass the guard above); the message shows max_id
            # as it was stored
            raise self._refusal(key, _minus(row[0], row[1] if step is None else step),
                                row[1], step)
        return row

    def _scope(self, key: str) -> str:
        return f"segments:{self.table_name}:{key}"[:255]

    @property
    def _table_scope(self) -> str:
        """The table's marker: a key first fetched after a fail-over the table's row
        shows skips ahead (:func:`flakekit.sql.failover.prepare`)."""
        return f"segments:{self.table_name}"[:255]

    def _skip_ahead(self, conn: Connection, key: str) -> None:
        """After a detected fail-over: ``max_id`` past anything the old primary may have
        handed out and this replica never received (fenced: the marker row is locked)."""
        t = self._table
        skip = self.failover_skip
        conn.execute(update(t).where(t.c.biz_tag == key, t.c.max_id >= 0,
                                     t.c.max_id <= MAX_ID - skip)
                     .values(max_id=t.c.max_id + skip))

    def _refusal(self, key: str, max_id: object, step: object, increment: int | None) -> Exception:
        """The error for a row that cannot serve a fetch (nothing was allocated)."""
        problem = row_problem(max_id, step, increment)
        if problem is None:  # it was changed under us between the UPDATE and the read
            return BackendError(f"segment store {self.where}: key {key!r} changed during "
                                "the fetch; retrying")
        fix = (f"UPDATE {self.table_name} SET step = 1000 WHERE biz_tag = '{key}'"
               if problem.startswith("step") else
               f"UPDATE {self.table_name} SET max_id = N WHERE biz_tag = '{key}', N an "
               "integer above every ID the key has issued")
        room = None
        if problem.startswith("used up"):
            assert isinstance(max_id, int)
            room = MAX_ID - max_id
            fix = ("move its users to a new key (`flakekit segments create NEW --step N`); "
                   "this one cannot go further")
        return SegmentRowError(
            key, f"segment store {self.where}: key {key!r} cannot serve a segment: "
            f"{problem}; nothing was allocated. Fix: {fix}", room,
        )

    @contextmanager
    def _transaction(self, claim: KeyClaim | None, returning: bool) -> Iterator[Connection]:
        """The fetch's transaction: a fenced one holds its lock from the first read."""
        if claim is not None:
            with write_transaction(self.engine) as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            if not returning:
                self._no_autocommit(conn)  # UPDATE and SELECT must be one transaction
            with conn.begin():
                yield conn

    def _fence(self, conn: Connection, key: str, claim: KeyClaim, action: str) -> None:
        if claim.key != key and not _period_of(key, claim.key):
            raise ValueError(f"the claim is for key {claim.key!r}, not {key!r}")
        problem = key_owner.check_claim(conn, key_owner.valid_claim(claim), self.events)
        if problem is not None:
            raise FenceError(f"segment store {self.where}: node {claim.node!r} may not "
                             f"{action} key {key!r} at epoch {claim.epoch}: {problem}; "
                             "nothing was changed")

    # -- periodic counters (flakekit.sql.periods) ----------------------------------------
    def db_now(self) -> dt.datetime:
        """The database's current time (aware UTC): what decides a counter's period."""
        from flakekit.sql.periods import database_now

        return database_now(self)

    def ensure_period_key(self, key: str, step: int, start: int, description: str) -> bool:
        """Create a period row unless it exists (race-free); True if this call did."""
        from flakekit.sql.periods import ensure_period_key

        return ensure_period_key(self, key, step, start, description)

    # -- the key fence (cluster mode) -----------------------------------------------------
    def claim_key(self, claim: KeyClaim, waited: bool) -> bool:
        """Take a strict key for ``claim.node`` at ``claim.epoch`` (see
        :mod:`flakekit.sql.key_owner`)."""
        with self._translating(f"claiming key {claim.key!r}"):
            return key_owner.claim_key(self.engine, claim, waited, self.events)

    def release_key(self, claim: KeyClaim) -> bool:
        """Release a strict key, fenced by node and epoch."""
        with self._translating(f"releasing key {claim.key!r}"):
            return key_owner.release_key(self.engine, claim)

    def key_owners(self) -> list[KeyOwnerRecord]:
        """The key-owner table."""
        with self._translating("listing key owners"):
            return key_owner.key_owners(self.engine)

    def key_owner(self, key: str) -> KeyOwnerRecord | None:
        """``key``'s row of the key-owner table (None: never claimed)."""
        with self._translating(f"reading the owner of key {key!r}"):
            return key_owner.key_owner_of(self.engine, key)

    def _no_autocommit(self, conn: Connection) -> None:
        """Make sure ``conn`` runs a real transaction even on an AUTOCOMMIT engine."""
        dialect = self.engine.dialect
        try:
            raw = conn.connection.dbapi_connection
            autocommit = raw is not None and dialect.detect_autocommit_setting(raw)
        except NotImplementedError:
            autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        if autocommit:
            conn.execution_options(isolation_level=conn.default_isolation_level or "SERIALIZABLE")

    # -- shutdown -------------------------------------------------------------------------
    def give_back(self, key: str, expected_max_id: int, new_max_id: int,
                  claim: KeyClaim | None = None) -> bool:
        """Lower ``max_id`` to ``new_max_id`` only if it is still ``expected_max_id``.

        The caller must own every ID in ``[new_max_id, expected_max_id)`` and never hand
        any of them out again. Returns True if the row was changed (False: someone else
        fetched meanwhile, so the tail stays unused, as in Leaf). With a ``claim`` the
        owner row is checked first in the same transaction: a deposed owner's give-back
        returns False and changes nothing.
        """
        if not 0 <= new_max_id < expected_max_id <= MAX_ID:
            return False
        t = self._table
        stmt = (
            update(t)
            .where(t.c.biz_tag == key, t.c.max_id == expected_max_id)
            .values(max_id=new_max_id, update_time=func.current_timestamp())
        )
        try:
            if claim is None:
                with self.engine.begin() as conn:
                    done = conn.execute(stmt).rowcount == 1
                if done:
                    self._high[key] = new_max_id
                return done
            with write_transaction(self.engine) as conn:
                try:
                    self._fence(conn, key, claim, "give back")
                except FenceError as exc:
                    log.warning("%s", exc)
                    return False
                done = conn.execute(stmt).rowcount == 1
            if done:   # committed: nothing of this process's is above new_max_id now
                self._high[key] = new_max_id
            return done
        except SQLAlchemyError as exc:
            raise self._translate(f"giving back the tail of key {key!r}", exc) from None

    # -- keys -----------------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Every ``biz_tag`` in the table, sorted."""
        t = self._table
        with self._translating("listing keys"), self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(select(t.c.biz_tag)))

    def exists(self, key: str) -> bool:
        t = self._table
        with self._translating(f"looking up key {key!r}"), self.engine.connect() as conn:
            return conn.execute(select(t.c.biz_tag).where(t.c.biz_tag == key)).first() is not None

    def insert_key(self, key: str, start: int, step: int, description: str | None,
                   what: str) -> bool:
        """Insert a new key's row (creating the table first if needed); False if the key
        has a row already. ``what`` (``creating key 'x'``) names the work in a
        BackendError."""
        self.init_schema()
        try:
            detect = failover.detection_ready(self.engine)
            if detect:
                failover.prepare(self.engine, self._table_scope)
            with self.engine.begin() as conn:
                conn.execute(insert(self._table).values(
                    biz_tag=key, max_id=start, step=step, description=description,
                    update_time=func.current_timestamp()))
                if detect:  # a new key, not one first fetched after a fail-over
                    failover.mark_written(conn, self._scope(key))
        except IntegrityError:
            return False
        except SQLAlchemyError as exc:
            raise self._translate(what, exc) from None
        return True

    def info(self, key: str | None = None) -> list[KeyInfo]:
        """The rows (one key, or all), for ``flakekit segments``."""
        t = self._table
        stmt = select(t.c.biz_tag, t.c.max_id, t.c.step, t.c.description, t.c.update_time)
        if key is not None:
            stmt = stmt.where(t.c.biz_tag == key)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt.order_by(t.c.biz_tag)).all()
        except SQLAlchemyError as exc:
            raise self._translate("listing keys", exc) from None
        return [KeyInfo(r[0], r[1], r[2], r[3], r[4], row_problem(r[1], r[2])) for r in rows]

    def create(
        self, key: str, step: int, start: int = 1, description: str | None = None
    ) -> KeyInfo:
        """Insert a key (creating the table first if needed). The first ID will be ``start``.

        Raises:
            ConfigError: bad key, step or start, or the key exists already.
        """
        _check_key(key)
        check_new_range(step, start, max_step=MAX_DB_STEP, max_id=MAX_ID,
                        why=f" with step {step} (a fetch ends at start + step, which must "
                            f"not pass {MAX_ID}, the BIGINT column's maximum)")
        if description is not None and len(description) > 256:
            raise ConfigError("description", "must be at most 256 characters")
        if not self.insert_key(key, start, step, description, f"creating key {key!r}"):
            row = self.info(key)
            now = f" (max_id {row[0].max_id}, step {row[0].step})" if row else ""
            raise ConfigError(
                "KEY", f"segment key {key!r} already exists{now}; pick another name, or change "
                f"its step with UPDATE {self.table_name} SET step = N WHERE biz_tag = '{key}'"
            )
        return self.info(key)[0]
