"""SegmentService: every key of one store, the way a Leaf server serves them.

Leaf loads the key list at start and every 60 s, and answers -2 for a key inserted since
(for up to a minute on every server). Here the list is refreshed every ``refresh`` seconds
too, but a key not in the list is looked up in the table on first use, so a key created a
moment ago works at once; unknown keys are remembered for ``unknown_ttl`` so a client
asking for a wrong key cannot turn every request into a query.

With ``state_file`` set, the keys this node served are written there on close and loaded
again on start (seed 004's own future-work item), so their first requests after a restart
find a segment already in memory.

Every key's background fetches run on one :class:`~flakekit.generators.fetcher.FetchPool`
of ``settings.fetch_threads`` threads (Leaf's shared update pool): a thread per key would
cap a process at a few thousand keys (``kernel.pid_max``), and idle keys cost no thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import TYPE_CHECKING

import attrs

from flakekit.errors import FlakekitError, UnknownKeyError
from flakekit.generators.fetcher import FetchPool
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.values.batch import IdBatch
from flakekit.values.clock import Clock, MonotonicClock
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.lifecycle import ClosesOnce, StartsInWith, started_daemon
from flakekit.values.periods import is_period_key
from flakekit.values.stats import SegmentStats

if TYPE_CHECKING:
    from flakekit.generators.stores import ListsKeys

__all__ = ["SegmentService"]

log = logging.getLogger("flakekit.segment")

#: at most this many keys are remembered as unknown (a flood of wrong keys must not grow
#: memory without bound; forgetting one early only costs one more lookup)
_UNKNOWN_MAX = 10_000


@attrs.define
class SegmentService(StartsInWith, ClosesOnce):
    """Lazily started :class:`SegmentGenerator` per key of ``store``. Thread-safe.

    Args:
        store: the segment store; it also lists its keys (:class:`ListsKeys`).
        settings: settings for every key's generator (``key`` is ignored).
        refresh: seconds between key-list refreshes (default 60, as Leaf).
        unknown_ttl: seconds an unknown key is remembered as unknown (default 1).
        state_file: where to remember the keys served, for preloading (default none).
        pool: the threads for every key's background fetches (default: a pool of
            ``settings.fetch_threads`` of its own, closed with the service).
    """

    store: ListsKeys
    settings: SegmentSettings = attrs.Factory(SegmentSettings)
    clock: Clock = attrs.Factory(MonotonicClock)
    events: Events = NO_EVENTS
    refresh: float = 60.0
    unknown_ttl: float = 1.0
    state_file: str | None = None
    pool: FetchPool | None = None
    _own_pool: bool = False
    _gens: dict[str, SegmentGenerator] = attrs.Factory(dict)
    _known: set[str] = attrs.Factory(set)
    _unknown: dict[str, float] = attrs.Factory(dict)
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _stop: threading.Event = attrs.Factory(threading.Event)
    _thread: threading.Thread | None = None
    _closed: bool = False

    def __attrs_post_init__(self) -> None:
        if self.pool is None:
            self.pool = FetchPool(self.settings.fetch_threads)
            self._own_pool = True

    def start(self) -> SegmentService:
        """Load the key list, preload remembered keys, start the refresher."""
        self.refresh_keys()
        for key in self._remembered():
            if key in self._known:
                try:
                    self.get(key)
                except FlakekitError as exc:
                    log.warning("preloading segment key %r failed: %s", key, exc)
        self._thread = started_daemon(self._run, "flakekit-segment-keys")
        return self

    def close(self) -> None:
        """Stop the refresher, close every generator (giving tails back), remember keys."""
        with self._lock:
            if not self._claim_close():
                return
            gens = dict(self._gens)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for gen in gens.values():
            gen.close()
        if self._own_pool and self.pool is not None:
            self.pool.close()
        self._remember(sorted(gens))

    # -- keys -------------------------------------------------------------------------------
    def refresh_keys(self) -> None:
        """Re-read the key list; drop generators of keys that vanished (not on an empty list,
        which is more likely a broken read than a deleted table: Leaf PR #204)."""
        with self._lock:
            before = set(self._known)
        keys = set(self.store.keys())
        gone: list[SegmentGenerator] = []
        with self._lock:
            if keys or not self._known:
                # a key first used while the list was being read is not in `keys` but is
                # not gone either: only keys known before the read can have vanished
                added = self._known - before
                for key in before - keys:
                    gen = self._gens.pop(key, None)
                    if gen is not None:
                        gone.append(gen)
                self._known = keys | added
                self._unknown = {k: t for k, t in self._unknown.items() if k not in keys}
        for gen in gone:
            log.info("segment key %r is gone from the store; stopping it", gen.key)
            gen.close()

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._known)

    def knows(self, key: str) -> bool:
        """Whether ``key`` was in the store at the last refresh (no query: a server's event
        loop asks this on every request for a key it does not serve yet)."""
        return key in self._known

    def get(self, key: str) -> SegmentGenerator:
        """The started generator of ``key``.

        Raises:
            UnknownKeyError: the key is not in the store (with how to create it).
        """
        gen = self._gens.get(key)
        return gen if gen is not None else self._open(key)

    def _open(self, key: str) -> SegmentGenerator:
        """Start ``key``'s generator: under the lock, once however many callers ask."""
        with self._lock:
            gen = self._gens.get(key)
            if gen is not None:
                return gen
            if self._closed:
                from flakekit.errors import NotStartedError

                raise NotStartedError("the segment service is closed")
            if is_period_key(key):   # only its periodic generator knows when its period ends
                raise UnknownKeyError(key, " (it is a periodic counter's period row, served "
                                      "only by that counter's generator)")
            if key not in self._known:
                until = self._unknown.get(key)
                if until is not None and self.clock.monotonic_ns() / 1e9 < until:
                    raise UnknownKeyError(key)
                if not self.store.exists(key):
                    now = self.clock.monotonic_ns() / 1e9
                    if len(self._unknown) >= _UNKNOWN_MAX:  # keep memory bounded
                        self._unknown = {k: t for k, t in self._unknown.items() if t > now}
                        if len(self._unknown) >= _UNKNOWN_MAX // 2:
                            self._unknown.clear()
                    self._unknown[key] = now + self.unknown_ttl
                    raise UnknownKeyError(key)
                self._known.add(key)
                self._unknown.pop(key, None)
            gen = SegmentGenerator(
                self.store, key, self.settings, clock=self.clock, events=self.events, name=key,
                pool=self.pool,
            ).start()
            self._gens[key] = gen
            return gen

    def next_id(self, key: str) -> int:
        return self.get(key).next_id()

    def next_ids(self, key: str, n: int) -> IdBatch:
        return self.get(key).next_ids(n)

    def stats(self) -> dict[str, SegmentStats]:
        """Every running key's generator stats (both buffers), by key."""
        with self._lock:
            gens = dict(self._gens)
        return {key: gen.stats() for key, gen in sorted(gens.items())}

    # -- background -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            try:
                self.refresh_keys()
            except FlakekitError as exc:
                log.warning("refreshing segment keys failed: %s", exc)

    def _remembered(self) -> list[str]:
        if not self.state_file:
            return []
        try:
            with open(self.state_file, encoding="utf-8") as fh:
                data = json.load(fh)
            return [k for k in data.get("keys", []) if isinstance(k, str)]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("ignoring segment state file %s: %s", self.state_file, exc)
            return []

    def _remember(self, keys: list[str]) -> None:
        if not self.state_file:
            return
        tmp = f"{self.state_file}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"keys": keys}, fh)
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("could not write segment state file %s: %s", self.state_file, exc)
