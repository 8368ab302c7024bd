"""Parsing of time units ("1ms", "10ms", "1s"), durations and epochs, and the one way
times are printed (:func:`iso_utc`)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any, TypeVar, overload

import attrs

from flakekit.errors import FieldError

__all__ = [
    "MAX_DURATION_NS", "Duration", "duration_field", "format_unit", "iso_utc", "parse_duration_ns",
    "parse_epoch_ms", "parse_unit_ns", "parsed_or", "to_duration",
]

T = TypeVar("T")

_SUFFIX_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
              "m": 60_000_000_000, "min": 60_000_000_000, "h": 3_600_000_000_000,
              "d": 86_400_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zµ]+)\s*$")
#: the longest duration accepted: deadlines are stored as 64-bit nanoseconds since 1970
#: (they end in 2262), so a longer lease or reclaim age cannot be written to any database
MAX_DURATION_NS = 100 * 365 * 86_400_000_000_000


def parsed_or(error: Callable[[str, str], Exception], where: str,
              parse: Callable[[Any], T], value: Any) -> T:
    """``parse(value)``; its ValueError raised as ``error(where, message)`` instead
    (``ConfigError``, ``LayoutError``: they name the field), without the chained traceback."""
    try:
        return parse(value)
    except ValueError as exc:
        raise error(where, str(exc)) from None


def parse_duration_ns(value: object, *, default_unit: str = "s") -> int:
    """Turn ``"5ms"``, ``"7d"``, ``"1.5s"`` or a bare number (in ``default_unit``) into ns,
    at most :data:`MAX_DURATION_NS` (100 years)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '5ms' or '1s', got {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"a duration must be a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return _at_most_max(round(value * _SUFFIX_NS[default_unit]), value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match and match.group(2) in _SUFFIX_NS:
            return _at_most_max(round(float(match.group(1)) * _SUFFIX_NS[match.group(2)]), value)
    raise ValueError(
        f"expected a duration such as '5ms', '10s' or '7d' (units: "
        f"{', '.join(_SUFFIX_NS)}), got {value!r}"
    )


def _at_most_max(ns: int, value: object) -> int:
    if ns > MAX_DURATION_NS:
        raise ValueError(
            f"a duration must be at most 36500d (100 years; deadlines are stored as 64-bit "
            f"nanoseconds), got {value!r}"
        )
    return ns


class Duration(int):
    """Nanoseconds that :func:`to_duration` has already read.

    A settings field holds one so that its converter can tell a value it read (passed
    through, so ``attrs.evolve(settings)`` keeps every duration) from a config value,
    whose bare number is in the field's unit (seconds; milliseconds for a clock's
    ``max_backward``). It is an ``int`` everywhere else: arithmetic gives plain ints.
    """

    __slots__ = ()


def to_duration(value: object, *, unit: str = "s", minimum: int = 0,
                maximum: int = MAX_DURATION_NS, example: str = "10s") -> Duration:
    """``value`` as a checked :class:`Duration`: the one converter of every duration
    setting. A :class:`Duration` is only checked against the bounds, anything else is
    parsed first (``"5ms"``, ``"7d"``, a bare number in ``unit``); its error says the
    fix (``minimum == 1`` reads "a positive duration such as ``example``")."""
    ns = value if isinstance(value, Duration) else parse_duration_ns(value, default_unit=unit)
    if ns < minimum:
        if minimum == 1:
            raise ValueError(f"must be a positive duration such as {example!r}, got {value!r}")
        raise ValueError(f"must be at least {format_unit(minimum)}, got {_shown(value)}")
    if ns > maximum:
        raise ValueError(f"must be at most {format_unit(maximum)}, got {_shown(value)}")
    return ns if isinstance(ns, Duration) else Duration(ns)


def _shown(value: object) -> str:
    return format_unit(value) if isinstance(value, Duration) else repr(value)


def duration_field(default: object = attrs.NOTHING, *, unit: str = "s", minimum: int = 0,
                   maximum: int = MAX_DURATION_NS, example: str = "10s",
                   optional: bool = False, **kwargs: Any) -> Any:
    """An attrs field holding a :class:`Duration` read by :func:`to_duration`
    (``optional``: ``None`` stays ``None``); a bad value raises a ``FieldError`` naming
    the field. ``default`` is written as config would write it (``"10s"``; an
    ``attrs.Factory`` returns a :class:`Duration`); ``kwargs`` go to ``attrs.field``."""
    def convert(value: object, field: attrs.Attribute[Any]) -> Duration | None:
        if value is None and optional:
            return None
        try:
            return to_duration(value, unit=unit, minimum=minimum, maximum=maximum,
                               example=example)
        except ValueError as exc:
            raise FieldError(field.name, str(exc)) from None
    return attrs.field(default=default, converter=attrs.Converter(convert, takes_field=True),
                       **kwargs)


def parse_unit_ns(value: object) -> int:
    """A layout's time unit: ``"1ms"``, ``"10ms"``, ``"1s"``; at least 1 µs."""
    ns = parse_duration_ns(value, default_unit="ms")
    if ns < 1_000:
        raise ValueError(f"a time unit must be at least 1us, got {value!r}")
    return ns


@overload
def iso_utc(when: dt.datetime) -> str: ...
@overload
def iso_utc(when: None) -> None: ...
@overload
def iso_utc(when: dt.datetime | None) -> str | None: ...
def iso_utc(when: dt.datetime | None) -> str | None:
    """``2016-04-30T11:18:25.796Z``: the one timestamp format of every flakekit output
    (CLI text and JSON, HTTP), UTC with milliseconds, as JavaScript's ``toISOString``
    prints it, so scripts parse one shape. ``None`` stays ``None``; a naive datetime is
    taken as UTC (databases hand those back)."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def format_unit(ns: int) -> str:
    for suffix in ("d", "h", "s", "ms", "us"):
        size = _SUFFIX_NS[suffix]
        if ns % size == 0:
            return f"{ns // size}{suffix}"
    return f"{ns}ns"


def parse_epoch_ms(value: object) -> int:
    """An epoch as milliseconds since 1970 (int) or an ISO-8601 string with a zone."""
    if isinstance(value, bool):
        raise ValueError(f"expected epoch milliseconds or an ISO-8601 time, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"an epoch cannot be before 1970, got {value}")
        return value
    if isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"expected epoch milliseconds or an ISO-8601 time such as "
                f"'2024-01-01T00:00:00Z', got {value!r}"
            ) from None
    else:
        raise ValueError(f"expected epoch milliseconds or an ISO-8601 time, got {value!r}")
    if when.tzinfo is None:
        raise ValueError(
            f"epoch {value!r} has no time zone; add 'Z' for UTC (e.g. '2024-01-01T00:00:00Z')"
        )
    ms = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    if ms < 0:
        raise ValueError(f"an epoch cannot be before 1970, got {value!r}")
    return ms
