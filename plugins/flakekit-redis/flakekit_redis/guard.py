"""The marker that tells a Redis that kept flakekit's data from one that lost it.

Redis without persistence restarts empty; ``FLUSHALL`` empties it; a replica promoted
before it received the last writes is behind. Counting again from zero would repeat
IDs, so every script the plugin runs starts with the same guard, in the same atomic
script as the allocation it protects:

- the **marker** (hash ``{prefix}/marker``: ``id``, ``seq``, ``hold``, ``floor``) must
  exist; it is written by ``flakekit redis reseed`` (or, with ``init = "first-use"``,
  by the first allocation in an empty namespace);
- its ``id`` must be the one this process saw before (another id: someone re-seeded);
- its ``seq``, which every allocating script increments, must not be below the
  highest value this process saw (lower: Redis went back, e.g. a restart from an old
  snapshot or a promoted replica that missed writes).

Otherwise the script changes nothing and the plugin raises
:class:`~flakekit_redis.errors.RedisDataLostError` with one line saying what to do.
The server's ``run_id`` and ``master_replid`` are read with every renewal and fetch so
the message can say that the server restarted or failed over.

Keys of one prefix carry a hash tag (``{flakekit}/...``) so they share a Redis Cluster
slot: one script may touch them all.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from flakekit.plugin import BackendError
from flakekit_redis.errors import RedisDataLostError

__all__ = ["PRELUDE", "Guard", "namespace"]

log = logging.getLogger("flakekit.redis")

#: the Lua helpers every script starts with: Redis's clock in ms, and a comparison of two
#: non-negative decimal strings, exactly
_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
"""

#: every script: KEYS[1..4] = marker, rev counter, session counter, segment index;
#: ARGV[1..4] = marker id seen ('' none), highest seq seen, '1' may create the marker
#: (first use, empty namespace), the id to create it with. Own KEYS/ARGV start at 5.
PRELUDE = _HELPERS + """local M = redis.call('HMGET', KEYS[1], 'id', 'seq', 'hold', 'floor')
if not M[1] then
  if ARGV[3] == '1' and ARGV[1] == ''
      and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) == 0 then
    local t = now_ms()
    redis.call('HSET', KEYS[1], 'id', ARGV[4], 'seq', 0, 'hold', 0, 'floor', '0',
               'created', t, 'how', 'first-use')
    redis.call('SET', KEYS[2], t)
    redis.call('SET', KEYS[3], t)
    M = {ARGV[4], '0', '0', '0'}
  else
    return {'LOST', '', 0}
  end
end
if ARGV[1] ~= '' and M[1] ~= ARGV[1] then return {'RESEEDED', M[1], tonumber(M[2]) or 0} end
local SEQ = tonumber(M[2]) or 0
if SEQ < tonumber(ARGV[2]) then return {'BACK', M[1], SEQ} end
local HOLD = tonumber(M[3]) or 0
local FLOOR = M[4] or '0'
local function wrote() SEQ = redis.call('HINCRBY', KEYS[1], 'seq', 1) end
"""

RESEED = _HELPERS + """local t = now_ms()
local old = redis.call('HGET', KEYS[1], 'id') or ''
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'seq', 0, 'hold', t + tonumber(ARGV[3]),
           'floor', ARGV[2], 'created', t, 'how', 'reseed', 'previous', old)
for _, k in ipairs({KEYS[2], KEYS[3]}) do
  local cur = tonumber(redis.call('GET', k) or '0') or 0
  if cur < t then redis.call('SET', k, t) end
end
local raised = 0
for _, name in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  local k = ARGV[4] .. name
  local cur = redis.call('HGET', k, 'max_id')
  if not cur then
    redis.call('SREM', KEYS[4], name)   -- lost: created again at the floor on first use
  elseif not string.match(cur, '^%d+$') or cmp(cur, ARGV[2]) < 0 then
    redis.call('HSET', k, 'max_id', ARGV[2])
    raised = raised + 1
  end
end
return {old, raised, t}
"""


def namespace(prefix: str) -> str:
    """The hash-tagged key prefix of ``prefix``: ``{flakekit}``."""
    return "{" + prefix + "}"


class Guard:
    """This process's memory of one namespace's marker, shared by every allocator and
    store of the process on the same Redis and prefix (:func:`guard_for`)."""

    def __init__(self, client: Any, where: str, prefix: str, *, init: str = "operator",
                 replicas: int = 0, wait_timeout_ms: int = 1000) -> None:
        self.client = client
        self.where = where
        self.prefix = prefix
        self.ns = namespace(prefix)
        self.init = init
        self.replicas = replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.marker_id = ""
        self.seq = 0
        self.run_id = ""
        self.replid = ""
        self.history: list[str] = []   # "restarted: run_id a -> b", for the message
        self._lock = threading.Lock()
        self._scripts: dict[str, Any] = {}

    # -- keys ------------------------------------------------------------------------------
    @property
    def marker_key(self) -> str:
        return f"{self.ns}/marker"

    @property
    def head_keys(self) -> list[str]:
        return [self.marker_key, f"{self.ns}/rev", f"{self.ns}/sessions",
                f"{self.ns}/segments#children"]

    def segment_key(self, name: str) -> str:
        return f"{self.ns}/segments/{name}"

    # -- calls -----------------------------------------------------------------------------
    def call(self, what: str, func: Any, *args: Any, **kwargs: Any) -> Any:
        """One Redis command; connection trouble is BackendError naming the server."""
        import redis

        try:
            return func(*args, **kwargs)
        except redis.exceptions.RedisError as exc:
            raise self._translate(what, exc) from None

    def _translate(self, what: str, exc: Exception) -> BackendError:
        import redis

        if isinstance(exc, redis.exceptions.AuthenticationError):
            return BackendError(f"Redis at {self.where} refused the credentials while "
                                f"{what}: {exc}; fix the password in url")
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            return BackendError(f"Redis at {self.where} did not answer while {what}: {exc}")
        return BackendError(f"Redis at {self.where} failed while {what}: {exc}")

    def run(self, name: str, body: str, keys: Sequence[str], args: Sequence[Any], *,
            what: str, write: bool) -> list[Any] | None:
        """Run script ``name`` (the prelude, then ``body``) and return its status and what
        follows its marker id and seq. None: the namespace is empty and this process saw
        no marker (a read with ``init = "first-use"``). Raises RedisDataLostError when
        the guard refused."""
        return self.run_seq(name, body, keys, args, what=what, write=write)[0]

    def run_seq(self, name: str, body: str, keys: Sequence[str], args: Sequence[Any], *,
                what: str, write: bool) -> tuple[list[Any] | None, int]:
        """:meth:`run`, and the marker's seq after the script (scripts run one at a
        time, so it orders them)."""
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.client.register_script(PRELUDE + body)
        with self._lock:
            head = [self.marker_id, self.seq, "1" if write and self.init == "first-use" else "0",
                    secrets.token_hex(8)]
        out = self.call(what, script, keys=[*self.head_keys, *keys], args=[*head, *args])
        status = _text(out[0])
        marker, seq = _text(out[1]), int(out[2])
        if status == "LOST" and not self.marker_id and self.init == "first-use" and not write:
            return None, 0
        if status in ("LOST", "RESEEDED", "BACK"):
            raise RedisDataLostError(self._refusal(status, marker, seq))
        with self._lock:
            if not self.marker_id:
                self.marker_id = marker
            self.seq = max(self.seq, seq)
        if write and self.replicas:
            self._wait(what)
        return [status, *out[3:]], seq

    def _wait(self, what: str) -> None:
        """WAIT for ``replicas`` copies; fewer is a failure (the caller drops what the
        write gave it: counters only grow, so a dropped range is never reissued)."""
        acked = int(self.call(what, self.client.wait, self.replicas, self.wait_timeout_ms))
        if acked < self.replicas:
            raise BackendError(
                f"Redis at {self.where}: only {acked} of {self.replicas} replicas confirmed "
                f"the write within {self.wait_timeout_ms} ms while {what}; nothing was "
                "used (a fail-over now could lose it). Check the replicas, or lower "
                "replicas in the config")

    def _refusal(self, status: str, marker: str, seq: int) -> str:
        key = self.marker_key
        seen = f" (this process saw marker {self.marker_id})" if self.marker_id else ""
        why = {
            "LOST": f"the marker key {key} is gone{seen}",
            "RESEEDED": f"the marker key {key} is {marker}, not the {self.marker_id} this "
                        "process started with: it was re-seeded",
            "BACK": f"the write counter of {key} went back to {seq} from {self.seq}: the "
                    "server lost its latest writes",
        }[status]
        history = f"; {', '.join(self.history)}" if self.history else ""
        if status == "LOST" and not self.marker_id:
            return (f"Redis at {self.where} has no flakekit marker under prefix "
                    f"'{self.prefix}' ({key}): either it is new or it lost its data; "
                    f"refusing to count from zero. Fix: `flakekit redis reseed --floor N`, "
                    f"N 0 for a new deployment, else above every ID already issued "
                    f"(docs/redis.md)")
        if status == "RESEEDED":
            return (f"Redis at {self.where}, prefix '{self.prefix}': {why}{history}; this "
                    "process stops using it (restart it to go on from the new floor)")
        return (f"Redis at {self.where} lost flakekit's data under prefix "
                f"'{self.prefix}': {why}{history}; refusing to count again from zero. Fix: "
                "`flakekit redis reseed --floor N`, N above every ID already issued "
                "(docs/redis.md)")

    # -- server identity -------------------------------------------------------------------
    def observe(self) -> None:
        """Read ``run_id`` and ``master_replid``; a change is remembered for messages
        (the marker decides; a restart with AOF keeps it and is fine)."""
        import redis

        try:
            info = self.client.info("server", "replication", "memory")
        except redis.exceptions.ResponseError:
            return   # INFO not permitted (an ACL): the marker alone decides
        except redis.exceptions.RedisError as exc:
            raise self._translate("reading INFO", exc) from None
        evicts = eviction(info)
        if evicts:
            raise BackendError(f"Redis at {self.where} {evicts}: flakekit's counters and "
                               "leases could vanish and IDs repeat; nothing is allocated. "
                               "Set maxmemory-policy noeviction (or maxmemory 0), or give "
                               "flakekit a Redis of its own")
        run_id, replid = str(info.get("run_id", "")), str(info.get("master_replid", ""))
        replid2 = str(info.get("master_replid2", ""))
        with self._lock:
            if self.run_id and run_id != self.run_id and self.replid and replid2 == self.replid:
                self._note(f"it failed over to a replica (run_id {self.run_id[:8]} -> "
                           f"{run_id[:8]}, which took over replication id {self.replid[:8]})",
                           f"failed over (run_id {self.run_id} -> {run_id})")
            elif self.run_id and run_id != self.run_id:
                self._note(f"the server restarted or was replaced (run_id {self.run_id[:8]} "
                           f"-> {run_id[:8]})", f"restarted (run_id {self.run_id} -> {run_id})")
            elif self.replid and replid != self.replid:
                self._note(f"it failed over (master_replid {self.replid[:8]} -> {replid[:8]})",
                           f"changed replication id ({self.replid} -> {replid})")
            self.run_id, self.replid = run_id, replid
            del self.history[:-3]

    def _note(self, event: str, logged: str) -> None:
        """Keep ``event`` for status and refusals, and log it once."""
        self.history.append(event)
        log.warning("Redis at %s %s", self.where, logged)

    def status(self) -> dict[str, Any]:
        """The marker as stored (empty dict: none), for ``flakekit redis check``."""
        raw = self.call("reading the marker", self.client.hgetall, self.marker_key)
        return {_text(k): _text(v) for k, v in raw.items()}

    def reseed(self, floor: int, hold_ms: int) -> dict[str, Any]:
        """A new marker (with ``floor`` and a hold on worker ids for ``hold_ms``), the
        counters above the server's clock in ms, every segment key at ``floor`` or more."""
        script = self.client.register_script(RESEED)
        new = secrets.token_hex(8)
        old, raised, now = self.call("re-seeding", script, keys=self.head_keys,
                                     args=[new, str(floor), int(hold_ms), self.segment_key("")])
        with self._lock:
            self.marker_id, self.seq = new, 0
        return {"previous": _text(old), "marker": new, "raised": int(raised),
                "floor": floor, "hold_ms": hold_ms, "at_ms": int(now)}


def eviction(info: dict[str, Any]) -> str:
    """Why this Redis may evict keys ('' when it never does): a ``maxmemory`` with a
    policy other than ``noeviction`` (``volatile-*`` ones pick keys with an expiry: the
    sessions that hold worker ids)."""
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if int(info.get("maxmemory", 0) or 0) and policy != "noeviction":
        return f"evicts keys (maxmemory {info.get('maxmemory')}, maxmemory-policy {policy})"
    return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_GUARDS: dict[tuple[Any, ...], Guard] = {}
_GUARDS_LOCK = threading.Lock()


def guard_for(url: str, prefix: str, connect_timeout_s: float, *, init: str = "operator",
              replicas: int = 0, wait_timeout_ms: int = 1000) -> Guard:
    """The process's guard of (url, prefix): allocators and stores share what they saw."""
    key = (url, prefix, connect_timeout_s, init, replicas, wait_timeout_ms)
    with _GUARDS_LOCK:
        guard = _GUARDS.get(key)
        if guard is None:
            guard = _GUARDS[key] = Guard(client_for(url, connect_timeout_s), where_of(url),
                                         prefix, init=init, replicas=replicas,
                                         wait_timeout_ms=wait_timeout_ms)
        return guard


def client_for(url: str, connect_timeout_s: float) -> Any:
    """A client that never retries by itself: a script whose reply was lost may have run,
    and the caller (the lease keeper, the segment prefetch) decides what to do again."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, socket_timeout=connect_timeout_s,
                                socket_connect_timeout=connect_timeout_s,
                                health_check_interval=0, retry=Retry(NoBackoff(), 0))


def where_of(url: str) -> str:
    """``url`` without its password, for messages."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 6379
    db = parts.path.lstrip("/") or "0"
    return f"{host}:{port}/{db}"
