"""Errors of the ZooKeeper allocator (subclasses of flakekit's own)."""

from __future__ import annotations

from flakekit.plugin import ClockMovedBackwardsError

__all__ = ["ClockBehindReportError"]


class ClockBehindReportError(ClockMovedBackwardsError):
    """The local clock is behind the last time this worker id reported (Leaf's check).

    Leaf catches its own ``CheckLastTimeException`` and starts anyway from the cached
    worker id; flakekit refuses, because IDs stamped before that time may already exist.
    """

    def __init__(self, clock: str, behind_ns: int, source: str, worker_id: int) -> None:
        self.clock, self.behind_ns, self.max_backward_ns = clock, behind_ns, 0
        self.source, self.worker_id = source, worker_id
        Exception.__init__(
            self,
            f"clock {clock!r} is {behind_ns / 1e6:.3f} ms behind the last time worker "
            f"{worker_id} reported ({source}); refusing to start, because IDs up to that "
            "time may already exist. Fix the host's time sync (NTP) and start again",
        )
