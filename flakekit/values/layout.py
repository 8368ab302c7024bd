"""Bit layouts: how an ID's bits are split into time, node fields and sequence.

Fields run from the most significant bit to the least. The time field comes first so IDs
sort by time; exactly one ``sequence`` field; any number of node fields (``worker``,
``region``, ``machine``...). A layout is a frozen value: build it once, share it freely.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import InvalidIdError, LayoutError, PartValueError
from flakekit.values.timeunits import format_unit, iso_utc, parse_epoch_ms, parse_unit_ns, parsed_or

if TYPE_CHECKING:
    from flakekit.values.formats import IdFormat

__all__ = ["BitLayout", "Capacity", "fields_from_bits"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_UTC = dt.UTC
_UNIX = dt.datetime(1970, 1, 1, tzinfo=_UTC)
TIME, SEQUENCE = "time", "sequence"
ALLOWED_TOTAL_BITS = (53, 63, 64)


def _as_fields(value: Any) -> tuple[tuple[str, int], ...]:
    if isinstance(value, Mapping):
        value = list(value.items())
    if not isinstance(value, (list, tuple)) or not value:
        raise LayoutError(
            "fields", 'expected a list of [name, bits] pairs, e.g. [["time", 41], '
            '["worker", 10], ["sequence", 12]]'
        )
    fields = []
    for i, item in enumerate(value):
        if (
            not isinstance(item, (list, tuple)) or len(item) != 2
            or not isinstance(item[0], str) or isinstance(item[1], bool)
            or not isinstance(item[1], int)
        ):
            raise LayoutError(f"fields[{i}]", f'expected ["name", bits], got {item!r}')
        fields.append((item[0], item[1]))
    return tuple(fields)


def _as_unit(value: Any) -> int:
    """An int is nanoseconds; a string is "1ms", "10ms", "1s"..."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1_000:
            raise LayoutError("unit", f"a time unit must be at least 1us (1000 ns), got {value} ns")
        return value
    return parsed_or(LayoutError, "unit", parse_unit_ns, value)


def _as_epoch(value: Any) -> int:
    return parsed_or(LayoutError, "epoch", parse_epoch_ms, value)


def _as_since(value: Any) -> int | None:
    return None if value is None else parsed_or(LayoutError, "since", parse_epoch_ms, value)


@attrs.frozen
class Capacity:
    """What a layout can hold, for people planning a deployment."""

    ids_per_second_per_worker: float
    max_workers: int
    overflows_at: dt.datetime | None  # None: after 9999-12-31, past any datetime
    years_left: float


@attrs.frozen(eq=True)
class BitLayout:
    """An ID layout.

    Attributes:
        name: the registered name.
        fields: ``(name, bits)`` pairs, most significant first; the time field first.
        unit_ns: the length of one time tick in ns (``"1ms"``, ``"10ms"`` in config).
        epoch_ms: the layout's epoch in Unix ms (an ISO-8601 string in config).
        total_bits: 63 (sign bit kept 0), 64 (unsigned) or 53 (JavaScript-safe).
        worker_field: the node field that receives the leased worker id.
        description: one line for listings.
        since_ms: when IDs of this layout were first made (Unix ms), if later than the
            epoch: Mastodon counts from 1970 but has made such IDs only since 2017. A
            reading before it is not plausible (``decode --all`` ranks by it).
    """

    name: str
    fields: tuple[tuple[str, int], ...] = attrs.field(converter=_as_fields)
    unit_ns: int = attrs.field(default=1_000_000, converter=_as_unit)
    epoch_ms: int = attrs.field(default=0, converter=_as_epoch)
    total_bits: int = 63
    worker_field: str | None = None
    description: str = ""
    since_ms: int | None = attrs.field(default=None, converter=_as_since)
    _shifts: dict[str, int] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.total_bits not in ALLOWED_TOTAL_BITS:
            raise LayoutError(
                "total_bits", f"must be 63 (signed 64-bit), 64 (unsigned) or 53 "
                f"(JavaScript-safe), got {self.total_bits!r}"
            )
        names = [name for name, _ in self.fields]
        for i, (name, bits) in enumerate(self.fields):
            if not _NAME.match(name):
                raise LayoutError(
                    f"fields[{i}]", f"field name {name!r} must be lower case letters, "
                    "digits and '_', starting with a letter"
                )
            if names.index(name) != i:
                raise LayoutError(f"fields[{i}]", f"field {name!r} appears twice")
            if not 1 <= bits <= 62:
                raise LayoutError(f"fields[{i}]", f"field {name!r} needs 1 to 62 bits, got {bits}")
        if names[0] != TIME:
            where = f"it is at position {names.index(TIME)}" if TIME in names else "there is none"
            raise LayoutError(
                "fields[0]", f"the first (most significant) field must be 'time' so IDs "
                f"sort by time; {where}"
            )
        if SEQUENCE not in names:
            raise LayoutError("fields", "a layout needs a 'sequence' field; add [\"sequence\", 12]")
        total = sum(bits for _, bits in self.fields)
        if total != self.total_bits:
            raise LayoutError(
                "fields", f"the fields add up to {total} bits but total_bits is "
                f"{self.total_bits}; change a field's bits by {self.total_bits - total:+d} "
                "or set total_bits"
            )
        if self.time_bits < 20:
            raise LayoutError("fields[0]",
                              f"the time field needs at least 20 bits, got {self.time_bits}")
        worker = self.worker_field
        if worker is None:
            nodes = self.node_fields
            worker = next((n for n in ("worker", "machine") if n in nodes), None)
            if worker is None and len(nodes) == 1:
                worker = nodes[0]
        elif worker not in self.node_fields:
            raise LayoutError(
                "worker_field", f"{worker!r} is not a node field of this layout; node "
                f"fields: {', '.join(self.node_fields) or '(none)'}"
            )
        object.__setattr__(self, "worker_field", worker)
        shifts, shift = {}, self.total_bits
        for name, bits in self.fields:
            shift -= bits
            shifts[name] = shift
        object.__setattr__(self, "_shifts", shifts)

    # -- named constructors -------------------------------------------------------------
    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any]) -> BitLayout:
        """Build from a config table ``{fields, unit, epoch, total_bits, ...}``."""
        known = {"fields", "unit", "epoch", "total_bits", "worker_field", "description", "since"}
        for key in data:
            if key not in known:
                from flakekit.errors import suggest

                raise LayoutError(key,
                                  "unknown key; known keys: "
                                  f"{', '.join(sorted(known))}{suggest(key, known)}")
        if "fields" not in data:
            raise LayoutError("fields",
                              'is required, e.g. fields = [["time", 41], ["worker", 10], '
                              '["sequence", 12]]')
        total = data.get("total_bits", 63)
        if isinstance(total, bool) or not isinstance(total, int):
            raise LayoutError("total_bits", f"expected 53, 63 or 64, got {total!r}")
        return cls(
            name=name, fields=data["fields"], unit_ns=data.get("unit", "1ms"),
            epoch_ms=data.get("epoch", 0), total_bits=total,
            worker_field=data.get("worker_field"), description=data.get("description", ""),
            since_ms=data.get("since"),
        )

    def one_off(self, *, epoch: Any = None, unit: Any = None, bits: str | None = None,
                name: str = "one-off") -> BitLayout:
        """This layout with another epoch, unit or field split (``flakekit decode --epoch
        --unit --bits``); ``bits`` as :func:`fields_from_bits` reads it, its sum the
        total bits."""
        fields = self.fields if bits is None else fields_from_bits(bits)
        total = self.total_bits if bits is None else sum(b for _, b in fields)
        if total not in ALLOWED_TOTAL_BITS:
            raise LayoutError("fields", f"the bits add up to {total}; use 53, 63 or 64")
        return BitLayout(
            name=name, fields=fields, unit_ns=self.unit_ns if unit is None else unit,
            epoch_ms=self.epoch_ms if epoch is None else epoch, total_bits=total,
            description=f"one-off layout from {self.name}",
        )

    # -- structure ----------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)

    @property
    def node_fields(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields if n not in (TIME, SEQUENCE))

    def bits(self, name: str) -> int:
        return dict(self.fields)[self._check_name(name)]

    def shift(self, name: str) -> int:
        return self._shifts[self._check_name(name)]

    def max_value(self, name: str) -> int:
        return (1 << self.bits(name)) - 1

    @property
    def time_bits(self) -> int:
        return self.fields[0][1]

    @property
    def epoch_ns(self) -> int:
        return self.epoch_ms * 1_000_000

    @property
    def max_id(self) -> int:
        return (1 << self.total_bits) - 1

    def _check_name(self, name: str) -> str:
        if name not in self._shifts:
            from flakekit.errors import suggest

            raise PartValueError(
                name, f"layout {self.name!r} has no such field; fields: "
                f"{', '.join(self.names)}{suggest(name, self.names)}"
            )
        return name

    # -- compose / decompose ------------------------------------------------------------
    def check_part(self, name: str, value: Any) -> int:
        """Return ``value`` if it fits field ``name``; raise naming the field otherwise."""
        self._check_name(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PartValueError(name, f"expected an integer, got {value!r}")
        top = self.max_value(name)
        if not 0 <= value <= top:
            raise PartValueError(
                name, f"{value} does not fit in {self.bits(name)} bits; allowed 0..{top} "
                f"in layout {self.name!r}"
            )
        return value

    def node_value(self, parts: Mapping[str, int]) -> int:
        """The pre-shifted OR of the given node fields (range-checked)."""
        value = 0
        for name, part in parts.items():
            if name in (TIME, SEQUENCE):
                raise PartValueError(name, "is not a node field")
            value |= self.check_part(name, part) << self.shift(name)
        return value

    def tick(self, when: int | dt.datetime) -> int:
        """The time-field value for a wall time (ns since 1970, or an aware datetime)."""
        if isinstance(when, dt.datetime):
            if when.tzinfo is None:
                raise PartValueError(TIME, "datetime has no time zone; use an aware (UTC) datetime")
            when = (when - _UNIX) // dt.timedelta(microseconds=1) * 1_000
        return (when - self.epoch_ns) // self.unit_ns

    def compose(self, **parts: int | dt.datetime) -> int:
        """Build an ID from named parts. ``time`` is ticks since the epoch or a datetime;
        missing node fields and ``sequence`` are 0."""
        if TIME not in parts:
            raise PartValueError(TIME, "is required (ticks since the epoch, or a datetime)")
        value = 0
        for name, part in parts.items():
            if name == TIME and isinstance(part, dt.datetime):
                part = self.tick(part)
            value |= self.check_part(name, part) << self.shift(name)
        return value

    def check_id(self, value: Any, fmt: IdFormat | None = None) -> int:
        """Return ``value`` as an int ID of this layout, or raise :class:`InvalidIdError`.

        A string may be decimal, ``0x`` hex, or a string form (:mod:`flakekit.formats`):
        ``fmt`` if given, else the format its prefix and length show (``ord_2T4kAq1bK9z``).
        """
        if isinstance(value, str):
            text = value.strip()
            if text.lower().startswith(("0b", "0o")):
                try:
                    value = int(text, 0)
                except ValueError:
                    raise InvalidIdError(f"id {text!r} is not a valid integer") from None
            elif text.isdigit() and text.isascii() and fmt is None:
                value = int(text)
            else:
                from flakekit.values.formats import parse_id

                value = parse_id(text, fmt)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidIdError(f"id must be an integer, got {value!r}")
        if not 0 <= value <= self.max_id:
            raise InvalidIdError(
                f"id {value} is outside layout {self.name!r} (0..{self.max_id}, "
                f"{self.total_bits} bits)"
            )
        return value

    def decompose(self, value: int | str, fmt: IdFormat | None = None) -> dict[str, int]:
        """Split an ID (an int, or a string as :meth:`check_id` reads it) into its named
        parts, most significant first."""
        value = self.check_id(value, fmt)
        return {
            name: (value >> self._shifts[name]) & ((1 << bits) - 1) for name, bits in self.fields
        }

    def timestamp(self, value: int | str, fmt: IdFormat | None = None) -> dt.datetime:
        """When the ID was made (UTC; start of its tick). :class:`InvalidIdError` if that
        lies after 9999-12-31 (no datetime holds it: never a clamped time)."""
        return self.time_of_tick(self.decompose(value, fmt)[TIME])

    @property
    def since(self) -> dt.datetime:
        """The earliest plausible time of an ID of this layout (``since_ms``, else the epoch)."""
        return self.time_of_tick(0) if self.since_ms is None else (
            _UNIX + dt.timedelta(milliseconds=max(self.since_ms, self.epoch_ms)))

    def plausible(self, value: int | str, now: dt.datetime | None = None,
                  ahead: dt.timedelta = dt.timedelta(days=1)) -> bool:
        """Whether ``value`` reads as an ID this layout made by now: it fits, and its time
        lies between :attr:`since` (the epoch, unless the layout says its IDs began
        later) and ``now + ahead``. ``flakekit decode --all`` ranks by it, so a user can
        tell which system an ID came from."""
        try:
            when = self.timestamp(value)
        except InvalidIdError:
            return False
        now = now or dt.datetime.now(_UTC)
        return self.since <= when <= now + ahead

    def time_at(self, tick: int) -> dt.datetime | None:
        """The UTC start of a tick, or None when it lies after 9999-12-31."""
        micros = (self.epoch_ns + tick * self.unit_ns) // 1_000
        try:
            return _UNIX + dt.timedelta(microseconds=micros)
        except OverflowError:
            return None

    def time_of_tick(self, tick: int) -> dt.datetime:
        """The UTC start of a tick; :class:`InvalidIdError` when no datetime holds it (a
        48-bit millisecond field reaches the year 10889): a time is never clamped."""
        when = self.time_at(tick)
        if when is None:
            seconds = (self.epoch_ns + tick * self.unit_ns) / 1e9
            raise InvalidIdError(
                f"time field {tick} of layout {self.name!r} is {tick} x "
                f"{format_unit(self.unit_ns)} "
                f"after {iso_utc(self.time_at(0))}, about the year "
                f"{1970 + int(seconds // 31_556_952)}: later than any date (9999-12-31)"
            )
        return when

    # -- capacity -----------------------------------------------------------------------
    @property
    def sequence_size(self) -> int:
        return 1 << self.bits(SEQUENCE)

    def capacity(self, now: dt.datetime | None = None) -> Capacity:
        now = now or dt.datetime.now(_UTC)
        node_bits = sum(self.bits(n) for n in self.node_fields)
        end_ns = self.epoch_ns + (1 << self.time_bits) * self.unit_ns
        now_ns = (now - _UNIX) // dt.timedelta(microseconds=1) * 1_000
        return Capacity(
            ids_per_second_per_worker=self.sequence_size * 1e9 / self.unit_ns,
            max_workers=1 << node_bits,
            overflows_at=self.time_at(1 << self.time_bits),
            years_left=(end_ns - now_ns) / (365.25 * 86_400e9),
        )

    def top_bit_at(self) -> dt.datetime | None:
        """When IDs of a 64-bit layout start to set bit 63 (None for 53 and 63 bits)."""
        if self.total_bits < 64:
            return None
        return self.time_at(1 << (self.time_bits - 1))

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (what ``flakekit layout show --json`` prints)."""
        cap = self.capacity()
        return {
            "name": self.name,
            "description": self.description,
            "fields": [
                {"name": n, "bits": b, "shift": self._shifts[n], "max": (1 << b) - 1}
                for n, b in self.fields
            ],
            "unit": format_unit(self.unit_ns),
            "epoch_ms": self.epoch_ms,
            "epoch": iso_utc(self.time_of_tick(0)),
            "since": iso_utc(self.since) if self.since_ms is not None else None,
            "total_bits": self.total_bits,
            "worker_field": self.worker_field,
            "ids_per_second_per_worker": cap.ids_per_second_per_worker,
            "max_workers": cap.max_workers,
            "overflows_at": iso_utc(cap.overflows_at),
            "years_left": round(cap.years_left, 2),
            "warnings": self.warnings(cap),
        }

    def warnings(self, cap: Capacity | None = None) -> list[str]:
        cap = cap or self.capacity()
        out = []
        if cap.years_left < 0:
            out.append("the time field has already overflowed: this layout cannot issue IDs")
        elif cap.years_left < 10:
            out.append(f"only {cap.years_left:.1f} years left before the time field overflows")
        if self.total_bits > 53:
            out.append("IDs can exceed 2^53: JavaScript numbers lose precision; send them as "
                       "strings")
        top = self.top_bit_at()
        if top is not None:
            out.append(
                f"64-bit layout: IDs made from {top.date().isoformat()} on overflow signed "
                "BIGINT columns (PostgreSQL bigint, MySQL BIGINT); store them in BIGINT "
                "UNSIGNED or NUMERIC(20), or as text"
            )
        if self.worker_field is None:
            out.append("no worker field: only one process may use this layout at a time")
        return out


_NODE_NAMES = {2: (), 3: ("worker",), 4: ("datacenter", "worker")}


def fields_from_bits(text: str) -> list[tuple[str, int]]:
    """Fields from a short spec: ``41/10/12`` (time/worker/sequence; two numbers are
    time/sequence, four time/datacenter/worker/sequence, more time/node1/.../sequence) or
    named, most significant first: ``time=39,sequence=8,machine=16``."""
    parts = [p.strip() for p in str(text).replace(",", "/").split("/") if p.strip()]
    if "=" in str(text):
        out = []
        for part in parts:
            name, sep, bits = part.partition("=")
            if not sep or not bits.strip().isdigit():
                raise LayoutError("fields",
                                  f"{part!r}: expected NAME=BITS, e.g. "
                                  "time=41,worker=10,sequence=12")
            out.append((name.strip(), int(bits)))
        return out
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise LayoutError(
            "fields", f"{text!r}: expected bits most significant first, e.g. 41/10/12 "
            "(time/worker/sequence) or time=39,sequence=8,machine=16"
        )
    nodes = _NODE_NAMES.get(len(parts)) or tuple(f"node{i}" for i in range(1, len(parts) - 1))
    names = (TIME, *nodes, SEQUENCE)
    return [(name, int(bits)) for name, bits in zip(names, parts, strict=True)]


def ensure_layouts(layouts: Iterable[BitLayout]) -> dict[str, BitLayout]:
    return {layout.name: layout for layout in layouts}
