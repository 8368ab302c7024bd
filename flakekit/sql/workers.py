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

Acquirers of one service serialise on that service's row of ``flakekit_schema``
(component ``workers:SERVICE``, created by the first acquire; a row lock on
PostgreSQL/MariaDB, the write lock on SQLite), so 256 simultaneous starters queue for a
few milliseconds each instead of racing for the same lowest id, and a peer stuck inside
its acquire transaction holds up its own service only -- until the server ends its session
(the backend's ``idle_in_transaction_timeout``). The lock is for throughput, not safety:
row locks, ``SKIP LOCKED``, the primary key and the version check keep ids apart even
without it. A lock wait that times out is retried for at most :data:`LOCK_RETRY_S`, then
acquire fails with one line saying which lock in which database is stuck.

A row is never taken when using it would lock the node out or break the lease: a
negative or out-of-layout ``machine_id``, a ``version`` at the column's maximum (the
epoch could not be bumped), an unreadable ``last_seen``, or a high-water mark further
ahead than ``max_start_wait`` (e.g. after ``workers release --force`` of a killed holder,
whose last heartbeat reserved up to a lease ahead): acquire takes the next usable id and
raises an alert naming each bad row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    String,
    and_,
    case,
    func,
    literal_column,
    not_,
    or_,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from flakekit.errors import (
    BackendError,
    LeaseLostError,
    SchemaError,
    WaitTooLongError,
    WorkerExhaustedError,
)
from flakekit.leases.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.sql import failover
from flakekit.sql.backends import describe_engine
from flakekit.sql.dbclock import (
    aware_utc,
    db_message,
    db_now,
    db_now_minus,
    dialect_of,
    lease_deadline_ns,
    ns_of,
    retry_kind,
    retry_pause,
)
from flakekit.sql.durability import watch_for, with_stall_cause
from flakekit.sql.schema import (
    WORKERS_COMPONENT,
    check_schema,
    schema_table,
    system_nodes,
    upgrade_schema,
)
from flakekit.values.clock import Clock
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.timeunits import iso_utc

__all__ = [
    "DEFAULT_TIERS_NS",
    "SqlWorkerAllocator",
    "resolve_host",
]

log = logging.getLogger("flakekit.sql.workers")

NS = 1_000_000_000
DEFAULT_TIERS_NS = (7 * 86400 * NS, 86400 * NS, 3600 * NS)
#: share of the worker range above which every acquire raises a capacity alert (seed 002)
CAPACITY_ALERT_RATIO = 0.8
#: how long one acquire keeps retrying unique conflicts, deadlocks and lock waits that
#: timed out (each waited the backend's lock_timeout) before it reports what is stuck.
#: Bounded by time, not by a count: 256 starters at one instant on a loaded host make
#: some of them lose many rounds (a count of 50 ran out in CI on MariaDB)
LOCK_RETRY_S = 60.0
#: ``system_nodes.version`` is an INTEGER: a row there cannot be leased again
VERSION_MAX = 2**31 - 1

_t = system_nodes.c


# -- database clock ------------------------------------------------------------------------
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


def lock_component(service: str) -> str:
    """The ``flakekit_schema`` row acquirers of ``service`` serialise on (64 chars max)."""
    name = f"{WORKERS_COMPONENT}:{service}"
    if len(name) <= 64:
        return name
    return f"{WORKERS_COMPONENT}:#{hashlib.sha256(service.encode()).hexdigest()[:54]}"


def _seen_readable(dialect: str) -> ColumnElement[bool]:
    """``last_seen`` holds a time this code can compare and read back."""
    if dialect == "postgresql":
        return func.isfinite(_t.last_seen)  # not 'infinity' (psycopg cannot load it)
    if dialect == "mysql":
        return _t.last_seen >= literal_column("'1000-01-01'")  # not a zero date
    return func.julianday(_t.last_seen).is_not(None)  # SQLite: any text goes in


def _when(ns: int) -> str:
    """A wall-clock ns value for people (a bad row may hold one no datetime can)."""
    try:
        return str(iso_utc(dt.datetime.fromtimestamp(ns / NS, dt.UTC)))
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns since 1970"


def _is_retryable(exc: SQLAlchemyError) -> bool:
    """A unique conflict (someone raced us), a deadlock, a serialisation failure or a
    lock wait that timed out."""
    return retry_kind(exc) is not None


def ensure_component(engine: Engine, component: str, create: bool) -> None:
    """Check ``component``'s tables; when they are missing or old and ``create`` is
    set, create and upgrade them instead (a newer schema than this code still fails)."""
    try:
        check_schema(engine, component)
    except SchemaError:
        if not create:
            raise
        upgrade_schema(engine, component)


@attrs.define
class SchemaOnce:
    """:func:`ensure_component` on the first call only (the allocator's and the cluster
    membership's tables are checked once per object)."""

    engine: Engine
    component: str
    create: bool
    _ok: bool = False

    def __call__(self) -> None:
        if not self._ok:
            ensure_component(self.engine, self.component, self.create)
            self._ok = True


def schema_once(component: str) -> Any:
    """An ``init=False`` attrs field holding the :class:`SchemaOnce` of ``component`` for
    the object's ``engine`` and ``create_schema`` (fields declared before it)."""
    return attrs.field(init=False, default=attrs.Factory(
        lambda self: SchemaOnce(self.engine, component, self.create_schema), takes_self=True))


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
        create_schema: create missing tables and upgrade older ones at start-up instead
            of failing (a newer schema still fails).
        max_start_wait_ns: the longest wait for a reused id's high-water mark; a row
            with a later mark is left for another id.
        events: where alerts go.
        lock_retry_s: how long lock waits that timed out are retried.
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
    lock_retry_s: float = LOCK_RETRY_S
    _ip: str = attrs.field(init=False, default="")
    _host_name: str = attrs.field(init=False, default="")
    _held: dict[int, str] = attrs.field(init=False, factory=dict)
    #: the port identity each held id was acquired with (a re-assert after a fail-over)
    _ports: dict[int, int] = attrs.field(init=False, factory=dict)
    _schema: SchemaOnce = schema_once(WORKERS_COMPONENT)
    _lock_row_ok: bool = attrs.field(init=False, default=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    #: one process may hold several ids at once (``workers = N``): every acquire has its
    #: own holder token, and a held row is never reused
    several_leases = True

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
        watch_for(self.engine).listen(self.events)

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
        return dialect_of(self.engine)

    @property
    def identity(self) -> str:
        return f"{self._ip}:{self.port}"

    # -- schema -------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create and upgrade (if allowed) and check the tables once per allocator."""
        self._schema()

    # -- acquire ------------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        """Lease a worker id in ``0..request.max_worker_id`` (one transaction, retried)."""
        self._wrap(self.ensure_schema)
        watch_for(self.engine).require(self.engine, f"grant a worker id of service "
                                       f"{self.service!r}")
        detect = failover.detection_ready(self.engine)
        if request.host and not self.host:  # the request's identity, unless overridden
            self._ip, self._host_name = resolve_host(request.host)
        port = self.port or request.port
        token = _new_token(self._ip, port)
        give_up = time.monotonic() + self.lock_retry_s
        lock_waits = 0
        for attempt in itertools.count():
            send_mono = self.clock.monotonic_ns()
            bound = self.clock.time_ns() + self.lease_ns
            stage = [f"the acquire lock of service {self.service!r} (row "
                     f"{lock_component(self.service)!r} of flakekit_schema)"]
            alerts: list[tuple[str, str, dict[str, Any]]] = []
            try:
                if not self._lock_row_ok:
                    self._create_lock_row()
                if detect:
                    failover.prepare(self.engine, self._scope)
                with self.engine.begin() as conn:
                    # the quarantine's start is committed even when this acquire is refused
                    if detect:  # after the service lock: a REPEATABLE READ snapshot
                        self._lock_service(conn)  # must not predate the lock
                    refused = self._failover_gate(conn) if detect else None
                    if refused is None:
                        row, how = self._acquire_in(conn, request.max_worker_id, port,
                                                    token, request.instance, bound, stage,
                                                    alerts)
                        self._check_wait(row, how)
                        allocated = conn.execute(
                            select(func.count()).select_from(system_nodes).where(
                                _t.service == self.service, _t.machine_id >= 0,
                                _t.machine_id <= request.max_worker_id)
                        ).scalar_one()
            except SQLAlchemyError as exc:
                kind = retry_kind(exc)
                lock_waits += kind == "lock"
                if kind and time.monotonic() < give_up:
                    alerts.clear()  # the next attempt finds the same rows again
                    log.debug("acquire attempt %d of %s: %s; retrying", attempt + 1,
                              self.service, db_message(exc))
                    time.sleep(retry_pause(attempt))
                    continue
                if kind == "lock":
                    raise BackendError(with_stall_cause(
                        self.engine, self._stuck(stage[-1], lock_waits))) from None
                tried = (f" (after {attempt + 1} attempts in {self.lock_retry_s:g} s)"
                         if kind else "")
                raise BackendError(with_stall_cause(
                    self.engine, f"cannot acquire a worker id for service {self.service!r} "
                    f"in {describe_engine(self.engine)}{tried}: {db_message(exc)}")
                ) from None
            finally:
                for kind_, message, fields in alerts:  # after the transaction, not in it
                    self.events.alert(kind_, message, fields)
            break
        if refused is not None:
            raise BackendError(refused)
        worker_id, version, issued_until = row
        with self._lock:
            self._held[worker_id] = token
            self._ports[worker_id] = port
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
            deadline_ns=lease_deadline_ns(send_mono, self.min_tier_ns, self.safety_window_ns),
            not_before_ns=issued_until,
            stamp_until_ns=max(bound, issued_until),  # what the row now holds
        )

    @property
    def _scope(self) -> str:
        """One marker for the registry of the database, not one per service: made at
        the first grant ever, it is on a replica long before a service first used
        within the replication lag (whose own marker would not be)."""
        return failover.WORKERS_SCOPE

    def _failover_gate(self, conn: Connection) -> str | None:
        """In the acquire transaction: detect a fail-over, and while its quarantine runs
        return why no id may be granted (None: go on)."""
        change = failover.check_primary(conn, self._scope)
        ends = failover.quarantine_end(conn, self._scope, self.min_tier_ns)
        if change is not None:
            failover.announce(change, describe_engine(self.engine),
                              f"service {self.service!r}: no worker id is granted until "
                              f"{ends:%Y-%m-%dT%H:%M:%SZ}" if ends else "", self.events)
        if ends is None:
            return None
        return (f"service {self.service!r}: no worker id is granted until "
                f"{ends:%Y-%m-%dT%H:%M:%S}Z (database time): a database fail-over was "
                "detected and leases the old primary granted may still be held (its copy "
                f"of them may be lost); the quarantine lasts the shortest reclaim age "
                f"({self.min_tier_ns / NS:g} s). Start again then, or use a consensus "
                "store (zookeeper, etcd) for worker leases")

    def _lock_service(self, conn: Connection) -> None:
        """Take this service's acquire lock (its ``flakekit_schema`` row) in ``conn``."""
        lock_row = lock_component(self.service)
        locked = conn.execute(
            update(schema_table).where(schema_table.c.component == lock_row)
            .values(version=schema_table.c.version)
        ).rowcount
        if not locked:
            conn.execute(schema_table.insert().values(component=lock_row, version=0))

    def _create_lock_row(self) -> None:
        """Create the service's acquire-lock row in a transaction of its own, once.

        Inside the acquire transaction a missing row is locked as a gap on MariaDB, and
        concurrent first acquires that all hold that gap and then insert deadlock each
        other; a plain insert here waits for the first inserter and then sees its row.
        """
        lock_row = lock_component(self.service)
        with self.engine.connect() as conn:  # a read: no write, no COMMIT when it exists
            found = conn.execute(select(schema_table.c.component).where(
                schema_table.c.component == lock_row)).first()
        if found is None:
            with self.engine.begin() as conn:  # a racing insert: unique conflict, retried
                conn.execute(schema_table.insert().values(component=lock_row, version=0))
        self._lock_row_ok = True

    def _stuck(self, what: str, waits: int) -> str:
        """One line: which lock in which database held every try up, and what to do."""
        db = describe_engine(self.engine)
        if self.dialect == "postgresql":
            find = ("find the session with SELECT pid, state, xact_start FROM "
                    "pg_stat_activity WHERE state LIKE 'idle in transaction%' and end it "
                    "with SELECT pg_terminate_backend(pid)")
        elif self.dialect == "mysql":
            find = ("find the session in information_schema.innodb_trx "
                    "(trx_mysql_thread_id) and end it with KILL <id>")
        else:
            find = ("another process holds the database file's write lock: find it "
                    f"with `fuser {self.engine.url.database}` and stop it")
        return (
            f"cannot acquire a worker id for service {self.service!r}: {what} in {db} "
            f"stayed locked by another session through {waits} lock wait(s) (each as long "
            f"as the backend's lock_timeout; retried for {self.lock_retry_s:g} s); "
            "flakekit's own sessions end after idle_in_transaction_timeout, so another "
            f"client or an older flakekit holds it: {find}"
        )

    def _check_wait(self, row: tuple[int, int, int], how: str) -> None:
        """Safety net for a mark that moved past the limit during the transaction."""
        gap = row[2] - self.clock.time_ns()
        if gap > self.max_start_wait_ns:
            raise WaitTooLongError(
                f"worker {row[0]} of service {self.service!r} ({how}) was used for IDs up "
                f"to {gap / NS:.3f} s ahead of this host's clock, more than max_start_wait "
                f"({self.max_start_wait_ns / NS:g} s); start again, or raise max_start_wait"
            )

    def _acquire_in(
        self, conn: Connection, max_id: int, port: int, token: str, instance: int = 0,
        bound: int = 0, stage: list[str] | None = None,
        alerts: list[tuple[str, str, dict[str, Any]]] | None = None,
    ) -> tuple[tuple[int, int, int], str]:
        """The body of the acquire transaction: ((id, version, issued_until), how).

        ``stage`` gets what the transaction waits for (for a lock-timeout message) and
        ``alerts`` the alerts to raise once it is over.
        """
        stage = stage if stage is not None else []
        alerts = alerts if alerts is not None else []
        dialect = dialect_of(conn)
        # Serialise this service's acquirers: the first statement is a write, so it also
        # takes SQLite's write lock at once (like BEGIN IMMEDIATE) and PostgreSQL/MariaDB's
        # row lock. _create_lock_row made the row; one deleted since is made again here
        # (and held until commit: a concurrent acquire gets a unique conflict, retried).
        self._lock_service(conn)
        stage.append(f"a system_nodes row of service {self.service!r}")
        now = db_now(dialect)
        lapsed = db_now_minus(dialect, self.min_tier_ns)
        mine = and_(_t.service == self.service, _t.host == self._ip, _t.port == port)
        take: dict[str, Any] = dict(holder=token, version=_t.version + 1, last_seen=now,
                    host_name=self._host_name, issued_until=self._raise_mark(bound))
        node_now = self.clock.time_ns()
        sound = and_(_t.machine_id >= 0, _t.version < VERSION_MAX, _seen_readable(dialect))
        usable = and_(_t.service == self.service, _t.machine_id <= max_id, sound,
                      _t.issued_until <= node_now + self.max_start_wait_ns)
        self._alert_bad_rows(conn, max_id, node_now, sound, alerts)

        # 1. reuse this host:port's row, if no live lease holds it
        row = conn.execute(
            select(_t.machine_id, _t.version, _t.issued_until)
            .where(mine, usable, or_(_t.holder.is_(None), _t.last_seen < lapsed))
            # an instance gets its own row back first (a server's worker process N)
            .order_by(case((_t.slot == instance, 0), else_=1), _t.slot, _t.machine_id).limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if row is not None:
            return self._take(conn, row, take), "reused"

        rows = conn.execute(select(_t.slot, _t.holder, _t.last_seen < lapsed,
                                   _t.machine_id).where(mine)).all()
        slots = {r[0] for r in rows}
        slot = instance if instance not in slots else next(
            i for i in range(len(slots) + 1) if i not in slots)
        live = [r for r in rows if r[1] is not None and not r[2] and 0 <= r[3] <= max_id]
        # siblings (instance > 0) share host:port, and so do processes with no port
        # identity (port 0: the embedded default, scripts, CLI runs) -- the normal case
        if live and slot and not instance and port:
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
                .where(usable, _t.last_seen < db_now_minus(dialect, tier))
                .order_by(_t.machine_id).limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                continue
            if i == last:
                alerts.append((
                    "worker-reclaim",
                    f"service {self.service!r}: every worker id is taken; reclaiming "
                    f"worker {row[0]} silent for over {tier / NS:g} s (the last tier) -- "
                    "abnormal: check for crashing or flapping nodes",
                    {"service": self.service, "worker_id": row[0], "tier_s": tier / NS},
                ))
            return self._take(conn, row, take), f"reclaimed (tier {tier / NS:g} s)"
        row = conn.execute(
            select(_t.machine_id, _t.version, _t.issued_until)
            .where(usable, _t.holder.is_(None))
            .order_by(_t.last_seen, _t.machine_id).limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if row is not None:
            return self._take(conn, row, take), "reclaimed (released)"

        # 4. nothing: say what blocks
        self._nothing_usable(conn, max_id, lapsed, sound, node_now)
        raise AssertionError("unreachable")  # pragma: no cover

    def _alert_bad_rows(self, conn: Connection, max_id: int, node_now: int,
                        sound: ColumnElement[bool],
                        alerts: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Queue an alert for each row of the service that acquire must never take."""
        far = node_now + self.lease_ns + self.max_start_wait_ns  # beyond any reservation
        bad = conn.execute(
            select(_t.machine_id, _t.host, _t.port, _t.slot, _t.version, _t.issued_until,
                   sound.label("sound"), _seen_readable(dialect_of(conn)).label("seen_ok"))
            .where(_t.service == self.service,
                   or_(not_(sound), _t.machine_id > max_id, _t.issued_until > far))
            .order_by(_t.machine_id).limit(20)
        ).all()
        for machine_id, host, port, slot, version, mark, _sound, seen_ok in bad:
            why = []
            if machine_id < 0 or machine_id > max_id:
                why.append(f"machine_id {machine_id} is outside this layout's 0..{max_id}")
            if version >= VERSION_MAX:
                why.append(f"version {version} is at the column's maximum (the lease epoch "
                           "cannot be raised)")
            if not seen_ok:
                why.append("last_seen is not a readable time")
            if mark > far:
                why.append(f"its high-water mark {_when(mark)} is {(mark - node_now) / NS:.0f} "
                           "s ahead of this host's clock, more than a lease reserves")
            row_name = (f"system_nodes row (service {self.service!r}, machine_id "
                        f"{machine_id}, host {host}:{port}, slot {slot})")
            alerts.append((
                "worker-bad-row",
                f"skipping {row_name}: {'; '.join(why)}; fix or delete that row "
                "(no flakekit writes such values)",
                {"service": self.service, "worker_id": machine_id, "host": str(host),
                 "port": port, "slot": slot, "reasons": why},
            ))

    def _nothing_usable(self, conn: Connection, max_id: int, lapsed: ColumnElement[Any],
                        sound: ColumnElement[bool], node_now: int) -> None:
        """Raise the error that says what keeps every id of the range from being used."""
        waiting = conn.execute(
            select(_t.machine_id, _t.issued_until, _t.holder,
                   type_coerce(_t.last_seen, String) if self.dialect == "sqlite"
                   else _t.last_seen)
            .where(_t.service == self.service, _t.machine_id <= max_id, sound,
                   or_(_t.holder.is_(None), _t.last_seen < lapsed),
                   _t.issued_until > node_now + self.max_start_wait_ns)
            .order_by(_t.issued_until).limit(1)
        ).first()
        if waiting is None:
            raise WorkerExhaustedError(
                f"service {self.service!r}: all {max_id + 1} worker ids are held by live "
                f"leases (none released, none silent for over {self.min_tier_ns / NS:g} s); "
                "stop unused nodes, free ids of dead nodes with `flakekit workers release "
                "ID`, shorten the reclaim tiers, or use a layout with more worker bits"
            )
        worker_id, mark, holder, last_seen = waiting
        gap = (mark - node_now) / NS
        seen_ns = ns_of(aware_utc(last_seen))
        state = "released" if holder is None else "lapsed"
        margin = self.max_start_wait_ns + self.safety_window_ns  # node vs database clock
        if seen_ns is not None and abs(mark - (seen_ns + self.lease_ns)) <= margin:
            why = (f"its last holder stopped without a clean shutdown (kill -9, then "
                   f"`workers release --force`?) and its last heartbeat reserved IDs up to "
                   f"{_when(mark)}, so it is usable from then on")
        else:
            why = (f"it was used for IDs up to {_when(mark)}, later than its last heartbeat "
                   "could reserve: that holder's clock ran ahead of this host's, or this "
                   "host's clock is behind (check NTP)")
        raise WaitTooLongError(
            f"service {self.service!r}: no usable worker id: no other id of 0..{max_id} is "
            f"free or reclaimable, and worker {worker_id} ({state}) would mean waiting "
            f"{gap:.0f} s, more than max_start_wait ({self.max_start_wait_ns / NS:g} s): "
            f"{why}; wait, raise max_start_wait, or use a layout with more worker bits"
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
        dialect = dialect_of(conn)
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
                "SELECT MIN(c) FROM ( SELECT 0 AS c WHERE NOT EXISTS (SELECT 1 FROM system_nodes"
                "  WHERE service = :service AND machine_id = 0)"
                " UNION ALL SELECT n.machine_id + 1 FROM system_nodes n WHERE n.service = :service"
                "  AND n.machine_id >= 0 AND n.machine_id < :max_id AND NOT EXISTS (SELECT 1 FROM "
                "system_nodes x  WHERE x.service = :service AND x.machine_id = n.machine_id + 1)"
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
        watch_for(self.engine).require(self.engine, f"renew worker {lease.worker_id} of "
                                       f"service {self.service!r}")
        detect = failover.detection_ready(self.engine)
        change = None
        reasserted = ""
        try:
            if detect:
                failover.prepare(self.engine, self._scope)
            with self.engine.begin() as conn:
                done = conn.execute(
                    update(system_nodes)
                    .where(*self._ours(lease))
                    .values(last_seen=db_now(dialect_of(conn)),
                            issued_until=self._raise_mark(bound))
                ).rowcount
                change = failover.check_primary(conn, self._scope) if detect else None
                current = None if done else self._row(conn, lease.worker_id)
                if not done and detect and failover.quarantine_end(
                        conn, self._scope, self.min_tier_ns) is not None:
                    reasserted = self._reassert(conn, lease, current, bound)
                    done = 1
        except SQLAlchemyError as exc:
            raise BackendError(with_stall_cause(
                self.engine, f"heartbeat of worker {lease.worker_id} ({self.service}) "
                f"failed: {db_message(exc)}")) from None
        if change is not None:
            failover.announce(change, describe_engine(self.engine),
                              f"service {self.service!r}: grants are quarantined for "
                              f"{self.min_tier_ns / NS:g} s", self.events)
        if reasserted:
            log.warning("worker %d of service %r: %s on the new primary after a database "
                        "fail-over; the lease goes on", lease.worker_id, self.service,
                        reasserted)
        if not done:
            self._lost(lease, current)
        return attrs.evolve(lease, stamp_until_ns=bound, deadline_ns=lease_deadline_ns(
            send_mono, self.min_tier_ns, self.safety_window_ns))

    def _reassert(self, conn: Connection, lease: WorkerLease,
                  current: dict[str, Any] | None, bound: int) -> str:
        """A live holder's row that a promoted replica lacks (or holds a stale copy of)
        is written back as ours: during the quarantine nobody else was granted it."""
        now = db_now(dialect_of(conn))
        if current is not None:
            conn.execute(update(system_nodes).where(
                _t.service == self.service, _t.machine_id == lease.worker_id).values(
                holder=lease.holder, version=lease.epoch, last_seen=now,
                issued_until=self._raise_mark(bound)))
            return (f"re-asserted its row (the replica's copy was stale: version "
                    f"{current['version']}, holder {current['holder'] or '(nobody)'})")
        port = self._ports.get(lease.worker_id, self.port)
        slots = {r[0] for r in conn.execute(select(_t.slot).where(
            _t.service == self.service, _t.host == self._ip, _t.port == port))}
        conn.execute(system_nodes.insert().values(
            service=self.service, machine_id=lease.worker_id, host=self._ip, port=port,
            slot=next(i for i in range(len(slots) + 1) if i not in slots),
            version=lease.epoch, last_seen=now, created_at=now, holder=lease.holder,
            host_name=self._host_name, issued_until=bound))
        return "re-created its row (the replica never received it)"

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
                   f"last seen {iso_utc(aware_utc(current['last_seen']))}")
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
                    .values(holder=None, last_seen=db_now(dialect_of(conn)),
                            issued_until=max(issued_until_ns, lease.not_before_ns))
                ).rowcount
        except SQLAlchemyError as exc:
            raise BackendError(f"releasing worker {lease.worker_id} failed: "
                               f"{db_message(exc)}") from None
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
                               f"{db_message(exc)}") from None


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
    dialect = dialect_of(engine)
    lease_s = (min(tiers_ns) - safety_window_ns) / NS
    # a last_seen the driver cannot load ('infinity', SQLite text) is listed as unknown
    if dialect == "postgresql":
        seen: Any = case((func.isfinite(_t.last_seen), _t.last_seen))
    elif dialect == "sqlite":
        seen = type_coerce(_t.last_seen, String)
    else:
        seen = _t.last_seen
    others = [c for c in system_nodes.c if c.name != "last_seen"]
    query = select(*others, seen.label("last_seen"), db_now(dialect).label("db_now")).order_by(
        _t.service, _t.machine_id)
    if service is not None:
        query = query.where(_t.service == service)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    mine = mine or {}
    out = []
    for row in rows:
        last_seen, now = aware_utc(row["last_seen"]), aware_utc(row["db_now"])
        age = (now - last_seen).total_seconds() if last_seen and now else None
        out.append(WorkerRecord(
            worker_id=row["machine_id"], holder=row["holder"] or "", epoch=row["version"],
            last_seen=last_seen, state=lease_state(age, row["holder"], lease_s),
            mine=mine.get(row["machine_id"]) == row["holder"] and row["holder"] is not None,
            extra={"service": row["service"], "host": str(row["host"]), "port": row["port"],
                   "slot": row["slot"], "host_name": row["host_name"],
                   "age_s": None if age is None else round(age, 3),
                   "issued_until_ns": row["issued_until"],
                   "created_at": iso_utc(aware_utc(row["created_at"]))},
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
                  _t.last_seen < db_now_minus(dialect_of(engine), min_tier_ns)]
    with engine.begin() as conn:
        done = conn.execute(
            update(system_nodes).where(*guard).values(holder=None, version=_t.version + 1)
        ).rowcount
    if not done:
        raise RuntimeError(f"worker {worker_id} of {service!r} changed meanwhile (a "
                           "heartbeat or another acquire); list it again")
    return f"released worker {worker_id} of {service!r} (was {record.holder}, {record.state})"
