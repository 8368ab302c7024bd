"""LeaseKeeper: holds a generator's worker lease and renews it in the background.

The keeper is the only thing that talks to the allocator after start-up. It pushes each
new deadline into the generator (a plain integer the hot path compares against), so an
ID is never issued once the lease could be handed to someone else, even if the renewal
thread is stuck or the process was paused.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

import attrs

from flakekit.clock import Clock
from flakekit.errors import LeaseLostError
from flakekit.events import Events
from flakekit.lease import LeaseRequest, WorkerAllocator, WorkerLease

__all__ = ["LeaseKeeper", "LeaseTarget"]

log = logging.getLogger("flakekit.lease")

#: exit status of a process stopped by ``on_lease_lost = "exit"``
LEASE_LOST_EXIT_STATUS = 75


class LeaseTarget(Protocol):
    """The generator side of a lease (implemented by SnowflakeGenerator)."""

    def bind(self, lease: WorkerLease) -> None: ...
    def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None: ...
    def revoke(self, reason: str) -> None: ...
    def issued_until_ns(self) -> int: ...


@attrs.define
class LeaseKeeper:
    """Acquire, renew and release one worker lease for one generator.

    Args:
        allocator: where the lease comes from.
        request: what to ask for.
        clock: the generator's clock (deadlines are on its monotonic timeline).
        events: where lease events go.
        on_lease_lost: ``"stop"`` (the generator raises from then on), ``"exit"`` (log,
            then end the process with status 75, as seed 000 prescribes) or
            ``"restart"`` (acquire a new lease in the background; IDs resume under it).
    """

    allocator: WorkerAllocator
    request: LeaseRequest
    clock: Clock
    events: Events
    on_lease_lost: str = "stop"
    lease: WorkerLease | None = None
    renew_failures: int = 0
    renewals: int = 0
    lost: str | None = None
    _target: LeaseTarget | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = attrs.Factory(threading.Event)
    _closed: threading.Event = attrs.Factory(threading.Event)
    _losing: threading.Lock = attrs.Factory(threading.Lock)
    _lost_lease: WorkerLease | None = None
    _life: threading.RLock = attrs.Factory(threading.RLock)

    # -- life cycle ---------------------------------------------------------------------
    def start(self, target: LeaseTarget) -> WorkerLease:
        """Acquire a lease, bind the target to it and start renewing.

        If that fails, the allocator is closed (its connections and threads with it):
        nothing else would, since a generator that never started is never closed.
        """
        self._closed.clear()
        try:
            lease = self._acquire(target)
        except BaseException:
            try:
                self.allocator.close()
            except Exception as exc:
                log.warning("%s: closing the allocator after a failed start: %s",
                            self.request.generator, exc)
            raise
        assert lease is not None
        return lease

    def _acquire(self, target: LeaseTarget) -> WorkerLease | None:
        """Acquire and bind; None if the keeper was closed meanwhile (a re-acquire)."""
        with self._life:  # never interleaved with close()
            if self._closed.is_set():
                return None
            self._target = target
            lease = self.allocator.acquire(self.request)
            try:
                target.bind(lease)  # may refuse: e.g. the previous holder's mark is too far
            except BaseException:
                self._give_back(lease, lease.not_before_ns)  # keep that holder's mark
                raise
            self.lease = lease
            self.lost = None
            self.events.lease_acquired(self.request.generator, lease)
            self._watch(self._pushed)
            interval = self.allocator.renew_interval
            if interval is not None and lease.deadline_ns is not None:
                self._stop = stop = threading.Event()  # each renew thread has its own
                thread = threading.Thread(
                    target=self._run, args=(interval, stop), daemon=True,
                    name=f"flakekit-lease-{self.request.generator}",
                )
                thread.start()
                self._thread = thread
            return lease

    def close(self, *, release: bool = True) -> None:
        """Stop renewing and (by default) give the worker id back."""
        self._closed.set()
        with self._life:
            self._close(release)

    def _close(self, release: bool) -> None:
        self._watch(None)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None
        lease, target = self.lease, self._target
        if release and lease is not None and target is not None and self._lost_lease is not lease:
            target.revoke("closed")
            self._give_back(lease, target.issued_until_ns())
        self.lease = None
        self.allocator.close()

    def _give_back(self, lease: WorkerLease, issued_until_ns: int) -> None:
        try:
            self.allocator.release(lease, issued_until_ns)
        except Exception as exc:  # the lease will lapse on its own
            log.warning("%s: could not release worker %d: %s",
                        self.request.generator, lease.worker_id, exc)

    # -- renewing -----------------------------------------------------------------------
    def _run(self, interval: float, stop: threading.Event) -> None:
        wait = interval
        while not stop.wait(wait):
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
        try:
            new = self.allocator.renew(lease, target.issued_until_ns())
        except LeaseLostError as exc:
            if self.lease is lease:  # a stale renewal must not revoke a newer lease
                self._lose(lease, str(exc))
            return False
        except Exception as exc:
            self.renew_failures += 1
            log.warning(
                "%s: renewing worker %d failed (%s); IDs flow until the lease deadline, "
                "%.1f s from now", self.request.generator, lease.worker_id, exc,
                self.remaining_s() or 0.0,
            )
            return False
        with self._losing:  # a loss (or re-acquire) while the call was in flight wins
            if self._stop.is_set() or self.lease is not lease or self._lost_lease is lease:
                return False
            self.lease = new
            self.renewals += 1
            target.extend(new.deadline_ns, new.stamp_until_ns)
        self.events.lease_renewed(self.request.generator, new)
        return True

    def _watch(self, callback: Callable[[str, str], None] | None) -> None:
        """Let an allocator that learns of a loss on its own (a ZooKeeper session
        watcher) report it at once instead of at the next renewal."""
        watch = getattr(self.allocator, "watch", None)
        if callable(watch):
            watch(callback)

    def _pushed(self, kind: str, reason: str) -> None:
        lease = self.lease
        if kind == "lost" and lease is not None and self.lost is None:
            self._lose(lease, reason)

    def _lose(self, lease: WorkerLease, reason: str) -> None:
        with self._losing:  # once per lease, whichever thread notices first
            if self._lost_lease is lease:
                return
            self._lost_lease = lease
        if self._target is not None:
            self._target.revoke(reason)   # first: no ID from here on
        self.events.lease_lost(self.request.generator, lease, reason)
        self.lost = reason                # then tell observers (hooks have run)
        if self.on_lease_lost == "exit":
            log.critical("%s: exiting because the worker lease was lost: %s",
                         self.request.generator, reason)
            logging.shutdown()
            os._exit(LEASE_LOST_EXIT_STATUS)
        if self.on_lease_lost == "restart" and not self._closed.is_set():
            threading.Thread(target=self._reacquire, daemon=True,
                             name=f"flakekit-reacquire-{self.request.generator}").start()

    def _reacquire(self) -> None:
        """After a loss: a new lease (usually a new worker id), retried with back-off."""
        old = self._thread
        self._stop.set()
        if old is not None and old is not threading.current_thread():
            old.join(timeout=10)
        delay = 0.1
        while not self._closed.is_set() and self._target is not None:
            try:
                self._acquire(self._target)  # returns at once if closed meanwhile
                return
            except Exception as exc:
                log.warning("%s: re-acquiring a worker lease failed (%s); retrying in %.1f s",
                            self.request.generator, exc, delay)
                self._closed.wait(delay)
                delay = min(delay * 2, 5.0)

    # -- numbers for metrics --------------------------------------------------------------
    def remaining_s(self) -> float | None:
        """Seconds of lease left (negative once lapsed); None when it never expires."""
        if self.lease is None or self.lease.deadline_ns is None:
            return None
        return (self.lease.deadline_ns - self.clock.monotonic_ns()) / 1e9

    def stats(self) -> dict[str, object]:
        lease = self.lease
        return {
            "worker_id": lease.worker_id if lease else None,
            "epoch": lease.epoch if lease else None,
            "lease_remaining_s": self.remaining_s(),
            "renewals": self.renewals,
            "renew_failures": self.renew_failures,
            "lost": self.lost,
        }
