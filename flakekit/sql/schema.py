"""Database schema of the SQL backends: versioned components and their migrations.

A :class:`Component` (``workers`` here, ``segments`` in :mod:`flakekit.sql.leaf`, a
plugin's tables through :func:`register_component`) owns some tables, a current version
and the ordered :class:`Migration` steps from each older version; its version lives in
one row of ``flakekit_schema(component, version)``. ``flakekit db init`` creates what is
missing, ``flakekit db upgrade`` also applies the migrations, both under one schema lock
per database (PostgreSQL advisory lock, MariaDB ``GET_LOCK``, SQLite ``BEGIN
IMMEDIATE``), so two of them at once run one after the other. Start-up calls
:func:`check_schema`: a missing, older or newer schema fails with one line saying what to
run, instead of an SQL error in the middle of an acquire.

Versions of the ``workers`` component (``system_nodes``):

1. the tables as first released (databases created before versions 2 existed are this).
2. index ``system_nodes_service_seen (service, last_seen)``: the reclaim tiers and the
   stale-row counts filter a service's rows by ``last_seen``; without it each tier query
   of an acquire that reaches step 3 reads the service's whole range inside the
   serialised acquire transaction (a full Sonyflake range: 109 ms per acquire instead of
   51, ``benchmarks/bench_workers_index.py``).

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

The ``cluster`` component (cluster mode, docs/cluster.md): ``flakekit_members`` (a node
lease per member, ``last_seen`` on the database clock), ``flakekit_cluster_view`` (one
row per cluster, never deleted; ``epoch`` changes only by compare-and-set) and
``flakekit_key_owner`` (who owns each strict key at which epoch: the fence every segment
fetch checks). They are tables of their own so that ``leaf_alloc`` stays Leaf's. Version
1 is the first: ``flakekit db upgrade`` (or ``db init``) adds the three tables to an
existing database and touches nothing else. Version 2 adds ``flakekit_members.renewals``
(a counter every renewal bumps: a lapse is proven on the claimer's own clock, never by a
database wall-clock age) and ``flakekit_members.config_digest`` (the member's strict keys,
compared at the join).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.reflection import Inspector
from sqlalchemy.exc import DBAPIError

from flakekit.errors import SchemaError
from flakekit.sql.backends import redact_url
from flakekit.sql.transactions import sqlite_immediate

if TYPE_CHECKING:
    from flakekit.assembly.config import Config

__all__ = [
    "CLUSTER",
    "CLUSTER_COMPONENT",
    "CLUSTER_SCHEMA_VERSION",
    "WORKERS_COMPONENT",
    "WORKERS_SCHEMA_VERSION",
    "Component",
    "Migration",
    "SchemaChange",
    "check_schema",
    "cluster_view",
    "components",
    "get_component",
    "init_schema",
    "key_owner",
    "members",
    "metadata",
    "read_version",
    "register_component",
    "schema_lock",
    "schema_table",
    "system_nodes",
    "unregister_component",
    "upgrade_schema",
]

metadata = MetaData()

#: one row per component: which schema version its tables have (``workers:SERVICE`` rows
#: are the acquire locks of :mod:`flakekit.sql.workers`, not components)
schema_table = Table(
    "flakekit_schema",
    metadata,
    Column("component", String(64), primary_key=True),
    Column("version", Integer, nullable=False),
)


class _PerDialect(TypeDecorator[Any]):
    """``impl`` on most databases, another type on some (:meth:`variant`). A decorator,
    not ``with_variant``: a dialect's own type is imported when a connection of that
    dialect needs it, not with this module (importing ``sqlalchemy.dialects.mysql`` and
    ``.postgresql`` is a third of SQLAlchemy's import time, and ``flakekit next`` on
    SQLite needs neither)."""

    cache_ok = True

    def variant(self, dialect: str) -> Any:
        """The type on ``dialect``; None: ``impl``."""
        return None

    def load_dialect_impl(self, dialect: Any) -> Any:
        own = self.variant(dialect.name)
        return dialect.type_descriptor(own if own is not None else self.impl_instance)


class _TimestampType(_PerDialect):
    """``DateTime(timezone=True)``; on MariaDB/MySQL ``DATETIME(6)`` (its DATETIME
    defaults to whole seconds)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def variant(self, dialect: str) -> Any:
        if dialect in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import DATETIME

            return DATETIME(fsp=6)
        return None


class _HostType(_PerDialect):
    """``String(45)``; on PostgreSQL ``INET``."""

    impl = String(45)
    cache_ok = True

    def variant(self, dialect: str) -> Any:
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import INET

            return INET()
        return None


#: timestamps with sub-second precision everywhere (MariaDB's DATETIME defaults to seconds)
_Timestamp = _TimestampType()

system_nodes = Table(
    "system_nodes",
    metadata,
    Column("service", String(64), nullable=False),
    Column("machine_id", Integer, nullable=False),
    Column("host", _HostType(), nullable=False),
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
#: workers v2: the reclaim tiers select a service's rows by ``last_seen``
system_nodes_seen = Index("system_nodes_service_seen", system_nodes.c.service,
                          system_nodes.c.last_seen)

# -- cluster mode (component ``cluster``) ---------------------------------------------------
#: one row per (cluster, node): the node's membership lease
members = Table(
    "flakekit_members",
    metadata,
    Column("cluster", String(64), nullable=False),
    Column("node", String(128), nullable=False),
    Column("advertise", String(255), nullable=False, server_default=""),
    Column("weight", Integer, nullable=False, server_default="1"),
    Column("holder", String(160), nullable=False),       # the incarnation's random token
    Column("incarnation", BigInteger, nullable=False),   # +1 on every join: fencing token
    Column("state", String(16), nullable=False),         # alive | draining | left
    Column("last_seen", _Timestamp, nullable=False, server_default=func.now()),
    Column("lease_ms", Integer, nullable=False),         # the lease the holder renews
    # +1 at every renewal: a claimer proves a lapse by seeing it unchanged (version 2)
    Column("renewals", BigInteger, nullable=False, server_default="0"),
    # the digest of the member's strict-key config (cluster/agreement.py; version 2)
    Column("config_digest", String(160), nullable=False, server_default=""),
    PrimaryKeyConstraint("cluster", "node", name="flakekit_members_pkey"),
)
#: one row per cluster, never deleted; ``epoch`` only moves by ``WHERE epoch = :seen``
cluster_view = Table(
    "flakekit_cluster_view",
    metadata,
    Column("cluster", String(64), primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("members", Text, nullable=False),             # JSON [{node, advertise, weight}]
    Column("changed_at", _Timestamp, nullable=False, server_default=func.now()),
)
#: one row per strict key: its owner and the view epoch of the claim (the fence)
key_owner = Table(
    "flakekit_key_owner",
    metadata,
    Column("biz_tag", String(128), primary_key=True),
    Column("owner_node", String(128), nullable=False),
    Column("owner_epoch", BigInteger, nullable=False),
    Column("released", Boolean, nullable=False),
    Column("claimed_at", _Timestamp, nullable=False, server_default=func.now()),
)

#: a step: SQL text, or a function of the connection (for checks such as "if missing")
Step = str | Callable[[Connection], None]


def _steps(value: Mapping[str, Sequence[Step]]) -> dict[str, tuple[Step, ...]]:
    return {dialect: tuple(steps) for dialect, steps in value.items()}


@attrs.frozen
class Migration:
    """The steps that take a component's tables from one version to the next.

    ``steps`` maps a dialect name (``postgresql``, ``mysql`` -- MariaDB too --,
    ``sqlite``) or ``"*"`` (every other) to what to run. Steps must be safe to run again
    (``IF NOT EXISTS``, ``checkfirst``): MariaDB commits each DDL statement on its own, so
    a crash can leave a migration half applied and unrecorded.
    """

    from_version: int
    to_version: int
    steps: Mapping[str, tuple[Step, ...]] = attrs.field(converter=_steps)
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.from_version < self.to_version:
            raise ValueError(f"a migration goes up from version 1 or later, got "
                             f"{self.from_version} -> {self.to_version}")

    def steps_for(self, dialect: str) -> tuple[Step, ...]:
        if dialect in self.steps:
            return self.steps[dialect]
        if "*" in self.steps:
            return self.steps["*"]
        raise SchemaError(f"schema migration {self.from_version} -> {self.to_version} "
                          f"({self.description}) has no steps for {dialect}")


def _tables(value: Iterable[Table]) -> tuple[Table, ...]:
    return tuple(value)


def _in_order(migrations: Iterable[Migration]) -> tuple[Migration, ...]:
    return tuple(sorted(migrations, key=lambda m: m.from_version))


def _create_table(conn: Connection, table: Table) -> None:
    table.create(conn, checkfirst=True)


@attrs.frozen(kw_only=True)
class Component:
    """A set of tables with one version, and how to bring older tables up to it.

    Attributes:
        name: its row in ``flakekit_schema`` (at most 64 characters).
        version: the version this code creates and needs.
        tables: the tables at ``version`` (created by ``db init`` when missing).
        migrations: ``from_version -> to_version`` steps, a chain ending at ``version``.
        unrecorded: the version of tables that exist with no row (``segments``: a Leaf
            database is version 1 and nothing is written to it while it stays there);
            None refuses such tables.
        create: how to create one table (default: SQLAlchemy's DDL).
        check: further start-up checks, given the engine and an inspector.
        backends: for a plugin's component: which of a loaded config's backends need it
            (``db init`` and ``db upgrade`` then include it); None: someone else asks.
    """

    name: str = attrs.field(validator=attrs.validators.max_len(64))
    version: int
    tables: tuple[Table, ...] = attrs.field(converter=_tables)
    migrations: tuple[Migration, ...] = attrs.field(default=(), converter=_in_order)
    unrecorded: int | None = None
    create: Callable[[Connection, Table], None] = _create_table
    check: Callable[[Engine, Inspector], None] | None = None
    backends: Callable[[Any], Iterable[str]] | None = None

    def __attrs_post_init__(self) -> None:
        version = self.migrations[0].from_version if self.migrations else self.version
        for m in self.migrations:
            if m.from_version != version:
                raise ValueError(f"component {self.name!r}: migrations must follow each "
                                 f"other, found {m.from_version} after version {version}")
            version = m.to_version
        if version != self.version:
            raise ValueError(f"component {self.name!r}: the migrations end at version "
                             f"{version}, not at its version {self.version}")

    def path(self, found: int) -> tuple[Migration, ...]:
        """The migrations from ``found`` to :attr:`version`, in order."""
        path = tuple(m for m in self.migrations if m.from_version >= found)
        if found < self.version and (not path or path[0].from_version != found):
            raise SchemaError(f"the {self.name} schema is version {found}, and this "
                              f"flakekit has no migration from it (oldest: "
                              f"{self.migrations[0].from_version if self.migrations else '-'})")
        return path


@attrs.frozen
class SchemaChange:
    """What :func:`init_schema` / :func:`upgrade_schema` found and did."""

    component: str
    before: int | None  # None: the tables were missing
    after: int
    latest: int
    tables: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    applied: tuple[Migration, ...] = ()

    @property
    def pending(self) -> bool:
        """The tables are older than this code (``db init`` leaves them so)."""
        return self.after < self.latest

    @property
    def changed(self) -> bool:
        return bool(self.created or self.applied)

    def describe(self, config: str | None = None) -> str:
        """One line for ``db init`` / ``db upgrade``."""
        tables = ", ".join(f"created {t}" if t in self.created else t for t in self.tables)
        if self.applied:
            what = "; ".join(m.description or f"{m.from_version} -> {m.to_version}"
                             for m in self.applied)
            return (f"{self.component} schema upgraded from version {self.before} to "
                    f"{self.after}: {what} ({tables})")
        if self.pending:
            return (f"{self.component} schema is version {self.after}, this flakekit uses "
                    f"{self.latest}: run {upgrade_command(config)} ({tables})")
        state = "ready" if self.created else "up to date"
        return f"{self.component} schema {state} (version {self.after}; {tables})"


def upgrade_command(config: str | None = None) -> str:
    """The command to paste: ``config`` None (unknown here) says ``-c CONFIG``, ``""``
    (the embedded default) needs no ``-c``."""
    import shlex

    if config == "":
        return "`flakekit db upgrade`"
    return f"`flakekit db upgrade -c {shlex.quote(config) if config else 'CONFIG'}`"


def _check_lease_clock(engine: Engine, inspector: Inspector) -> None:
    """``last_seen`` must not depend on the session time zone.

    A PostgreSQL ``TIMESTAMP`` (without time zone) stores ``now()`` in the writer's
    session zone and a MariaDB/MySQL ``TIMESTAMP`` converts through it, so a node whose
    session zone differs sees a live lease as hours old and reclaims it.
    """
    (col,) = [c for c in inspector.get_columns("system_nodes") if c["name"] == "last_seen"]
    type_ = col["type"]
    name = engine.dialect.name
    if name == "postgresql":
        bad = not (isinstance(type_, DateTime) and type_.timezone)
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


WORKERS_COMPONENT = "workers"
WORKERS_SCHEMA_VERSION = 2

WORKERS = Component(
    name=WORKERS_COMPONENT,
    version=WORKERS_SCHEMA_VERSION,
    tables=(system_nodes,),
    migrations=(
        Migration(1, 2, {"*": (lambda conn: system_nodes_seen.create(conn, checkfirst=True),)},
                  "index system_nodes_service_seen (service, last_seen)"),
    ),
    unrecorded=1,  # tables without a row were made by hand from the version-1 DDL
    check=_check_lease_clock,
)

CLUSTER_COMPONENT = "cluster"
CLUSTER_SCHEMA_VERSION = 2


def _add_member_columns(conn: Connection) -> None:
    """Cluster 1 -> 2: the columns ``renewals`` and ``config_digest`` (if missing: a step
    is run again after a half-applied migration)."""
    have = {c["name"].lower() for c in inspect(conn).get_columns(members.name)}
    for name in ("renewals", "config_digest"):
        if name in have:
            continue
        col = members.c[name]
        default = "0" if name == "renewals" else "''"
        conn.execute(text(f"ALTER TABLE {members.name} ADD COLUMN {name} "
                          f"{col.type.compile(dialect=conn.dialect)} NOT NULL DEFAULT {default}"))


def _cluster_backends(config: Config) -> Iterable[str]:
    """The backend of a config's ``[cluster] membership = {type = "sql", ...}``
    (``"default"`` when not given); none without a ``[cluster]`` or with another
    membership. The key-owner table of strict generators is asked for by their segment
    stores."""
    spec = config.cluster
    if spec is None or spec.membership.type != "sql":
        return
    backend = spec.membership.settings.get("backend", "default")
    if isinstance(backend, str) and backend:
        yield backend


CLUSTER = Component(
    name=CLUSTER_COMPONENT,
    version=CLUSTER_SCHEMA_VERSION,
    tables=(members, cluster_view, key_owner),
    migrations=(
        Migration(1, 2, {"*": (_add_member_columns,)},
                  "flakekit_members: renewals and config_digest"),
    ),
    check=None,
    backends=_cluster_backends,
)

#: name -> component; plugins and other modules add theirs with register_component
_COMPONENTS: dict[str, Component] = {WORKERS.name: WORKERS, CLUSTER.name: CLUSTER}


def register_component(component: Component) -> Component:
    """Declare a component (a plugin's tables); registering it again replaces it."""
    _COMPONENTS[component.name] = component
    return component


def unregister_component(name: str) -> None:
    """Forget a component (tests that register their own)."""
    _COMPONENTS.pop(name, None)


def components() -> list[Component]:
    return [_COMPONENTS[name] for name in sorted(_COMPONENTS)]


def get_component(name: str | Component) -> Component:
    if isinstance(name, Component):
        return name
    try:
        return _COMPONENTS[name]
    except KeyError:
        raise SchemaError(
            f"unknown schema component {name!r}; known: "
            f"{', '.join(c.name for c in components())}"
        ) from None


def _where(engine: Engine | Connection) -> str:
    return redact_url(engine.engine.url.render_as_string(hide_password=True))


def _first_line(exc: DBAPIError) -> str:
    lines = str(exc.orig or exc).strip().splitlines()
    return lines[0] if lines else type(exc.orig or exc).__name__


# -- the lock -----------------------------------------------------------------------------
#: PostgreSQL advisory lock key / MariaDB lock name of schema changes
LOCK_NAME = "flakekit_schema"
_PG_LOCK_KEY = zlib.crc32(LOCK_NAME.encode())
#: how long a MariaDB ``db upgrade`` waits for another one (PostgreSQL: lock_timeout)
LOCK_WAIT_S = 120


@contextmanager
def schema_lock(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that holds the database's schema lock."""
    dialect = engine.dialect.name
    with engine.connect() as conn:
        if dialect == "sqlite":
            with sqlite_immediate(conn) as locked:
                yield locked
        elif dialect == "postgresql":
            with conn.begin():
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
                yield conn
        elif dialect in ("mysql", "mariadb"):
            got = conn.execute(text("SELECT GET_LOCK(:name, :wait)"),
                               {"name": LOCK_NAME, "wait": LOCK_WAIT_S}).scalar()
            conn.commit()
            if got != 1:
                raise SchemaError(f"another schema change in {_where(engine)} held the lock "
                                  f"{LOCK_NAME!r} for {LOCK_WAIT_S} s; try again once it ends")
            try:
                with conn.begin():  # DDL commits on its own here: steps must be re-runnable
                    yield conn
            finally:
                conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": LOCK_NAME})
                conn.commit()
        else:
            with conn.begin():
                yield conn


# -- reading and writing versions ---------------------------------------------------------
def read_version(conn: Connection, name: str) -> int | None:
    """The recorded version of component ``name`` (None: no row, or no table)."""
    if not inspect(conn).has_table(schema_table.name):
        return None
    return conn.execute(
        select(schema_table.c.version).where(schema_table.c.component == name)
    ).scalar_one_or_none()


def _record(conn: Connection, component: Component, version: int, had_row: bool) -> None:
    if had_row:
        conn.execute(update(schema_table).where(schema_table.c.component == component.name)
                     .values(version=version))
        return
    if version == component.unrecorded:  # e.g. a Leaf database stays untouched
        return
    schema_table.create(conn, checkfirst=True)
    conn.execute(schema_table.insert().values(component=component.name, version=version))


def _newer(component: Component, found: int, where: str) -> SchemaError:
    from flakekit.__about__ import __version__

    return SchemaError(
        f"the {component.name} schema in {where} is version {found}, newer than this "
        f"flakekit {__version__} understands (version {component.version}); upgrade "
        "flakekit to the release that upgraded the database"
    )


def _ensure(conn: Connection, component: Component, upgrade: bool) -> SchemaChange:
    """Under the schema lock: create what is missing, then (``upgrade``) migrate."""
    existing = set(inspect(conn).get_table_names())
    found = read_version(conn, component.name)
    had_row = found is not None
    present = [t for t in component.tables if t.name in existing]
    missing = [t for t in component.tables if t.name not in existing]
    if found is None and present:
        if component.unrecorded is None:
            raise SchemaError(
                f"the {component.name} tables in {_where(conn)} carry no schema version "
                f"(flakekit_schema has no {component.name!r} row); record the version "
                "they have by hand"
            )
        found = component.unrecorded
    for table in missing:
        component.create(conn, table)
    created = tuple(t.name for t in missing)
    names = tuple(t.name for t in component.tables)
    if found is None:  # a fresh database: the tables are the latest
        _record(conn, component, component.version, had_row)
        return SchemaChange(component.name, None, component.version, component.version,
                            names, created)
    if found > component.version:
        raise _newer(component, found, _where(conn))
    if found == component.version or not upgrade:
        return SchemaChange(component.name, found, found, component.version, names, created)
    applied = component.path(found)
    version = found
    for migration in applied:
        for step in migration.steps_for(conn.dialect.name):
            if isinstance(step, str):
                conn.execute(text(step))
            else:
                step(conn)
        version = migration.to_version
        _record(conn, component, version, had_row)  # MariaDB: progress survives a crash
        had_row = had_row or version != component.unrecorded
    return SchemaChange(component.name, found, version, component.version, names, created,
                        applied)


def _locked(engine: Engine, component: Component, upgrade: bool) -> SchemaChange:
    try:
        with schema_lock(engine) as conn:
            return _ensure(conn, component, upgrade)
    except DBAPIError as exc:
        raise SchemaError(f"cannot {'upgrade' if upgrade else 'create'} the "
                          f"{component.name} tables in {_where(engine)}: "
                          f"{_first_line(exc)}") from None


def init_schema(engine: Engine, component: str | Component) -> SchemaChange:
    """Create the missing tables of ``component`` (``flakekit db init``); idempotent.

    Existing tables are not changed: an older version stays older (see
    :attr:`SchemaChange.pending`), a newer one raises :class:`SchemaError`.
    """
    comp = get_component(component)
    change = _locked(engine, comp, upgrade=False)
    if not change.pending:
        check_schema(engine, comp)
    return change


def upgrade_schema(engine: Engine, component: str | Component) -> SchemaChange:
    """Create what is missing and apply the migrations in order (``flakekit db
    upgrade``); idempotent, and serialised with any other upgrade of the database."""
    comp = get_component(component)
    change = _locked(engine, comp, upgrade=True)
    check_schema(engine, comp)
    return change


def check_schema(engine: Engine, component: str | Component) -> None:
    """Raise :class:`SchemaError` unless ``component``'s tables are there and current."""
    comp = get_component(component)
    fix = "run `flakekit db init` (with --config FILE for your config)"
    try:
        inspector = inspect(engine)
        existing = set(inspector.get_table_names())
        for table in comp.tables:
            if table.name not in existing:
                raise SchemaError(
                    f"table {table.name!r} does not exist in {_where(engine)}; {fix}, "
                    "or set create_schema = true on the allocator"
                )
            have = {col["name"].lower() for col in inspector.get_columns(table.name)}
            absent = [col.name for col in table.columns if col.name not in have]
            if absent:
                raise SchemaError(
                    f"table {table.name!r} in {_where(engine)} is older than this "
                    f"flakekit: it lacks column(s) {', '.join(absent)}; {fix} after "
                    "moving the old table aside (its rows can be copied back)"
                )
        if comp.check is not None:
            comp.check(engine, inspector)
        with engine.connect() as conn:
            found = read_version(conn, comp.name)
    except DBAPIError as exc:
        raise SchemaError(
            f"cannot read the flakekit schema in {_where(engine)}: {_first_line(exc)}"
        ) from None
    if found is None:
        if comp.unrecorded is None:
            raise SchemaError(
                f"the {comp.name} tables in {_where(engine)} carry no schema version "
                f"(flakekit_schema has no {comp.name!r} row); {fix}"
            )
        found = comp.unrecorded
    if found < comp.version:
        raise SchemaError(
            f"the {comp.name} schema in {_where(engine)} is version {found}, this "
            f"flakekit needs {comp.version}; run {upgrade_command()}"
        )
    if found > comp.version:
        raise _newer(comp, found, _where(engine))
