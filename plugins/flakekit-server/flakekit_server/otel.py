"""OpenTelemetry, optional (``pip install "flakekit-server[otel]"``): the numbers of
``/metrics`` as OpenTelemetry instruments, and a span per segment fetch, lease renewal and
cluster hand-off (the ``flakekit_operation`` hook).

Only ``opentelemetry-api`` is used: the application (or ``opentelemetry-instrument
flakekit serve``) sets up the SDK and its exporters; without an SDK every call is the API's
no-op. Nothing imports this module unless ``opentelemetry`` is installed
(:func:`available`), so without it there is no cost at all.

Each server process exports its own numbers (the ``process`` attribute, as the
Prometheus label). Counters drop Prometheus' ``_total`` suffix (an OpenTelemetry
Prometheus exporter adds it back); histograms are exported as their ``_count`` and
``_sum`` counters (OpenTelemetry has no asynchronous histogram; the spans carry each
fetch's and renewal's duration).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Status, StatusCode

from flakekit_server import __version__
from flakekit_server.metrics import FAMILIES, render

__all__ = ["SPAN_PREFIX", "export_metrics", "record_operation", "use"]

#: span names: "flakekit segment.fetch", "flakekit lease.renew", "flakekit cluster.handoff"
SPAN_PREFIX = "flakekit "
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
#: the providers to use instead of the global ones (tests; an application's own set-up)
_providers: dict[str, Any] = {}


def use(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Use these providers instead of OpenTelemetry's global ones (None: the global)."""
    _providers["trace"], _providers["metrics"] = tracer_provider, meter_provider


def _tracer() -> trace.Tracer:
    provider = _providers.get("trace")
    if provider is not None:
        return provider.get_tracer("flakekit", __version__)   # type: ignore[no-any-return]
    return trace.get_tracer("flakekit", __version__)


def record_operation(name: str, generator: str, duration_ns: int,
                     attributes: Mapping[str, Any], error: str | None) -> None:
    """One span for a finished round trip; it ended now and lasted ``duration_ns``."""
    end = time.time_ns()
    attrs: dict[str, Any] = {"flakekit.generator": generator}
    attrs.update({f"flakekit.{k}": v for k, v in attributes.items()
                  if isinstance(v, (str, bool, int, float))})
    span = _tracer().start_span(SPAN_PREFIX + name, start_time=end - max(0, duration_ns),
                                attributes=attrs)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end)


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    return {k: re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], v)
            for k, v in _LABEL.findall(text)}


class _Samples:
    """The process's Prometheus samples, rendered at most once per collection (every
    instrument's callback of one collection reads the same rendering)."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], max_age_s: float = 0.5) -> None:
        self.snapshot, self.max_age_s = snapshot, max_age_s
        self._lock = threading.Lock()
        self._at = -math.inf
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = {}

    def get(self, name: str) -> list[tuple[dict[str, str], float]]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > self.max_age_s:
                self._by_name = self._parse(render([self.snapshot()]))
                self._at = now
            return self._by_name.get(name, [])

    @staticmethod
    def _parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None:
                continue   # # HELP / # TYPE
            value = float(match[3])
            if math.isfinite(value):
                out.setdefault(match[1], []).append((_labels(match[2]), value))
        return out


def _observer(samples: _Samples, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, labels) for labels, value in samples.get(name)]
    return observe


def export_metrics(snapshot: Callable[[], Mapping[str, Any]]) -> list[str]:
    """Register an asynchronous instrument per ``/metrics`` family, read from
    ``snapshot()`` (the process's :meth:`IdService.snapshot`) when the SDK collects.
    Returns the instrument names."""
    provider = _providers.get("metrics")
    meter = (provider.get_meter("flakekit", __version__) if provider is not None
             else metrics.get_meter("flakekit", __version__))
    samples = _Samples(snapshot)
    names = []
    for family, kind, help_ in FAMILIES:
        if kind == "counter":
            name = family.removesuffix("_total")
            meter.create_observable_counter(name, [_observer(samples, family)], description=help_)
            names.append(name)
        elif kind == "gauge":
            meter.create_observable_gauge(family, [_observer(samples, family)], description=help_)
            names.append(family)
        else:   # histogram: its count and sum
            for suffix in ("_count", "_sum"):
                meter.create_observable_counter(family + suffix,
                                                [_observer(samples, family + suffix)],
                                                description=f"{help_} ({suffix[1:]})")
                names.append(family + suffix)
    return names
