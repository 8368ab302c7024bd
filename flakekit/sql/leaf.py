"""SqlSegmentStore: Leaf's ``leaf_alloc`` table, read and advanced with SQLAlchemy Core.

The table is Meituan Leaf's, column for column, so a Leaf MySQL database works unchanged
and a Leaf server can keep running next to flakekit during a migration: both advance
``max_id`` with the same single-row update, and the row lock serialises them.

A fetch is one transaction: ``UPDATE leaf_alloc SET max_id = max_id + step`` followed by
reading the row back (``RETURNING`` where the dialect has it). The new range is
``[max_id - step, max_id)``. Nothing else is ever written except by :meth:`create` and by
the compare-and-set of :meth:`give_back`, which only lowers ``max_id`` when it still equals
the end of the caller's own last range (so nobody handed anything out above it).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.exc import (
    IntegrityError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)

from flakekit.errors import BackendError, ConfigError, SchemaError, UnknownKeyError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = [
    "LEAF_MYSQL_DDL",
    "Allocation",
    "KeyInfo",
    "SqlSegmentStore",
    "SqlStoreSettings",
    "leaf_alloc_table",
]

log = logging.getLogger("flakekit.segment")

#: ``step`` is ``int(11)`` in Leaf's DDL
MAX_DB_STEP = 2**31 - 1
#: ``max_id`` is a signed 64-bit column
MAX_ID = 2**63 - 1

#: Leaf's own DDL (``scripts/leaf_alloc.sql``), used verbatim on MySQL and MariaDB so a
#: table flakekit creates is byte-for-byte what Leaf would have created.
LEAF_MYSQL_DDL = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    "biz_tag varchar(128) NOT NULL DEFAULT '', "
    "max_id bigint(20) NOT NULL DEFAULT '1', "
    "step int(11) NOT NULL, "
    "description varchar(256) DEFAULT NULL, "
    "update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, "
    "PRIMARY KEY (biz_tag)) ENGINE=InnoDB"
)


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


def _validate_table_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if not value.replace("_", "").isalnum() or not value[:1].isalpha():
        raise ValueError(f"a table name must be letters, digits and '_' , got {value!r}")


@attrs.frozen
class SqlStoreSettings:
    """``store = {type = "sql", ...}`` of a segment generator.

    Attributes:
        backend: the ``[backends.NAME]`` holding the table (default ``"default"``).
        table: the table name (default ``"leaf_alloc"``, Leaf's; change it only to keep
            several independent Leaf-style tables in one database).
    """

    backend: str = attrs.field(default="default", validator=attrs.validators.instance_of(str))
    table: str = attrs.field(
        default="leaf_alloc",
        validator=[attrs.validators.instance_of(str), _validate_table_name],
    )


@attrs.frozen
class Allocation:
    """One successful fetch: the row as it was right after the update.

    Attributes:
        key: the ``biz_tag``.
        max_id: ``max_id`` after the update: the end (exclusive) of the new range.
        step: how far this fetch advanced ``max_id`` (the range length).
        db_step: the row's ``step`` column (the floor of the dynamic step).
    """

    key: str
    max_id: int
    step: int
    db_step: int

    @property
    def start(self) -> int:
        return self.max_id - self.step


@attrs.frozen
class KeyInfo:
    """One ``leaf_alloc`` row, for listings."""

    key: str
    max_id: int
    step: int
    description: str | None
    update_time: dt.datetime | None

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "max_id": self.max_id,
            "step": self.step,
            "description": self.description,
            "update_time": self.update_time.isoformat() if self.update_time else None,
        }


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > 128:
        raise ConfigError("key", f"a segment key is a non-empty string of at most 128 characters, got {key!r}")
    return key


@attrs.define
class SqlSegmentStore:
    """Leaf-style ranges per key in one SQL table (PostgreSQL, MariaDB/MySQL, SQLite).

    Thread-safe: every method is one short transaction on a pooled connection.
    """

    engine: Engine
    table_name: str = "leaf_alloc"
    _table: Table = attrs.field(init=False)
    _checked: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._table = leaf_alloc_table(self.table_name)

    @classmethod
    def from_settings(cls, settings: SqlStoreSettings, ctx: object) -> SqlSegmentStore:
        """The registered factory: ``factory(settings, context)``."""
        path = getattr(ctx, "path", "store")
        engine = ctx.backends.engine(settings.backend, f"{path}.backend")  # type: ignore[attr-defined]
        return cls(engine, settings.table)

    # -- naming for messages ------------------------------------------------------------
    @property
    def where(self) -> str:
        """The database, without password, for messages."""
        return f"{self.table_name} at {self.engine.url.render_as_string(hide_password=True)}"

    def _backend_error(self, action: str, exc: BaseException) -> BackendError:
        orig = getattr(exc, "orig", None) or exc
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        return BackendError(f"segment store {self.where}: {action} failed: {first}")

    # -- schema ---------------------------------------------------------------------------
    def has_table(self) -> bool:
        try:
            return inspect(self.engine).has_table(self.table_name)
        except SQLAlchemyError as exc:
            raise self._backend_error("looking for the table", exc) from None

    def init_schema(self) -> bool:
        """Create the table if it is missing (Leaf's DDL on MySQL/MariaDB). True if created."""
        if self.has_table():
            return False
        try:
            with self.engine.begin() as conn:
                if self.engine.dialect.name in ("mysql", "mariadb"):
                    conn.execute(text(LEAF_MYSQL_DDL.format(table=self.table_name)))
                else:
                    self._table.metadata.create_all(conn, tables=[self._table], checkfirst=True)
        except SQLAlchemyError as exc:
            if self.has_table():  # another process created it at the same moment
                return False
            raise self._backend_error("creating the table", exc) from None
        log.info("created segment table %s", self.where)
        self._checked = False
        return True

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
        self._checked = True

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
    def fetch(self, key: str, step: int | None = None) -> Allocation:
        """Advance ``max_id`` of ``key`` by ``step`` (None: by the row's ``step`` column)
        in one transaction and return the new range.

        Raises:
            UnknownKeyError: no row for ``key``.
            SchemaError: the table is missing.
            BackendError: the database failed (nothing was allocated, or the allocation is
                simply lost: ``max_id`` only grows, so a lost range is never reissued).
        """
        t = self._table
        if step is not None and not (1 <= step <= MAX_ID):
            raise ValueError(f"step must be at least 1, got {step}")
        increment = t.c.step if step is None else step
        stmt = (
            update(t)
            .where(t.c.biz_tag == key)
            .values(max_id=t.c.max_id + increment, update_time=func.current_timestamp())
        )
        returning = self.engine.dialect.update_returning
        try:
            with self.engine.connect() as conn:
                if not returning:
                    self._no_autocommit(conn)  # UPDATE and SELECT must be one transaction
                with conn.begin():
                    if returning:
                        row = conn.execute(stmt.returning(t.c.max_id, t.c.step)).first()
                    else:
                        result = conn.execute(stmt)
                        row = None
                        if result.rowcount:
                            row = conn.execute(
                                select(t.c.max_id, t.c.step).where(t.c.biz_tag == key)
                            ).first()
                    if row is not None and int(row[1]) < 1:
                        # raised inside the transaction, so it rolls back: a step of 0 or
                        # below must never move max_id (lowering it would reissue IDs)
                        raise SchemaError(
                            f"segment store {self.where}: key {key!r} has step {int(row[1])}; "
                            f"a step must be at least 1 (UPDATE {self.table_name} SET step = "
                            f"1000 WHERE biz_tag = '{key}')"
                        )
        except SQLAlchemyError as exc:
            raise self._translate(f"fetching a segment of key {key!r}", exc) from None
        if row is None:
            raise UnknownKeyError(key, f" (no row in {self.where})")
        max_id, db_step = int(row[0]), int(row[1])
        return Allocation(key, max_id, db_step if step is None else step, db_step)

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
    def give_back(self, key: str, expected_max_id: int, new_max_id: int) -> bool:
        """Lower ``max_id`` to ``new_max_id`` only if it is still ``expected_max_id``.

        The caller must own every ID in ``[new_max_id, expected_max_id)`` and never hand
        any of them out again. Returns True if the row was changed (False: someone else
        fetched meanwhile, so the tail stays unused, as in Leaf).
        """
        if new_max_id >= expected_max_id:
            return False
        t = self._table
        stmt = (
            update(t)
            .where(t.c.biz_tag == key, t.c.max_id == expected_max_id)
            .values(max_id=new_max_id, update_time=func.current_timestamp())
        )
        try:
            with self.engine.begin() as conn:
                return conn.execute(stmt).rowcount == 1
        except SQLAlchemyError as exc:
            raise self._translate(f"giving back the tail of key {key!r}", exc) from None

    # -- keys -----------------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Every ``biz_tag`` in the table, sorted."""
        t = self._table
        try:
            with self.engine.connect() as conn:
                return sorted(r[0] for r in conn.execute(select(t.c.biz_tag)))
        except SQLAlchemyError as exc:
            raise self._translate("listing keys", exc) from None

    def exists(self, key: str) -> bool:
        t = self._table
        try:
            with self.engine.connect() as conn:
                return conn.execute(select(t.c.biz_tag).where(t.c.biz_tag == key)).first() is not None
        except SQLAlchemyError as exc:
            raise self._translate(f"looking up key {key!r}", exc) from None

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
        return [KeyInfo(r[0], int(r[1]), int(r[2]), r[3], r[4]) for r in rows]

    def create(
        self, key: str, step: int, start: int = 1, description: str | None = None
    ) -> KeyInfo:
        """Insert a key (creating the table first if needed). The first ID will be ``start``.

        Raises:
            ConfigError: bad key, step or start, or the key exists already.
        """
        _check_key(key)
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_DB_STEP:
            raise ConfigError("step", f"must be an integer from 1 to {MAX_DB_STEP}, got {step!r}")
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < MAX_ID:
            raise ConfigError("start", f"must be an integer from 0 to {MAX_ID - 1}, got {start!r}")
        if description is not None and len(description) > 256:
            raise ConfigError("description", "must be at most 256 characters")
        self.init_schema()
        t = self._table
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(t).values(
                        biz_tag=key, max_id=start, step=step, description=description,
                        update_time=func.current_timestamp(),
                    )
                )
        except IntegrityError:
            row = self.info(key)
            now = f" (max_id {row[0].max_id}, step {row[0].step})" if row else ""
            raise ConfigError(
                "KEY", f"segment key {key!r} already exists{now}; pick another name, or change "
                f"its step with UPDATE {self.table_name} SET step = N WHERE biz_tag = '{key}'"
            ) from None
        except SQLAlchemyError as exc:
            raise self._translate(f"creating key {key!r}", exc) from None
        return self.info(key)[0]
