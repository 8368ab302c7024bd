"""Periods of a counter that starts again every day, month or year (invoice numbers such
as ``20261201-000042``), as plain values: no I/O, no clock of their own.

Why it looks the way it does:

* A period is named by its digits (``20261201``, ``202612``, ``2026``), and each period
  is a row of its own in ``leaf_alloc``: ``KEY@DIGITS`` (``invoice@20261201``). ``@``
  followed by 4, 6 or 8 digits at the end of a key is reserved for these rows
  (``flakekit segments create`` refuses such a name), so a user's key cannot collide with
  a period row, and a Leaf server still serves the row as an ordinary ``biz_tag``.
* The integer form of an ID is the period's digits followed by the zero-padded sequence
  (``20261201000042``): unique across periods and increasing from one period to the next,
  so ``next_id()`` and Leaf's text answer stay plain integers.
* The sequence has a fixed width (``{seq:06d}``): a period that would need a seventh
  digit is full, and that is an error, never a wider number (which would sort wrongly and
  could equal another period's ID).
* Which period it is comes from the database's clock, read elsewhere; here a UTC instant
  becomes a period in a time zone (``zoneinfo``, so daylight-saving days are 23 or 25 h).
"""

from __future__ import annotations

import datetime as dt
import re
import string
import zoneinfo
from typing import Any

import attrs

from flakekit.errors import ConfigError

__all__ = [
    "PERIODS",
    "PERIOD_KEY",
    "Period",
    "PeriodFormat",
    "PeriodRule",
    "default_template",
    "is_period_key",
    "period_key",
]

#: ``reset`` values and the digits that name one of their periods
PERIODS = {"daily": "%Y%m%d", "monthly": "%Y%m", "yearly": "%Y"}
_DIGITS = {"daily": 8, "monthly": 6, "yearly": 4}
#: a ``leaf_alloc`` row of one period: ``KEY@DIGITS`` (4, 6 or 8 digits)
PERIOD_KEY = re.compile(r"^(?P<base>.+)@(?P<digits>\d{4}|\d{6}|\d{8})$")
#: an int64 holds 18 digits for sure: the period's digits and the sequence share them
_MAX_DIGITS = 18
_SEQ_SPEC = re.compile(r"^0(?P<width>[1-9]\d?)d$")


def is_period_key(key: str) -> bool:
    """Whether ``key`` has the reserved form of a period row (``KEY@20261201``)."""
    return PERIOD_KEY.match(key) is not None


def period_key(base: str, digits: str) -> str:
    """The ``leaf_alloc`` row of one period of ``base``."""
    return f"{base}@{digits}"


@attrs.frozen
class Period:
    """One period: its first day, its digits, and its bounds as UTC instants."""

    first_day: dt.date
    digits: str
    start: dt.datetime   # aware UTC, inclusive
    end: dt.datetime     # aware UTC, exclusive


def _zone(value: Any) -> dt.tzinfo:
    if not isinstance(value, str) or not value:
        raise ConfigError("time_zone", f"expected an IANA time zone name such as "
                          f"'Europe/Berlin' or 'UTC', got {value!r}")
    if value == "UTC":   # the default needs no time zone database (slim images have none)
        return dt.UTC
    try:
        return zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError("time_zone", f"unknown time zone {value!r}; use an IANA name such "
                          "as 'UTC', 'Europe/Berlin' or 'America/New_York'") from None


@attrs.frozen
class PeriodRule:
    """How instants map to periods: ``reset`` (daily, monthly, yearly) in ``time_zone``."""

    reset: str
    time_zone: str = "UTC"
    zone: dt.tzinfo = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.reset not in PERIODS:
            raise ConfigError("reset", f"expected one of {', '.join(map(repr, PERIODS))}, "
                              f"got {self.reset!r}")
        object.__setattr__(self, "zone", _zone(self.time_zone))

    @property
    def digit_count(self) -> int:
        return _DIGITS[self.reset]

    def first_day_of(self, day: dt.date) -> dt.date:
        if self.reset == "daily":
            return day
        if self.reset == "monthly":
            return day.replace(day=1)
        return day.replace(month=1, day=1)

    def next_first_day(self, first: dt.date) -> dt.date:
        if self.reset == "daily":
            return first + dt.timedelta(days=1)
        if self.reset == "monthly":
            return (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        return first.replace(year=first.year + 1)

    def _midnight_utc(self, day: dt.date) -> dt.datetime:
        local = dt.datetime(day.year, day.month, day.day, tzinfo=self.zone)
        return local.astimezone(dt.UTC)

    def period_of(self, instant: dt.datetime) -> Period:
        """The period ``instant`` (aware) falls in."""
        local = instant.astimezone(self.zone).date()
        first = self.first_day_of(local)
        start = self._midnight_utc(first)
        if instant < start:   # a zone whose day does not start at 00:00 (rare DST rules)
            first = self.first_day_of(first - dt.timedelta(days=1))
            start = self._midnight_utc(first)
        return self.period_starting(first, start)

    def period_starting(self, first: dt.date, start: dt.datetime | None = None) -> Period:
        return Period(first, first.strftime(PERIODS[self.reset]),
                      start or self._midnight_utc(first),
                      self._midnight_utc(self.next_first_day(first)))

    def day_of_digits(self, digits: str) -> dt.date:
        """The first day of the period named ``digits`` (``20261201`` -> 2026-12-01)."""
        return dt.datetime.strptime(digits, PERIODS[self.reset]).date()


@attrs.frozen
class PeriodFormat:
    """The string form of a periodic ID, e.g. ``{date:%Y%m%d}-{seq:06d}``.

    Fields: ``date`` (the period's first day, a :class:`datetime.date`), ``seq`` (the
    number within the period; its spec must be a zero-padded width such as ``06d``, which
    is also the period's capacity) and ``key`` (the generator's key). It has
    ``encode``/``encode_many`` like :class:`~flakekit.values.formats.IdFormat`, so
    ``next_str()`` and the HTTP server's string answers use it unchanged.
    """

    template: str
    rule: PeriodRule
    key: str = ""
    width: int = attrs.field(init=False)
    scale: int = attrs.field(init=False)
    prefix: str = ""   # IdFormat's: what a server's other encodings put first
    #: read as an IdFormat's by the CLI and the server: not decimal, fixed width
    encoding = "template"
    pad = True
    _seq_spec: str = attrs.field(init=False, eq=False, repr=False)
    _parts: dict[int, tuple[str | None, ...]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        width = _check_template(self.template, self.rule)
        if self.rule.digit_count + width > _MAX_DIGITS:
            raise ConfigError("template", f"{{seq:0{width}d}} is too wide for a {self.rule.reset} "
                              f"counter: the period's {self.rule.digit_count} digits and the "
                              f"sequence must fit {_MAX_DIGITS} digits (a 64-bit integer); use "
                              f"at most {{seq:0{_MAX_DIGITS - self.rule.digit_count}d}}")
        object.__setattr__(self, "width", width)
        object.__setattr__(self, "scale", 10**width)
        object.__setattr__(self, "_seq_spec", f"0{width}d")
        object.__setattr__(self, "_parts", {})

    @property
    def capacity(self) -> int:
        """The last sequence number a period can hold (``999999`` for ``06d``)."""
        return self.scale - 1

    def compose(self, digits: str, seq: int) -> int:
        return int(digits) * self.scale + seq

    def encode(self, value: int) -> str:
        digits, seq = divmod(value, self.scale)
        parts = self._parts.get(digits)
        if parts is None:
            parts = self._render(digits)
        spec = self._seq_spec
        return "".join(format(seq, spec) if p is None else p for p in parts)

    def _render(self, digits: int) -> tuple[str | None, ...]:
        """The template with everything but ``{seq}`` written out for one period (strftime
        once a period, not once an ID); None marks where the number goes."""
        day = self.rule.day_of_digits(str(digits))
        parts: list[str | None] = []
        for literal, name, spec, _ in string.Formatter().parse(self.template):
            parts.append(literal)
            if name == "seq":
                parts.append(None)
            elif name is not None:
                value = day if name == "date" else self.key
                parts.append(format(value, spec or ""))
        if len(self._parts) >= 64:   # a few periods are ever in use at once
            self._parts.clear()
        self._parts[digits] = done = tuple(parts)
        return done

    def encode_many(self, values: Any) -> list[str]:
        return [self.encode(v) for v in values]

    @property
    def sortable(self) -> bool:
        return True

    def __str__(self) -> str:
        return self.template


def _check_template(template: object, rule: PeriodRule) -> int:
    """The sequence width ``template`` gives, after checking it names each period apart."""
    if not isinstance(template, str):
        raise ConfigError("template", f"expected a string such as '{{date:%Y%m%d}}-{{seq:06d}}', "
                          f"got {template!r}")
    width = None
    fields: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError("template", f"{template!r} is not a format string: {exc}") from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if name not in ("date", "seq", "key") or conv:
            raise ConfigError("template", f"unknown field {{{name}}} in {template!r}; use "
                              "{date:...}, {seq:0Nd} and {key}")
        fields.add(name)
        if name == "seq":
            found = _SEQ_SPEC.match(spec or "")
            if found is None:
                raise ConfigError("template", f"{{seq:{spec}}}: the sequence needs a fixed, "
                                  "zero-padded width such as {seq:06d} (it is also the "
                                  "period's capacity)")
            width = int(found.group("width"))
    if width is None or "date" not in fields:
        raise ConfigError("template", f"{template!r} needs both {{date:...}} and {{seq:0Nd}}, "
                          "e.g. '{date:%Y%m%d}-{seq:06d}'")
    # the date part must tell neighbouring periods apart (a daily counter written with
    # {date:%Y%m} would repeat its strings every day of the month)
    for sample in (dt.date(2026, 12, 31), dt.date(2026, 1, 31), dt.date(2026, 6, 15)):
        a = rule.first_day_of(sample)
        b = rule.next_first_day(a)
        if template.format(date=a, seq=1, key="") == template.format(date=b, seq=1, key=""):
            raise ConfigError("template", f"{template!r} writes the {rule.reset} periods "
                              f"starting {a} and {b} the same; its date part must name the "
                              f"period, e.g. {{date:{PERIODS[rule.reset]}}}")
    return width


def default_template(reset: str) -> str:
    return f"{{date:{PERIODS.get(reset, '%Y%m%d')}}}-{{seq:06d}}"
