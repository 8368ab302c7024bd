"""The ``redis`` segment store: Leaf's ``leaf_alloc`` rows as hashes, moved by Lua.

``{ns}/segments/{key}`` holds ``max_id``, ``step``, ``description``, ``update_time``;
the set ``{ns}/segments#children`` lists every key ever created. A fetch is one script:
the marker guard, then ``HINCRBY max_id step`` (Redis's signed 64-bit arithmetic, so a
key never passes 2^63 - 1, like the BIGINT column) and the new ``max_id``: the range is
``[max_id - step, max_id)``, as in Leaf. A give-back lowers ``max_id`` only if it is
still the value the caller fetched, under the same guard.

A key that is listed but gone (deleted by hand, or lost without the marker) is refused,
never created again from ``start``. A key created on first use (``step`` set) starts at
the marker's floor if that is higher: after ``flakekit redis reseed --floor N`` every
key, old or new, continues above N.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import attrs

from flakekit.plugin import (
    Allocation,
    ConfigError,
    SegmentRowError,
    UnknownKeyError,
    check_new_range,
)
from flakekit_redis.errors import RedisDataLostError
from flakekit_redis.guard import Guard

__all__ = ["MAX_ID", "RedisAllocation", "RedisSegmentStore"]

MAX_ID = 2**63 - 1
MAX_DB_STEP = 100_000_000

_FETCH = """
local k = KEYS[5]
if redis.call('EXISTS', k) == 0 then
  if redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then return {'VANISHED', M[1], SEQ} end
  if ARGV[7] == '' then return {'UNKNOWN', M[1], SEQ} end
  local start = ARGV[8]
  if cmp(FLOOR, start) > 0 then start = FLOOR end
  redis.call('HSET', k, 'max_id', start, 'step', ARGV[7], 'update_time', now_ms())
  redis.call('SADD', KEYS[4], ARGV[5])
end
local row = redis.call('HMGET', k, 'max_id', 'step')
local step = tonumber(row[2] or '')
if not step or step < 1 or step ~= math.floor(step) then
  return {'BAD', M[1], SEQ, row[1] or '', row[2] or ''}
end
if not row[1] or not string.match(row[1], '^%d+$') then
  return {'BAD', M[1], SEQ, row[1] or '', row[2]}
end
local inc = row[2]
if ARGV[6] ~= '' then inc = ARGV[6] end
local done = redis.pcall('HINCRBY', k, 'max_id', inc)
if type(done) == 'table' and done.err then return {'FULL', M[1], SEQ, row[1], row[2]} end
redis.call('HSET', k, 'update_time', now_ms())
wrote()
return {'OK', M[1], SEQ, redis.call('HGET', k, 'max_id'), row[2]}
"""

_GIVE_BACK = """
local cur = redis.call('HGET', KEYS[5], 'max_id')
if cur ~= ARGV[5] then return {'OK', M[1], SEQ, 0} end
redis.call('HSET', KEYS[5], 'max_id', ARGV[6], 'update_time', now_ms())
wrote()
return {'OK', M[1], SEQ, 1}
"""

_CREATE = """
if redis.call('EXISTS', KEYS[5]) == 1 then return {'EXISTS', M[1], SEQ} end
local start = ARGV[7]
if cmp(FLOOR, start) > 0 then start = FLOOR end
redis.call('HSET', KEYS[5], 'max_id', start, 'step', ARGV[6], 'description', ARGV[8],
           'update_time', now_ms())
redis.call('SADD', KEYS[4], ARGV[5])
wrote()
return {'OK', M[1], SEQ, start}
"""

_INFO = """
local out = {'OK', M[1], SEQ}
local names = redis.call('SMEMBERS', KEYS[4])
for _, name in ipairs(names) do
  if ARGV[5] == '' or ARGV[5] == name then
    local h = redis.call('HMGET', ARGV[6] .. name, 'max_id', 'step', 'description',
                         'update_time')
    for _, v in ipairs({name, h[1] or '', h[2] or '', h[3] or '', h[4] or ''}) do
      table.insert(out, v)
    end
  end
end
return out
"""


#: one fetch: the :class:`~flakekit.plugin.Allocation` every store returns
RedisAllocation = Allocation


@attrs.frozen
class RedisKeyInfo:
    """One key, for listings (``max_id`` None: listed but gone)."""

    key: str
    max_id: int | None
    step: int | None
    description: str | None
    update_time: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "max_id": self.max_id, "step": self.step,
                "description": self.description,
                "update_time": self.update_time.isoformat() if self.update_time else None}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > 128 or "/" in key:
        raise ConfigError("key", "a Redis segment key is a non-empty string of at most "
                          f"128 characters without '/', got {key!r}")
    return key


@attrs.define(eq=False)
class RedisSegmentStore:
    """Leaf-style ranges per key in Redis, guarded by the namespace's marker.

    Args:
        guard: the namespace (Redis, prefix, marker memory).
        create_step: create a missing key with this step on first use (None: a missing
            key is UnknownKeyError, as in Leaf).
        start: the first ID of a key created on first use (raised to the floor).
    """

    guard: Guard
    create_step: int | None = None
    start: int = 1
    #: per key, this process's latest fetch (the marker's seq after it, its range): a
    #: range overlapping it can only come from a Redis that went back (a fail-over)
    _last: dict[str, tuple[int, range]] = attrs.Factory(dict)
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    @property
    def where(self) -> str:
        return f"Redis at {self.guard.where} prefix '{self.guard.prefix}'"

    def fetch(self, key: str, step: int | None = None) -> RedisAllocation:
        """Advance ``max_id`` of ``key`` by ``step`` (None: the key's own) in one script.

        Raises:
            RedisDataLostError: the guard refused, the key vanished, or the range is
                below one this process fetched before (nothing is used).
            UnknownKeyError: no such key (and no ``step`` to create it with).
            SegmentRowError: the key cannot serve a fetch (bad value, used up).
            BackendError: Redis did not answer.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                                 or not 1 <= step <= MAX_ID):
            raise ValueError(f"step must be an integer from 1 to {MAX_ID}, got {step!r}")
        self.guard.observe()
        out, seq = self.guard.run_seq(
            "fetch", _FETCH, [self.guard.segment_key(key)],
            [key, "" if step is None else step,
             "" if self.create_step is None else self.create_step, self.start],
            what=f"fetching a segment of key {key!r}", write=True)
        if out is None:
            out = ["UNKNOWN"]
        status = out[0]
        if status == "UNKNOWN":
            raise UnknownKeyError(key, f" (no key {self.guard.segment_key(key)} in "
                                  f"{self.where}; create it with step = N in the store's "
                                  "settings)")
        if status == "VANISHED":
            raise RedisDataLostError(
                f"{self.where}: segment key {key!r} was created but {self.guard.segment_key(key)} "
                "is gone (deleted, or lost); refusing to count it again from its start. Fix: "
                "`flakekit redis reseed --floor N`, N above every ID it issued")
        if status in ("BAD", "FULL"):
            bad_max, bad_step = _text(out[1]), _text(out[2])
            problem = (f"max_id {bad_max} + step would pass {MAX_ID} (used up)" if status == "FULL"
                       else f"max_id {bad_max!r} / step {bad_step!r} are not positive integers")
            raise SegmentRowError(key, f"segment store {self.where}: key {key!r} cannot serve "
                                  f"a segment: {problem}; nothing was allocated", None)
        max_id, db_step = int(_text(out[1])), int(_text(out[2]))
        got = RedisAllocation(key, max_id, db_step if step is None else step, db_step)
        with self._lock:
            last_seq, last = self._last.get(key, (0, range(0)))
            # scripts run one at a time, so seq orders the fetches of racing threads: a
            # later one starts at or above the earlier one's end (one that was overtaken
            # by a later one is not checked)
            if last_seq and seq > last_seq and got.max_id - got.step < last.stop:
                raise RedisDataLostError(
                    f"{self.where}: key {key!r} handed out [{got.max_id - got.step}, {max_id}) "
                    "after this "
                    f"process had fetched [{last.start}, {last.stop}): Redis went back (a "
                    "fail-over or a restore lost writes); the range is not used. Fix: "
                    f"`flakekit redis reseed --floor N`, N at least {last.stop}")
            if seq > last_seq:
                self._last[key] = (seq, range(got.max_id - got.step, max_id))
        return got

    def give_back(self, key: str, expected_max_id: int, new_max_id: int) -> bool:
        """Lower ``max_id`` to ``new_max_id`` only if it is still ``expected_max_id`` and
        the marker is the one this process saw (never after a data loss)."""
        if not 0 <= new_max_id < expected_max_id <= MAX_ID:
            return False
        try:
            out, seq = self.guard.run_seq("give_back", _GIVE_BACK, [self.guard.segment_key(key)],
                                 [str(expected_max_id), str(new_max_id)],
                                 what=f"giving back the tail of key {key!r}", write=True)
        except RedisDataLostError:
            return False
        done = bool(out and int(_text(out[1])))
        if done:
            with self._lock:   # the next fetch starts at the given-back tail
                self._last[key] = (seq, range(new_max_id, new_max_id))
        return done

    def create(self, key: str, step: int, start: int = 1,
               description: str | None = None) -> int:
        """Create ``key`` (the first ID is ``start``, or the marker's floor if higher);
        returns that first ID. ConfigError when it exists or the values are bad."""
        _check_key(key)
        check_new_range(step, start, max_step=MAX_DB_STEP, max_id=MAX_ID)
        out = self.guard.run("create", _CREATE, [self.guard.segment_key(key)],
                             [key, step, str(start), description or ""],
                             what=f"creating key {key!r}", write=True)
        if out and out[0] == "EXISTS":
            raise ConfigError("KEY", f"segment key {key!r} already exists in {self.where}")
        assert out is not None
        return int(_text(out[1]))

    def info(self, key: str | None = None) -> list[RedisKeyInfo]:
        out = self.guard.run("info", _INFO, [], [key or "", self.guard.segment_key("")],
                             what="listing keys", write=False)
        rows = (out or ["EMPTY"])[1:]
        found = []
        for i in range(0, len(rows), 5):
            name, max_id, step, desc, updated = (_text(v) for v in rows[i:i + 5])
            found.append(RedisKeyInfo(
                name, int(max_id) if max_id.isdigit() else None,
                int(step) if step.isdigit() else None, desc or None,
                dt.datetime.fromtimestamp(int(updated) / 1000, dt.UTC)
                if updated.isdigit() else None))
        return sorted(found, key=lambda r: r.key)

    def keys(self) -> list[str]:
        return [r.key for r in self.info()]

    def exists(self, key: str) -> bool:
        return any(r.max_id is not None for r in self.info(key))

    def close(self) -> None:
        """Nothing to close: the client's pool is the process's (shared by the guard)."""
