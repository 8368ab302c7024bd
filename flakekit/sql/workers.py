"""The SQL worker registry: seed 000's ``system_nodes`` algorithm with seed 002's leases.

One acquire is one transaction (seed 000):

1. reuse the row of this ``(service, host, port)`` -- but only one that no live lease
   holds (released on clean shutdown, or silent for longer than the shortest reclaim
   age), so a clone or a second process on the same host:port never shares an id;
2. else insert the lowest free id of the layout's worker range (a unique conflict means
   a race: retry);
3. else reclaim the row with the oldest-qualifying ``last_seen`` through the tiers
   (default 7 d, 1 d, 1 h; ``FOR UPDATE SKIP LOCKED``); the last tier fires an alert;
   then, still safe, a row its holder released;
4. else fail start-up with a message saying what to do.

Every acquisition increments ``version``: it is the lease epoch (fencing token). The
heartbeat updates the row only where ``holder`` and ``version`` are still ours, and
``last_seen`` always comes from the database clock (``now()``), never from the node.

Lease math: a row is reclaimable once its ``last_seen`` (database time of the last
heartbeat, which is after that heartbeat was sent) is older than the shortest tier. The
holder stops issuing at ``send + shortest tier - safety window`` on its own monotonic
clock, so it has stopped a safety window before anyone may take the id -- even when it
cannot reach the database, or was paused.

Acquirers of one database serialise on the ``workers`` row of ``flakekit_schema`` (a
row lock on PostgreSQL/MariaDB, the write lock on SQLite), so 256 simultaneous starters
queue for a few milliseconds each instead of racing for the same lowest id.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from sqlalchemy import and_, case, func, literal, literal_column, or_, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from flakekit.clock import Clock
from flakekit.errors import (
    BackendError,
    LeaseLostError,
    SchemaError,
    WaitTooLongError,
    WorkerExhaustedError,
)
from flakekit.events import NO_EVENTS, Events
from flakekit.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.sql.schema import (
    WORKERS_COMPONENT,
    check_schema,
    init_schema,
    schema_table,
    system_nodes,
)

__all__ = [
    "DEFAULT_TIERS_NS",
    "SqlWorkerAllocator",
    "db_now",
    "db_now_minus",
    "resolve_host",
]

log = logging.getLogger("flakekit.sql.workers")

NS = 1_000_000_000
DEFAULT_TIERS_NS = (7 * 86400 * NS, 86400 * NS, 3600 * NS)
#: share of the worker range above which every acquire raises a capacity alert (seed 002)
CAPACITY_ALERT_RATIO = 0.8
#: attempts of one acquire after unique conflicts or deadlocks
MAX_ATTEMPTS = 50

_t = system_nodes.c


# -- database clock ------------------------------------------------------------------------
def _dialect(engine_or_conn: Engine | Connection) -> str:
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


def _aware(value: Any) -> dt.datetime | None:
    """Rows come back naive on MariaDB/SQLite (stored as UTC) and aware on PostgreSQL."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value


# -- host identity --------------------------------------------------------------------------
def _primary_address() -> str:
    """The address this host uses to reach the outside (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
            return sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def resolve_host(value: str) -> tuple[str, str]:
    """``(ip, name)`` for a host identity that is an IP address, a name or empty.

    ``system_nodes.host`` is an INET column (seed 000), so a name is resolved to its
    first address; the name is kept for display. Empty means "this host's primary
    address". Raises ValueError when a name does not resolve.
    """
    value = (value or "").strip()
    if not value:
        return _primary_address(), socket.gethostname()
    try:
        return str(ipaddress.ip_address(value)), ""
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(value, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise ValueError(
            f"host {value!r} is neither an IP address nor a name that resolves ({exc}); "
            "set host = \"10.0.0.5\" (this node's address) in the allocator settings"
        ) from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # prefer IPv4
    return str(ipaddress.ip_address(infos[0][4][0])), value


def _new_token(ip: str, port: int) -> str:
    return f"{ip}:{port}/pid{os.getpid()}/{uuid.uuid4().hex[:12]}"


def _is_retryable(exc: SQLAlchemyError) -> bool:
    """A unique conflict (someone raced us), a deadlock or a serialisation failure."""
    if not isinstance(exc, DBAPIError):  # e.g. the pool's TimeoutError
        return False
    if isinstance(exc, IntegrityError):
        return True
    text_ = str(exc.orig or exc).lower()
    return isinstance(exc, OperationalError) and any(
        word in text_ for word in ("deadlock", "serializ", "database is locked", "lock wait")
    )


def _db_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    if orig is exc and isinstance(exc, SQLAlchemyError) and exc.args:
        orig = exc.args[0]  # without SQLAlchemy's "(Background on this error ...)"
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


# -- the allocator --------------------------------------------------------------------------
@attrs.define
class SqlWorkerAllocator:
    """Worker ids leased from ``system_nodes`` (see the module docstring).

    Args:
        engine: the backend's engine (owned by the backend pool; never disposed here).
        service: the row namespace (seed 000's ``service``).
        clock: the generator's clock; deadlines are on its monotonic timeline.
        host, port: this process's identity; ``host`` may be an IP, a name or empty.
        heartbeat_ns: renewal period (``renew_interval``).
        tiers_ns: reclaim ages, oldest first; the shortest one bounds every lease.
        safety_window_ns: a lease ends this long before its row may be reclaimed.
        create_schema: create missing tables at start-up instead of failing.
        max_start_wait_ns: the longest wait for a reused id's high-water mark.
        events: where alerts go.
    """

    engine: Engine
    service: str
    clock: Clock
    host: str = ""
    port: int = 0
    heartbeat_ns: int = 10 * NS
    tiers_ns: tuple[int, ...] = DEFAULT_TIERS_NS
    safety_window_ns: int = 5 * NS
    create_schema: bool = False
    max_start_wait_ns: int = 10 * NS
    events: Events = NO_EVENTS
    _ip: str = attrs.field(init=False, default="")
    _host_name: str = attrs.field(init=False, default="")
    _held: dict[int, str] = attrs.field(init=False, factory=dict)
    _schema_ok: bool = attrs.field(init=False, default=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        if not self.tiers_ns:
            raise ValueError("reclaim tiers must not be empty")
        if self.lease_ns <= self.heartbeat_ns:
            raise ValueError(
                f"the shortest reclaim age ({self.min_tier_ns / NS:g} s) minus the safety "
                f"window ({self.safety_window_ns / NS:g} s) must exceed the heartbeat "
                f"({self.heartbeat_ns / NS:g} s), or every lease lapses between heartbeats"
            )
        self._ip, self._host_name = resolve_host(self.host)

    # -- derived numbers --------------------------------------------------------------------
    @property
    def renew_interval(self) -> float:
        return self.heartbeat_ns / NS

    @property
    def min_tier_ns(self) -> int:
        return min(self.tiers_ns)

    @property
    def lease_ns(self) -> int:
        """How long one successful heartbeat keeps the lease valid."""
        return self.min_tier_ns - self.safety_window_ns

    @property
    def dialect(self) -> str:
        return _dialect(self.engine)

    @property
    def identity(self) -> str:
        return f"{self._ip}:{self.port}"

    # -- schema -------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create (if allowed) and check the tables once per allocator."""
        if self._schema_ok:
            return
        try:
            check_schema(self.engine, WORKERS_COMPONENT)
        except SchemaError:
            if not self.create_schema:
                raise
            init_schema(self.engine, WORKERS_COMPONENT)
        self._schema_ok = True

    # -- acquire ------------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        """Lease a worker id in ``0..request.max_worker_id`` (one transaction, retried)."""
        self._wrap(self.ensure_schema)
        if request.host and not self.host:  # the request's identity, unless overridden
            self._ip, self._host_name = resolve_host(request.host)
        port = self.port or request.port
        token = _new_token(self._ip, port)
        for attempt in range(MAX_ATTEMPTS):
            send_mono = self.clock.monotonic_ns()
            bound = self.clock.time_ns() + self.lease_ns
            try:
                with self.engine.begin() as conn:
                    row, how = self._acquire_in(conn, request.max_worker_id, port, token,
                                                request.instance, bound)
                    self._check_wait(row, how)
                    allocated = conn.execute(
                        select(func.count()).select_from(system_nodes).where(
                            _t.service == self.service, _t.machine_id <= request.max_worker_id)
                    ).scalar_one()
            except SQLAlchemyError as exc:
                if _is_retryable(exc) and attempt + 1 < MAX_ATTEMPTS:
                    log.debug("acquire attempt %d of %s: %s; retrying", attempt + 1,
                              self.service, _db_message(exc))
                    time.sleep(min(0.002 * (attempt + 1), 0.05))
                    continue
                raise BackendError(
                    f"cannot acquire a worker id for service {self.service!r}: "
                    f"{_db_message(exc)}"
                ) from None
            break
        worker_id, version, issued_until = row
        with self._lock:
            self._held[worker_id] = token
        log.info("%s: %s worker %d (version %d) for %s", self.service, how, worker_id,
                 version, self.identity)
        size = request.max_worker_id + 1
        if allocated > CAPACITY_ALERT_RATIO * size:
            self.events.alert(
                "worker-capacity",
                f"service {self.service!r} has {allocated} of {size} worker ids allocated "
                f"(over {CAPACITY_ALERT_RATIO:.0%}); plan a layout with more worker bits",
                {"service": self.service, "allocated": allocated, "size": size},
            )
        return WorkerLease(
            worker_id=worker_id, epoch=version, holder=token, ttl=self.lease_ns / NS,
            deadline_ns=send_mono + self.lease_ns, not_before_ns=issued_until,
            stamp_until_ns=max(bound, issued_until),  # what the row now holds
        )

    def _check_wait(self, row: tuple[int, int, int], how: str) -> None:
        gap = row[2] - self.clock.time_ns()
        if gap > self.max_start_wait_ns:
            raise WaitTooLongError(
                f"worker {row[0]} of service {self.service!r} ({how}) was used for IDs up "
                f"to {gap / NS:.3f} s in the future of this host's clock, more than "
                f"max_start_wait ({self.max_start_wait_ns / NS:g} s); fix the clock (NTP) "
                "or raise max_start_wait"
            )

    def _acquire_in(
        self, conn: Connection, max_id: int, port: int, token: str, instance: int = 0,
        bound: int = 0,
    ) -> tuple[tuple[int, int, int], str]:
        """The body of the acquire transaction: ((id, version, issued_until), how)."""
        dialect = _dialect(conn)
        # Serialise acquirers: the first statement is a write, so it also takes SQLite's
        # write lock at once (like BEGIN IMMEDIATE) and PostgreSQL/MariaDB's row lock.
        locked = conn.execute(
            update(schema_table).where(schema_table.c.component == WORKERS_COMPONENT)
            .values(version=schema_table.c.version)
        ).rowcount
        if not locked:
            raise SchemaError(f"flakekit_schema has no {WORKERS_COMPONENT!r} row; "
                              "run `flakekit db init`")
        now = db_now(dialect)
        lapsed = db_now_minus(dialect, self.min_tier_ns)
        mine = and_(_t.service == self.service, _t.host == self._ip, _t.port == port)
        take: dict[str, Any] = dict(holder=token, version=_t.version + 1, last_seen=now,
                    host_name=self._host_name, issued_until=self._raise_mark(bound))

        # 1. reuse this host:port's row, if no live lease holds it
        row = conn.execute(
            select(_t.machine_id, _t.version, _t.issued_until)
            .where(mine, _t.machine_id <= max_id,
                   or_(_t.holder.is_(None), _t.last_seen < lapsed))
            # an instance gets its own row back first (a server's worker process N)
            .order_by(case((_t.slot == instance, 0), else_=1), _t.slot, _t.machine_id).limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if row is not None:
            return self._take(conn, row, take), "reused"

        slots = set(conn.execute(select(_t.slot).where(mine)).scalars())
        slot = instance if instance not in slots else next(
            i for i in range(len(slots) + 1) if i not in slots)
        if slot and not instance:  # siblings (instance > 0) are expected to share host:port
            log.warning(
                "%s: %s already holds a live worker lease (another process with the same "
                "host:port: a clone or a second instance?); taking a separate id",
                self.service, f"{self._ip}:{port}",
            )

        # 2. the lowest free id
        free = self._lowest_free(conn, max_id)
        if free is not None:
            conn.execute(system_nodes.insert().values(
                service=self.service, machine_id=free, host=self._ip, port=port, slot=slot,
                version=1, last_seen=now, created_at=now, holder=token,
                host_name=self._host_name, issued_until=bound,
            ))
            return (free, 1, 0), "allocated"

        # 3. reclaim through the tiers, then released rows
        take.update(host=self._ip, port=port, slot=slot)
        last = len(self.tiers_ns) - 1
        for i, tier in enumerate(self.tiers_ns):
            row = conn.execute(
                select(_t.machine_id, _t.version, _t.issued_until)
                .where(_t.service == self.service, _t.machine_id <= max_id,
                       _t.last_seen < db_now_minus(dialect, tier))
                .order_by(_t.machine_id).limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                continue
            if i == last:
                self.events.alert(
                    "worker-reclaim",
                    f"service {self.service!r}: every worker id is taken; reclaiming "
                    f"worker {row[0]} silent for over {tier / NS:g} s (the last tier) -- "
                    "abnormal: check for crashing or flapping nodes",
                    {"service": self.service, "worker_id": row[0], "tier_s": tier / NS},
                )
            return self._take(conn, row, take), f"reclaimed (tier {tier / NS:g} s)"
        row = conn.execute(
            select(_t.machine_id, _t.version, _t.issued_until)
            .where(_t.service == self.service, _t.machine_id <= max_id, _t.holder.is_(None))
            .order_by(_t.last_seen, _t.machine_id).limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if row is not None:
            return self._take(conn, row, take), "reclaimed (released)"

        # 4. nothing: a human must look
        raise WorkerExhaustedError(
            f"service {self.service!r}: all {max_id + 1} worker ids are held by live "
            f"leases (none released, none silent for over {self.min_tier_ns / NS:g} s); "
            "stop unused nodes, free ids of dead nodes with `flakekit workers release "
            "ID`, shorten the reclaim tiers, or use a layout with more worker bits"
        )

    def _take(self, conn: Connection, row: Any, values: dict[str, Any]) -> tuple[int, int, int]:
        worker_id, version, issued_until = row
        done = conn.execute(
            update(system_nodes)
            .where(_t.service == self.service, _t.machine_id == worker_id,
                   _t.version == version)
            .values(**values)
        ).rowcount
        if done != 1:  # cannot happen under the row lock; fail safe anyway
            raise IntegrityError("worker row changed under the lock", None, Exception())
        return worker_id, version + 1, int(issued_until or 0)

    def _lowest_free(self, conn: Connection, max_id: int) -> int | None:
        """Seed 000's lowest free id in ``0..max_id`` (not a hard-coded 255)."""
        dialect = _dialect(conn)
        if dialect == "postgresql":
            series = func.generate_series(0, max_id).table_valued("machine_id").render_derived()
            m = series.c.machine_id
        elif dialect == "mysql" and getattr(conn.dialect, "is_mariadb", False):
            # MariaDB's sequence engine stands in for generate_series
            return conn.execute(text(
                f"SELECT m.seq FROM seq_0_to_{int(max_id)} AS m "
                "LEFT JOIN system_nodes n ON n.service = :service AND n.machine_id = m.seq "
                "WHERE n.machine_id IS NULL ORDER BY m.seq LIMIT 1"
            ), {"service": self.service}).scalar_one_or_none()
        else:
            # SQLite / MySQL: id 0 if free, else the smallest id+1 that is free
            return conn.execute(text(
                "SELECT MIN(c) FROM ("
                " SELECT 0 AS c WHERE NOT EXISTS (SELECT 1 FROM system_nodes"
                "  WHERE service = :service AND machine_id = 0)"
                " UNION ALL"
                " SELECT n.machine_id + 1 FROM system_nodes n WHERE n.service = :service"
                "  AND n.machine_id < :max_id AND NOT EXISTS (SELECT 1 FROM system_nodes x"
                "  WHERE x.service = :service AND x.machine_id = n.machine_id + 1)"
                ") AS gaps"
            ), {"service": self.service, "max_id": max_id}).scalar()
        return conn.execute(
            select(m).select_from(series.outerjoin(
                system_nodes, and_(_t.service == self.service, _t.machine_id == m)))
            .where(_t.machine_id.is_(None)).order_by(m).limit(1)
        ).scalar_one_or_none()

    # -- renew / release ------------------------------------------------------------------------
    def _raise_mark(self, value: int) -> Any:
        """``issued_until`` raised to ``value``, never lowered (GREATEST / MAX)."""
        if self.dialect == "sqlite":
            return func.max(_t.issued_until, value)
        return func.greatest(_t.issued_until, value)

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        """Seed 000's heartbeat with the version check; a new deadline on success.

        The stored high-water mark becomes ``now + lease``: until its next heartbeat the
        holder may stamp IDs up to that instant of its own clock, so whoever gets the id
        after a crash waits past it (a host whose clock runs behind cannot overlap).
        """
        send_mono = self.clock.monotonic_ns()
        bound = max(issued_until_ns, self.clock.time_ns() + self.lease_ns)
        try:
            with self.engine.begin() as conn:
                done = conn.execute(
                    update(system_nodes)
                    .where(*self._ours(lease))
                    .values(last_seen=db_now(_dialect(conn)),
                            issued_until=self._raise_mark(bound))
                ).rowcount
                current = None if done else self._row(conn, lease.worker_id)
        except SQLAlchemyError as exc:
            raise BackendError(
                f"heartbeat of worker {lease.worker_id} ({self.service}) failed: "
                f"{_db_message(exc)}"
            ) from None
        if not done:
            self._lost(lease, current)
        return attrs.evolve(lease, deadline_ns=send_mono + self.lease_ns, stamp_until_ns=bound)

    def _ours(self, lease: WorkerLease) -> list[ColumnElement[bool]]:
        return [_t.service == self.service, _t.machine_id == lease.worker_id,
                _t.holder == lease.holder, _t.version == lease.epoch]

    def _row(self, conn: Connection, worker_id: int) -> dict[str, Any] | None:
        row = conn.execute(
            select(_t.machine_id, _t.host, _t.port, _t.version, _t.holder, _t.last_seen)
            .where(_t.service == self.service, _t.machine_id == worker_id)
        ).mappings().first()
        return None if row is None else {**row, "host": str(row["host"])}

    def _lost(self, lease: WorkerLease, current: dict[str, Any] | None) -> None:
        with self._lock:
            self._held.pop(lease.worker_id, None)
        if current is None:
            now = "the row is gone (released by an operator?)"
        else:
            now = (f"the row is now held by {current['holder'] or '(nobody)'} at "
                   f"{current['host']}:{current['port']}, version {current['version']}, "
                   f"last seen {current['last_seen']}")
        message = (f"worker {lease.worker_id} of service {self.service!r} is no longer "
                   f"ours (we held version {lease.epoch} as {lease.holder}); {now}")
        log.error("%s", message)
        raise LeaseLostError(message)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        """Give the id back at once (clean shutdown). The holder has stopped, so the
        high-water mark comes down from the heartbeat's bound to the exact last ID (never
        below the previous holder's): a restart right after gets its id back without a
        wait."""
        with self._lock:
            self._held.pop(lease.worker_id, None)
        try:
            with self.engine.begin() as conn:
                done = conn.execute(
                    update(system_nodes).where(*self._ours(lease))
                    .values(holder=None, last_seen=db_now(_dialect(conn)),
                            issued_until=max(issued_until_ns, lease.not_before_ns))
                ).rowcount
        except SQLAlchemyError as exc:
            raise BackendError(f"releasing worker {lease.worker_id} failed: "
                               f"{_db_message(exc)}") from None
        if not done:
            log.warning("%s: worker %d was no longer ours when releasing it",
                        self.service, lease.worker_id)

    # -- listing ------------------------------------------------------------------------------
    def records(self) -> list[WorkerRecord]:
        """Every row of this service, with its lease state as the database sees it."""
        self._wrap(self.ensure_schema)
        return list_records(self.engine, self.service, self.tiers_ns, self.safety_window_ns,
                            mine=dict(self._held))

    def close(self) -> None:
        """Nothing to free: the engine belongs to the backend pool."""

    def _wrap(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except SQLAlchemyError as exc:
            raise BackendError(f"database of service {self.service!r}: "
                               f"{_db_message(exc)}") from None


def lease_state(age_s: float | None, holder: str | None, lease_s: float) -> str:
    """``released`` (holder NULL), ``held`` (may still issue IDs) or ``lapsed``."""
    if holder is None:
        return "released"
    if age_s is not None and age_s >= lease_s:
        return "lapsed"
    return "held"


def list_records(
    engine: Engine, service: str | None, tiers_ns: Sequence[int] = DEFAULT_TIERS_NS,
    safety_window_ns: int = 5 * NS, mine: dict[int, str] | None = None,
) -> list[WorkerRecord]:
    """The rows of ``service`` (every service when None) as :class:`WorkerRecord`."""
    dialect = _dialect(engine)
    lease_s = (min(tiers_ns) - safety_window_ns) / NS
    query = select(system_nodes, db_now(dialect).label("db_now")).order_by(
        _t.service, _t.machine_id)
    if service is not None:
        query = query.where(_t.service == service)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    mine = mine or {}
    out = []
    for row in rows:
        last_seen, now = _aware(row["last_seen"]), _aware(row["db_now"])
        age = (now - last_seen).total_seconds() if last_seen and now else None
        out.append(WorkerRecord(
            worker_id=row["machine_id"], holder=row["holder"] or "", epoch=row["version"],
            last_seen=last_seen, state=lease_state(age, row["holder"], lease_s),
            mine=mine.get(row["machine_id"]) == row["holder"] and row["holder"] is not None,
            extra={"service": row["service"], "host": str(row["host"]), "port": row["port"],
                   "slot": row["slot"], "host_name": row["host_name"],
                   "age_s": None if age is None else round(age, 3),
                   "issued_until_ns": row["issued_until"],
                   "created_at": _aware(row["created_at"])},
        ))
    return out


def release_worker(
    engine: Engine, service: str, worker_id: int, *, force: bool = False,
    tiers_ns: Sequence[int] = DEFAULT_TIERS_NS, safety_window_ns: int = 5 * NS,
) -> str:
    """Operator release (``flakekit workers release``): free a row for reuse.

    A row whose lease may still be live is refused unless ``force`` (the operator
    vouches that the holder is dead). The version is bumped either way, so a holder that
    is alive after all finds out at its next heartbeat and stops.
    """
    records = [r for r in list_records(engine, service, tiers_ns, safety_window_ns)
               if r.worker_id == worker_id]
    if not records:
        raise LookupError(f"service {service!r} has no worker {worker_id}")
    record = records[0]
    if record.state == "released":
        return f"worker {worker_id} of {service!r} is already released"
    # Without --force, free only what acquire could reclaim itself (silent for longer
    # than the shortest tier): "lapsed" alone would skip the safety window.
    min_tier_ns = min(tiers_ns)
    age = record.extra["age_s"]
    assert age is None or isinstance(age, (int, float))
    if not force and (age is None or age * NS <= min_tier_ns):
        raise RuntimeError(
            f"worker {worker_id} of {service!r} is held by {record.holder} (last heartbeat "
            f"{age} s ago, {record.state}); stop that process (it releases on shutdown), "
            f"wait until it has been silent for {min_tier_ns / NS:g} s, or pass --force if "
            "you know it is dead"
        )
    guard = [_t.service == service, _t.machine_id == worker_id, _t.version == record.epoch]
    if not force:  # re-checked in the UPDATE: a heartbeat may have come in meanwhile
        guard += [_t.holder == record.holder,
                  _t.last_seen < db_now_minus(_dialect(engine), min_tier_ns)]
    with engine.begin() as conn:
        done = conn.execute(
            update(system_nodes).where(*guard).values(holder=None, version=_t.version + 1)
        ).rowcount
    if not done:
        raise RuntimeError(f"worker {worker_id} of {service!r} changed meanwhile (a "
                           "heartbeat or another acquire); list it again")
    return f"released worker {worker_id} of {service!r} (was {record.holder}, {record.state})"
