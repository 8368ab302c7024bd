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

Dynamic step is Leaf's: the first two fetches use the table's ``step``; after that the
step doubles when the previous segment lasted less than ``grow_below`` (15 min, capped at
``max_step``) and halves when it lasted ``shrink_after`` (30 min) or more, never below the
table's ``step``, which is re-read on every fetch. Durations come from the injected clock.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from flakekit.batch import IdBatch
from flakekit.clock import Clock, MonotonicClock
from flakekit.errors import (
    FlakekitError,
    NotStartedError,
    SchemaError,
    SegmentUnavailableError,
    UnknownKeyError,
)
from flakekit.events import NO_EVENTS, Events
from flakekit.forks import after_fork_in_child
from flakekit.timeunits import parse_duration_ns

__all__ = [
    "Segment",
    "SegmentGenerator",
    "SegmentSettings",
    "SegmentStore",
    "build_segment_generator",
]

log = logging.getLogger("flakekit.segment")

#: below every ID: a buffer whose ``end`` is this issues nothing
_STOPPED = -(2**80)


class SegmentStore(Protocol):
    """What a generator needs from a store (the ``sql`` store is the built-in one)."""

    def fetch(self, key: str, step: int | None = None) -> Any:
        """Advance the key by ``step`` (None: its stored step); return an object with
        ``max_id``, ``step`` (the range length) and ``db_step`` (the stored step)."""

    def give_back(self, key: str, expected_max_id: int, new_max_id: int) -> bool: ...


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

    __slots__ = ("counter", "end", "hard_end", "next", "segment", "triggered")

    def __init__(self, segment: Segment, start: int, trigger: int) -> None:
        self.segment = segment
        self.counter = itertools.count(start)
        self.next = self.counter.__next__
        self.hard_end = segment.end
        # the hot path's bound: the prefetch point first, the real end once it is passed
        self.triggered = trigger <= start
        self.end = segment.end if self.triggered else trigger

    def position(self) -> int:
        """The next value the counter would give (clamped to the end), without taking it."""
        value = int(repr(self.counter)[6:-1])  # "count(N)"
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


def _duration(value: object) -> int:
    return parse_duration_ns(value, default_unit="s")


def _fraction(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be at least 0 and below 1 (0.1 = prefetch once 10% is used), got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"must be at least 1, got {value!r}")


@attrs.frozen
class SegmentSettings:
    """``[generators.NAME]`` with ``strategy = "segment"`` (besides ``store``).

    Attributes:
        key: the ``biz_tag`` in the store (default: the generator's name).
        prefetch_at: share of the current segment used before the next one is fetched
            (default 0.1, as Leaf; 0 fetches at once; must be below 1).
        dynamic_step: adapt the step to traffic, as Leaf (default true).
        max_step: the step never grows above this (default 1,000,000, Leaf's
            ``MAX_STEP``), and never shrinks below the table's ``step``.
        grow_below: double the step when a segment lasted less than this (default 15min).
        shrink_after: halve it when a segment lasted this long or more (default 30min;
            must not be below ``grow_below``).
        wait_budget: how long ``next_id()`` waits for a refill when both buffers are empty
            before raising ``SegmentUnavailableError`` (default 1s; 0 = Leaf's fail-fast).
        give_back: on a clean ``close()``, return the unused tail with a compare-and-set
            on ``max_id`` (default true).
        preload: fetch the first segment in ``start()`` (default true); false fetches it
            in the background, and the first ``next_id()`` waits for it.
        retry_min / retry_max: back-off between failed background fetches (default 50ms,
            doubling up to 2s).
    """

    key: str | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(str)),
    )
    prefetch_at: float = attrs.field(default=0.1, converter=float, validator=_fraction)
    dynamic_step: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    max_step: int = attrs.field(
        default=1_000_000, validator=[attrs.validators.instance_of(int), _positive]
    )
    grow_below: int = attrs.field(default="15min", converter=_duration)  # type: ignore[assignment]  # converted
    shrink_after: int = attrs.field(default="30min", converter=_duration)  # type: ignore[assignment]  # converted
    wait_budget: int = attrs.field(default="1s", converter=_duration)  # type: ignore[assignment]  # converted
    give_back: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    preload: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    retry_min: int = attrs.field(default="50ms", converter=_duration)  # type: ignore[assignment]  # converted
    retry_max: int = attrs.field(default="2s", converter=_duration)  # type: ignore[assignment]  # converted

    def __attrs_post_init__(self) -> None:
        if self.key is not None and not 0 < len(self.key) <= 128:
            raise ValueError(f"key must be 1 to 128 characters, got {self.key!r}")
        if self.shrink_after < self.grow_below:
            raise ValueError(
                "shrink_after must not be below grow_below "
                f"({self.shrink_after / 1e9:g}s < {self.grow_below / 1e9:g}s)"
            )
        if self.retry_min < 1_000_000 or self.retry_max < self.retry_min:
            raise ValueError("retry_min must be at least 1ms and retry_max not below retry_min")


class _Stats:
    __slots__ = (
        "fetch_failures", "fetch_ns_max", "fetch_ns_total", "fetches", "gave_back",
        "last_error", "last_fetch_ns", "unavailable", "waits",
    )

    def __init__(self) -> None:
        self.fetches = self.fetch_failures = self.waits = self.unavailable = 0
        self.fetch_ns_total = self.fetch_ns_max = self.last_fetch_ns = 0
        self.gave_back = 0
        self.last_error: str | None = None


class SegmentGenerator:
    """IDs for one key from Leaf-style segments. Thread-safe.

    Args:
        store: where segments come from (``fetch`` / ``give_back``).
        key: the key (``biz_tag``).
        settings: behaviour; see :class:`SegmentSettings`.
        clock: time for the dynamic step (``monotonic_ns``); waits use real time.
        events: where alerts go.
        name: the generator's name (messages, stats).
    """

    def __init__(
        self, store: SegmentStore, key: str, settings: SegmentSettings | None = None, *,
        clock: Clock | None = None, events: Events = NO_EVENTS, name: str | None = None,
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
        self._wake = threading.Event()  # interrupts the fetcher's back-off sleep on close
        self._thread: threading.Thread | None = None
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
        after_fork_in_child(self, SegmentGenerator._after_fork_in_child)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> SegmentGenerator:
        """Start the fetcher; with ``preload`` fetch the first segment now.

        Raises:
            UnknownKeyError: the key is not in the store.
            SchemaError: the store's table is missing.
            NotStartedError: the generator was closed.
        A database that is down is not an error here: the fetcher keeps trying and
        ``next_id()`` waits up to ``wait_budget``.
        """
        with self._start_lock:  # one start at a time: one fetcher thread, one first fetch
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
                    log.warning("%s: first fetch failed, retrying in the background: %s", self.name, exc)
            with self._cond:
                closed = self._closed  # close() ran during the first fetch
                if not closed:
                    if segment is not None:
                        self._cur = self._buffer(segment)
                    self._started = True
                    if self._cur is _EMPTY or self._cur.triggered:
                        self._fetch_wanted = True
                    self._thread = threading.Thread(
                        target=self._run, name=f"flakekit-segment-{self.key}", daemon=True
                    )
                    self._thread.start()
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
            if self._closed:
                return
            self._closed = True
            cur = self._cur
            line = cur.stop() if cur is not _EMPTY else None
            self._cur = _EMPTY
            self._cond.notify_all()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s: fetcher still busy after %.1fs; not giving anything back", self.name, timeout)
                return
        if self.settings.give_back and self._started:
            self._give_back(cur if cur is not _EMPTY else None, line)

    def __enter__(self) -> SegmentGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _slow(self, buf: _Buffer, value: int) -> int:
        with self._cond:
            if value < buf.hard_end:  # crossed the prefetch point, or raced a switch
                if not buf.triggered:
                    self._trigger(buf)
                return value
            return self._take_locked()

    def _take_locked(self) -> int:
        deadline: float | None = None
        while True:
            self._check_open()
            cur = self._cur
            value = cur.next()
            if value < cur.hard_end:
                if not cur.triggered:
                    self._trigger(cur)
                return value
            deadline = self._advance_or_wait(deadline)

    def _advance_or_wait(self, deadline: float | None) -> float:
        """Current buffer empty (lock held): switch to the next one or wait for it."""
        if self._next is not None:
            self._switch()
            return deadline if deadline is not None else 0.0
        self._want_fetch()
        if isinstance(self._fetch_error, (UnknownKeyError, SchemaError)):
            self._stats.unavailable += 1
            self._raise_unavailable()  # waiting will not fix a missing key or table
        now = time.monotonic()
        if not deadline:
            deadline = now + self.settings.wait_budget / 1e9
            self._stats.waits += 1
        remaining = deadline - now
        if remaining <= 0:
            self._stats.unavailable += 1
            self._raise_unavailable()
        self._cond.wait(remaining)
        return deadline

    def _raise_unavailable(self) -> None:
        error = self._fetch_error
        if isinstance(error, UnknownKeyError):
            raise UnknownKeyError(self.key, " (it is no longer in the store)")
        if isinstance(error, SchemaError):
            raise SchemaError(str(error))
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        reason = f": last fetch failed: {first}" if error is not None else ""
        message = (
            f"segment key {self.key!r}: both buffers are empty and no new segment arrived "
            f"within wait_budget ({self.settings.wait_budget / 1e9:g}s){reason}; the "
            "fetcher keeps retrying (raise the key's step or wait_budget if this happens "
            "under bursts)"
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
        if not self._fetch_wanted:
            self._fetch_wanted = True
            self._cond.notify_all()

    def _switch(self) -> None:
        old, new = self._cur, self._next
        assert new is not None
        if old is not _EMPTY:
            old.stop()
        self._cur, self._next = new, None
        if new.triggered:  # prefetch_at = 0: fetch the one after at once
            self._want_fetch()

    # -- batches --------------------------------------------------------------------------
    def next_ids(self, n: int) -> IdBatch:
        """``n`` IDs as ranges (one per segment touched); may span several segments.

        Raises:
            ValueError: ``n`` is negative.
            SegmentUnavailableError: the IDs could not all be found within ``wait_budget``
                (the ones already taken are lost, never reissued).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        ranges: list[range] = []
        remaining = n
        with self._cond:
            deadline: float | None = None
            while remaining:
                self._check_open()
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
                        fresh = _Buffer(cur.segment, rest, rest if was_triggered else soft_end)
                        self._cur = fresh
                        if fresh.triggered and not was_triggered:
                            self._trigger(fresh)
                        continue
                    self._cur = _EMPTY
                    if not was_triggered and self._next is None:
                        self._want_fetch()
                if self._next is None and remaining > self._step:
                    self._fetch_extra = remaining  # one big segment, not many round trips
                deadline = self._advance_or_wait(deadline)
        return IdBatch(ranges)

    # -- background fetcher ---------------------------------------------------------------
    def _run(self) -> None:
        backoff = self.settings.retry_min / 1e9
        while True:
            with self._cond:
                while not self._fetch_wanted and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                segment = self._fetch()
            except Exception as exc:  # noqa: BLE001 - any failure: report, back off, retry
                with self._cond:
                    self._fetch_error = exc
                    self._stats.fetch_failures += 1
                    self._stats.last_error = str(exc)
                    self._cond.notify_all()
                if not isinstance(exc, FlakekitError):
                    log.exception("%s: unexpected error fetching a segment", self.name)
                else:
                    log.warning("%s: fetching a segment failed (retry in %.2fs): %s", self.name, backoff, exc)
                if self._wake.wait(backoff):
                    return
                backoff = min(backoff * 2, self.settings.retry_max / 1e9)
                continue
            backoff = self.settings.retry_min / 1e9
            with self._cond:
                self._fetch_error = None
                self._alerted = False
                self._fetch_wanted = False
                buf = self._buffer(segment)
                if self._cur is _EMPTY and not self._closed:
                    self._cur = buf
                    if buf.triggered:
                        self._fetch_wanted = True
                else:
                    self._next = buf  # kept even when closing, so close() can give it back
                self._cond.notify_all()
                if self._closed:
                    return

    def _buffer(self, segment: Segment) -> _Buffer:
        used = math.floor(segment.step * self.settings.prefetch_at)
        return _Buffer(segment, segment.start, segment.start + used)

    def _fetch(self) -> Segment:
        """One store round trip with Leaf's step rules (fetcher thread or start only)."""
        now = self.clock.monotonic_ns()
        step: int | None = None
        extra = self._fetch_extra
        if self._loads >= 2 and self.settings.dynamic_step:
            assert self._last_fetch_mono is not None
            duration = now - self._last_fetch_mono
            step = self._step
            if duration < self.settings.grow_below:
                if step * 2 <= self.settings.max_step:
                    step *= 2
            elif duration >= self.settings.shrink_after:
                if step // 2 >= self._min_step:
                    step //= 2
        elif self._loads >= 2:
            step = self._step
        if extra > (step or self._step):
            fetch_step: int | None = extra
        else:
            fetch_step = step
        t0 = time.perf_counter_ns()
        try:
            alloc = self.store.fetch(self.key, fetch_step)
        finally:
            elapsed = time.perf_counter_ns() - t0
        self._fetch_extra = 0
        stats = self._stats
        stats.fetches += 1
        stats.last_fetch_ns = elapsed
        stats.fetch_ns_total += elapsed
        stats.fetch_ns_max = max(stats.fetch_ns_max, elapsed)
        self._min_step = alloc.db_step
        new_step = alloc.db_step if step is None else step
        # the table's step is the floor; re-read on every fetch so editing it works live
        self._step = max(new_step, self._min_step)
        if self._loads >= 1:
            self._last_fetch_mono = now
        self._loads += 1
        self._db_max = alloc.max_id
        return Segment(alloc.max_id - alloc.step, alloc.max_id, alloc.step)

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
    def stats(self) -> dict[str, Any]:
        """Both buffers (position, end, step, ready), the step and the fetch counters."""
        with self._cond:
            cur, nxt = self._cur, self._next
            s = self._stats
            buffers = [self._buffer_info(cur, "current"), self._buffer_info(nxt, "next")]
            return {
                "strategy": "segment",
                "name": self.name,
                "key": self.key,
                "started": self._started,
                "closed": self._closed,
                "step": self._step,
                "min_step": self._min_step,
                "max_id": self._db_max,
                "buffers": buffers,
                "fetching": self._fetch_wanted,
                "fetches": s.fetches,
                "fetch_failures": s.fetch_failures,
                "fetch_ms_last": s.last_fetch_ns / 1e6,
                "fetch_ms_max": s.fetch_ns_max / 1e6,
                "fetch_ms_mean": (s.fetch_ns_total / s.fetches / 1e6) if s.fetches else 0.0,
                "waits": s.waits,
                "unavailable": s.unavailable,
                "gave_back": s.gave_back,
                "last_error": s.last_error,
            }

    @staticmethod
    def _buffer_info(buf: _Buffer | None, slot: str) -> dict[str, Any]:
        if buf is None or buf is _EMPTY or buf.hard_end == _STOPPED:
            return {"slot": slot, "ready": False, "start": None, "position": None,
                    "end": None, "step": None, "idle": 0}
        seg = buf.segment
        pos = buf.position()
        return {"slot": slot, "ready": pos < seg.end, "start": seg.start, "position": pos,
                "end": seg.end, "step": seg.step, "idle": seg.end - pos}

    def __repr__(self) -> str:
        return f"SegmentGenerator(name={self.name!r}, key={self.key!r})"

    def _after_fork_in_child(self) -> None:
        """The child must not count through the parent's buffers (duplicates)."""
        self._cond = threading.Condition(threading.Lock())  # the parent's may be held
        self._start_lock = threading.Lock()
        self._cur, self._next = _EMPTY, None
        self._forked = self._closed = True
        self._thread = None


# -- building from config ----------------------------------------------------------------

_DEFAULT_STORE = {"type": "sql", "backend": "default"}


def build_segment_generator(
    name: str, table: Mapping[str, Any], path: str, ctx: Any
) -> SegmentGenerator:
    """Build the generator of ``[generators.NAME]`` (``strategy = "segment"``).

    ``table`` is the raw TOML table without ``strategy``. Keys: ``store`` (default
    ``{type = "sql", backend = "default"}``) plus the fields of :class:`SegmentSettings`.

    Raises:
        ConfigError: an unknown key, a wrong value (naming the field), an unknown store
            type or backend.
    """
    from flakekit.kit import build_plugin
    from flakekit.settings import build_settings, check_keys

    table = dict(table)
    check_keys(table, {f.name for f in attrs.fields(SegmentSettings)} | {"store"}, path)
    store_table = table.pop("store", _DEFAULT_STORE)
    settings = build_settings(SegmentSettings, table, path)
    assert settings is not None
    store_path = f"{path}.store"
    store_ctx = attrs.evolve(ctx, path=store_path) if attrs.has(type(ctx)) else ctx
    store = build_plugin(ctx.plugins.segment_stores, store_table, store_path, store_ctx,
                         default_type="sql")
    return SegmentGenerator(
        store, settings.key or name, settings, clock=ctx.clock, events=ctx.events, name=name
    )
