"""Database schema of the SQL backends, versioned per component.

Every component (``workers`` here, ``segments`` in :mod:`flakekit.sql.leaf`) owns some
tables and one row in ``flakekit_schema(component, version)``. ``flakekit db init``
creates what is missing and records the version; start-up calls :func:`check_schema` so a
missing or older table fails with one message that says what to run, instead of an SQL
error in the middle of an acquire.

Why the columns look the way they do (``system_nodes``):

* seed 000's columns, primary key ``(service, machine_id)`` and its identity key
  ``(service, host, port)`` -- extended by ``slot`` (0 for the first process of a
  host:port). A second *live* process with the same host:port (a cloned VM, a
  mis-configured port) must take another id instead of sharing, and it needs a row of
  its own for that; ``slot`` numbers those rows. With one process per host:port the key
  behaves exactly like the seed's.
* ``machine_id`` is INTEGER, not SMALLINT: a Sonyflake layout has 16 machine bits
  (0..65535) and SMALLINT stops at 32767.
* ``host`` is INET on PostgreSQL (as in the seed) and VARCHAR(45) elsewhere; it holds an
  IP address. A host identity given as a name is resolved and the name kept in
  ``host_name`` (for people; it plays no part in matching).
* lease fields: ``holder`` (a per-process token, NULL once released), ``issued_until``
  (wall ns up to which the holder issued IDs: the restart high-water mark).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    func,
    inspect,
    select,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from flakekit.backends import redact_url
from flakekit.errors import SchemaError

__all__ = [
    "WORKERS_COMPONENT",
    "WORKERS_SCHEMA_VERSION",
    "check_schema",
    "create_tables",
    "init_schema",
    "metadata",
    "register_component",
    "schema_table",
    "system_nodes",
]

metadata = MetaData()

#: one row per component: which schema version its tables have
schema_table = Table(
    "flakekit_schema",
    metadata,
    Column("component", String(64), primary_key=True),
    Column("version", Integer, nullable=False),
)

#: timestamps with sub-second precision everywhere (MariaDB's DATETIME defaults to seconds)
_Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

system_nodes = Table(
    "system_nodes",
    metadata,
    Column("service", String(64), nullable=False),
    Column("machine_id", Integer, nullable=False),
    Column("host", String(45).with_variant(postgresql.INET(), "postgresql"), nullable=False),
    Column("port", Integer, nullable=False),
    Column("slot", Integer, nullable=False, server_default="0"),
    Column("version", Integer, nullable=False),
    Column("last_seen", _Timestamp, nullable=False, server_default=func.now()),
    Column("created_at", _Timestamp, nullable=False, server_default=func.now()),
    Column("holder", String(160), nullable=True),
    Column("host_name", String(255), nullable=False, server_default=""),
    Column("issued_until", BigInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("service", "machine_id", name="system_nodes_pkey"),
    UniqueConstraint("service", "host", "port", "slot", name="system_nodes_identity"),
)

WORKERS_COMPONENT = "workers"
WORKERS_SCHEMA_VERSION = 1

#: component -> (version, tables); other modules add theirs with register_component
_COMPONENTS: dict[str, tuple[int, tuple[Table, ...]]] = {
    WORKERS_COMPONENT: (WORKERS_SCHEMA_VERSION, (system_nodes,)),
}


def register_component(name: str, version: int, tables: Sequence[Table]) -> None:
    """Declare a component's tables and current schema version (idempotent)."""
    _COMPONENTS[name] = (version, tuple(tables))


def components() -> list[str]:
    return sorted(_COMPONENTS)


def _component(name: str) -> tuple[int, tuple[Table, ...]]:
    try:
        return _COMPONENTS[name]
    except KeyError:
        raise SchemaError(
            f"unknown schema component {name!r}; known: {', '.join(components())}"
        ) from None


def _where(engine: Engine) -> str:
    return redact_url(engine.url.render_as_string(hide_password=True))


def create_tables(engine: Engine, component: str, version: int, tables: Iterable[Table]) -> None:
    """Create ``tables`` if missing and record ``component`` at ``version``.

    Safe to run from many processes at once: a racing ``CREATE`` or version insert is
    ignored as long as the schema checks out afterwards.
    """
    tables = list(tables)
    try:
        with engine.begin() as conn:
            schema_table.create(conn, checkfirst=True)
            for table in tables:
                table.create(conn, checkfirst=True)
    except DBAPIError:  # someone else created them a moment ago
        pass
    try:
        with engine.begin() as conn:
            found = conn.execute(
                select(schema_table.c.version).where(schema_table.c.component == component)
            ).scalar_one_or_none()
            if found is None:
                conn.execute(schema_table.insert().values(component=component, version=version))
    except IntegrityError:
        pass
    _check(engine, component, version, tables)


def init_schema(engine: Engine, component: str) -> None:
    """Create the tables of ``component`` (``flakekit db init``); idempotent."""
    version, tables = _component(component)
    create_tables(engine, component, version, tables)


def check_schema(engine: Engine, component: str) -> None:
    """Raise :class:`SchemaError` unless ``component``'s tables are there and current."""
    version, tables = _component(component)
    _check(engine, component, version, tables)


def _check_lease_clock(engine: Engine, columns: Sequence[Mapping[str, Any]]) -> None:
    """``last_seen`` must not depend on the session time zone.

    A PostgreSQL ``TIMESTAMP`` (without time zone) stores ``now()`` in the writer's
    session zone and a MariaDB/MySQL ``TIMESTAMP`` converts through it, so a node whose
    session zone differs sees a live lease as hours old and reclaims it.
    """
    (col,) = [c for c in columns if c["name"] == "last_seen"]
    type_ = col["type"]
    name = engine.dialect.name
    if name == "postgresql":
        bad = not getattr(type_, "timezone", False)
        want = "TIMESTAMPTZ"
    elif name in ("mysql", "mariadb"):
        bad = not isinstance(type_, DateTime) or type(type_).__name__.upper() != "DATETIME"
        want = "DATETIME(6)"
    else:
        return
    if bad:
        raise SchemaError(
            f"system_nodes.last_seen in {_where(engine)} is {type_}, which depends on each "
            f"session's time zone (a node in another zone would reclaim live ids); stop "
            f"the nodes and change the column to {want} holding UTC"
        )


def _check(engine: Engine, component: str, version: int, tables: Sequence[Table]) -> None:
    fix = "run `flakekit db init` (with --config FILE for your config)"
    try:
        inspector = inspect(engine)
        existing = set(inspector.get_table_names())
        for table in (schema_table, *tables):
            if table.name not in existing:
                raise SchemaError(
                    f"table {table.name!r} does not exist in {_where(engine)}; {fix}, "
                    "or set create_schema = true on the allocator"
                )
            have = {col["name"] for col in inspector.get_columns(table.name)}
            missing = [col.name for col in table.columns if col.name not in have]
            if missing:
                raise SchemaError(
                    f"table {table.name!r} in {_where(engine)} is older than this "
                    f"flakekit: it lacks column(s) {', '.join(missing)}; {fix} after "
                    "moving the old table aside (its rows can be copied back)"
                )
            if table is system_nodes:
                _check_lease_clock(engine, inspector.get_columns(table.name))
        with engine.connect() as conn:
            found = conn.execute(
                select(schema_table.c.version).where(schema_table.c.component == component)
            ).scalar_one_or_none()
    except DBAPIError as exc:
        lines = str(exc.orig or exc).strip().splitlines()
        raise SchemaError(
            f"cannot read the flakekit schema in {_where(engine)}: "
            f"{lines[0] if lines else type(exc.orig or exc).__name__}"
        ) from None
    if found is None:
        raise SchemaError(
            f"the {component} tables in {_where(engine)} carry no schema version "
            f"(flakekit_schema has no {component!r} row); {fix}"
        )
    if found < version:
        raise SchemaError(
            f"the {component} schema in {_where(engine)} is version {found}, this "
            f"flakekit needs {version}; {fix} to upgrade it"
        )
    if found > version:
        raise SchemaError(
            f"the {component} schema in {_where(engine)} is version {found}, newer than "
            f"this flakekit understands ({version}); upgrade flakekit"
        )
