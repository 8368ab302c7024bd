"""SegmentGenerator: Leaf's double buffer for one key, without Leaf's "-3".

IDs come from ranges ("segments") that a :class:`SegmentStore` hands out; only the end of
the last range is persisted. The generator keeps two buffers: the *current* segment, which
``next_id()`` counts through, and the *next* one, fetched in the background as soon as a
configurable share (Leaf: 10%) of the current one is used. So the database is never on
the path of an ID, and an outage is ridden out for as long as the buffers last.

Why the hot path looks the way it does:

* ``next_id()`` is a counter (``itertools.count().__next__``, atomic under the GIL) and one
  comparison against the buffer's ``end``. No lock, no clock, no allocation but the int.
* ``end`` starts at the *prefetch point*, not the real end of the segment: the first ID at
  or past it takes the slow path once, which asks for the prefetch and raises ``end`` to
  the real end. So the 10% check costs nothing per ID.
* Anything that must stop a buffer (switching, splitting off a batch, closing) first sets
  its ``end`` below every ID, then draws one more value from its counter. A thread that drew
  its value before that draw got a smaller value (safe to return); a thread that draws
  after it compares against the lowered ``end`` and falls into the slow path. So the drawn
  value is a hard line: nothing at or above it was or will be handed out from that buffer.
  That is what makes batches and the give-back at shutdown safe without a hot-path lock.
* When both buffers are empty, callers wait up to ``wait_budget`` for the refill (Leaf
  sleeps 10 ms once and answers -3), then raise :class:`SegmentUnavailableError`; the
  background fetcher keeps retrying with back-off, so service resumes on its own.
* The background fetch is a job on a :class:`~flakekit.generators.fetcher.FetchPool`
  (Leaf's shared update pool), not a thread per key: at most one fetch per key in flight,
  back-off on the pool's timer, so a service with 100,000 keys runs a handful of threads.

Dynamic step is Leaf's: the first two fetches use the table's ``step``; after that the
step doubles when the previous segment lasted less than ``grow_below`` (15 min, capped at
``max_step``) and halves when it lasted ``shrink_after`` (30 min) or more, never below the
table's ``step``, which is re-read on every fetch. Durations come from the injected clock.

Hunger (CosId's): Leaf's step reacts over minutes; a burst empties a buffer in less time
than a fetch takes. So each exhausted segment is timed against the last fetch latency
(both on the injected clock): when it lasted under two latencies the *prefetch distance*
grows (at least doubles; as far as the shortfall says), and the next fetch asks the store
for ``step x distance`` (at most ``hunger_max x max_step``) in its one round trip; when
one lasted over eight, it shrinks again (at least halves). Leaf's rule
sees the time per step (the time between fetches divided by the distance), so both go on
side by side. With ``segment_ttl`` a segment is never served once that long has passed
since it was fetched (checked after the draw, on a hot path of its own; off by default):
the rest of the range is dropped and wasted, which is safe, since nothing reissues it.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import threading
import time
from typing import TYPE_CHECKING

import attrs

from flakekit.errors import (
    FlakekitError,
    NotStartedError,
    SchemaError,
    SegmentRowError,
    SegmentUnavailableError,
    UnknownKeyError,
)
from flakekit.generators.fetcher import FetchJob, FetchPool, shared_pool
from flakekit.generators.segment_settings import SegmentSettings
from flakekit.generators.stores import Locates, SegmentStore, TellsStalls
from flakekit.values.batch import IdBatch
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.counter import peek
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.forks import after_fork_in_child
from flakekit.values.formats import StringIds
from flakekit.values.lifecycle import ClosesOnce, StartsInWith
from flakekit.values.stats import LATENCY_BOUNDS_NS, BufferStats, SegmentStats

if TYPE_CHECKING:
    from flakekit.values.allocation import Allocation

__all__ = [
    "Segment",
    "SegmentGenerator",
    "SegmentSettings",
]

log = logging.getLogger("flakekit.segment")

#: below every ID: a buffer whose ``end`` is this issues nothing
_STOPPED = -(2**80)
_NEVER = 1 << 127
#: hunger: a segment that lasted under this many fetch latencies doubles the distance,
#: one that lasted over _CALM of them halves it
_HUNGRY = 2
_CALM = 8


@attrs.frozen
class Segment:
    """A range ``[start, end)`` of IDs fetched in one go; ``step`` is its length."""

    start: int
    end: int
    step: int

    def __attrs_post_init__(self) -> None:
        if self.end - self.start != self.step or self.step < 1:
            raise ValueError(f"inconsistent segment {self!r}")


class _Buffer:
    """One live segment: a counter and the bound the hot path compares against."""

    __slots__ = ("counter", "end", "expires", "hard_end", "next", "observed", "segment",
                 "started", "triggered")

    def __init__(self, segment: Segment, start: int, trigger: int,
                 expires: int = _NEVER) -> None:
        self.segment = segment
        self.expires = expires   # monotonic ns (injected clock): never served after it
        self.started = 0         # when it became the current buffer (for hunger)
        self.observed = False    # its running out was already timed
        self.counter = itertools.count(start)
        self.next = self.counter.__next__
        self.hard_end = segment.end
        # the hot path's bound: the prefetch point first, the real end once it is passed
        self.triggered = trigger <= start
        self.end = segment.end if self.triggered else trigger

    def position(self) -> int:
        """The next value the counter would give (clamped to the end), without taking it."""
        value = peek(self.counter)
        return min(max(value, self.segment.start), self.hard_end)

    def stop(self) -> int:
        """Stop issuing; return the hard line (no ID at or above it was handed out)."""
        self.end = _STOPPED
        line = self.next()
        self.hard_end = _STOPPED
        return line


_EMPTY = _Buffer(Segment(0, 1, 1), 1, 1)  # exhausted from the start: always the slow path
_EMPTY.end = _STOPPED
_EMPTY.hard_end = _STOPPED


def _check_count(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")


class _Wait:
    """One caller's wait for a refill: until when, and how many fetches had completed."""

    __slots__ = ("fetches", "until")

    def __init__(self, until: float, fetches: int) -> None:
        self.until, self.fetches = until, fetches


class _Stats:
    __slots__ = (
        "fetch_buckets", "fetch_failures", "fetch_ns_max", "fetch_ns_total", "fetches", "gave_back",
        "last_error", "last_fetch_ns", "unavailable", "waits",
    )

    def __init__(self) -> None:
        self.fetches = self.fetch_failures = self.waits = self.unavailable = 0
        self.fetch_ns_total = self.fetch_ns_max = self.last_fetch_ns = 0
        self.fetch_buckets = [0] * (len(LATENCY_BOUNDS_NS) + 1)   # off the hot path
        self.gave_back = 0
        self.last_error: str | None = None


class SegmentGenerator(StringIds, StartsInWith, ClosesOnce):
    """IDs for one key from Leaf-style segments. Thread-safe.

    Args:
        store: where segments come from (``fetch`` / ``give_back``).
        key: the key (``biz_tag``).
        settings: behaviour; see :class:`SegmentSettings`.
        clock: time for the dynamic step (``monotonic_ns``); waits use real time.
        events: where alerts go.
        name: the generator's name (messages, stats).
        pool: the threads that run its background fetches (default: the process-wide
            :func:`~flakekit.generators.fetcher.shared_pool`; a service passes its own).
    """

    def __init__(
        self, store: SegmentStore, key: str, settings: SegmentSettings | None = None, *,
        clock: Clock | None = None, events: Events = NO_EVENTS, name: str | None = None,
        pool: FetchPool | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.settings = settings or SegmentSettings()
        self.clock = clock or MonotonicClock()
        self.events = events
        self.name = name or key
        self._cur: _Buffer = _EMPTY
        self._next: _Buffer | None = None
        self._cond = threading.Condition(threading.Lock())
        self._start_lock = threading.Lock()
        self._pool = pool
        self._job: FetchJob | None = None   # made in start(): fetches run on the pool
        self._backoff = self.settings.retry_min / 1e9
        self._started = False
        self._closed = False
        self._fetch_wanted = False
        self._fetch_extra = 0  # a big next_ids() asks for a larger one-off segment
        self._fetch_error: BaseException | None = None
        # dynamic step state (Leaf's SegmentBuffer.step / minStep / updateTimestamp)
        self._loads = 0
        self._step = 0
        self._min_step = 0
        self._last_fetch_mono: int | None = None
        self._db_max: int | None = None  # max_id after our newest fetch
        self._stats = _Stats()
        self._forked = False
        self._alerted = False
        # hunger: steps per fetch, the last fetch's latency and start (injected clock)
        self._distance = 1
        self._last_distance = 1
        self._latency_ns = 0
        self._fetched_at = 0
        self._ttl = self.settings.segment_ttl
        self.dropped = 0   # segments dropped past their TTL
        self.installed = 0   # segments the background fetch put in a buffer
        if self._ttl:   # a hot path that checks the TTL after the draw
            self.next_id = self._next_id_ttl  # type: ignore[method-assign]
        after_fork_in_child(self, SegmentGenerator._after_fork_in_child)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> SegmentGenerator:
        """Start fetching; with ``preload`` fetch the first segment now.

        Raises:
            UnknownKeyError: the key is not in the store.
            SchemaError: the store's table is missing.
            NotStartedError: the generator was closed.
        A database that is down is not an error here: the fetcher keeps trying and
        ``next_id()`` waits up to ``wait_budget``.
        """
        with self._start_lock:  # one start at a time: one fetch job, one first fetch
            with self._cond:
                self._check_not_closed()
                if self._started:
                    return self
            segment = None
            if self.settings.preload:
                try:
                    segment = self._fetch()
                except (UnknownKeyError, SchemaError):
                    raise
                except FlakekitError as exc:
                    log.warning("%s: first fetch failed, retrying in the background: %s", self.name,
                                exc)
            with self._cond:
                closed = self._closed  # close() ran during the first fetch
                if not closed:
                    if segment is not None:
                        self._cur = self._buffer(segment)
                        self._cur.started = self.clock.monotonic_ns()
                    self._started = True
                    self._job = (self._pool or shared_pool()).job(self._run, self.name)
                    if self._cur is _EMPTY or self._cur.triggered:
                        self._want_fetch()
            if closed:
                if segment is not None and self.settings.give_back:
                    self._next = self._buffer(segment)  # never issued from: give it all back
                    self._give_back(None, None)
                self._check_not_closed()
        return self

    def _check_not_closed(self) -> None:
        if self._closed:
            raise NotStartedError(
                f"segment generator {self.name!r} was closed; build a new one (a "
                "restarted generator always starts from a fresh segment)"
            )

    def close(self, timeout: float = 5.0) -> None:
        """Stop issuing IDs, stop the fetcher, and give the unused tail back if allowed."""
        with self._cond:
            if not self._claim_close():
                return
            cur = self._cur
            line = cur.stop() if cur is not _EMPTY else None
            self._cur = _EMPTY
            self._cond.notify_all()
            job = self._job
        # a queued fetch or a back-off never runs; one in flight is waited for (bounded)
        if job is not None and not job.cancel(timeout):
            log.warning("%s: fetcher still busy after %.1fs; not giving anything back", self.name,
                        timeout)
            return
        if self.settings.give_back and self._started:
            self._give_back(cur if cur is not _EMPTY else None, line)

    # -- hot path -------------------------------------------------------------------------
    def next_id(self) -> int:
        """The next ID of this key: increasing within this generator, never a duplicate.

        Raises:
            SegmentUnavailableError: both buffers were empty for ``wait_budget``.
            NotStartedError: before ``start()`` or after ``close()``.
        """
        buf = self._cur
        value = buf.next()
        if value < buf.end:
            return value
        return self._slow(buf, value)

    def _next_id_ttl(self) -> int:
        """:meth:`next_id` with ``segment_ttl``: the age is checked after the draw."""
        buf = self._cur
        value = buf.next()
        if value < buf.end and self.clock.monotonic_ns() <= buf.expires:
            return value
        return self._slow(buf, value)

    def _slow(self, buf: _Buffer, value: int) -> int:
        with self._cond:
            if self._still_yours(buf, value):
                return value
            return self._take_locked()

    def _still_yours(self, buf: _Buffer, value: int) -> bool:
        """(lock held) ``value``, drawn from ``buf`` past its fast-path end, may still go
        out: it crossed the prefetch point (which starts the prefetch) or raced a switch."""
        if value < buf.hard_end and not self._expired(buf):
            if not buf.triggered:
                self._trigger(buf)
            return True
        return False

    def _take_locked(self) -> int:
        wait: _Wait | None = None
        while True:
            self._check_open()
            cur = self._cur
            value = cur.next()
            if value < cur.hard_end:
                if self._expired(cur):   # the value is dropped with the rest of it
                    self._drop_current()
                    continue
                if not cur.triggered:
                    self._trigger(cur)
                return value
            wait = self._advance_or_wait(wait)

    # -- hunger and TTL (lock held) -------------------------------------------------------
    def _expired(self, buf: _Buffer) -> bool:
        return bool(self._ttl) and buf is not _EMPTY and self.clock.monotonic_ns() > buf.expires

    def _drop_current(self) -> None:
        """The current segment is past its TTL: stop it, waste the rest, fetch anew."""
        cur = self._cur
        cur.stop()
        self._cur = _EMPTY
        self.dropped += 1
        log.info("%s: dropped the rest of [%d, %d): past segment_ttl", self.name,
                 cur.segment.start, cur.segment.end)
        if self._next is None:
            self._want_fetch()

    def _observe(self, buf: _Buffer) -> None:
        """A segment ran out: time it against the last fetch (CosId's hunger)."""
        if buf is _EMPTY or buf.observed or not self.settings.hunger:
            return
        buf.observed = True
        latency = self._latency_ns
        if latency <= 0:
            return
        lasted = max(self.clock.monotonic_ns() - buf.started, 1)
        distance = self._distance
        if lasted < _HUNGRY * latency:
            # at least double; at once as far as the shortfall says (a segment that lasted
            # a hundredth of a fetch needs a hundred times the steps), up to a fetch of
            # hunger_max x max_step IDs
            need = -(-_HUNGRY * latency // lasted)
            top = max(1, self.settings.hunger_max * self.settings.max_step // max(self._step, 1))
            grown = min(distance * max(2, need), top)
            if grown > distance:
                log.info("%s: a segment lasted %.1f ms, a fetch takes %.1f ms: fetching %d "
                         "steps at once", self.name, lasted / 1e6, latency / 1e6, grown)
            self._distance = grown
        elif lasted > _CALM * latency and distance > 1:
            # at least halve; as far down as the surplus says
            self._distance = max(1, min(distance // 2, distance * _CALM * latency // lasted))

    @property
    def prefetch_distance(self) -> int:
        """How many steps the next fetch asks for (1 when calm; grows under hunger)."""
        return self._distance

    def _advance_or_wait(self, wait: _Wait | None) -> _Wait | None:
        """Current buffer empty (lock held): switch to the next one or wait for it."""
        self._observe(self._cur)
        if self._next is not None and self._expired(self._next):
            self._next.stop()   # fetched long ago and never served: dropped
            self._next = None
            self.dropped += 1
        if self._next is not None:
            self._switch()
            return wait
        self._want_fetch()
        if isinstance(self._fetch_error, (UnknownKeyError, SchemaError)):
            self._stats.unavailable += 1
            self._raise_unavailable(wait)  # waiting will not fix a missing key or table
        now = time.monotonic()
        if wait is None:
            wait = _Wait(now + self.settings.wait_budget / 1e9, self._stats.fetches)
            self._stats.waits += 1
            self._stall_cause()  # starts the store's check now: ready if the wait fails
        remaining = wait.until - now
        if remaining <= 0:
            self._stats.unavailable += 1
            self._raise_unavailable(wait)
        self._cond.wait(remaining)
        return wait

    def _stall_cause(self) -> object:
        """Why the store's commits wait now, if it can tell (never blocks: a store that
        checks does so in the background, at most every few seconds)."""
        return self.store.stall_cause() if isinstance(self.store, TellsStalls) else None

    def _raise_unavailable(self, wait: _Wait | None) -> None:
        error = self._fetch_error
        if isinstance(error, UnknownKeyError):
            raise UnknownKeyError(self.key, " (it is no longer in the store)")
        if isinstance(error, SegmentRowError):
            raise SegmentRowError(error.key, str(error), error.room)
        if isinstance(error, SchemaError):
            raise SchemaError(str(error))
        budget = f"wait_budget ({self.settings.wait_budget / 1e9:g}s)"
        where = self.store.where if isinstance(self.store, Locates) else ""
        store = f"the segment store ({where})" if where else "the segment store"
        if error is not None:  # the cause is the database, not the step
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            message = (
                f"segment key {self.key!r}: no IDs left in memory and no new segment within "
                f"{budget}: the last fetch failed: {first}; check that the database is up "
                "and reachable from this host (the fetcher keeps retrying)"
            )
        elif wait is None or self._stats.fetches == wait.fetches:
            cause = self._stall_cause()  # an away synchronous standby, say
            check = (cause if isinstance(cause, str) else "check that the database is up, "
                     "reachable and not locked or overloaded")
            message = (
                f"segment key {self.key!r}: no IDs left in memory and {store} did not answer "
                f"within {budget}; {check} (the fetcher keeps retrying)"
            )
        else:  # segments did arrive, and were used up before this caller got an ID
            message = (
                f"segment key {self.key!r}: both buffers are empty and the segments that "
                f"arrived within {budget} were used up by other callers; raise the key's "
                "step (or wait_budget) for bursts like this one"
            )
        if not self._alerted:  # once per outage, not once per caller
            self._alerted = True
            self.events.alert("segment-unavailable", message, {
                "generator": self.name, "key": self.key, "last_error": str(error or ""),
            })
        raise SegmentUnavailableError(message)

    def _check_open(self) -> None:
        if self._forked:
            raise NotStartedError(
                f"segment generator {self.name!r} was inherited through fork(); its buffers "
                "belong to the parent process: build a new generator in the child"
            )
        if self._closed:
            raise NotStartedError(f"segment generator {self.name!r} is closed")
        if not self._started:
            raise NotStartedError(f"segment generator {self.name!r} is not started; call start()")

    def _trigger(self, buf: _Buffer) -> None:
        buf.triggered = True
        if buf.end != _STOPPED:
            buf.end = buf.hard_end
        if self._next is None:
            self._want_fetch()

    def _want_fetch(self) -> None:
        """Ask for a background fetch (lock held): while ``_fetch_wanted`` is set, the job
        is queued, running or backing off, and it clears the flag once a segment is in."""
        if not self._fetch_wanted:
            self._fetch_wanted = True
            job = self._job
            if job is not None:
                job.request()

    def _switch(self) -> None:
        old, new = self._cur, self._next
        assert new is not None
        if old is not _EMPTY:
            old.stop()
        self._cur, self._next = new, None
        new.started = self.clock.monotonic_ns()
        if new.triggered:  # prefetch_at = 0: fetch the one after at once
            self._want_fetch()

    def try_next_id(self) -> int | None:
        """Like :meth:`next_id`, but ``None`` instead of waiting for a refill (for asyncio:
        the event loop must never wait on the database)."""
        buf = self._cur
        value = buf.next()
        if value < buf.end and (not self._ttl or self.clock.monotonic_ns() <= buf.expires):
            return value
        with self._cond:
            if self._still_yours(buf, value):
                return value
            self._check_open()
            if self._expired(self._cur):
                self._drop_current()
            if self._next is not None and self._expired(self._next):
                self._next.stop()
                self._next = None
                self.dropped += 1
            cur = self._cur
            if self._next is None and cur.position() >= cur.hard_end:
                self._observe(cur)
                self._want_fetch()
                return None
            return self._take_locked()  # does not wait: a value or the next buffer is there

    def try_next_ids(self, n: int) -> IdBatch | None:
        """Like :meth:`next_ids`, but ``None`` (nothing taken) unless the buffers in memory
        hold all ``n`` IDs."""
        _check_count(n)
        with self._cond:
            self._check_open()
            cur, nxt = self._cur, self._next
            room = max(0, cur.hard_end - cur.position()) if cur.hard_end != _STOPPED else 0
            room += nxt.segment.end - nxt.segment.start if nxt is not None else 0
            if room < n:
                self._want_fetch()
                return None
            return self._next_ids_locked(n)

    # -- batches --------------------------------------------------------------------------
    def next_ids(self, n: int) -> IdBatch:
        """``n`` IDs as ranges (one per segment touched); may span several segments.

        Raises:
            ValueError: ``n`` is negative.
            SegmentUnavailableError: the IDs could not all be found within ``wait_budget``
                (the ones already taken are lost, never reissued).
        """
        _check_count(n)
        with self._cond:
            return self._next_ids_locked(n)

    def _next_ids_locked(self, n: int) -> IdBatch:
        ranges: list[range] = []
        remaining = n
        wait: _Wait | None = None
        while remaining:
            self._check_open()
            if self._expired(self._cur):
                self._drop_current()
            cur = self._cur
            if cur.hard_end != _STOPPED:
                was_triggered, soft_end = cur.triggered, cur.end
                line = cur.stop()  # nothing at or above `line` was handed out
                take = min(remaining, max(0, cur.segment.end - line))
                if take:
                    ranges.append(range(line, line + take))
                    remaining -= take
                rest = line + take
                if rest < cur.segment.end:
                    # the untouched rest goes on as a buffer of its own
                    fresh = _Buffer(cur.segment, rest, rest if was_triggered else soft_end,
                                    cur.expires)
                    fresh.started = cur.started
                    self._cur = fresh
                    if fresh.triggered and not was_triggered:
                        self._trigger(fresh)
                    continue
                self._observe(cur)
                self._cur = _EMPTY
                if not was_triggered and self._next is None:
                    self._want_fetch()
            if self._next is None and remaining > self._step:
                self._fetch_extra = remaining  # one big segment, not many round trips
            wait = self._advance_or_wait(wait)
        return IdBatch(ranges)

    # -- background fetcher ---------------------------------------------------------------
    def _run(self) -> float | None:
        """One background fetch (a pool job): ``None`` when nothing more is wanted, ``0``
        to fetch again at once, else the back-off before the retry (seconds)."""
        with self._cond:
            if self._closed or not self._fetch_wanted:
                return None
        try:
            segment = self._fetch()
        except Exception as exc:  # any failure: report, back off, retry
            backoff = self._backoff
            self._backoff = min(backoff * 2, self.settings.retry_max / 1e9)
            with self._cond:
                self._fetch_error = exc
                self._stats.fetch_failures += 1
                self._stats.last_error = str(exc)
                self._cond.notify_all()
                closed = self._closed
            if not isinstance(exc, FlakekitError):
                log.exception("%s: unexpected error fetching a segment", self.name)
            else:
                log.warning("%s: fetching a segment failed (retry in %.2fs): %s", self.name,
                            backoff, exc)
            return None if closed else backoff
        self._backoff = self.settings.retry_min / 1e9
        with self._cond:
            self._fetch_error = None
            self._alerted = False
            self._fetch_wanted = False
            buf = self._buffer(segment)
            self.installed += 1
            if self._cur is _EMPTY and not self._closed:
                self._cur = buf
                buf.started = self.clock.monotonic_ns()
                if buf.triggered:
                    self._fetch_wanted = True
            else:
                self._next = buf  # kept even when closing, so close() can give it back
            self._cond.notify_all()
            if self._closed or not self._fetch_wanted:
                return None
            return 0.0

    def _buffer(self, segment: Segment) -> _Buffer:
        used = math.floor(segment.step * self.settings.prefetch_at)
        expires = self._fetched_at + self._ttl if self._ttl else _NEVER
        return _Buffer(segment, segment.start, segment.start + used, expires)

    def _fetch(self) -> Segment:
        """One store round trip with Leaf's step rules (the fetch job or start only)."""
        now = self.clock.monotonic_ns()
        step: int | None = None
        extra = self._fetch_extra
        if self._loads >= 2 and self.settings.dynamic_step:
            assert self._last_fetch_mono is not None
            # Leaf's rule sees the time per step: a fetch of k steps lasts k times longer
            duration = (now - self._last_fetch_mono) // self._last_distance
            step = self._step
            if duration < self.settings.grow_below:
                if step * 2 <= self.settings.max_step:
                    step *= 2
            elif duration >= self.settings.shrink_after:
                if step // 2 >= self._min_step:
                    step //= 2
        elif self._loads >= 2:
            step = self._step
        distance = self._distance if self.settings.hunger else 1
        fetch_step: int | None = step
        base = step or self._step   # 0 before the first fetch: the table's step
        if distance > 1 and base:   # several steps in one round trip
            fetch_step = min(base * distance, self.settings.hunger_max * self.settings.max_step)
        else:
            distance = 1
        if extra > (fetch_step or self._step):
            fetch_step = extra
        t0 = time.perf_counter_ns()
        sent = self.clock.monotonic_ns()
        try:
            alloc = self._store_fetch(fetch_step)
        except Exception as exc:
            self.events.operation("segment.fetch", self.name, time.perf_counter_ns() - t0,
                                  {"key": self.key, "step": fetch_step}, str(exc))
            raise
        elapsed = time.perf_counter_ns() - t0
        self.events.operation("segment.fetch", self.name, elapsed,
                              {"key": self.key, "step": alloc.step, "max_id": alloc.max_id}, None)
        self._latency_ns = max(0, self.clock.monotonic_ns() - sent)
        self._fetched_at = sent   # a TTL counts from before the round trip
        self._last_distance = distance
        self._fetch_extra = 0
        stats = self._stats
        stats.fetches += 1
        stats.last_fetch_ns = elapsed
        stats.fetch_ns_total += elapsed
        stats.fetch_ns_max = max(stats.fetch_ns_max, elapsed)
        stats.fetch_buckets[bisect.bisect_left(LATENCY_BOUNDS_NS, elapsed)] += 1
        self._min_step = alloc.db_step
        new_step = alloc.db_step if step is None else step
        # the table's step is the floor; re-read on every fetch so editing it works live
        self._step = max(new_step, self._min_step)
        if self._loads >= 1:
            self._last_fetch_mono = now
        self._loads += 1
        self._db_max = alloc.max_id
        return Segment(alloc.max_id - alloc.step, alloc.max_id, alloc.step)

    def _store_fetch(self, step: int | None) -> Allocation:
        try:
            return self.store.fetch(self.key, step)
        except SegmentRowError as exc:
            # near the top of the BIGINT range a doubled step (or the table's) may not fit
            # while a smaller one still does: take what is left, then fail cleanly
            if exc.room and (step is None or step > exc.room):
                return self.store.fetch(self.key, exc.room)
            raise

    # -- shutdown -------------------------------------------------------------------------
    def _give_back(self, cur: _Buffer | None, line: int | None) -> None:
        """Return the unused top of what we hold, if nobody fetched after us."""
        expected = self._db_max
        if expected is None:
            return
        nxt = self._next
        new_max: int | None = None
        if nxt is not None and nxt.segment.end == expected:
            new_max = nxt.segment.start
            if cur is not None and line is not None and cur.segment.end == nxt.segment.start:
                new_max = max(cur.segment.start, min(line, cur.segment.end))
        elif nxt is None and cur is not None and line is not None and cur.segment.end == expected:
            new_max = max(cur.segment.start, min(line, cur.segment.end))
        if new_max is None or new_max >= expected:
            return
        try:
            done = self.store.give_back(self.key, expected, new_max)
        except FlakekitError as exc:
            log.warning("%s: could not give back [%d, %d): %s", self.name, new_max, expected, exc)
            return
        if done:
            self._stats.gave_back = expected - new_max
            log.info("%s: gave back [%d, %d)", self.name, new_max, expected)
        else:
            log.info("%s: max_id moved on since our last fetch; nothing given back", self.name)

    # -- observation ----------------------------------------------------------------------
    def stats(self) -> SegmentStats:
        """Both buffers (position, end, step, ready), the step and the fetch counters."""
        with self._cond:
            cur, nxt = self._cur, self._next
            s = self._stats
            return SegmentStats(
                strategy="segment",
                name=self.name,
                key=self.key,
                started=self._started,
                closed=self._closed,
                step=self._step,
                min_step=self._min_step,
                max_id=self._db_max,
                buffers=(self._buffer_info(cur, "current"), self._buffer_info(nxt, "next")),
                fetching=self._fetch_wanted,
                fetches=s.fetches,
                fetch_failures=s.fetch_failures,
                fetch_ms_last=s.last_fetch_ns / 1e6,
                fetch_ms_max=s.fetch_ns_max / 1e6,
                fetch_ms_mean=(s.fetch_ns_total / s.fetches / 1e6) if s.fetches else 0.0,
                waits=s.waits,
                unavailable=s.unavailable,
                gave_back=s.gave_back,
                last_error=s.last_error,
                fetch_buckets=tuple(s.fetch_buckets),
            )

    @staticmethod
    def _buffer_info(buf: _Buffer | None, slot: str) -> BufferStats:
        if buf is None or buf is _EMPTY or buf.hard_end == _STOPPED:
            return BufferStats(slot=slot, ready=False, start=None, position=None,
                               end=None, step=None, idle=0)
        seg = buf.segment
        pos = buf.position()
        return BufferStats(slot=slot, ready=pos < seg.end, start=seg.start, position=pos,
                           end=seg.end, step=seg.step, idle=seg.end - pos)

    def __repr__(self) -> str:
        return f"SegmentGenerator(name={self.name!r}, key={self.key!r})"

    def _after_fork_in_child(self) -> None:
        """The child must not count through the parent's buffers (duplicates)."""
        self._cond = threading.Condition(threading.Lock())  # the parent's may be held
        self._start_lock = threading.Lock()
        self._cur, self._next = _EMPTY, None
        self._forked = self._closed = True
        self._job = None   # the parent's pool job: the child's pool is a fresh one
