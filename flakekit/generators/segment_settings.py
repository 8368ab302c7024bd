"""SegmentSettings: what a ``strategy = "segment"`` table configures, apart from the
generator that reads it.

Its own module because the plugin host imports the built-in strategies (which subclass
it) for every command, ``flakekit --help`` included: the settings cost an attrs class,
the generator (:mod:`flakekit.generators.segment`) is imported only when one is built.
"""

from __future__ import annotations

import attrs

from flakekit.errors import FieldError
from flakekit.values.keys import key_problem
from flakekit.values.timeunits import Duration, duration_field

__all__ = ["SegmentSettings"]


def _fraction(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError("must be at least 0 and below 1 (0.1 = prefetch once 10% is used), got "
                         f"{value!r}")


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"must be at least 1, got {value!r}")


def _segment_key(_inst: object, _attr: object, value: str) -> None:
    """The rule the server and ``segments create`` apply (flakekit.values.keys)."""
    problem = key_problem(value)
    if problem:
        raise FieldError("key", problem)


@attrs.frozen
class SegmentSettings:
    """``[generators.NAME]`` with ``strategy = "segment"`` (besides ``store``).

    Attributes:
        key: the ``biz_tag`` in the store (default: the generator's name).
        prefetch_at: share of the current segment used before the next one is fetched
            (default 0.1, as Leaf; 0 fetches at once; must be below 1).
        dynamic_step: adapt the step to traffic, as Leaf (default true).
        max_step: the step never grows above this (default 1,000,000, Leaf's
            ``MAX_STEP``), and never shrinks below the table's ``step``.
        grow_below: double the step when a segment lasted less than this (default 15min).
        shrink_after: halve it when a segment lasted this long or more (default 30min;
            must not be below ``grow_below``).
        wait_budget: how long ``next_id()`` waits for a refill when both buffers are empty
            before raising ``SegmentUnavailableError`` (default 1s; 0 = Leaf's fail-fast).
        give_back: on a clean ``close()``, return the unused tail with a compare-and-set
            on ``max_id`` (default true).
        preload: fetch the first segment in ``start()`` (default true); false fetches it
            in the background, and the first ``next_id()`` waits for it.
        retry_min / retry_max: back-off between failed background fetches (default 50ms,
            doubling up to 2s).
        hunger: ride out bursts (CosId's "hunger"): when a segment ran out in less than
            two fetch latencies, the next fetch asks for more steps in its one round trip
            (at least twice as many); when one lasted over eight, half as many (default
            true).
        hunger_max: a fetch under hunger asks for at most ``hunger_max x max_step`` IDs
            (default 16: 16,000,000), which is also what a crash may waste per key.
        segment_ttl: a segment is never served longer than this after it was fetched;
            an idle range past it is dropped and its IDs wasted (safe: never reissued).
            Default ``0`` (off).
        fetch_threads: the threads one :class:`~flakekit.generators.segment_service.SegmentService`
            (every key of a table, ``store.keys = "all"``) shares for its keys' background
            fetches (default 8, 1 to 1024; Leaf's shared update pool). A generator of its
            own uses the process-wide pool.
        reset: ``"daily"``, ``"monthly"`` or ``"yearly"``: a counter that starts again every
            period, one ``leaf_alloc`` row per period (``KEY@20261201``), the period
            decided by the database's clock (default none: one counter forever). See
            :mod:`flakekit.generators.periodic`.
        time_zone: the IANA zone whose midnight ends a period (default ``"UTC"``).
        template: the string form, ``{date:...}`` and a zero-padded ``{seq:0Nd}`` whose
            width is each period's capacity (default ``{date:%Y%m%d}-{seq:06d}`` for
            daily, ``%Y%m`` monthly, ``%Y`` yearly).
        period_step: the ``step`` of a period row flakekit creates (default 1000).
        period_start: the first number of each period (default 1).
        boundary_margin: a period's IDs stop this long before its end by the database's
            clock (default 100ms; besides 500 ppm of the time left, for the drift between
            this host's monotonic clock and the database's).
        clock_sync: how often the database's clock is read again in the background
            (default 10s; 0: only when a period's deadline is reached).
    """

    key: str | None = attrs.field(
        default=None,
        validator=attrs.validators.optional([attrs.validators.instance_of(str), _segment_key]),
    )
    prefetch_at: float = attrs.field(default=0.1, converter=float, validator=_fraction)
    dynamic_step: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    max_step: int = attrs.field(
        default=1_000_000, validator=[attrs.validators.instance_of(int), _positive]
    )
    grow_below: Duration = duration_field("15min")
    shrink_after: Duration = duration_field("30min")
    wait_budget: Duration = duration_field("1s")
    give_back: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    preload: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    retry_min: Duration = duration_field("50ms")
    retry_max: Duration = duration_field("2s")
    hunger: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    hunger_max: int = attrs.field(
        default=16, validator=[attrs.validators.instance_of(int), _positive]
    )
    segment_ttl: Duration = duration_field(0)
    fetch_threads: int = attrs.field(
        default=8, validator=[attrs.validators.instance_of(int), _positive,
                              attrs.validators.le(1024)]
    )

    reset: str | None = attrs.field(default=None)
    time_zone: str = attrs.field(default="UTC", validator=attrs.validators.instance_of(str))
    template: str | None = attrs.field(default=None)
    period_step: int = attrs.field(
        default=1000, validator=[attrs.validators.instance_of(int), _positive,
                                 attrs.validators.le(2**31 - 1)]
    )
    period_start: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)]
    )
    boundary_margin: Duration = duration_field("100ms")
    clock_sync: Duration = duration_field("10s")

    def __attrs_post_init__(self) -> None:
        self._check_period()
        if self.key is not None and not 0 < len(self.key) <= 128:
            raise FieldError("key", f"key must be 1 to 128 characters, got {self.key!r}")
        if self.shrink_after < self.grow_below:
            raise FieldError(
                "shrink_after",
                "shrink_after must not be below grow_below "
                f"({self.shrink_after / 1e9:g}s < {self.grow_below / 1e9:g}s)"
            )
        if self.retry_min < 1_000_000 or self.retry_max < self.retry_min:
            raise FieldError(
                "retry_min", "retry_min must be at least 1ms and retry_max not below retry_min")
        if self.segment_ttl and self.segment_ttl < 1_000_000:
            raise FieldError("segment_ttl", "segment_ttl must be at least 1ms, or 0 for off "
                             f"(got {self.segment_ttl}ns)")
        if self.segment_ttl < 0:
            raise FieldError("segment_ttl", "segment_ttl must not be negative (0 = off)")

    def _check_period(self) -> None:
        """``reset`` and the fields that go with it (a periodic counter, or none set)."""
        from flakekit.errors import ConfigError

        if self.reset is None:
            for name in ("template",):
                if getattr(self, name) is not None:
                    raise FieldError(name, f"{name} needs reset = \"daily\", \"monthly\" or "
                                     "\"yearly\" (a counter that starts again every period)")
            return
        from flakekit.values.periods import PeriodFormat, PeriodRule, default_template

        try:
            rule = PeriodRule(self.reset, self.time_zone)
            fmt = PeriodFormat(self.template or default_template(self.reset), rule, self.key or "")
        except ConfigError as exc:
            raise FieldError(exc.path, exc.message) from None
        if self.key is not None and "@" in self.key:
            raise FieldError("key", f"key {self.key!r}: a periodic counter's key may not contain "
                             "'@' (its period rows are named KEY@20261201)")
        if self.period_start > fmt.capacity:
            raise FieldError("period_start", f"period_start {self.period_start} does not fit "
                             f"{{seq:0{fmt.width}d}} (at most {fmt.capacity})")
        if self.boundary_margin < 1_000_000:
            raise FieldError("boundary_margin", "boundary_margin must be at least 1ms")
        if self.clock_sync and self.clock_sync < 100_000_000:
            raise FieldError("clock_sync", "clock_sync must be at least 100ms, or 0 for off")
