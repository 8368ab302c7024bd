"""etcd as a :class:`flakekit.plugin.KeyValueStore` (etcd3gw, the v3 JSON gateway), for the
core's lease algorithm (:class:`flakekit.plugin.KvLeaseAllocator`).

The session is ONE etcd lease per process (:mod:`flakekit_etcd.session`: every
allocator of the process with the same endpoints, TTL and credentials shares it; its TTL
is what the server granted, which may be more than asked: etcd raises small TTLs to its
minimum). Keys
created with ``session=True`` carry that lease; a version is the key's ``mod_revision``;
``commit`` is one ``txn`` (``create_revision == 0`` for a create, ``mod_revision == v``
for a put or delete, ``mod_revision`` and ``lease`` for a check) and answers the txn's
``header.revision``, which the allocator takes as the epoch. etcd keeps no time
(``now_ms`` is None): the claimant measures quarantines on its own clock.

``keepalive`` sends one ``lease keepalive``; an answer without a TTL (or TTL <= 0) means
the lease is gone: LOST at once. etcd has no connection to lose: ``state`` stays
CONNECTED while the lease lives, a failed call is BackendError (the keeper keeps the old
deadline and retries) and is reported once to the listener as SUSPENDED, the next
success as CONNECTED. A watch on each session key sends CHANGED hints (renew now); it is
never trusted (etcd3gw's watch ignores cancel and compaction answers): safety comes from
the renewal, which re-reads the claim and fences the heartbeat on it.

Several endpoints: a call goes to the current one and moves on to the next when it
refuses the connection or answers 5xx, within the call's timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from flakekit.plugin import BackendError, KvEntry, KvOp, KvState, KvStoreBase, LeaseLostError
from flakekit_etcd import wire
from flakekit_etcd.session import EtcdSession, session_for

__all__ = ["EtcdStore"]

log = logging.getLogger("flakekit.etcd")


class EtcdStore(KvStoreBase):
    """One allocator's view of the process's etcd lease: its listener, the claims it
    created (deleted on close while others keep the lease) and their watches."""

    kind = "etcd"
    epoch_is_revision = True

    def __init__(self, endpoints: str, ttl_s: int, connect_timeout_s: float, *,
                 username: str | None = None, password: str | None = None,
                 watch: bool = True) -> None:
        self.endpoints = endpoints
        self.where = self._where(endpoints)
        self.watching = watch
        self.session: EtcdSession = session_for(endpoints, ttl_s, connect_timeout_s,
                                                username, password)
        self._lease: int | None = None    # the lease this store attached to
        self._created: dict[str, int] = {}   # session keys this store created: revision
        self._watches: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    # -- session ---------------------------------------------------------------------------
    def _tell(self, state: str) -> None:
        if state != KvState.LOST or self._lease is not None:
            super()._tell(state)

    def connect(self) -> None:
        if self.state == KvState.CONNECTED:
            return
        self.session.attach(self._tell)
        self._lease = self.session.lease

    @property
    def _mine(self) -> bool:
        return self._lease is not None and self.session.attached(self._tell)

    @property
    def session_id(self) -> int | None:
        return self.session.lease if self.state == KvState.CONNECTED else None

    @property
    def session_ms(self) -> int:
        return self.session.granted_ms

    @property
    def state(self) -> str:
        if not self._mine:
            return KvState.CLOSED
        if self.session.lease != self._lease:
            return KvState.LOST      # ours ended and another was granted meanwhile
        return self.session.state

    def _call(self, path: str, payload: dict[str, Any],
              timeout: float | None = None) -> dict[str, Any]:
        if not self._mine:
            raise BackendError(f"{self.where}: the allocator's etcd client was closed")
        return self.session.call(path, payload, timeout)

    def keepalive(self, timeout: float | None = None) -> None:
        if self.state != KvState.CONNECTED:
            raise LeaseLostError(f"the etcd lease 0x{self._lease or 0:x} is {self.state}")
        self.session.keepalive(timeout)

    def time_to_live(self, lease: int, timeout: float | None = None) -> int:
        return self.session.time_to_live(lease, timeout)

    def close(self) -> None:
        """Stop the watches, delete the claims this store still holds (fenced on their
        revision and lease) and detach; the last store out revokes the lease."""
        with self._lock:
            lease, self._lease = self._lease, None
            created, self._created = self._created, {}
            watches, self._watches = self._watches, []
        for cancel in watches:
            try:
                cancel()
            except Exception:  # pragma: no cover
                log.debug("cancelling an etcd watch failed", exc_info=True)
        session = self.session
        if lease is None or not session.attached(self._tell):
            return
        if created and session.lease == lease and session.state == KvState.CONNECTED:
            compare, delete = [], []
            for key, rev in created.items():
                k = wire.b64(key)
                compare += [{"key": k, "result": "EQUAL", "target": "CREATE",
                             "create_revision": rev},
                            {"key": k, "result": "EQUAL", "target": "LEASE", "lease": lease}]
                delete.append({"request_delete_range": {"key": k}})
            try:
                session.call("kv/txn", {"compare": compare, "success": delete},
                             timeout=min(1.0, session.connect_timeout_s))
            except (BackendError, LeaseLostError) as exc:
                log.debug("deleting claims on close: %s", exc)
        session.detach(self._tell)

    # -- calls -----------------------------------------------------------------------------
    def now_ms(self, key: str) -> int | None:
        return None   # etcd keeps no time

    def ensure(self, prefix: str) -> None:
        """etcd's key space is flat: nothing to create."""

    def _range(self, key: str, end: bytes | None = None, *, keys_only: bool = False,
               timeout: float | None = None) -> list[dict[str, Any]]:
        payload = wire.range_payload(key, end, keys_only=keys_only)
        return list(self._call("kv/range", payload, timeout).get("kvs") or [])

    @staticmethod
    def _entry(kv: dict[str, Any]) -> KvEntry:
        return KvEntry(wire.unb64(kv.get("value")), int(kv.get("mod_revision", 0)), None,
                       int(kv.get("lease", 0)) or None)

    def children(self, prefix: str) -> list[str]:
        start = prefix.rstrip("/") + "/"
        kvs = self._range(start, wire.range_end(start), keys_only=True)
        return sorted({wire.unb64(kv["key"]).decode()[len(start):].split("/")[0] for kv in kvs})

    def get(self, key: str, timeout: float | None = None) -> KvEntry | None:
        kvs = self._range(key, timeout=timeout)
        return self._entry(kvs[0]) if kvs else None

    def get_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        """One range over the keys' common prefix (never more than one round trip)."""
        if not keys:
            return {}
        wanted = set(keys)
        prefix = _common_prefix(keys)
        if not prefix:
            return {k: e for k in keys if (e := self.get(k)) is not None}
        kvs = self._range(prefix, wire.range_end(prefix))
        out = {}
        for kv in kvs:
            key = wire.unb64(kv["key"]).decode()
            if key in wanted:
                out[key] = self._entry(kv)
        return out

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        lease = self._lease
        compare: list[dict[str, Any]] = []
        success: list[dict[str, Any]] = []
        created: list[str] = []
        deleted: list[str] = []
        for op in ops:
            key = op.key
            if op.kind == "create":
                compare.append(wire.created(key, 0))
                success.append(wire.put(key, op.data, lease=lease if op.session else None))
                if op.session:
                    created.append(key)
            elif op.kind in ("put", "delete", "check"):
                compare.append(wire.exists(key) if op.version is None
                               else wire.modified(key, op.version))
                if op.kind == "check" and op.owner is not None:
                    compare.append(wire.leased(key, op.owner))
                if op.kind == "put":   # keeps the key's lease (a record has none)
                    success.append(wire.put(key, op.data, keep_lease=True))
                elif op.kind == "delete":
                    success.append(wire.delete(key))
                    deleted.append(key)
            else:  # pragma: no cover - the interface has no other kind
                raise ValueError(f"unknown operation {op.kind!r}")
        body = self._call("kv/txn", {"compare": compare, "success": success}, timeout)
        if not body.get("succeeded"):
            return None
        revision = int(body["header"]["revision"])
        with self._lock:
            for key in deleted:
                self._created.pop(key, None)
            for key in created:
                self._created[key] = revision
        for key in created:
            self._watch(key, revision)
        return [revision] * len(ops)

    # -- hints -----------------------------------------------------------------------------
    def _watch(self, key: str, revision: int) -> None:
        """Watch a session key from after its creation: any event is a CHANGED hint."""
        if self.watching:
            threading.Thread(target=self._watch_loop, args=(key, revision), daemon=True,
                             name=f"flakekit-etcd-watch-{key}").start()

    def _watch_loop(self, key: str, revision: int) -> None:
        lease = self._lease
        try:
            events, cancel = self.session.client_for_watch().watch(
                key, start_revision=revision + 1)
        except Exception as exc:  # noqa: BLE001 - a hint only: the renewal keeps safety
            log.debug("etcd watch on %s not started: %s", key, exc)
            return
        with self._lock:
            if self._lease != lease or lease is None:
                cancel()
                return
            self._watches.append(cancel)
        try:
            for _event in events:
                if self._lease != lease:
                    return
                self._tell(KvState.CHANGED)
        except Exception as exc:  # noqa: BLE001  # pragma: no cover - etcd3gw ends watches quietly
            log.debug("etcd watch on %s ended: %s", key, exc)


def _common_prefix(keys: Sequence[str]) -> str:
    first, last = min(keys), max(keys)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


