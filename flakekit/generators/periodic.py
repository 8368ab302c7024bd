"""PeriodicSegment: a segment counter that starts again every day, month or year, for
numbers such as ``20261201-000042`` (Leaf #96; CosId's grouped segments).

Each period is an ordinary ``leaf_alloc`` row, ``KEY@DIGITS`` (``invoice@20261201``,
:mod:`flakekit.values.periods`), served by an ordinary :class:`SegmentGenerator`; this
class only decides which row is current, and until when.

Why it looks the way it does:

* **The database's clock decides the period, never this host's.** Every node reads the
  database's time (``store.db_now()``, one ``SELECT now()``) and turns it into a deadline
  on its own monotonic clock the way a lease is timed: counted from the *send* time of the
  read (the database stamped it later), less ``boundary_margin`` and 500 ppm of the time
  left (clock drift). So a node stops issuing a period before the database reaches its
  end, and a node starts the next period only once the database says it has begun: no ID
  of one period is issued in another, on any node.
* **The deadline is checked after the ID is drawn and before it is returned** (one clock
  read on the hot path, like ``segment_ttl``). IDs of the old period still in the buffers
  at the boundary are dropped with them, never issued late; they are never reissued either.
* **The next period's row is created by whichever node gets there first**: an insert that
  may lose the race to another node's (the unique ``biz_tag`` decides), then the same
  fetch as any key. A row of that name that flakekit did not create (its description says
  so) is refused rather than shared.
* **Capacity is the template's width**: a period with ``{seq:06d}`` holds 999,999 numbers;
  the next one raises :class:`~flakekit.errors.PeriodFullError` until the period ends,
  never a seventh digit.
* A background thread re-reads the database's clock every ``clock_sync`` and at the
  deadline, so callers do not wait at midnight; when it cannot, the first caller past the
  deadline reads it (bounded by ``wait_budget``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import TYPE_CHECKING, Any

from flakekit.errors import (
    BackendError,
    FlakekitError,
    NotStartedError,
    PeriodFullError,
    SegmentUnavailableError,
)
from flakekit.generators.segment import SegmentGenerator
from flakekit.generators.segment_settings import SegmentSettings
from flakekit.values.batch import IdBatch
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.lifecycle import ClosesOnce, StartsInWith, started_daemon
from flakekit.values.periods import (
    Period,
    PeriodFormat,
    PeriodRule,
    default_template,
    period_key,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from flakekit.generators.fetcher import FetchPool
    from flakekit.generators.stores import PeriodStore
    from flakekit.values.stats import SegmentStats

__all__ = ["PeriodicSegment", "build_key_generator", "period_description"]

log = logging.getLogger("flakekit.segment")

#: the drift allowed between this host's monotonic clock and the database's clock, per
#: second left in the period (500 ppm: well above what NTP-disciplined clocks show)
DRIFT = 500e-6
_NEVER_NS = -(2**62)
#: callers past the deadline read the database's clock at most this often
_RESYNC_NS = 5_000_000


def period_description(base: str, rule: PeriodRule, period: Period) -> str:
    """What a period row flakekit creates says in ``description`` (and how a row of that
    name is recognised as flakekit's own)."""
    return (f"flakekit {rule.reset} period {period.first_day.isoformat()} of {base!r} "
            f"({rule.time_zone})")


class _Live:
    """The current period: its generator and the monotonic deadline of its IDs."""

    __slots__ = ("base", "deadline", "digits", "full", "gen", "next", "period")

    def __init__(self, period: Period | None, gen: SegmentGenerator | None, base: int,
                 deadline: int) -> None:
        self.period, self.gen, self.base, self.deadline = period, gen, base, deadline
        self.digits = period.digits if period is not None else ""
        self.next: Callable[[], int] = gen.next_id if gen is not None else _never
        self.full = False   # its numbers are used up: nothing more is drawn (or fetched)


def _never() -> int:
    raise NotStartedError("the periodic generator is not started; call start()")


_NONE = _Live(None, None, 0, _NEVER_NS)


class PeriodicSegment(StartsInWith, ClosesOnce):
    """IDs of ``key`` that start again every period (``settings.reset``). Thread-safe.

    ``next_id()`` gives the period's digits followed by the zero-padded number
    (``20261201000042``); ``next_str()`` the template's form (``20261201-000042``).

    Args:
        store: a segment store that also has ``db_now()`` and ``ensure_period_key()``.
        key: the base key (period rows are ``KEY@DIGITS``).
        settings: segment settings with ``reset`` set.
        clock: the monotonic clock deadlines are counted on (injected in tests).
        db_clock: reads the database's time (default ``store.db_now``; tests inject one).
    """

    def __init__(
        self, store: PeriodStore, key: str, settings: SegmentSettings, *,
        clock: Clock | None = None, events: Events = NO_EVENTS, name: str | None = None,
        pool: FetchPool | None = None, db_clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        if settings.reset is None:
            raise ValueError("PeriodicSegment needs settings.reset")
        self.store, self.key, self.settings = store, key, settings
        self.clock = clock or MonotonicClock()
        self._mono = self.clock.monotonic_ns   # the hot path's one clock read
        self.events, self.name, self._pool = events, name or key, pool
        self.rule = PeriodRule(settings.reset, settings.time_zone)
        self._format = PeriodFormat(settings.template or default_template(settings.reset),
                                    self.rule, key)
        self._cap = self._format.scale   # sequence numbers below this fit the width
        self._db_clock = db_clock or store.db_now
        self._cur = _NONE
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closers: list[threading.Thread] = []   # closing the generators of old periods
        self._closed = False
        self._synced = _NEVER_NS   # when the database's clock was last read (monotonic)
        self.rolled = 0   # periods this generator has served after its first

    # -- string form ----------------------------------------------------------------------
    @property
    def id_format(self) -> PeriodFormat:
        return self._format

    @id_format.setter
    def id_format(self, value: Any) -> None:
        """The kit sets every generator's ``format``: a periodic one is written by its
        template, so any other than the default is refused."""
        from flakekit.errors import ConfigError
        from flakekit.values.formats import DECIMAL

        if value is not self._format and value != DECIMAL:
            raise ConfigError(f"generators.{self.name}.format", "a periodic counter (reset) "
                              "is written by its template; remove format and set template")

    def next_str(self) -> str:
        return self._format.encode(self.next_id())

    def next_strs(self, n: int) -> list[str]:
        return self._format.encode_many(self.next_ids(n))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> PeriodicSegment:
        """Read the database's clock, create the period's row if needed, fetch."""
        with self._lock:
            if self._closed:
                raise NotStartedError(f"periodic generator {self.name!r} was closed")
            if self._cur is not _NONE:
                return self
            self._sync()
            if self._thread is None and self.settings.clock_sync:
                self._thread = started_daemon(self._run, f"flakekit-period-{self.name}")
        return self

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if not self._claim_close():
                return
            cur, self._cur = self._cur, _NONE
        self._wake.set()
        if cur.gen is not None:
            cur.gen.close(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
        for closer in self._closers:
            closer.join(timeout)

    # -- hot path -------------------------------------------------------------------------
    def next_id(self) -> int:
        """The next ID of the current period (the database's), never one of another.

        Raises:
            PeriodFullError: the period's numbers are used up (the template's width).
            SegmentUnavailableError: no segment, or the database's clock could not be
                read, within ``wait_budget``.
        """
        cur = self._cur
        try:
            seq = cur.next()
        except NotStartedError:   # the period rolled under us (its generator closed)
            seq = self._cap
        if seq < self._cap and self._mono() < cur.deadline:
            return cur.base + seq
        return self._slow(cur, seq, None, 1)   # type: ignore[return-value]

    def next_ids(self, n: int) -> IdBatch:
        """``n`` IDs of one period, as ranges (the whole batch is of the period current
        when it is returned)."""
        cur = self._cur
        try:
            batch = cur.gen.next_ids(n) if cur.gen is not None and not cur.full else None
        except NotStartedError:
            batch = None
        return self._slow(cur, None, batch, n)   # type: ignore[return-value]

    def try_next_id(self) -> int | None:
        """Like :meth:`next_id`, but ``None`` instead of waiting (a refill, the database's
        clock, a boundary, a full period): for asyncio, whose loop never waits on the
        database (:mod:`flakekit.aio` then runs ``next_id`` in a thread)."""
        cur = self._cur
        if cur.gen is None or cur.full:
            return None
        try:
            seq = cur.gen.try_next_id()
        except NotStartedError:
            return None
        if seq is not None and seq < self._cap and self._mono() < cur.deadline:
            return cur.base + seq
        return None   # a value drawn past the deadline is dropped, never issued

    def try_next_ids(self, n: int) -> IdBatch | None:
        """Like :meth:`next_ids`, but ``None`` unless memory holds all ``n`` of the period."""
        cur = self._cur
        if cur.gen is None or cur.full:
            return None
        try:
            batch = cur.gen.try_next_ids(n)
        except NotStartedError:
            return None
        if batch is None or self._mono() >= cur.deadline:
            return None
        if max((r.stop for r in batch.ranges), default=0) > self._cap:
            return None
        return IdBatch([range(cur.base + r.start, cur.base + r.stop) for r in batch.ranges])

    def _slow(self, cur: _Live, seq: int | None, batch: IdBatch | None,
              n: int) -> int | IdBatch:
        """Past the deadline, a full period, a batch, or a roll under us."""
        give_up = self.clock.monotonic_ns() + self.settings.wait_budget
        while True:
            with self._lock:
                if self._closed:
                    raise NotStartedError(f"periodic generator {self.name!r} is closed")
                if self._cur is _NONE:
                    raise NotStartedError(f"periodic generator {self.name!r} is not started")
                if self._cur is cur and self.clock.monotonic_ns() < cur.deadline:
                    answer = self._answer(cur, seq, batch)
                    if answer is not None:
                        return answer
                if self._cur is cur and self._mono() - self._synced >= _RESYNC_NS:
                    self._resync(give_up)
                live = self._cur
                if live is not cur or self.clock.monotonic_ns() < live.deadline:
                    cur = live   # draw again from the period now current
                    assert cur.gen is not None
                    if seq is None:
                        batch = None if cur.full else cur.gen.next_ids(n)
                    else:
                        seq = cur.next()
                    continue
                # still the old period, inside its margin: wait for the database's midnight
            if self.clock.monotonic_ns() >= give_up:
                raise SegmentUnavailableError(
                    f"periodic key {self.key!r}: period {cur.digits} is over on this node "
                    "(its boundary margin) and the database has not reached the next one "
                    f"within wait_budget ({self.settings.wait_budget / 1e9:g}s)")
            self.clock.sleep(min(0.01, self.settings.boundary_margin / 1e9))

    def _answer(self, cur: _Live, seq: int | None,
                batch: IdBatch | None) -> int | IdBatch | None:
        """What a draw of the current period, inside its deadline, gives (lock held): the
        number or batch in the period's width, else the full period's error; None when
        there is nothing to answer yet (a batch draw that found the generator closed
        under it: draw again)."""
        if cur.full:
            raise self._full(cur)
        if batch is not None:
            if max((r.stop for r in batch.ranges), default=0) <= self._cap:
                return IdBatch([range(cur.base + r.start, cur.base + r.stop)
                                for r in batch.ranges])
            raise self._full(cur)
        if seq is None:
            return None
        if seq < self._cap:
            return cur.base + seq
        raise self._full(cur)

    def _resync(self, give_up: int) -> None:
        """The deadline passed: what does the database say? Callers waiting in the margin
        share one read every few ms, not one each (lock held). A failed read is retried
        until ``give_up``, then raised."""
        try:
            self._sync()
        except FlakekitError as exc:
            if self.clock.monotonic_ns() >= give_up:
                raise SegmentUnavailableError(
                    f"periodic key {self.key!r}: the database's clock could not be "
                    f"read to tell the period: {exc}") from None
            log.warning("%s: reading the database's clock failed: %s", self.name, exc)

    def _full(self, cur: _Live) -> PeriodFullError:
        """The error for a used-up period (lock held); the first one alerts and stops
        drawing, so callers past it cost no fetch."""
        message = (f"periodic key {self.key!r}: period {cur.digits} is full: "
                   f"{self._format.template!r} holds numbers up to {self._format.capacity}; "
                   "no wider number is ever issued. It starts again with the next period; "
                   f"for more per period, widen the template's {{seq:0{self._format.width}d}}")
        if not cur.full:
            cur.full = True
            cap = self._cap
            cur.next = lambda: cap   # the hot path falls into _slow without drawing
            self.events.alert("period-full", message, {"generator": self.name,
                                                       "key": self.key, "period": cur.digits})
        return PeriodFullError(message)

    # -- the database's clock -------------------------------------------------------------
    def _sync(self) -> None:
        """Read the database's time; extend the current period's deadline, or roll over to
        the period it says has begun (lock held)."""
        sent = self._synced = self.clock.monotonic_ns()
        raw = self._db_clock()
        now = _aware(raw)
        period = self.rule.period_of(now)
        left_ns = (period.end - now) // dt.timedelta(microseconds=1) * 1000
        deadline = (sent + left_ns - self.settings.boundary_margin - int(left_ns * DRIFT))
        cur = self._cur
        if cur.period is not None and period.start == cur.period.start:
            cur.deadline = deadline
            return
        if cur.period is not None and period.start < cur.period.start:
            cur.deadline = _NEVER_NS
            raise BackendError(
                f"periodic key {self.key!r}: the database's clock went back from period "
                f"{cur.digits} to {period.digits}; nothing is issued until it reaches "
                f"{cur.digits} again (check the database host's time)")
        self._roll(period, deadline)

    def _roll(self, period: Period, deadline: int) -> None:
        row = period_key(self.key, period.digits)
        self.store.ensure_period_key(
            row, self.settings.period_step, self.settings.period_start,
            period_description(self.key, self.rule, period))
        gen = SegmentGenerator(self.store, row, self.settings, clock=self.clock,
                               events=self.events, name=self.name, pool=self._pool).start()
        old, self._cur = self._cur, _Live(period, gen, int(period.digits) * self._cap, deadline)
        if old.gen is not None:
            old.deadline = _NEVER_NS
            self.rolled += 1
            log.info("%s: period %s began (database time); serving %s", self.name,
                     period.digits, row)
            # its give-back is no caller's wait; close() joins it
            closer = started_daemon(old.gen.close, f"flakekit-period-close-{self.name}")
            self._closers = [t for t in self._closers if t.is_alive()] + [closer]

    def _run(self) -> None:
        """Re-read the database's clock every ``clock_sync`` and at the deadline."""
        every = self.settings.clock_sync / 1e9
        while not self._closed:
            cur = self._cur
            until = (cur.deadline - self.clock.monotonic_ns()) / 1e9
            if until <= 0 and cur is not _NONE:   # in the margin: the database's midnight is near
                wait = min(every, self.settings.boundary_margin / 1e9)
            else:
                wait = every if until <= 0 else min(every, until)
            if self._wake.wait(max(wait, 0.001)):
                return
            try:
                with self._lock:
                    if not self._closed:
                        self._sync()
            except FlakekitError as exc:
                log.warning("%s: reading the database's clock failed: %s", self.name, exc)

    # -- observation ----------------------------------------------------------------------
    @property
    def period_key(self) -> str | None:
        """The ``leaf_alloc`` row now served (None before ``start()``)."""
        cur = self._cur
        return period_key(self.key, cur.digits) if cur.period is not None else None

    def stats(self) -> SegmentStats:
        """The current period's segment stats (its key is the period's row)."""
        cur = self._cur
        if cur.gen is None:
            raise NotStartedError(f"periodic generator {self.name!r} is not started")
        return cur.gen.stats()

    def __repr__(self) -> str:
        return f"PeriodicSegment(name={self.name!r}, key={self.key!r}, reset={self.rule.reset!r})"


def _aware(value: Any) -> dt.datetime:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise BackendError(f"the database's clock gave {value!r}, not a time")
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def build_key_generator(
    store: Any, key: str, settings: SegmentSettings, **kwargs: Any,
) -> SegmentGenerator | PeriodicSegment:
    """The generator of one key: periodic when ``settings.reset`` is set (the cluster
    node builds strict keys with this, so the key's owner owns each period's row)."""
    if settings.reset is not None:
        return PeriodicSegment(store, key, settings, **kwargs)
    return SegmentGenerator(store, key, settings, **kwargs)
