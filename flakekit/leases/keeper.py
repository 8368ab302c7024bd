"""LeaseKeeper: the one lease machine; holds a lease and renews it in the background.

Generic over what is leased (a worker id today; node membership and key ownership in
cluster mode): it needs a :class:`~flakekit.leases.lease.LeaseSource` and a
:class:`~flakekit.leases.lease.LeaseTarget`, nothing else. The keeper is the only thing
that talks to the source after start-up. It pushes each new deadline into the target (a
plain integer the hot path compares against), so nothing is served once the lease could
be handed to someone else, even if the renewal thread is stuck or the process was paused.
The source computes each deadline from the *send* time of the renewal that succeeded.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

from flakekit.errors import LeaseLostError, NotStartedError
from flakekit.leases.lease import (
    Asks,
    Lease,
    LeaseEvents,
    LeaseSource,
    LeaseTarget,
    Pushes,
    TracedEvents,
    WorkerLease,
)
from flakekit.values.clock import Clock
from flakekit.values.lifecycle import started_daemon
from flakekit.values.stats import LATENCY_BOUNDS_NS, LeaseStats

__all__ = ["LEASE_LOST_EXIT_STATUS", "LeaseKeeper", "LeaseTarget"]

log = logging.getLogger("flakekit.lease")

#: exit status of a process stopped by ``on_lease_lost = "exit"``
LEASE_LOST_EXIT_STATUS = 75

L = TypeVar("L", bound=Lease)


@attrs.define
class LeaseKeeper(Generic[L]):
    """Acquire, renew and release one lease for one holder.

    Args:
        source: where the lease comes from (``allocator`` is the same attribute, the
            name the worker-id path uses).
        request: what to ask for (passed to ``source.acquire`` as it is).
        clock: the target's clock (deadlines are on its monotonic timeline).
        events: where lease events go.
        on_lease_lost: ``"stop"`` (the target refuses from then on), ``"exit"`` (log,
            then end the process with status 75, as seed 000 prescribes) or
            ``"restart"`` (acquire a new lease in the background; work resumes under it).
    """

    source: LeaseSource[Any, L]
    request: Asks
    clock: Clock
    events: LeaseEvents[L]
    on_lease_lost: str = "stop"
    lease: L | None = None
    renew_failures: int = 0
    renewals: int = 0
    #: acquire latency on the target's clock (for the acquire histogram; off the hot path)
    acquires: int = 0
    acquire_ns_total: int = 0
    _acquire_buckets: list[int] = attrs.Factory(lambda: [0] * (len(LATENCY_BOUNDS_NS) + 1))
    lost: str | None = None
    _target: LeaseTarget[L] | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = attrs.Factory(threading.Event)
    _wake: threading.Event = attrs.Factory(threading.Event)
    _closed: threading.Event = attrs.Factory(threading.Event)
    #: bumped by close(): a re-acquire begun before it never installs its lease after
    #: it, even if start() was called again meanwhile
    _life_no: int = 0
    _losing: threading.Lock = attrs.Factory(threading.Lock)
    _lost_lease: L | None = None
    _life: threading.RLock = attrs.Factory(threading.RLock)

    @property
    def allocator(self) -> Any:
        """The source (worker-id code calls it the allocator)."""
        return self.source

    @allocator.setter
    def allocator(self, value: Any) -> None:
        self.source = value

    @property
    def name(self) -> str:
        return self.request.owner

    # -- life cycle ---------------------------------------------------------------------
    def start(self, target: LeaseTarget[L]) -> L:
        """Acquire a lease, bind the target to it and start renewing.

        If that fails, the allocator is closed (its connections and threads with it):
        nothing else would, since a generator that never started is never closed.
        """
        self._closed.clear()
        try:
            lease = self._acquire(target, self._life_no)
        except BaseException:
            try:
                self.source.close()
            except Exception as exc:  # noqa: BLE001 - the start's own error is the one to raise
                log.warning("%s: closing the allocator after a failed start: %s",
                            self.name, exc)
            raise
        if lease is None:
            raise NotStartedError(f"{self.name}: closed while starting; start() it again")
        return lease

    def _acquire(self, target: LeaseTarget[L], life_no: int) -> L | None:
        """Acquire and bind; None if the keeper was closed meanwhile (a re-acquire).

        The network call and the wait in bind() run without the keeper's lock, so
        close() never waits for them (it closes the allocator, which ends the call); the
        lock only guards installing the lease, and a lease won after close() is given
        back at once."""
        if self._closed.is_set() or life_no != self._life_no:
            return None
        self._target = target
        started = self.clock.monotonic_ns()
        lease = self.source.acquire(self.request)
        elapsed = max(0, self.clock.monotonic_ns() - started)
        self.acquires += 1
        self.acquire_ns_total += elapsed
        self._acquire_buckets[bisect.bisect_left(LATENCY_BOUNDS_NS, elapsed)] += 1
        try:
            target.bind(lease)  # may refuse: e.g. the previous holder's mark is too far
        except BaseException:
            self._give_back(lease, lease.not_before_ns)  # keep that holder's mark
            raise
        with self._life:  # never interleaved with close()
            closed = self._closed.is_set() or life_no != self._life_no
            if not closed:
                self._install(lease)
        if closed:
            target.revoke("closed")
            self._give_back(lease, target.issued_until_ns())
            self._close_allocator()
            return None
        self.events.lease_acquired(self.name, lease)
        return lease

    def _install(self, lease: L) -> None:
        self.lease = lease
        self.lost = None
        self._watch(self._pushed)
        interval = self.source.renew_interval
        if interval is not None and lease.deadline_ns is not None:
            # each renew thread has its own events
            self._stop, self._wake = stop, wake = threading.Event(), threading.Event()
            self._thread = started_daemon(self._run, f"flakekit-lease-{self.name}",
                                          interval, stop, wake)

    def close(self, *, release: bool = True) -> None:
        """Stop renewing and (by default) give the lease back.

        Bounded: the lock is held only to take the lease; the renew thread is waited for
        a bounded time (its calls are bounded by the allocator)."""
        self._closed.set()
        with self._life:
            self._life_no += 1
            self._watch(None)
            self._stop.set()
            self._wake.set()
            thread, self._thread = self._thread, None
            lease, target = self.lease, self._target
            self.lease = None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if release and lease is not None and target is not None and self._lost_lease is not lease:
            target.revoke("closed")
            self._give_back(lease, target.issued_until_ns())
        self._close_allocator()

    def _close_allocator(self) -> None:
        try:
            self.source.close()
        except Exception as exc:  # noqa: BLE001 - a plugin's close: log it, go on closing
            log.warning("%s: closing the allocator: %s", self.name, exc)

    def _give_back(self, lease: L, issued_until_ns: int) -> None:
        try:
            self.source.release(lease, issued_until_ns)
        except Exception as exc:  # noqa: BLE001 - the lease will lapse on its own
            log.warning("%s: could not release %s: %s", self.name, lease.subject, exc)

    # -- renewing -----------------------------------------------------------------------
    def _run(self, interval: float, stop: threading.Event, wake: threading.Event) -> None:
        wait = interval
        while True:
            wake.wait(wait)   # the interval, or a push ("connected": renew now)
            wake.clear()
            if stop.is_set():
                return
            ok = self.renew_once()
            if self.lost is not None:
                return
            # after a failure, retry sooner so a short outage costs little lease time
            wait = interval if ok else min(interval, 1.0)

    def renew_once(self) -> bool:
        """Renew now; True on success. Tests call this directly with a manual clock."""
        lease, target = self.lease, self._target
        if lease is None or target is None or self.lost is not None:
            return False
        started = self.clock.monotonic_ns()
        try:
            new = self.source.renew(lease, target.issued_until_ns())
        except LeaseLostError as exc:
            self._traced(lease, started, str(exc))
            if self.lease is lease:  # a stale renewal must not revoke a newer lease
                self._lose(lease, str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - any renewal failure keeps the old deadline
            self._traced(lease, started, str(exc))
            self.renew_failures += 1
            log.warning(
                "%s: renewing %s failed (%s); IDs flow until the lease deadline, "
                "%.1f s from now", self.name, lease.subject, exc, self.remaining_s() or 0.0,
            )
            return False
        self._traced(lease, started, None)
        if new is lease:   # nothing new to push (e.g. leaf: no report since the last one)
            return True
        with self._losing:  # a loss (or re-acquire) while the call was in flight wins
            if self._stop.is_set() or self.lease is not lease or self._lost_lease is lease:
                return False
            self.lease = new
            self.renewals += 1
            target.extend(new.deadline_ns, new.stamp_until_ns)
        self.events.lease_renewed(self.name, new)
        return True

    def _traced(self, lease: L, started_ns: int, error: str | None) -> None:
        """The renewal's round trip, for tracing (``flakekit_operation``), where the
        events take it (:class:`Events` does; a membership's or a test's need not)."""
        if isinstance(self.events, TracedEvents):
            self.events.operation("lease.renew", self.name,
                                  self.clock.monotonic_ns() - started_ns,
                                  {"subject": str(lease.subject)}, error)

    def _watch(self, callback: Callable[[str, str], None] | None) -> None:
        """Let a source that learns of a loss on its own (a ZooKeeper session watcher)
        report it at once instead of at the next renewal (the optional :class:`Pushes`)."""
        if isinstance(self.source, Pushes):
            self.source.watch(callback)

    def _pushed(self, kind: str, reason: str) -> None:
        lease = self.lease
        if kind == "lost" and lease is not None and self.lost is None:
            self._lose(lease, reason)
        elif kind == "connected":   # the connection is back: renew now, not at the interval
            self._wake.set()

    def _lose(self, lease: L, reason: str) -> None:
        with self._losing:  # once per lease, whichever thread notices first
            if self._lost_lease is lease:
                return
            self._lost_lease = lease
        if self._target is not None:
            self._target.revoke(reason)   # first: no ID from here on
        self.events.lease_lost(self.name, lease, reason)
        self.lost = reason                # then tell observers (hooks have run)
        if self.on_lease_lost == "exit":
            log.critical("%s: exiting because the lease on %s was lost: %s",
                         self.name, lease.subject, reason)
            logging.shutdown()
            os._exit(LEASE_LOST_EXIT_STATUS)
        if self.on_lease_lost == "restart" and not self._closed.is_set():
            started_daemon(self._reacquire, f"flakekit-reacquire-{self.name}", self._life_no)

    def _reacquire(self, life_no: int) -> None:
        """After a loss: a new lease (for worker ids usually a new id), retried with
        back-off."""
        old = self._thread
        self._stop.set()
        self._wake.set()
        if old is not None and old is not threading.current_thread():
            old.join(timeout=10)
        delay = 0.1
        while not self._closed.is_set() and self._target is not None \
                and life_no == self._life_no:
            try:
                self._acquire(self._target, life_no)  # returns at once if closed meanwhile
                return
            except Exception as exc:  # noqa: BLE001 - the background retry must go on
                log.warning("%s: re-acquiring a lease failed (%s); retrying in %.1f s",
                            self.name, exc, delay)
                self._closed.wait(delay)
                delay = min(delay * 2, 5.0)

    # -- numbers for metrics --------------------------------------------------------------
    def remaining_s(self) -> float | None:
        """Seconds of lease left (negative once lapsed); None when it never expires."""
        if self.lease is None or self.lease.deadline_ns is None:
            return None
        return (self.lease.deadline_ns - self.clock.monotonic_ns()) / 1e9

    def stats(self) -> LeaseStats:
        lease = self.lease
        return LeaseStats(
            worker_id=lease.worker_id if isinstance(lease, WorkerLease) else None,
            epoch=lease.epoch if lease else None,
            lease_remaining_s=self.remaining_s(),
            renewals=self.renewals,
            renew_failures=self.renew_failures,
            lost=self.lost,
            acquires=self.acquires,
            acquire_ns_total=self.acquire_ns_total,
            acquire_buckets=tuple(self._acquire_buckets),
        )
