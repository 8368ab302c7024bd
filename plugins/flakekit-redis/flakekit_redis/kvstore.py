"""Redis as a :class:`flakekit.plugin.KeyValueStore`, for the core's lease algorithm
(:class:`flakekit.plugin.KvLeaseAllocator`).

=====================  ===============================================================
interface              Redis
=====================  ===============================================================
session / TTL          a key ``{ns}/session/{n}`` with ``PX ttl``, ``n`` from ``INCR``
keepalive()            ``PEXPIRE`` of that key; 0 (gone): LeaseLostError at once
create, session=True   a hash whose ``o`` names the session: it counts as absent once
                       the session key has expired (every script checks)
put / delete on v      a Lua script: the hash's ``v`` is still ``v``, then write
KvEntry.version        ``v``: the revision (``INCR {ns}/rev``) of the script that wrote
KvEntry.mtime_ms       ``t``: the server's ``TIME`` when the script wrote
commit()               one Lua script (conditions first, then every write, atomically);
                       its revision is the claim's epoch (``epoch_is_revision``)
now_ms()               the server's ``TIME``
children()             a set ``{parent}#children`` kept by the same scripts
=====================  ===============================================================

Every script runs the marker guard first (:mod:`flakekit_redis.guard`): a Redis that
lost its data refuses, and a renewal against it is LeaseLostError. Redis has no
connection to lose: ``state`` stays CONNECTED while the session key lives; a failed call
is BackendError (the keeper keeps the old deadline and retries) and is reported once
to the listener as SUSPENDED, the next success as CONNECTED.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from flakekit.plugin import (
    BackendError,
    KvEntry,
    KvOp,
    KvState,
    KvStoreBase,
    LeaseLostError,
    WorkerExhaustedError,
)
from flakekit_redis.errors import RedisDataLostError
from flakekit_redis.guard import Guard

__all__ = ["RedisKvStore"]

_CONNECT = """
wrote()
local id = redis.call('INCR', KEYS[3])
redis.call('SET', ARGV[5] .. id, '1', 'PX', ARGV[6])
return {'OK', M[1], SEQ, id}
"""

_KEEPALIVE = """
if redis.call('PEXPIRE', KEYS[5], ARGV[5]) == 0 then return {'GONE', M[1], SEQ} end
wrote()
return {'OK', M[1], SEQ}
"""

_LIVE = """
local function live(key)
  local h = redis.call('HMGET', key, 'd', 'v', 't', 'o')
  if not h[2] then return nil end
  if h[4] and h[4] ~= '0' and redis.call('EXISTS', ARGV[5] .. h[4]) == 0 then return nil end
  return h
end
"""

_GET = _LIVE + """
local out = {'OK', M[1], SEQ}
for i = 5, #KEYS do
  local h = live(KEYS[i])
  if h then
    for _, v in ipairs({'1', h[1], h[2], h[3] or '', h[4] or '0'}) do table.insert(out, v) end
  else
    for _, v in ipairs({'0', '', '', '', ''}) do table.insert(out, v) end
  end
end
return out
"""

_CHILDREN = _LIVE + """
local out = {'OK', M[1], SEQ}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  if live(ARGV[6] .. name) then table.insert(out, name) end
end
return out
"""

_COMMIT = _LIVE + """
local n = #KEYS - 4
for i = 1, n do
  local key, a = KEYS[4 + i], 6 + (i - 1) * 4
  local kind, version, flag = ARGV[a + 1], ARGV[a + 3], ARGV[a + 4]
  local h = live(key)
  if kind == 'create' then
    if h then return {'COND', M[1], SEQ} end
    if flag == '1' then
      if redis.call('EXISTS', ARGV[5] .. ARGV[6]) == 0 then return {'GONE', M[1], SEQ} end
      local wait = HOLD - now_ms()
      if wait > 0 then return {'HOLD', M[1], SEQ, wait} end
    end
  else
    if not h then return {'COND', M[1], SEQ} end
    if version ~= '' and tonumber(h[2]) ~= tonumber(version) then
      return {'COND', M[1], SEQ}
    end
    if kind == 'check' and flag ~= '' and (h[4] or '0') ~= flag then
      return {'COND', M[1], SEQ}
    end
  end
end
local rev = redis.call('INCR', KEYS[2])
local t = now_ms()
for i = 1, n do
  local key, a = KEYS[4 + i], 6 + (i - 1) * 4
  local kind = ARGV[a + 1]
  local parent, name = string.match(key, '^(.*)/([^/]*)$')
  if kind == 'create' then
    local owner = '0'
    if ARGV[a + 4] == '1' then owner = ARGV[6] end
    redis.call('DEL', key)
    redis.call('HSET', key, 'd', ARGV[a + 2], 'v', rev, 't', t, 'o', owner)
    redis.call('SADD', parent .. '#children', name)
  elseif kind == 'put' then
    redis.call('HSET', key, 'd', ARGV[a + 2], 'v', rev, 't', t)
  elseif kind == 'delete' then
    redis.call('DEL', key)
    redis.call('SREM', parent .. '#children', name)
  end
end
wrote()
return {'OK', M[1], SEQ, rev}
"""


def _int(value: Any) -> int:
    return int(value.decode() if isinstance(value, bytes) else value)


class RedisKvStore(KvStoreBase):
    """One allocator's session on one Redis namespace (see the table above)."""

    kind = "Redis"
    epoch_is_revision = True

    def __init__(self, guard: Guard, ttl_ms: int) -> None:
        self.guard = guard
        self.where = self._where(guard.where)
        self.ttl_ms = ttl_ms
        self._failing = False
        self._lock = threading.Lock()

    @property
    def _sess_prefix(self) -> str:
        return f"{self.guard.ns}/session/"

    # -- session ---------------------------------------------------------------------------
    def _run(self, name: str, body: str, keys: Sequence[str], args: Sequence[Any], *,
             what: str, write: bool) -> list[Any]:
        """A guarded script; a failure to reach Redis is told once as SUSPENDED."""
        try:
            out = self.guard.run(name, body, keys, args, what=what, write=write)
        except RedisDataLostError:
            raise
        except BackendError:
            self._reached(False)
            raise
        self._reached(True)
        if out is None:   # first-use, empty namespace, a read: nothing there
            return ["EMPTY"]
        return out

    def _reached(self, ok: bool) -> None:
        """Tell a change once: SUSPENDED at the first failure, CONNECTED at the next
        success (only while a session is held)."""
        if ok == self._failing:
            self._failing = not ok
            if self._session is not None:
                self._tell(KvState.CONNECTED if ok else KvState.SUSPENDED)

    def connect(self) -> None:
        if self.state == KvState.CONNECTED:
            return
        self.guard.observe()
        out = self._run("connect", _CONNECT, [], [self._sess_prefix, self.ttl_ms],
                        what="opening a session", write=True)
        with self._lock:
            self._session, self._state, self._failing = _int(out[1]), KvState.CONNECTED, False

    @property
    def session_ms(self) -> int:
        return self.ttl_ms

    def _lose(self, why: str, *, tell: bool = True) -> LeaseLostError:
        """The session is gone. ``tell=False``: the error alone carries the reason (the
        listener's LOST would replace it with "session expired")."""
        with self._lock:
            was = self._state
            self._state = KvState.LOST
        if was == KvState.CONNECTED and tell:
            self._tell(KvState.LOST)
        return LeaseLostError(why)

    def keepalive(self, timeout: float | None = None) -> None:
        session = self._session
        if self._state != KvState.CONNECTED or session is None:
            raise LeaseLostError(f"the Redis session {session} is {self._state}")
        self.guard.observe()
        try:
            out = self._run("keepalive", _KEEPALIVE, [self._sess_prefix + str(session)],
                            [self.ttl_ms], what="renewing the session", write=True)
        except RedisDataLostError as exc:
            raise self._lose(str(exc), tell=False) from None
        if out[0] == "GONE":
            raise self._lose(f"the Redis session {session} expired (its key "
                             f"{self._sess_prefix}{session} is gone)")

    def close(self) -> None:
        """Delete the session key: every claim of it counts as gone at once."""
        with self._lock:
            session, self._session = self._session, None
            self._state = KvState.CLOSED
        if session is not None:
            try:
                self.guard.call("closing the session", self.guard.client.delete,
                                self._sess_prefix + str(session))
            except BackendError:
                pass   # it expires by itself

    # -- calls -----------------------------------------------------------------------------
    def now_ms(self, key: str) -> int | None:
        sec, usec = self.guard.call("reading the server's clock", self.guard.client.time)
        return int(sec) * 1000 + int(usec) // 1000

    def ensure(self, prefix: str) -> None:
        """Redis's key space is flat: nothing to create."""

    def children(self, prefix: str) -> list[str]:
        parent = prefix.rstrip("/")
        out = self._run("children", _CHILDREN, [f"{parent}#children"],
                        [self._sess_prefix, parent + "/"], what=f"listing {parent}",
                        write=False)
        return sorted(_text(n) for n in out[1:])

    def get(self, key: str, timeout: float | None = None) -> KvEntry | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        if not keys:
            return {}
        out = self._run("get", _GET, list(keys), [self._sess_prefix],
                        what=f"reading {keys[0]}", write=False)
        found: dict[str, KvEntry] = {}
        rows = out[1:]
        for i, key in enumerate(keys if rows else ()):
            flag, data, version, mtime, owner = rows[i * 5:i * 5 + 5]
            if _text(flag) == "1":
                data_b = data if isinstance(data, bytes) else str(data).encode()
                found[key] = KvEntry(data_b, _int(version), _int(mtime) if mtime else None,
                                     _int(owner) or None)
        return found

    def commit(self, ops: Sequence[KvOp], timeout: float | None = None) -> list[int] | None:
        args: list[Any] = [self._sess_prefix, self._session or 0]
        for op in ops:
            if op.kind == "create":
                flag = "1" if op.session else "0"
            elif op.kind == "check":
                flag = "" if op.owner is None else str(op.owner)
            elif op.kind in ("put", "delete"):
                flag = ""
            else:  # pragma: no cover - the interface has no other kind
                raise ValueError(f"unknown operation {op.kind!r}")
            args += [op.kind, op.data, "" if op.version is None else op.version, flag]
        out = self._run("commit", _COMMIT, [op.key for op in ops], args,
                        what=f"writing {ops[0].key}", write=True)
        status = out[0]
        if status == "HOLD":
            raise WorkerExhaustedError(   # like a quarantine: retry later
                f"{self.where}, prefix '{self.guard.prefix}' was re-seeded: no worker id "
                f"is granted for {_int(out[1]) / 1000:.1f} s more, until every lease given "
                "out before the data loss has run out (the hold of `flakekit redis reseed`)")
        if status == "GONE":
            raise self._lose(f"the Redis session {self._session} expired")
        if status != "OK":
            return None
        return [_int(out[1])] * len(ops)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
