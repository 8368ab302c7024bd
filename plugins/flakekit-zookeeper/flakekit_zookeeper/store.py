"""ZooKeeper as a :class:`flakekit.plugin.KeyValueStore` (kazoo), for the core's lease
algorithm (:class:`flakekit.plugin.KvLeaseAllocator`).

The session is the lease (TTL = the negotiated timeout); a key created with
``session=True`` is an ephemeral znode; a version is ``stat.version``; the clock is the
mtime of a write (the leader's clock). kazoo's BadVersion / NoNode / NodeExists are
failed conditions (``None``), SessionExpired is LeaseLostError, any other kazoo error
or timeout is BackendError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import ZnodeStat

from flakekit.plugin import BackendError, KvEntry, KvOp, KvState, KvStoreBase, LeaseLostError
from flakekit_zookeeper.client import ZK_ERRORS, ZkConnection, start_held

__all__ = ["ZkStore"]

_CONDITIONS = (BadVersionError, NoNodeError, NodeExistsError)
_STATES = {KazooState.CONNECTED: KvState.CONNECTED, KazooState.SUSPENDED: KvState.SUSPENDED,
           KazooState.LOST: KvState.LOST}


def _entry(data: bytes, stat: Any) -> KvEntry:
    return KvEntry(data, stat.version, stat.mtime, stat.ephemeralOwner or None)


class ZkStore(KvStoreBase):
    """One kazoo client (made on :meth:`connect`, dropped on :meth:`close`)."""

    kind = "ZooKeeper"
    epoch_is_revision = False

    def __init__(self, hosts: str, session_timeout_s: float, connect_timeout_s: float) -> None:
        self.hosts = hosts
        self.where = self._where(hosts)
        self.session_timeout_s = session_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.conn: ZkConnection | None = None

    # -- session ---------------------------------------------------------------------------
    def connect(self) -> None:
        start_held(self, "conn", self._new_connection)

    def _new_connection(self) -> ZkConnection:
        conn = ZkConnection(self.hosts, self.session_timeout_s, self.connect_timeout_s)
        conn.add_listener(self._on_state)
        return conn

    def _on_state(self, state: str) -> None:
        kind = _STATES.get(state)
        if kind is not None:
            self._tell(kind)

    @property
    def session_id(self) -> int | None:
        return self.conn.session_id if self.conn else None

    @property
    def session_ms(self) -> int:
        return self.conn.session_ms() if self.conn else int(self.session_timeout_s * 1000)

    @property
    def state(self) -> str:
        conn = self.conn
        if conn is None:
            return KvState.CLOSED
        return _STATES.get(conn.client.state, KvState.LOST)

    def keepalive(self, timeout: float | None = None) -> None:
        """kazoo pings by itself; the renewal's read of the claim proves the session."""

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    # -- calls -----------------------------------------------------------------------------
    def _conn(self) -> ZkConnection:
        if self.conn is None:
            raise BackendError(f"the ZooKeeper client for {self.hosts} was closed")
        return self.conn

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """kazoo's errors as the interface's: an expired session is LeaseLostError, a
        failed condition stays itself, anything else is BackendError."""
        try:
            yield
        except SessionExpiredError as exc:
            raise LeaseLostError(f"the ZooKeeper session expired: {exc!r}") from None
        except _CONDITIONS:
            raise
        except ZK_ERRORS as exc:
            raise BackendError(f"{self.where}: {exc!r}") from None

    def _call(self, method: str, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        with self._translated():
            return self._conn().call(method, *args, timeout=timeout, **kw)

    def now_ms(self, key: str) -> int:
        """ZooKeeper's time (the leader's clock), read by writing ``key``."""
        try:
            return int(self._call("set", key, b"").mtime)
        except NoNodeError:
            self._call("ensure_path", key)
            return int(self._call("set", key, b"").mtime)

    def ensure(self, prefix: str) -> None:
        self._call("ensure_path", prefix)

    def children(self, prefix: str) -> list[str]:
        try:
            return list(self._call("get_children", prefix))
        except NoNodeError:
            return []

    def get(self, key: str, timeout: float | None = None) -> KvEntry | None:
        try:
            data, stat = self._call("get", key, timeout=timeout)
        except NoNodeError:
            return None
        return _entry(data, stat)

    def get_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        zk = self._conn().client
        found = {}
        with self._translated():
            pending = {key: zk.get_async(key) for key in keys}
            for key, res in pending.items():
                try:
                    data, stat = res.get(timeout=self.connect_timeout_s)
                except NoNodeError:
                    continue
                found[key] = _entry(data, stat)
        return found

    def put(self, key: str, data: bytes, version: int,
            timeout: float | None = None) -> int | None:
        try:
            return int(self._call("set", key, data, version=version, timeout=timeout).version)
        except _CONDITIONS:
            return None

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        conn = self._conn()
        tx = conn.client.transaction()
        for op in ops:
            if op.kind == "create":
                tx.create(op.key, op.data, ephemeral=op.session)
            elif op.kind == "put":
                tx.set_data(op.key, op.data, version=-1 if op.version is None else op.version)
            else:
                tx.delete(op.key, version=-1 if op.version is None else op.version)
        with self._translated():
            results = conn.commit(tx, timeout=timeout)
        if any(isinstance(r, Exception) for r in results):
            return None   # all or nothing: a condition failed (or the session is gone)
        # create answers the path, delete True: a created znode has version 0
        return [r.version if isinstance(r, ZnodeStat) else 0 for r in results]
