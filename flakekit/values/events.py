"""Events: how generators, keepers and stores tell plugins what happened.

Generators never call pluggy directly; they hold an :class:`Events` object whose methods
call the ``flakekit_*`` event hooks. They run on rare events only (lease changes, a clock
step, an alert), never per ID. :data:`NO_EVENTS` drops everything (for bare generators).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from flakekit.leases.lease import WorkerLease

__all__ = ["NO_EVENTS", "Events"]

log = logging.getLogger("flakekit")


@attrs.define
class Events:
    """Forwards events to a pluggy hook relay (``pm.hook``), or only logs them."""

    hook: Any = None

    def _call(self, name: str, **kwargs: Any) -> None:
        if self.hook is None:
            return
        try:
            getattr(self.hook, name)(**kwargs)
        except Exception:  # a broken plugin must not stop ID generation
            log.exception("plugin hook %s failed", name)

    def lease_acquired(self, generator: str, lease: WorkerLease) -> None:
        log.info("%s: acquired worker %d (epoch %d)", generator, lease.worker_id, lease.epoch)
        self._call("flakekit_lease_acquired", generator=generator, lease=lease)

    def lease_renewed(self, generator: str, lease: WorkerLease) -> None:
        self._call("flakekit_lease_renewed", generator=generator, lease=lease)

    def operation(self, name: str, generator: str, duration_ns: int,
                  attributes: dict[str, Any], error: str | None = None) -> None:
        """A timed round trip (a segment fetch, a lease renewal, a hand-off) finished."""
        self._call("flakekit_operation", operation=name, generator=generator,
                   duration_ns=duration_ns, attributes=attributes, error=error)

    def lease_lost(self, generator: str, lease: WorkerLease, reason: str) -> None:
        log.error("%s: lost worker %d: %s", generator, lease.worker_id, reason)
        self._call("flakekit_lease_lost", generator=generator, lease=lease, reason=reason)

    def clock_moved_backwards(
        self, generator: str, clock: str, behind_ns: int, waited: bool
    ) -> None:
        log.warning(
            "%s: clock %s moved backwards by %.3f ms (%s)", generator, clock,
            behind_ns / 1e6, "waited" if waited else "refused",
        )
        self._call(
            "flakekit_clock_moved_backwards", generator=generator, clock=clock,
            behind_ns=behind_ns, waited=waited,
        )

    def alert(self, kind: str, message: str, details: dict[str, Any] | None = None) -> None:
        log.warning("ALERT %s: %s", kind, message)
        self._call("flakekit_alert", kind=kind, message=message, details=details or {})


NO_EVENTS = Events()
