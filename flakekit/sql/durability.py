"""What an acknowledged commit survives, per SQL backend (docs/replicated-databases.md).

A segment range or a worker lease is only as safe as the commit that recorded it: on an
asynchronously replicated database the promoted replica may lack it, and the next fetch
hands the same range out again. So each backend's durability is read from the server
(never assumed), shown by ``flakekit db check``, the server's status and metrics, and
re-read every :data:`RECHECK_S` seconds by the fetches and grants that use it:

* PostgreSQL: ``synchronous_standby_names`` with ``synchronous_commit`` on (or
  ``remote_write``/``remote_apply``): **synchronous**; streaming standbys without it:
  **asynchronous**; no standby: **single** (a commit survives a restart, not the loss of
  the server).
* MariaDB: semi-sync enabled and ``Rpl_semi_sync_master_status`` ON: **synchronous**;
  enabled but OFF: **fallen-back** (the primary gave up waiting after
  ``rpl_semi_sync_master_timeout`` and commits are asynchronous); binary log without
  semi-sync: **asynchronous**; no binary log: **single**.
* SQLite: **local-disk**.

``[backends.X] replication = "synchronous"`` makes every fetch and grant refuse (one line
naming the database setting to fix) while the verdict is not synchronous; the default
``"any"`` only reports. A change for the worse raises one ``database-durability`` alert.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import BackendError
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.lifecycle import started_daemon

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from flakekit.sql.backends import BackendPool

__all__ = [
    "RECHECK_S",
    "REPLICATION_MODES",
    "Durability",
    "DurabilityWatch",
    "pool_durability",
    "probe",
    "stall_cause",
    "watch_for",
    "with_stall_cause",
]

log = logging.getLogger("flakekit.durability")

#: ``[backends.X] replication``: "any" reports, "synchronous" refuses without it
REPLICATION_MODES = ("any", "synchronous")
#: how often fetches and grants re-read a backend's durability
RECHECK_S = 30.0
#: how old a verdict may be when an error message asks why commits wait (re-read then)
STALL_RECHECK_S = 2.0
#: verdicts, from the most durable down (an alert fires when the rank gets worse)
_RANK = {"synchronous": 0, "local-disk": 1, "single": 1, "fallen-back": 2,
         "asynchronous": 2, "unknown": 3}


@attrs.frozen
class Durability:
    """One backend's verdict.

    Attributes:
        dialect: ``postgresql``, ``mysql`` (MariaDB too) or ``sqlite``.
        verdict: ``synchronous``, ``asynchronous``, ``fallen-back``, ``single``,
            ``local-disk`` or ``unknown``.
        detail: what was read from the server, for people.
        fix: the database setting that would make commits synchronous (None: they are).
        waiting: why commits wait now (a synchronous standby or semi-sync replica is
            away), for the messages of fetches and grants that time out meanwhile.
    """

    dialect: str
    verdict: str
    detail: str
    fix: str | None = None
    waiting: str | None = None

    @property
    def synchronous(self) -> bool:
        """An acknowledged commit is on a second server too."""
        return self.verdict == "synchronous"

    def line(self, backend: str, where: str) -> str:
        """One line for ``flakekit db check``."""
        fix = f"; for synchronous commits set {self.fix}" if self.fix else ""
        now = f"; now {self.waiting}" if self.waiting else ""
        return f"backends.{backend} ({where}): {self.verdict}: {self.detail}{fix}{now}"

    def to_dict(self) -> dict[str, Any]:
        return {"dialect": self.dialect, "verdict": self.verdict, "detail": self.detail,
                "synchronous": self.synchronous, "fix": self.fix, "waiting": self.waiting}


_PG_SYNC_COMMIT = ("on", "remote_write", "remote_apply")
PG_FIX = ("synchronous_standby_names (e.g. 'FIRST 1 (*)') and synchronous_commit = on "
          "on the primary")
MARIADB_FIX = ("rpl_semi_sync_master_enabled = ON with a replica connected and "
               "rpl_semi_sync_master_timeout large enough never to fall back (e.g. "
               "4294967295)")


def _scalar(conn: Connection, sql: str) -> Any:
    from sqlalchemy import text

    return conn.execute(text(sql)).scalar()


def probe(conn: Connection) -> Durability:
    """Read the durability of ``conn``'s server (any role may: no admin views needed)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return _probe_postgresql(conn)
    if dialect in ("mysql", "mariadb"):
        return _probe_mariadb(conn)
    if dialect == "sqlite":
        return Durability(dialect, "local-disk", "one file on this host's disk; nothing "
                          "is replicated")
    return Durability(dialect, "unknown", f"flakekit cannot read the durability of {dialect}")


def _probe_postgresql(conn: Connection) -> Durability:
    from sqlalchemy import text

    row = conn.execute(text(  # one round trip: fetches re-read it on their own path
        "SELECT current_setting('synchronous_standby_names'), "
        "current_setting('synchronous_commit'), "
        "(SELECT count(*) FROM pg_stat_replication), pg_is_in_recovery(), "
        "(SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep')")).one()
    names, commit = str(row[0] or "").strip(), str(row[1] or "")
    standbys, stuck = int(row[2] or 0), int(row[4] or 0)
    if row[3]:
        return Durability("postgresql", "unknown", "the server is a standby in recovery "
                          "(read-only): point the backend at the primary", PG_FIX)
    if names and commit in _PG_SYNC_COMMIT:
        waiting = None
        if not standbys or stuck:
            seen = ("no standby confirms (pg_stat_replication is empty)" if not standbys
                    else f"{standbys} standby(s) connected, none confirms")
            waiting = (f"the commit is waiting for the synchronous standby "
                       f"(synchronous_standby_names = '{names}'): {seen}; {stuck} "
                       "commit(s) wait in SyncRep until it is back: bring the standby "
                       "back or fail over to it (a cancelled wait counts as a failure)")
        return Durability("postgresql", "synchronous",
                          f"commits wait for synchronous_standby_names = '{names}' "
                          f"(synchronous_commit = {commit}; {standbys} standby(s) connected)",
                          None, waiting)
    if standbys:
        why = (f"synchronous_commit = {commit}" if names else
               "synchronous_standby_names is empty")
        return Durability("postgresql", "asynchronous",
                          f"{standbys} standby(s) streaming asynchronously ({why}): a "
                          "fail-over loses the last commits", PG_FIX)
    return Durability("postgresql", "single",
                      "no standby: a commit survives a restart, not the loss of the server",
                      PG_FIX)


def _probe_mariadb(conn: Connection) -> Durability:
    from sqlalchemy import text

    def variable(name: str) -> Any:
        try:
            return _scalar(conn, f"SELECT @@{name}")
        except Exception:  # noqa: BLE001  # a server without the variable (MySQL 8 names)
            return None

    status = {str(r[0]).lower(): str(r[1]) for r in conn.execute(text(
        "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_%'"))}
    enabled = str(variable("rpl_semi_sync_master_enabled")) in ("1", "ON")
    timeout = variable("rpl_semi_sync_master_timeout")
    on = status.get("rpl_semi_sync_master_status", "OFF").upper() == "ON"
    if enabled and on:
        clients = status.get("rpl_semi_sync_master_clients", "?")
        stuck = status.get("rpl_semi_sync_master_wait_sessions", "0")
        waiting = None
        if clients == "0" or stuck not in ("0", ""):
            waiting = (f"the commit is waiting for a semi-sync replica "
                       f"(Rpl_semi_sync_master_clients = {clients}, {stuck} session(s) "
                       f"waiting): it waits up to rpl_semi_sync_master_timeout = {timeout} "
                       "ms, then the primary falls back to asynchronous; bring the replica "
                       "back")
        return Durability("mysql", "synchronous",
                          f"semi-sync on ({clients} replica(s); it falls back to "
                          f"asynchronous after rpl_semi_sync_master_timeout = {timeout} ms)",
                          None, waiting)
    if enabled:
        return Durability("mysql", "fallen-back",
                          f"semi-sync is enabled but OFF: the primary stopped waiting "
                          f"(rpl_semi_sync_master_timeout = {timeout} ms, "
                          f"{status.get('rpl_semi_sync_master_no_tx', '?')} commits not "
                          "acknowledged): a fail-over loses them", MARIADB_FIX)
    if str(variable("log_bin")) in ("1", "ON"):
        return Durability("mysql", "asynchronous", "binary log on, semi-sync off: "
                          "replicas lag, a fail-over loses the last commits", MARIADB_FIX)
    return Durability("mysql", "single", "no binary log (no replica): a commit survives "
                      "a restart, not the loss of the server", MARIADB_FIX)


@attrs.define(eq=False)
class DurabilityWatch:
    """A backend's last verdict, re-read at most every ``recheck_s`` seconds by
    :meth:`require`, with the ``replication`` setting it enforces."""

    backend: str
    replication: str = "any"
    recheck_s: float = RECHECK_S
    events: list[Events] = attrs.Factory(list)
    last: Durability | None = None
    _read_at: float = -1e18
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _probing: threading.Thread | None = None
    _tried_at: float = -1e18

    def listen(self, events: Events) -> None:
        """Send this backend's ``database-durability`` alerts to ``events`` too."""
        if events is not NO_EVENTS and events not in self.events:
            self.events.append(events)

    def read(self, engine: Engine) -> Durability:
        """Read the verdict now (alerting when it got worse)."""
        with engine.connect() as conn:
            found = probe(conn)
            conn.rollback()
        with self._lock:
            before, self.last, self._read_at = self.last, found, time.monotonic()
        if before is not None and _RANK[found.verdict] > _RANK[before.verdict]:
            message = (f"backends.{self.backend}: commits are no longer "
                       f"{before.verdict}, now {found.verdict}: {found.detail}"
                       + (f"; set {found.fix}" if found.fix else ""))
            log.warning("ALERT database-durability: %s", message)
            for events in self.events or [NO_EVENTS]:
                events.alert("database-durability", message,
                             {"backend": self.backend, "before": before.verdict,
                              "now": found.verdict})
        elif before is None and not found.synchronous and found.verdict != "local-disk":
            log.info("backends.%s: commits are %s: %s", self.backend, found.verdict,
                     found.detail)
        return found

    def require(self, engine: Engine, action: str) -> None:
        """Before a fetch or grant: refresh the verdict when due, and refuse when the
        backend must be synchronous and is not (:class:`BackendError`, one line)."""
        if self.last is None or time.monotonic() - self._read_at >= self.recheck_s:
            try:
                self.read(engine)
            except Exception as exc:  # noqa: BLE001  # the fetch itself will say why
                log.debug("backends.%s: durability check failed: %s", self.backend, exc)
                if self.replication == "any":
                    return
        last = self.last
        if self.replication == "synchronous" and (last is None or not last.synchronous):
            seen = f"{last.verdict} ({last.detail})" if last else "unknown (not readable)"
            raise BackendError(
                f"backends.{self.backend}: refusing to {action}: replication = "
                f"\"synchronous\" but commits are {seen}; set "
                f"{last.fix if last and last.fix else PG_FIX} "
                "on the database, or replication = \"any\" to accept the loss")


    def stall_cause(self, engine: Engine, wait_s: float = 0.0) -> str | None:
        """Why commits on this backend wait now (None: no sign they do), for an error
        message: the verdict is re-read in a thread of its own when older than
        :data:`STALL_RECHECK_S` (a probe through a black hole must not hold the caller
        up), waiting for it at most ``wait_s``."""
        with self._lock:
            stale = time.monotonic() - self._read_at >= STALL_RECHECK_S
            probing = self._probing
            if stale and (probing is None or not probing.is_alive()):
                probing = self._probing = started_daemon(
                    self._read_quietly, f"flakekit-durability-{self.backend}", engine)
        if stale and wait_s > 0 and probing is not None:
            probing.join(wait_s)
        last = self.last
        if last is None or (self._read_at < self._tried_at and not (
                probing is not None and probing.is_alive())):
            return None  # the last check failed: the server itself is away, say
        return last.waiting

    def _read_quietly(self, engine: Engine) -> None:
        self._tried_at = time.monotonic()
        try:
            self.read(engine)
        except Exception as exc:  # noqa: BLE001  # the caller's own error says enough
            log.debug("backends.%s: durability check failed: %s", self.backend, exc)


def stall_cause(engine: Engine, wait_s: float = 0.0) -> str | None:
    """:meth:`DurabilityWatch.stall_cause` of ``engine``'s watch (None at once where
    no standby can be waited for: SQLite)."""
    if engine.dialect.name not in ("postgresql", "mysql", "mariadb"):
        return None
    return watch_for(engine).stall_cause(engine, wait_s)


def with_stall_cause(engine: Engine, message: str, wait_s: float = 2.0) -> str:
    """``message`` of a failed fetch or grant, naming the away standby when commits
    wait for one (a lock or reply timeout says nothing of it by itself)."""
    cause = stall_cause(engine, wait_s)
    return f"{message}; {cause}" if cause else message


_WATCHES: weakref.WeakKeyDictionary[Any, DurabilityWatch] = weakref.WeakKeyDictionary()


def watch_for(engine: Engine, backend: str | None = None,
              replication: str = "any") -> DurabilityWatch:
    """The engine's watch (made by :class:`~flakekit.sql.backends.BackendPool`; an engine
    made elsewhere gets one that only reports)."""
    found = _WATCHES.get(engine)
    if found is None:
        found = _WATCHES[engine] = DurabilityWatch(backend or engine.url.drivername,
                                                   replication)
    return found


def pool_durability(pool: BackendPool) -> dict[str, dict[str, Any]]:
    """The last verdict of each engine a :class:`BackendPool` has made (no I/O: what the
    fetches and grants read last; None before the first), for the server's status."""
    from flakekit.sql.failover import FAILOVERS

    out: dict[str, dict[str, Any]] = {}
    for name, engine in pool.engines().items():
        watch = watch_for(engine, name)
        where = engine.url.render_as_string(hide_password=True)
        out[name] = {**(watch.last.to_dict() if watch.last else {"verdict": None}),
                     "replication": watch.replication,
                     "failovers": sum(n for db, n in FAILOVERS.items() if db.startswith(where)
                                      or where in db)}
    return out
