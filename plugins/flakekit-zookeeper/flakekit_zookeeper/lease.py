"""``mode = "lease"``: recyclable worker ids; the ZooKeeper session is the lease (seed 002).

Znodes under ``{root}/{name}`` (default ``/flakekit/{generator}``)::

    workers/{id}   persistent; JSON {epoch, holder, session, lease_ms, state,
                   issued_until}; its mtime (ZooKeeper's clock) is the last heartbeat
                   or the release
    claims/{id}    ephemeral, owned by the holder's session
    clock          written to read ZooKeeper's time

Acquire: the lowest id with no claim whose quarantine is over, claimed in ONE transaction
(set ``workers/{id}`` with the next epoch, compare-and-set on its version, and create
``claims/{id}``). Renew (every session_timeout/3): the claim still belongs to our
session, then a heartbeat (CAS on the version). The deadline is
``t0 + session - safety_window``, where t0 is read *before* the request that proved the
session alive, so it lies before anything the server could count from.

An id is claimable again once its claim is gone (the session ended) and
``quarantine`` has passed since ``mtime + lease_ms`` (the holder's last possible ID),
or since the release for a clean release.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import attrs
from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NoNodeError, SessionExpiredError

from flakekit.clock import Clock
from flakekit.errors import BackendError, LeaseLostError, WorkerExhaustedError
from flakekit.events import Events
from flakekit.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit_zookeeper.client import ZK_ERRORS, ZkConnection

__all__ = ["LeaseAllocator"]

log = logging.getLogger("flakekit.zookeeper")

_MAX_RACES = 20


@attrs.frozen
class _Node:
    """A ``workers/{id}`` znode."""

    epoch: int
    holder: str
    session: str
    lease_ms: int
    state: str
    issued_until_ms: int
    mtime_ms: int
    version: int

    @classmethod
    def parse(cls, data: bytes, stat: Any) -> _Node:
        try:
            raw = json.loads(data.decode() or "{}")
        except (ValueError, UnicodeDecodeError):
            raw = {}
        return cls(int(raw.get("epoch", 0)), str(raw.get("holder", "")),
                   str(raw.get("session", "")), int(raw.get("lease_ms", 0)),
                   str(raw.get("state", "")), int(raw.get("issued_until", 0)),
                   stat.mtime, stat.version)

    def free_at_ms(self, quarantine_ms: int) -> int:
        """ZooKeeper time from which the id may be claimed (its claim being gone)."""
        last_id = self.mtime_ms if self.state == "released" else self.mtime_ms + self.lease_ms
        return last_id + quarantine_ms


def _data(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


def _ms(ts: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts / 1000, dt.UTC)


@attrs.define(eq=False)
class LeaseAllocator:
    """Worker ids held by ephemeral claims; stops a safety window before the session may end."""

    settings: Any
    hosts: str
    name: str
    root: str
    clock: Clock
    events: Events
    generator: str = "default"
    path: str = "allocator"
    host: str = ""
    port: int = 0
    lost: str | None = None
    suspended: int = 0
    _conn: ZkConnection | None = None
    _session: int | None = None
    _worker: int | None = None
    _version: int = -1
    _epoch: int = 0
    _lease_ms: int = 0
    _holder: str = ""
    _watch: Callable[[str, str], None] | None = None
    _lock: threading.RLock = attrs.Factory(threading.RLock)

    # -- paths and facts -------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"{self.root}/{self.name}"

    def _w(self, wid: int) -> str:
        return f"{self.base}/workers/{wid}"

    def _c(self, wid: int) -> str:
        return f"{self.base}/claims/{wid}"

    @property
    def session_ms(self) -> int:
        return self._conn.session_ms() if self._conn else self.settings.session_timeout // 10**6

    @property
    def renew_interval(self) -> float:
        return self.session_ms / 3000

    #: a LOST session is not the end: take a new (quarantine-respecting) id and go on,
    #: unless the config says ``on_lease_lost = "stop"`` or ``"exit"``
    default_on_lease_lost = "restart"

    @property
    def quarantine_ms(self) -> int:
        return self.settings.quarantine // 1_000_000

    def watch(self, callback: Callable[[str, str], None] | None) -> None:
        """Optional push channel: ``callback("lost", reason)`` from kazoo's thread as soon
        as the session is LOST (a keeper that supports it revokes at once)."""
        self._watch = callback

    # -- connection ----------------------------------------------------------------------
    def _connect(self) -> ZkConnection:
        if self._conn is None:
            conn = ZkConnection(self.hosts, self.settings.session_timeout / 1e9,
                                self.settings.connect_timeout / 1e9)
            conn.add_listener(self._on_state)
            self._conn = conn
        try:
            return self._conn_started()
        except BackendError:
            self._conn = None
            raise

    def _conn_started(self) -> ZkConnection:
        assert self._conn is not None
        self._conn.start()
        return self._conn

    def _on_state(self, state: str) -> None:
        # kazoo's event thread: flags only, no ZooKeeper calls
        if state == KazooState.LOST and self._session is not None and self.lost is None:
            self.lost = f"ZooKeeper session 0x{self._session:x} expired (LOST)"
            log.error("%s: %s; worker %s is gone", self.generator, self.lost, self._worker)
            if self._watch is not None:
                self._watch("lost", self.lost)
        elif state == KazooState.SUSPENDED:
            self.suspended += 1
            log.warning("%s: ZooKeeper connection SUSPENDED; IDs stop at the lease deadline "
                        "unless it comes back", self.generator)

    def _server_now_ms(self, zk: Any) -> int:
        """ZooKeeper's time (the leader's clock), read by writing the clock znode."""
        node = f"{self.base}/clock"
        try:
            return zk.set(node, b"").mtime
        except NoNodeError:
            zk.ensure_path(node)
            return zk.set(node, b"").mtime

    # -- acquire -------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        with self._lock:
            if self.lost is not None:  # after LOST: a fresh client, not kazoo's reconnect loop
                self.close()
            conn = self._connect()
            try:
                return self._acquire(conn, request)
            except ZK_ERRORS as exc:
                self.close()  # nothing is held: no kazoo threads left behind
                raise BackendError(f"{self.generator}: ZooKeeper at {self.hosts}: "
                                   f"{exc!r}") from None
            except BaseException:
                self.close()
                raise

    def _scan(self, zk: Any) -> tuple[int, set[int], dict[int, _Node]]:
        now = self._server_now_ms(zk)
        claims = {int(c) for c in zk.get_children(f"{self.base}/claims") if c.isdigit()}
        pending = {int(c): zk.get_async(self._w(int(c)))
                   for c in zk.get_children(f"{self.base}/workers") if c.isdigit()}
        nodes = {}
        for wid, res in pending.items():
            try:
                data, stat = res.get(timeout=self.settings.connect_timeout / 1e9)
            except NoNodeError:
                continue
            nodes[wid] = _Node.parse(data, stat)
        return now, claims, nodes

    def _acquire(self, conn: ZkConnection, request: LeaseRequest) -> WorkerLease:
        zk = conn.client
        zk.ensure_path(f"{self.base}/workers")
        zk.ensure_path(f"{self.base}/claims")
        self._holder = f"{request.host or self.host}:{request.port or self.port}/{os.getpid()}"
        for _ in range(_MAX_RACES):
            now, claims, nodes = self._scan(zk)
            quarantined = {}
            wid = None
            for i in range(request.max_worker_id + 1):
                if i in claims:
                    continue
                node = nodes.get(i)
                if node is not None and node.free_at_ms(self.quarantine_ms) > now:
                    quarantined[i] = node.free_at_ms(self.quarantine_ms)
                    continue
                wid = i
                break
            if wid is None:
                self._exhausted(request, claims, quarantined, now)
            lease = self._claim(conn, wid, nodes.get(wid))
            if lease is not None:
                return lease
        raise BackendError(f"{self.generator}: lost the race for a free worker id "
                           f"{_MAX_RACES} times under {self.base}; retry")

    def _exhausted(self, request: LeaseRequest, claims: set[int],
                   quarantined: dict[int, int], now: int) -> None:
        total = request.max_worker_id + 1
        msg = (f"{self.generator}: all {total} worker ids under {self.base} are taken: "
               f"{len(claims)} held")
        if quarantined:
            soon = min(quarantined.values())
            msg += (f", {len(quarantined)} in quarantine (the first is free again in "
                    f"{max(soon - now, 0) / 1000:.1f} s)")
        self.events.alert("workers-exhausted", msg, {"held": len(claims),
                                                     "quarantined": len(quarantined)})
        raise WorkerExhaustedError(msg + "; flakekit never takes a live id. Stop idle "
                                   "generators, shorten quarantine, or use a layout with "
                                   "more worker bits")

    def _claim(self, conn: ZkConnection, wid: int, node: _Node | None) -> WorkerLease | None:
        zk = conn.client
        session_ms = conn.session_ms()
        lease_ms = session_ms - self.settings.safety_window // 1_000_000
        epoch = (node.epoch if node else 0) + 1
        session = conn.session_id or 0
        # the mark is the latest time this holder may stamp an ID before its next
        # heartbeat (its clock + the lease): a successor after a crash waits past it
        bound = max(node.issued_until_ms if node else 0,
                    self.clock.time_ns() // 1_000_000 + lease_ms)
        data = _data(epoch=epoch, holder=self._holder, session=f"0x{session:x}",
                     lease_ms=lease_ms, state="held", issued_until=bound)
        t0 = self.clock.monotonic_ns()
        tx = zk.transaction()
        if node is None:
            tx.create(self._w(wid), data)
        else:
            tx.set_data(self._w(wid), data, version=node.version)
        tx.create(self._c(wid), _data(holder=self._holder, epoch=epoch), ephemeral=True)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            log.info("%s: worker %d was taken meanwhile (%s); rescanning", self.generator,
                     wid, [type(r).__name__ for r in results])
            return None
        version = 0 if node is None else results[0].version
        stat = zk.exists(self._c(wid))
        if stat is None or stat.ephemeralOwner != session or conn.session_id != session:
            log.warning("%s: the session changed while claiming worker %d; retrying",
                        self.generator, wid)
            return None
        self._session, self._worker, self._version = session, wid, version
        self._epoch, self._lease_ms, self.lost = epoch, lease_ms, None
        return WorkerLease(
            worker_id=wid, epoch=epoch, holder=f"{self._holder} session 0x{session:x}",
            ttl=session_ms / 1000, deadline_ns=t0 + lease_ms * 1_000_000,
            not_before_ns=(node.issued_until_ms if node else 0) * 1_000_000,
            stamp_until_ns=bound * 1_000_000,
        )

    # -- renew / release -------------------------------------------------------------------
    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        with self._lock:
            conn, session, wid = self._conn, self._session, self._worker
            if self.lost is not None:
                raise LeaseLostError(f"{self.lost}; worker {lease.worker_id} may be "
                                     "claimed by another process")
            if conn is None or wid is None or session is None:
                raise LeaseLostError("the allocator was closed")
            if conn.session_id != session:
                raise LeaseLostError(f"ZooKeeper session 0x{session:x} was replaced by "
                                     f"0x{conn.session_id or 0:x}: the old one expired")
            if not conn.connected:
                raise BackendError(f"ZooKeeper connection is {conn.client.state}")
            zk = conn.client
            t0 = self.clock.monotonic_ns()
            try:
                stat = zk.exists(self._c(wid))
                if stat is None or stat.ephemeralOwner != session:
                    raise LeaseLostError(f"the claim {self._c(wid)} is gone or belongs to "
                                         "another session")
                until = max(-(-issued_until_ns // 1_000_000),
                            self.clock.time_ns() // 1_000_000 + self._lease_ms)
                st = zk.set(self._w(wid), _data(
                    epoch=self._epoch, holder=self._holder, session=f"0x{session:x}",
                    lease_ms=self._lease_ms, state="held", issued_until=until,
                ), version=self._version)
            except (BadVersionError, NoNodeError, SessionExpiredError) as exc:
                raise LeaseLostError(f"worker {wid} changed hands: {exc!r}") from None
            except ZK_ERRORS as exc:
                raise BackendError(f"heartbeat failed: {exc!r}") from None
            if conn.session_id != session:  # expired while we talked
                raise LeaseLostError(f"ZooKeeper session 0x{session:x} expired")
            self._version = st.version
            return attrs.evolve(lease, deadline_ns=t0 + self._lease_ms * 1_000_000,
                                stamp_until_ns=until * 1_000_000)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        """Mark the id released (its quarantine starts now) and drop the claim."""
        with self._lock:
            conn, session, wid = self._conn, self._session, self._worker
            self._worker = self._session = None
            if conn is None or wid is None or self.lost is not None \
                    or conn.session_id != session or not conn.connected:
                return
            # stopped: the exact last ID (never below the previous holder's mark)
            until = -(-max(issued_until_ns, lease.not_before_ns) // 1_000_000)
            tx = conn.client.transaction()
            tx.set_data(self._w(wid), _data(
                epoch=self._epoch, holder=self._holder, session=f"0x{session:x}",
                lease_ms=self._lease_ms, state="released", issued_until=until,
            ), version=self._version)
            tx.delete(self._c(wid))
            try:
                results = tx.commit()
            except ZK_ERRORS as exc:
                log.warning("%s: releasing worker %d failed: %r", self.generator, wid, exc)
                return
            if any(isinstance(r, Exception) for r in results):
                log.warning("%s: releasing worker %d failed: %s", self.generator, wid, results)

    def records(self) -> list[WorkerRecord]:
        with self._lock:
            try:
                zk = self._connect().client
                now, claims, nodes = self._scan(zk)
            except NoNodeError:
                return []
            except ZK_ERRORS as exc:
                raise BackendError(f"ZooKeeper at {self.hosts}: {exc!r}") from None
            out = []
            for wid in sorted(set(claims) | set(nodes)):
                node = nodes.get(wid)
                free_at = node.free_at_ms(self.quarantine_ms) if node else 0
                if wid in claims:
                    state = "held"
                elif free_at > now:
                    state = "quarantined"
                else:
                    state = "free"
                out.append(WorkerRecord(
                    worker_id=wid, holder=node.holder if node else "?",
                    epoch=node.epoch if node else 0,
                    last_seen=_ms(node.mtime_ms) if node else None, state=state,
                    mine=wid == self._worker and self._session is not None,
                    extra={"mode": "lease", "session": node.session if node else "",
                           "free_at": _ms(free_at).isoformat() if state == "quarantined"
                           else None, "issued_until": node.issued_until_ms if node else 0},
                ))
            return out

    def close(self) -> None:
        with self._lock:
            self._session = self._worker = None   # first: closing reports LOST
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def stats(self) -> dict[str, Any]:
        return {"session": f"0x{self._session:x}" if self._session else None,
                "worker": self._worker, "epoch": self._epoch, "lost": self.lost,
                "suspended": self.suspended}
