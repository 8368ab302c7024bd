"""Which system made this ID? An ID read under every layout, readings ranked by evidence.

A 64-bit number decodes under any layout, so a reading is only worth showing with the
evidence for it (``flakekit decode --all``):

* **fits**: the value has no bit above the layout's ``total_bits`` (a 63-bit layout keeps
  the sign bit 0);
* **in its era**: the time is a real date between the layout's :attr:`~BitLayout.since`
  (its epoch, or when its IDs began: Mastodon's count from 1970 but began in 2017) and now
  + 1 day, so it is no time the system could not have stamped;
* **strength**: how rarely a 64-bit number picked at random would fit and land in that
  era, 1 in N (``log2 N``, in bits of evidence). A reading that hits a narrow window
  (Sonyflake v2's two years out of 174) says more than one that hits a wide one. Ties keep
  the listing order.

Readings that agree on the time (``snowflake``, ``twitter`` and ``region-split`` share an
epoch and differ only in how the node bits split) are one *time*. When plausible readings
disagree on the time, the verdict is **ambiguous** and says so: a tweet from 2022 is also
a Discord ID of 2026, and no bit of it tells them apart.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

import attrs

from flakekit.errors import InvalidIdError
from flakekit.values.layout import BitLayout
from flakekit.values.timeunits import iso_utc

__all__ = ["AHEAD", "Reading", "Verdict", "rank", "read"]

#: how far past "now" a time still counts (clocks of the system that made it may be ahead)
AHEAD = dt.timedelta(days=1)


@attrs.frozen
class Reading:
    """One layout's reading of an ID.

    Attributes:
        layout: the layout's name.
        fits: the value fits the layout's bits.
        plausible: fits, and its time is a date within the layout's era.
        timestamp: the time (UTC), None when it does not fit or lies after 9999-12-31.
        parts: the fields, most significant first (empty when it does not fit).
        evidence: why it is (not) plausible, in words.
        strength: bits of evidence: ``log2 N`` where 1 in N random 64-bit numbers would
            read as plausibly (0 when not plausible).
    """

    layout: str
    fits: bool
    plausible: bool
    timestamp: dt.datetime | None
    parts: dict[str, int]
    evidence: str
    strength: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "fits": self.fits, "plausible": self.plausible,
                "timestamp": iso_utc(self.timestamp), "parts": self.parts,
                "evidence": self.evidence, "strength": round(self.strength, 2)}


def read(layout: BitLayout, value: int, now: dt.datetime) -> Reading:
    """``value`` under ``layout``, with the evidence for and against it."""
    try:
        parts = layout.decompose(value)
    except InvalidIdError:
        return Reading(layout.name, False, False, None, {},
                       f"does not fit: needs {value.bit_length()} bits, the layout has "
                       f"{layout.total_bits}")
    when = layout.time_at(parts["time"])
    since, until = layout.since, now + AHEAD
    if when is None:
        return Reading(layout.name, True, False, None, parts,
                       "its time lies after 9999-12-31: no date at all")
    if when < since:
        return Reading(layout.name, True, False, when, parts,
                       f"its time is before {since.date().isoformat()}, when these IDs began")
    if when > until:
        return Reading(layout.name, True, False, when, parts,
                       "its time is in the future")
    span_ns = (1 << layout.time_bits) * layout.unit_ns
    era_ns = max((until - since) // dt.timedelta(microseconds=1) * 1_000, 1)
    # a random 64-bit number fits 63 bits half the time, 53 bits 1 time in 2048
    strength = max(math.log2(span_ns / era_ns), 0.0) + (64 - layout.total_bits)
    return Reading(layout.name, True, True, when, parts,
                   f"a date in its era ({since.date().isoformat()} to now)", strength)


@attrs.frozen
class Verdict:
    """All readings, best first, and what they add up to.

    ``kind`` is ``"one"`` (one time fits), ``"ambiguous"`` (plausible readings disagree on
    the time) or ``"none"`` (nothing fits: no plausible reading).
    """

    readings: tuple[Reading, ...]
    kind: str
    summary: str

    @property
    def best(self) -> Reading | None:
        return self.readings[0] if self.kind != "none" else None


def rank(value: int, layouts: Iterable[BitLayout], now: dt.datetime) -> Verdict:
    """Every layout's reading of ``value``, plausible ones first (strongest evidence
    first, listing order on ties), then those that fit, then those that do not."""
    readings = [read(lay, value, now) for lay in layouts]
    readings.sort(key=lambda r: (not r.plausible, not r.fits, -r.strength))
    good = [r for r in readings if r.plausible]
    times: dict[dt.datetime, list[str]] = {}
    for r in good:
        assert r.timestamp is not None
        times.setdefault(r.timestamp, []).append(r.layout)
    if not good:
        return Verdict(tuple(readings), "none", "no layout reads it as an ID made by now")
    groups = [f"{' = '.join(names)} ({iso_utc(when)})" for when, names in times.items()]
    if len(times) == 1:
        return Verdict(tuple(readings), "one", f"one time fits: {groups[0]}")
    return Verdict(tuple(readings), "ambiguous",
                   f"ambiguous: {len(times)} different times fit: {'; '.join(groups)}")
