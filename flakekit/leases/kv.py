"""Worker ids leased from a key-value store: one algorithm for ZooKeeper, etcd, ...

The store is reached only through :class:`KeyValueStore`; everything that decides who
holds an id lives here. Keys under ``base``::

    workers/{id}   the record, without a session (it survives its holder): JSON
                   {epoch, holder, session, lease_ms, state, issued_until}; its mtime
                   (the store's clock) is the last heartbeat or the release
    claims/{id}    attached to the holder's session; gone when the session ends
    clock          written to read the store's clock

Acquire: the lowest id with no claim whose quarantine is over, claimed in ONE
transaction (create the record, or put it conditioned on the version read, with the
next epoch; and create the claim, attached to the session, only if absent). Renew
(every session/3): the session is alive and the claim is still ours, then a heartbeat
(a put conditioned on the record's version). The deadline is
``t0 + session - safety_window``, t0 read *before* the request that proved the session
alive (the send time of the last confirmed contact), so it lies before anything the
server could count from. An id is claimable again once its claim is gone and
``quarantine`` has passed since ``mtime + lease_ms`` (the holder's last possible ID), or
since the release for a clean release. The high-water mark ``issued_until`` is the
holder's clock + the lease while held (what a crash could have stamped), the exact last
ID after a clean release; a successor waits past it.

How the stores map onto the interface:

=====================  ===============================  =================================
interface              ZooKeeper (kazoo)                etcd (v3 API, etcd3gw)
=====================  ===============================  =================================
session / TTL          the session; TTL = negotiated    one lease per process
                       timeout (min with requested)     (``lease grant``); TTL = granted
keepalive()            nothing (kazoo pings); the       ``lease keepalive``; TTL <= 0
                       claim read proves the session    answered: LeaseLostError at once
create, session=True   ephemeral znode                  txn ``create_revision(k) == 0``
                                                        then put with the lease
create (no session)    persistent znode                 txn ``create_revision(k) == 0``
put / delete on        ``set``/``delete`` with          txn ``mod_revision(k) == v``
version v              ``version=v``
KvEntry.version        ``stat.version``                 ``mod_revision``
KvEntry.owner          ``stat.ephemeralOwner``          the key's lease id
KvEntry.mtime_ms       ``stat.mtime`` (leader's clock)  None (etcd keeps no time)
commit()               ``transaction()`` (all or none)  ``txn`` (compare, success ops)
                                                        versions = header.revision
epoch                  counted in the record (+1 per    ``epoch_is_revision``: the claim
                       claim)                           txn's revision
now_ms()               mtime of a write to ``clock``    None: quarantine is measured by
                                                        the claimant (see below)
state SUSPENDED        kazoo SUSPENDED (may come back)  keep-alive failing, lease alive
state LOST             kazoo LOST (session expired)     keep-alive TTL <= 0 / lease gone
=====================  ===============================  =================================

A store without a clock (``now_ms()`` returns None) gets the quarantine measured by the
claimant on its own monotonic clock: an id whose claim is gone becomes claimable once it
was seen free, unchanged (same record version), for ``lease + quarantine``. That is a
duration measured locally, never a comparison of two machines' clocks, and it only
errs on the late side.

Adapters report failures as: a condition that did not hold -> ``None`` from ``put`` /
``commit``; the session is gone -> :class:`~flakekit.errors.LeaseLostError`; anything
else the store could not answer (timeouts included) ->
:class:`~flakekit.errors.BackendError`. Every call is bounded by its ``timeout``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol, Self

import attrs

from flakekit.errors import BackendError, LeaseLostError, WorkerExhaustedError
from flakekit.leases.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.values.clock import Clock
from flakekit.values.events import Events
from flakekit.values.timeunits import iso_utc

__all__ = ["KeyValueStore", "KvEntry", "KvLeaseAllocator", "KvOp", "KvState", "KvStoreBase"]

log = logging.getLogger("flakekit.kv")


class KvState:
    """Connection states a store reports to its listener."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"   # the session may come back: keep the deadline
    LOST = "lost"             # the session ended: every claim of it is gone
    CLOSED = "closed"
    #: a hint, not a state (``state`` never returns it): a watched key of the session
    #: changed (etcd: a claim was deleted); the holder renews now, and the renewal,
    #: which re-reads everything, decides
    CHANGED = "changed"


CONNECTED, SUSPENDED, LOST = KvState.CONNECTED, KvState.SUSPENDED, KvState.LOST

_MAX_RACES = 20


@attrs.frozen
class KvEntry:
    """One key as read.

    Attributes:
        data: the value.
        version: what a conditional write compares against (grows on every write).
        mtime_ms: the store's clock at the last write (None when it keeps no time).
        owner: the session the key is attached to (None or 0: none).
    """

    data: bytes
    version: int
    mtime_ms: int | None = None
    owner: int | None = None


@attrs.frozen
class KvOp:
    """One operation of a transaction.

    ``create``: only if the key is absent; ``session=True`` attaches it to the session
    (gone when the session ends). ``put`` / ``delete``: only if the key's version is
    still ``version``. ``check`` (stores with ``epoch_is_revision``): writes nothing,
    only if the key exists at ``version`` and, with ``owner``, is attached to that
    session: a claim is never rewritten, so its version is the revision that created it
    (the epoch), and a renewal or release fenced on it fails once the claim is gone.
    """

    kind: str   # "create" | "put" | "delete" | "check"
    key: str
    data: bytes = b""
    version: int | None = None
    session: bool = False
    owner: int | None = None

    @classmethod
    def create(cls, key: str, data: bytes, *, session: bool = False) -> KvOp:
        return cls("create", key, data, None, session)

    @classmethod
    def put(cls, key: str, data: bytes, version: int) -> KvOp:
        return cls("put", key, data, version)

    @classmethod
    def delete(cls, key: str, version: int | None = None) -> KvOp:
        return cls("delete", key, b"", version)

    @classmethod
    def check(cls, key: str, version: int, owner: int | None = None) -> KvOp:
        return cls("check", key, b"", version, False, owner)


class KeyValueStore(Protocol):
    """What the lease algorithm needs from a coordination service (see the table above).

    ``kind`` names the service in messages (``"ZooKeeper"``); ``where`` says which one
    (``"ZooKeeper at zk1:2181"``). ``timeout=None`` means the store's own bound (its
    connect timeout).
    """

    kind: str
    where: str
    #: True: a claim's epoch is the revision its transaction committed at (etcd)
    epoch_is_revision: bool

    def connect(self) -> None:
        """Open (or wait for) the session; BackendError when the service does not answer."""

    @property
    def session_id(self) -> int | None:
        """The live session (None while not connected or after it ended)."""

    @property
    def session_ms(self) -> int:
        """The session TTL to plan with: what the server granted (never more than asked)."""

    @property
    def state(self) -> str:
        """A :class:`KvState`: CONNECTED, SUSPENDED (the session may come back), LOST
        (it ended) or CLOSED."""

    def listen(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(state)`` on every state change (from the store's thread: the
        callback only sets flags)."""

    def keepalive(self, timeout: float | None = None) -> None:
        """Prove the session alive now (LeaseLostError if it is gone)."""

    def now_ms(self, key: str) -> int | None:
        """The store's clock (by a write to ``key``), None if it has none."""

    def ensure(self, prefix: str) -> None: ...
    def children(self, prefix: str) -> list[str]:
        """Names directly under ``prefix`` ([] when there is none)."""

    def get(self, key: str, timeout: float | None = None) -> KvEntry | None: ...
    def get_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        """The keys that exist (read in parallel or in one range)."""

    def put(self, key: str, data: bytes, version: int,
            timeout: float | None = None) -> int | None:
        """Write if the version still is ``version``: the new version, None if not."""

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        """All of ``ops`` or none: each op's new version (the revision, for etcd), or
        None when a condition failed."""

    def close(self) -> None:
        """End the session (safe from any thread, while a call is in flight)."""



class KvStoreBase:
    """What the :class:`KeyValueStore` implementations share: the one listener told of
    every state change (:meth:`_tell`), the state and session kept in ``_state`` and
    ``_session`` (a store that derives them from its client overrides the properties),
    ``where`` worded from ``kind``, and ``put`` as a one-operation :meth:`commit`."""

    kind: str
    where: str
    _listener: Callable[[str], None] | None = None
    _state: str = KvState.CLOSED
    _session: int | None = None

    def _where(self, address: str) -> str:
        """What ``where`` says: ``ZooKeeper at zk1:2181``."""
        return f"{self.kind} at {address}"

    def listen(self, callback: Callable[[str], None]) -> None:
        self._listener = callback

    def _tell(self, state: str) -> None:
        if self._listener is not None:
            self._listener(state)

    @property
    def session_id(self) -> int | None:
        return self._session if self.state == KvState.CONNECTED else None

    @property
    def state(self) -> str:
        return self._state

    def put(self, key: str, data: bytes, version: int,
            timeout: float | None = None) -> int | None:
        done = self.commit([KvOp.put(key, data, version)], timeout)
        return None if done is None else done[0]

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        raise NotImplementedError

@attrs.frozen
class _Record:
    """A ``workers/{id}`` record."""

    epoch: int
    holder: str
    session: str
    lease_ms: int
    state: str
    issued_until_ms: int
    mtime_ms: int | None
    version: int

    @classmethod
    def parse(cls, entry: KvEntry) -> _Record:
        try:
            raw = json.loads(entry.data.decode() or "{}")
        except (ValueError, UnicodeDecodeError):
            raw = {}
        return cls(int(raw.get("epoch", 0)), str(raw.get("holder", "")),
                   str(raw.get("session", "")), int(raw.get("lease_ms", 0)),
                   str(raw.get("state", "")), int(raw.get("issued_until", 0)),
                   entry.mtime_ms, entry.version)

    def last_id_ms(self) -> int:
        """Store time of the holder's last possible ID."""
        mtime = self.mtime_ms or 0
        return mtime if self.state == "released" else mtime + self.lease_ms

    def free_at_ms(self, quarantine_ms: int) -> int:
        """Store time from which the id may be claimed (its claim being gone)."""
        return self.last_id_ms() + quarantine_ms


def _data(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


def _ms(ts: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts / 1000, dt.UTC)


@attrs.define(eq=False)
class KvLeaseAllocator:
    """Worker ids held by session-attached claims; stops a safety window before the
    session may end. A :class:`~flakekit.leases.lease.WorkerAllocator`.

    Args:
        store: the adapter.
        base: the key prefix of this namespace (``/flakekit/orders``).
        clock: the generator's clock (deadlines on its monotonic timeline).
        safety_window_ns: how long before the session could end IDs stop.
        quarantine_ns: how long a freed id stays unclaimable after its last ID.
        connect_timeout_ns: the longest any call waits (renewals wait less).
    """

    store: KeyValueStore
    base: str
    clock: Clock
    events: Events
    safety_window_ns: int
    quarantine_ns: int
    connect_timeout_ns: int
    generator: str = "default"
    path: str = "allocator"
    host: str = ""
    port: int = 0
    #: the plugin's settings it was built from (None: built directly)
    settings: Any = None
    lost: str | None = None
    suspended: int = 0
    _session: int | None = None
    _worker: int | None = None
    _version: int = -1
    _epoch: int = 0          # the record's counted epoch (what the next claim adds 1 to)
    _claim_version: int = -1  # the claim's version (epoch_is_revision: the epoch)
    _lease_ms: int = 0
    _holder: str = ""
    _watch: Callable[[str, str], None] | None = None
    _lock: threading.RLock = attrs.Factory(threading.RLock)
    #: stores without a clock: (id, record version) -> monotonic ns first seen free
    _seen_free: dict[tuple[int, int], int] = attrs.Factory(dict)

    @classmethod
    def from_settings(cls, store: KeyValueStore, base: str, settings: Any, ctx: Any,
                      **extra: Any) -> Self:
        """Built from a plugin's settings (its ``safety_window``, ``quarantine`` and
        ``connect_timeout`` durations) and the factory's build context (clock, events,
        generator, path, host and port); ``extra``: the subclass's own fields."""
        return cls(store=store, base=base, clock=ctx.clock, events=ctx.events,
                   safety_window_ns=settings.safety_window, quarantine_ns=settings.quarantine,
                   connect_timeout_ns=settings.connect_timeout, generator=ctx.generator,
                   path=ctx.path, host=ctx.host, port=ctx.port, settings=settings, **extra)

    def __attrs_post_init__(self) -> None:
        self.store.listen(self._on_state)

    # -- paths and facts -------------------------------------------------------------------
    def _w(self, wid: int) -> str:
        return f"{self.base}/workers/{wid}"

    def _c(self, wid: int) -> str:
        return f"{self.base}/claims/{wid}"

    @property
    def session_ms(self) -> int:
        return self.store.session_ms

    @property
    def renew_interval(self) -> float:
        return self.session_ms / 3000

    @property
    def lease_ms(self) -> int:
        """The held lease's length in ms, as the store granted it (0: none held yet)."""
        return self._lease_ms

    #: a LOST session is not the end: take a new (quarantine-respecting) id and go on,
    #: unless the config says ``on_lease_lost = "stop"`` or ``"exit"``
    default_on_lease_lost = "restart"

    @property
    def quarantine_ms(self) -> int:
        return self.quarantine_ns // 1_000_000

    @property
    def op_timeout(self) -> float:
        """The longest a renewal waits for one reply: a third of the session (the renew
        interval), at least 0.5 s, at most the connect timeout."""
        return min(self.connect_timeout_ns / 1e9, max(0.5, self.session_ms / 3000))

    def watch(self, callback: Callable[[str, str], None] | None) -> None:
        """Push channel: ``callback("lost", reason)`` from the store's thread as soon as
        the session is LOST (the keeper revokes at once); ``("connected", "")`` when the
        connection is back (the keeper renews now)."""
        self._watch = callback

    def _sid(self, session: int | None) -> str:
        return f"0x{session or 0:x}"

    def _on_state(self, state: str) -> None:
        # the store's event thread: flags only, no calls to the store
        kind = self.store.kind
        if state == LOST and self._session is not None and self.lost is None:
            self.lost = f"{kind} session {self._sid(self._session)} expired (LOST)"
            log.error("%s: %s; worker %s is gone", self.generator, self.lost, self._worker)
            if self._watch is not None:
                self._watch("lost", self.lost)
        elif state == SUSPENDED:
            self.suspended += 1
            log.warning("%s: %s connection SUSPENDED; IDs stop at the lease deadline "
                        "unless the session comes back", self.generator, kind)
        elif state in (CONNECTED, KvState.CHANGED) and self._session is not None \
                and self._watch is not None:
            self._watch("connected", "")   # renew now: IDs resume without waiting

    # -- acquire -------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        with self._lock:
            if self.lost is not None:  # after LOST: a fresh session, not a reconnect loop
                self.close()
                self.lost = None
            self.store.connect()   # BackendError as it is; a failed connect keeps nothing
            try:
                return self._acquire(request)
            except (BackendError, LeaseLostError) as exc:
                self.close()  # nothing is held: no client threads left behind
                raise BackendError(f"{self.generator}: {exc}") from None
            except BaseException:
                self.close()
                raise

    def _scan(self) -> tuple[int | None, set[int], dict[int, _Record]]:
        now = self.store.now_ms(f"{self.base}/clock")
        claims = {int(c) for c in self.store.children(f"{self.base}/claims") if c.isdigit()}
        ids = [int(c) for c in self.store.children(f"{self.base}/workers") if c.isdigit()]
        found = self.store.get_many([self._w(i) for i in ids])
        records = {i: _Record.parse(found[self._w(i)]) for i in ids if self._w(i) in found}
        return now, claims, records

    def _free_at(self, wid: int, rec: _Record, now: int | None, mono: int) -> int:
        """When ``wid`` is claimable, on the scale of ``now`` (the store's clock), or of
        the monotonic clock in ms for a store without one."""
        if now is not None:
            return rec.free_at_ms(self.quarantine_ms)
        wait = (0 if rec.state == "released" else rec.lease_ms) + self.quarantine_ms
        first = self._seen_free.setdefault((wid, rec.version), mono)
        return first // 1_000_000 + wait

    def _acquire(self, request: LeaseRequest) -> WorkerLease:
        self.store.ensure(f"{self.base}/workers")
        self.store.ensure(f"{self.base}/claims")
        self._holder = f"{request.host or self.host}:{request.port or self.port}/{os.getpid()}"
        for _ in range(_MAX_RACES):
            now, claims, records = self._scan()
            mono = self.clock.monotonic_ns()
            ref = now if now is not None else mono // 1_000_000
            quarantined = {}
            wid = None
            for i in range(request.max_worker_id + 1):
                if i in claims:
                    continue
                rec = records.get(i)
                if rec is not None:
                    free_at = self._free_at(i, rec, now, mono)
                    if free_at > ref:
                        quarantined[i] = free_at
                        continue
                wid = i
                break
            if now is None:   # forget sightings of ids that changed or were claimed since
                seen = {(i, r.version) for i, r in records.items() if i not in claims}
                self._seen_free = {k: v for k, v in self._seen_free.items() if k in seen}
            if wid is None:
                self._exhausted(request, claims, quarantined, ref)
            lease = self._claim(wid, records.get(wid))
            if lease is not None:
                return lease
        raise BackendError(f"lost the race for a free worker id {_MAX_RACES} times under "
                           f"{self.base}; retry")

    def _exhausted(self, request: LeaseRequest, claims: set[int],
                   quarantined: dict[int, int], now: int) -> NoReturn:
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

    def _claim(self, wid: int, rec: _Record | None) -> WorkerLease | None:
        store = self.store
        session_ms = store.session_ms
        lease_ms = session_ms - self.safety_window_ns // 1_000_000
        epoch = (rec.epoch if rec else 0) + 1
        session = store.session_id or 0
        # the mark is the latest time this holder may stamp an ID before its next
        # heartbeat (its clock + the lease): a successor after a crash waits past it
        bound = max(rec.issued_until_ms if rec else 0,
                    self.clock.time_ns() // 1_000_000 + lease_ms)
        data = _data(epoch=epoch, holder=self._holder, session=self._sid(session),
                     lease_ms=lease_ms, state="held", issued_until=bound)
        t0 = self.clock.monotonic_ns()
        record = (KvOp.create(self._w(wid), data) if rec is None
                  else KvOp.put(self._w(wid), data, rec.version))
        claim = KvOp.create(self._c(wid), _data(holder=self._holder, epoch=epoch),
                            session=True)
        versions = store.commit([record, claim])
        if versions is None:
            log.info("%s: worker %d was taken meanwhile; rescanning", self.generator, wid)
            return None
        entry = store.get(self._c(wid))
        if entry is None or entry.owner != session or store.session_id != session:
            log.warning("%s: the session changed while claiming worker %d; retrying",
                        self.generator, wid)
            return None
        self._session, self._worker, self._version = session, wid, versions[0]
        self._claim_version = versions[1]
        self._epoch, self._lease_ms, self.lost = epoch, lease_ms, None
        return WorkerLease(
            worker_id=wid, epoch=versions[1] if store.epoch_is_revision else epoch,
            holder=f"{self._holder} session {self._sid(session)}",
            ttl=session_ms / 1000, deadline_ns=t0 + lease_ms * 1_000_000,
            not_before_ns=(rec.issued_until_ms if rec else 0) * 1_000_000,
            stamp_until_ns=bound * 1_000_000,
        )

    # -- renew / release -------------------------------------------------------------------
    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        """Heartbeat. The connection state is read first: SUSPENDED is not LOST (the same
        session may come back), so it raises BackendError and the keeper keeps the old
        deadline; only LOST, another session or a missing claim mean the id is gone."""
        with self._lock:
            store, session, wid = self.store, self._session, self._worker
            if self.lost is not None:
                raise LeaseLostError(f"{self.lost}; worker {lease.worker_id} may be "
                                     "claimed by another process")
            if wid is None or session is None:
                raise LeaseLostError("the allocator was closed")
            if store.state != CONNECTED:   # while not connected the session is unknown
                raise BackendError(f"{store.kind} connection is {store.state.upper()}; waiting "
                                   f"for session {self._sid(session)} to come back")
            if store.session_id != session:
                raise LeaseLostError(
                    f"{store.kind} session {self._sid(session)} was replaced by "
                    f"{self._sid(store.session_id)}: the old one expired")
            t0 = self.clock.monotonic_ns()   # before the contact that proves the session
            wait = self.op_timeout
            try:
                store.keepalive(wait)
                entry = store.get(self._c(wid), timeout=wait)
                if entry is None or entry.owner != session:
                    raise LeaseLostError(f"the claim {self._c(wid)} is gone or belongs to "
                                         "another session")
                until = max(-(-issued_until_ns // 1_000_000),
                            self.clock.time_ns() // 1_000_000 + self._lease_ms)
                data = _data(epoch=self._epoch, holder=self._holder,
                             session=self._sid(session), lease_ms=self._lease_ms,
                             state="held", issued_until=until)
                version = self._heartbeat(wid, session, data, wait)
                if version is None:
                    # a heartbeat that timed out may have reached the server later: the
                    # record is still ours if it carries our session and epoch
                    self._version = self._own_version(wid, session, wait)
                    version = self._heartbeat(wid, session, data, wait)
                    if version is None:
                        raise LeaseLostError(f"worker {wid} changed hands: its record "
                                             "changed under the heartbeat")
            except BackendError as exc:
                raise BackendError(f"heartbeat failed: {exc}") from None
            if store.session_id != session:  # expired while we talked
                raise LeaseLostError(f"{store.kind} session {self._sid(session)} expired")
            self._version = version
            return attrs.evolve(lease, deadline_ns=t0 + self._lease_ms * 1_000_000,
                                stamp_until_ns=until * 1_000_000)

    def _fence(self, wid: int, session: int | None) -> list[KvOp]:
        """Stores whose epoch is a revision condition every write on the claim: it still
        exists, created by our claim (its version is the epoch), on our session."""
        if not self.store.epoch_is_revision:
            return []
        return [KvOp.check(self._c(wid), self._claim_version, owner=session)]

    def _heartbeat(self, wid: int, session: int, data: bytes, wait: float) -> int | None:
        fence = self._fence(wid, session)
        if not fence:
            return self.store.put(self._w(wid), data, self._version, timeout=wait)
        done = self.store.commit([*fence, KvOp.put(self._w(wid), data, self._version)],
                                 timeout=wait)
        return None if done is None else done[-1]

    def _own_version(self, wid: int, session: int, wait: float) -> int:
        entry = self.store.get(self._w(wid), timeout=wait)
        if entry is None:
            raise LeaseLostError(f"worker {wid} changed hands: {self._w(wid)} is gone")
        rec = _Record.parse(entry)
        if rec.session != self._sid(session) or rec.epoch != self._epoch \
                or rec.state != "held":
            raise LeaseLostError(f"worker {wid} changed hands: {self._w(wid)} now holds "
                                 f"epoch {rec.epoch} of session {rec.session}")
        return rec.version

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        """Mark the id released (its quarantine starts now) and drop the claim, fenced
        on the record's version: a deposed holder's release fails instead of writing."""
        with self._lock:
            store, session, wid = self.store, self._session, self._worker
            self._worker = self._session = None
            if wid is None or self.lost is not None or store.state != CONNECTED \
                    or store.session_id != session:
                return
            # stopped: the exact last ID (never below the previous holder's mark)
            until = -(-max(issued_until_ns, lease.not_before_ns) // 1_000_000)
            data = _data(epoch=self._epoch, holder=self._holder, session=self._sid(session),
                         lease_ms=self._lease_ms, state="released", issued_until=until)
            try:
                done = store.commit([*self._fence(wid, session),
                                     KvOp.put(self._w(wid), data, self._version),
                                     KvOp.delete(self._c(wid))], timeout=self.op_timeout)
            except (BackendError, LeaseLostError) as exc:
                log.warning("%s: releasing worker %d failed: %s", self.generator, wid, exc)
                return
            if done is None:
                log.warning("%s: releasing worker %d failed: it changed hands",
                            self.generator, wid)

    def records(self) -> list[WorkerRecord]:
        with self._lock:
            try:
                self.store.connect()
                now, claims, records = self._scan()
            except (BackendError, LeaseLostError) as exc:
                raise BackendError(str(exc)) from None
            out = []
            for wid in sorted(set(claims) | set(records)):
                rec = records.get(wid)
                free_at = rec.free_at_ms(self.quarantine_ms) if rec else 0
                if wid in claims:
                    state = "held"
                elif now is not None and free_at > now:
                    state = "quarantined"
                elif now is None and rec is not None and rec.state == "held":
                    state = "lapsed"   # no clock: quarantine is the claimant's to measure
                else:
                    state = "free"
                seen = rec.mtime_ms if rec else None
                out.append(WorkerRecord(
                    worker_id=wid, holder=rec.holder if rec else "?",
                    epoch=rec.epoch if rec else 0,
                    last_seen=_ms(seen) if seen is not None else None, state=state,
                    mine=wid == self._worker and self._session is not None,
                    extra={"mode": "lease", "session": rec.session if rec else "",
                           "free_at": iso_utc(_ms(free_at)) if state == "quarantined"
                           else None, "issued_until": rec.issued_until_ms if rec else 0},
                ))
            return out

    def close(self) -> None:
        """End the session. Takes no lock, so it never waits for a call in flight (that
        call then fails): the keeper closes from another thread during a re-acquire."""
        self._session = self._worker = None   # first: closing reports LOST
        self.store.close()

    def stats(self) -> dict[str, Any]:
        return {"session": self._sid(self._session) if self._session else None,
                "worker": self._worker, "epoch": self._epoch, "lost": self.lost,
                "suspended": self.suspended}
