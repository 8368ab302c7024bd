"""Typed stats records: what a generator reports for metrics, the monitor and ``--json``.

Frozen attrs records, read by attribute; :meth:`as_dict` gives the JSON shape (field
order is the key order), so the HTTP and CLI output does not depend on who built it.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["LATENCY_BOUNDS_NS", "LATENCY_BUCKETS_S", "BufferStats", "LeaseStats", "SegmentStats",
           "SnowflakeStats"]

#: latency histogram bounds (seconds) of a segment fetch: Prometheus ``le`` buckets
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0)
#: the same in nanoseconds: ``bisect_left(LATENCY_BOUNDS_NS, ns)`` is the bucket's index
LATENCY_BOUNDS_NS = tuple(round(b * 1e9) for b in LATENCY_BUCKETS_S)


class _AsDict:
    """``as_dict()`` for a record: its fields in order, nested records as dicts."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)  # type: ignore[arg-type]


@attrs.frozen
class LeaseStats(_AsDict):
    """The lease a keeper holds: worker id, epoch, time left, renewals, why it was lost."""

    worker_id: int | None
    epoch: int | None
    lease_remaining_s: float | None
    renewals: int
    renew_failures: int
    lost: str | None
    #: successful acquires, their total time, and counts per latency bucket
    #: (``LATENCY_BUCKETS_S``, then one above the last bound)
    acquires: int = 0
    acquire_ns_total: int = 0
    acquire_buckets: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class SnowflakeStats(LeaseStats):
    """A snowflake generator: its own numbers, then its keeper's :class:`LeaseStats`
    (flat, as the JSON has them)."""

    name: str
    strategy: str
    layout: str
    clock: str
    ids_drawn: int

    def as_dict(self) -> dict[str, Any]:
        lease = attrs.asdict(self)
        own = {k: lease.pop(k) for k in _SNOWFLAKE_OWN}
        return {**own, **lease}

    @classmethod
    def of(cls, name: str, layout: str, clock: str, ids_drawn: int,
           lease: LeaseStats) -> SnowflakeStats:
        return cls(name=name, strategy="snowflake", layout=layout, clock=clock,
                   ids_drawn=ids_drawn, **attrs.asdict(lease, recurse=False))


#: the generator's own fields, the first keys of its JSON
_SNOWFLAKE_OWN = tuple(a.name for a in attrs.fields(SnowflakeStats)
                       if a.name not in attrs.fields_dict(LeaseStats))


@attrs.frozen
class BufferStats(_AsDict):
    """One of a segment generator's two buffers (``start``.. ``end`` is ``None`` when empty)."""

    slot: str
    ready: bool
    start: int | None
    position: int | None
    end: int | None
    step: int | None
    idle: int


@attrs.frozen
class SegmentStats(_AsDict):
    """A segment generator: both buffers, the step and the fetch counters."""

    strategy: str
    name: str
    key: str
    started: bool
    closed: bool
    step: int
    min_step: int
    max_id: int | None
    buffers: tuple[BufferStats, ...]
    fetching: bool
    fetches: int
    fetch_failures: int
    fetch_ms_last: float
    fetch_ms_max: float
    fetch_ms_mean: float
    waits: int
    unavailable: int
    gave_back: int
    last_error: str | None
    #: fetches per latency bucket (``LATENCY_BUCKETS_S``, then one above the last bound)
    fetch_buckets: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "buffers": [b.as_dict() for b in self.buffers]}
