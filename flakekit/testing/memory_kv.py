"""An in-memory key-value store with sessions on an injected clock: the reference
adapter of :class:`flakekit.leases.kv.KeyValueStore`, for testing the lease algorithm
(and any other user of the interface) without a server.

:class:`MemoryKv` is the server: keys, versions, sessions with a TTL that end when the
injected clock's monotonic time passes their last keep-alive + TTL (their session keys
go with them). :class:`MemoryKvClient` is one process's adapter, with fault switches:
:meth:`~MemoryKvClient.suspend` (the connection drops, the session keeps ticking on the
server), :meth:`~MemoryKvClient.resume`, :meth:`MemoryKv.expire` (end a session from
outside). ``style="zookeeper"`` behaves like ZooKeeper (per-key versions from 0, mtime
from the clock, any call keeps the session alive, epochs counted);
``style="etcd"`` like etcd (one global revision, no clock, only ``keepalive()`` renews
the lease, the epoch is the claim's revision).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from flakekit.errors import BackendError, LeaseLostError
from flakekit.leases.kv import KvEntry, KvOp, KvState, KvStoreBase

__all__ = ["MemoryKv", "MemoryKvClient"]


@attrs.define
class _Node:
    data: bytes
    version: int
    mtime_ms: int | None
    owner: int | None


@attrs.define
class _Session:
    ttl_ms: int
    expires_ns: int


@attrs.define(eq=False)
class MemoryKv:
    """The server. ``max_ttl_ms`` clamps what a session asks for (as ZooKeeper's
    ``maxSessionTimeout`` does)."""

    clock: Any
    style: str = "zookeeper"
    max_ttl_ms: int = 60_000
    nodes: dict[str, _Node] = attrs.Factory(dict)
    sessions: dict[int, _Session] = attrs.Factory(dict)
    revision: int = 0
    _next_session: int = 0x1000
    _clients: list[MemoryKvClient] = attrs.Factory(list)
    _lock: threading.RLock = attrs.Factory(threading.RLock)

    def __attrs_post_init__(self) -> None:
        if self.style not in ("zookeeper", "etcd"):
            raise ValueError(f"style must be 'zookeeper' or 'etcd', got {self.style!r}")

    def client(self, ttl_ms: int = 10_000) -> MemoryKvClient:
        """A new process's adapter, asking for sessions of ``ttl_ms``."""
        c = MemoryKvClient(self, ttl_ms)
        self._clients.append(c)
        return c

    # -- sessions ---------------------------------------------------------------------------
    def open_session(self, ttl_ms: int) -> tuple[int, int]:
        with self._lock:
            sid, self._next_session = self._next_session, self._next_session + 1
            granted = min(ttl_ms, self.max_ttl_ms)
            self.sessions[sid] = _Session(granted, self.clock.monotonic_ns() + granted * 10**6)
            return sid, granted

    def touch(self, sid: int) -> bool:
        """Keep a session alive; False if it has ended."""
        with self._lock:
            self.expire_due()
            s = self.sessions.get(sid)
            if s is None:
                return False
            s.expires_ns = self.clock.monotonic_ns() + s.ttl_ms * 10**6
            return True

    def expire(self, sid: int) -> None:
        """End a session now (its keys go; its client sees LOST)."""
        with self._lock:
            self.sessions.pop(sid, None)
            for key in [k for k, n in self.nodes.items() if n.owner == sid]:
                del self.nodes[key]
                self.revision += 1
        for c in list(self._clients):
            c._ended(sid)

    def expire_due(self) -> None:
        """End every session whose TTL has passed on the clock."""
        now = self.clock.monotonic_ns()
        with self._lock:
            due = [sid for sid, s in self.sessions.items() if s.expires_ns <= now]
        for sid in due:
            self.expire(sid)

    def close_session(self, sid: int) -> None:
        self.expire(sid)

    # -- data -------------------------------------------------------------------------------
    def _mtime(self) -> int | None:
        return self.clock.time_ns() // 1_000_000 if self.style == "zookeeper" else None

    def entry(self, key: str) -> KvEntry | None:
        n = self.nodes.get(key)
        return None if n is None else KvEntry(n.data, n.version, n.mtime_ms, n.owner)

    def apply(self, ops: Sequence[KvOp], sid: int) -> list[int] | None:
        with self._lock:
            for op in ops:
                node = self.nodes.get(op.key)
                if op.kind == "create" and node is not None:
                    return None
                if op.kind in ("put", "delete", "check") and (
                        node is None or op.version is not None and node.version != op.version):
                    return None
                if op.kind == "check" and op.owner is not None and node is not None \
                        and node.owner != op.owner:
                    return None
            self.revision += 1
            out = []
            for op in ops:
                node = self.nodes.get(op.key)
                if op.kind == "check":   # a condition only (KvOp.check)
                    out.append(node.version if node is not None else 0)
                    continue
                if op.kind == "delete":
                    del self.nodes[op.key]
                    out.append(self.revision if self.style == "etcd" else 0)
                    continue
                if self.style == "etcd":
                    version = self.revision
                else:
                    version = 0 if node is None else node.version + 1
                owner = (sid if op.session else None) if node is None else node.owner
                self.nodes[op.key] = _Node(op.data, version, self._mtime(), owner)
                out.append(version)
            return out


class MemoryKvClient(KvStoreBase):
    """One process's :class:`~flakekit.leases.kv.KeyValueStore` on a :class:`MemoryKv`."""

    kind = "MemoryKv"

    def __init__(self, server: MemoryKv, ttl_ms: int) -> None:
        self.server, self.ttl_ms = server, ttl_ms
        self.where = "MemoryKv"
        self.epoch_is_revision = server.style == "etcd"
        self.granted_ms = ttl_ms
        #: called inside every request (after it was sent, before it answers): a test
        #: advances the clock here to model a slow reply
        self.during_call: Callable[[], None] | None = None
        self.calls = 0

    # -- fault switches ------------------------------------------------------------------
    def suspend(self) -> None:
        """The connection drops; the session keeps ticking on the server."""
        if self._state == KvState.CONNECTED:
            self._set(KvState.SUSPENDED)

    def resume(self) -> None:
        """The connection is back: the same session if it still lives, else LOST."""
        if self._state != KvState.SUSPENDED or self.sid is None:
            return
        if self.server.touch(self.sid):
            self._set(KvState.CONNECTED)
        else:
            self._ended(self.sid)

    def _ended(self, sid: int) -> None:
        if sid == self.sid and self._state != KvState.CLOSED:
            self._session = None
            self._set(KvState.LOST)

    def _set(self, state: str) -> None:
        self._state = state
        self._tell(state)

    # -- the interface -------------------------------------------------------------------
    def connect(self) -> None:
        if self._state == KvState.CONNECTED and self.sid is not None:
            return
        if self._state == KvState.SUSPENDED:
            raise BackendError("MemoryKv: suspended; not reconnected")
        self._session, self.granted_ms = self.server.open_session(self.ttl_ms)
        self._set(KvState.CONNECTED)

    @property
    def sid(self) -> int | None:
        """The server's number for this client's session, connected or not (tests end
        it with :meth:`MemoryKv.expire`)."""
        return self._session

    @property
    def session_ms(self) -> int:
        return self.granted_ms

    def _enter(self, *, renews: bool) -> int:
        self.calls += 1
        if self._state != KvState.CONNECTED or self.sid is None:
            raise BackendError(f"MemoryKv: connection is {self._state}")
        self.server.expire_due()
        if self.sid is None:
            raise LeaseLostError("MemoryKv: the session expired")
        if self.during_call is not None:
            self.during_call()
        sid = self.sid
        if renews and not self.server.touch(sid):
            raise LeaseLostError("MemoryKv: the session expired")
        if sid not in self.server.sessions:
            raise LeaseLostError("MemoryKv: the session expired")
        return sid

    @property
    def _zk(self) -> bool:
        return self.server.style == "zookeeper"

    def keepalive(self, timeout: float | None = None) -> None:
        self._enter(renews=True)

    def now_ms(self, key: str) -> int | None:
        sid = self._enter(renews=self._zk)
        if not self._zk:
            return None
        node = self.server.nodes.get(key)
        ops = [KvOp.create(key, b"")] if node is None else [KvOp.put(key, b"", node.version)]
        self.server.apply(ops, sid)
        return self.server.nodes[key].mtime_ms

    def ensure(self, prefix: str) -> None:
        self._enter(renews=self._zk)

    def children(self, prefix: str) -> list[str]:
        self._enter(renews=self._zk)
        start = prefix.rstrip("/") + "/"
        return sorted({k[len(start):].split("/")[0] for k in list(self.server.nodes)
                       if k.startswith(start)})

    def get(self, key: str, timeout: float | None = None) -> KvEntry | None:
        self._enter(renews=self._zk)
        return self.server.entry(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        self._enter(renews=self._zk)
        found = {k: self.server.entry(k) for k in keys}
        return {k: e for k, e in found.items() if e is not None}

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        sid = self._enter(renews=self._zk)
        return self.server.apply(ops, sid)

    def close(self) -> None:
        sid, self._session = self._session, None
        self._state = KvState.CLOSED
        if sid is not None:
            self.server.close_session(sid)
