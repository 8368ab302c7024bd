"""Prometheus text format: request counters and latency, generator and lease numbers.

Every number comes from a *snapshot* (a JSON-able dict, see :mod:`flakekit_server.app`);
with several processes each one writes its snapshot to a shared run directory and
``/metrics`` renders them all, labelled ``process="N"``. So any process answers for all.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["EVENTS", "LATENCY_BUCKETS_S", "RequestStats", "render"]

#: request latency histogram bounds, seconds
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 0.5, 1.0, 2.5)
_BOUNDS_NS = [round(b * 1e9) for b in LATENCY_BUCKETS_S]


class RequestStats:
    """Requests by route and status, latency histograms by route (event-loop thread only)."""

    __slots__ = ("connections", "latency", "requests", "rejected_connections")

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency: dict[str, list[int]] = {}   # route -> bucket counts + [sum_ns, count]
        self.connections = 0
        self.rejected_connections = 0

    def observe(self, route: str, status: int, elapsed_ns: int) -> None:
        self.requests[route, status] += 1
        h = self.latency.get(route)
        if h is None:
            h = self.latency[route] = [0] * (len(_BOUNDS_NS) + 3)
        h[bisect.bisect_left(_BOUNDS_NS, elapsed_ns)] += 1
        h[-2] += elapsed_ns
        h[-1] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": [[route, status, n] for (route, status), n in self.requests.items()],
            "latency": {route: list(h) for route, h in self.latency.items()},
            "connections": self.connections,
            "rejected_connections": self.rejected_connections,
        }


class _Events:
    """Counts of rare events, filled by this plugin's event hooks (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lease_lost: Counter[str] = Counter()
        self.clock_rollbacks: Counter[tuple[str, bool]] = Counter()
        self.alerts: Counter[str] = Counter()

    def add(self, counter: Counter[Any], key: Any) -> None:
        with self._lock:
            counter[key] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "lease_lost": dict(self.lease_lost),
                "clock_rollbacks": [[g, w, n] for (g, w), n in self.clock_rollbacks.items()],
                "alerts": dict(self.alerts),
            }


#: process-wide event counters (hooks in :mod:`flakekit_server` feed them)
EVENTS = _Events()


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}"


def _num(value: Any) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Family:
    def __init__(self, name: str, kind: str, help_: str) -> None:
        self.name, self.kind, self.help = name, kind, help_
        self.samples: list[str] = []

    def add(self, value: Any, suffix: str = "", **labels: Any) -> None:
        self.samples.append(f"{self.name}{suffix}{_labels(labels)} {_num(value)}")


FAMILIES = [
    ("flakekit_server_ready", "gauge", "1 while this process is ready (every lease valid, every segment key has a buffer)."),
    ("flakekit_server_start_time_seconds", "gauge", "Unix time the process started serving."),
    ("flakekit_ids_issued_total", "counter", "IDs handed out over HTTP, by generator."),
    ("flakekit_generator_ready", "gauge", "1 while the generator can issue IDs."),
    ("flakekit_worker_id", "gauge", "The worker id a snowflake generator leased."),
    ("flakekit_lease_epoch", "gauge", "The epoch (fencing token) of the worker lease."),
    ("flakekit_lease_remaining_seconds", "gauge", "Seconds left on the worker lease (+Inf: never expires; negative: lapsed)."),
    ("flakekit_lease_renewals_total", "counter", "Successful lease renewals."),
    ("flakekit_lease_renew_failures_total", "counter", "Failed lease renewals."),
    ("flakekit_lease_losses_total", "counter", "Worker leases lost (the generator stopped issuing)."),
    ("flakekit_clock_rollbacks_total", "counter", "Times the wall clock stepped back (waited: waited it out)."),
    ("flakekit_alerts_total", "counter", "Alerts raised (e.g. worker-reclaim, worker-capacity)."),
    ("flakekit_segment_step", "gauge", "The current (dynamic) step of a segment key."),
    ("flakekit_segment_buffer_ready", "gauge", "1 if the buffer (current/next) holds IDs."),
    ("flakekit_segment_buffer_remaining", "gauge", "IDs left in the buffer."),
    ("flakekit_segment_buffer_fill_ratio", "gauge", "Share of the buffer's segment still unused (0..1)."),
    ("flakekit_segment_fetches_total", "counter", "Segments fetched from the database."),
    ("flakekit_segment_fetch_failures_total", "counter", "Failed segment fetches."),
    ("flakekit_segment_fetch_duration_seconds", "summary", "Database fetch latency per key."),
    ("flakekit_segment_fetch_duration_max_seconds", "gauge", "Slowest database fetch per key."),
    ("flakekit_segment_fetch_duration_last_seconds", "gauge", "Latest database fetch per key."),
    ("flakekit_segment_waits_total", "counter", "Requests that waited for a refill (both buffers empty)."),
    ("flakekit_segment_unavailable_total", "counter", "Requests refused: no refill within the wait budget."),
    ("flakekit_http_requests_total", "counter", "HTTP requests by route and status code."),
    ("flakekit_http_request_duration_seconds", "histogram", "Time from a request's first byte to its response, by route."),
    ("flakekit_http_connections", "gauge", "Open HTTP connections."),
    ("flakekit_http_rejected_connections_total", "counter", "Connections refused over --max-connections."),
]


def render(snapshots: Iterable[Mapping[str, Any]]) -> str:
    """Prometheus text exposition (version 0.0.4) of every process's snapshot."""
    fams = {name: _Family(name, kind, help_) for name, kind, help_ in FAMILIES}
    for snap in snapshots:
        p = str(snap["process"])
        fams["flakekit_server_ready"].add(snap["ready"], process=p)
        fams["flakekit_server_start_time_seconds"].add(snap["started"], process=p)
        for gen in snap["generators"]:
            g = gen["name"]
            fams["flakekit_ids_issued_total"].add(gen["issued"], generator=g, process=p)
            fams["flakekit_generator_ready"].add(gen["ready"], generator=g, process=p)
            if gen["strategy"] == "snowflake":
                w = "" if gen.get("worker_id") is None else gen["worker_id"]
                if gen.get("worker_id") is not None:
                    fams["flakekit_worker_id"].add(gen["worker_id"], generator=g, process=p)
                    fams["flakekit_lease_epoch"].add(gen.get("epoch"), generator=g, process=p, worker=w)
                remaining = gen.get("lease_remaining_s")
                if gen.get("worker_id") is not None:
                    fams["flakekit_lease_remaining_seconds"].add(
                        float("inf") if remaining is None else remaining,
                        generator=g, process=p, worker=w)
                fams["flakekit_lease_renewals_total"].add(gen.get("renewals", 0), generator=g, process=p)
                fams["flakekit_lease_renew_failures_total"].add(gen.get("renew_failures", 0), generator=g, process=p)
                fams["flakekit_lease_losses_total"].add(
                    snap["events"]["lease_lost"].get(g, 0), generator=g, process=p)
            else:
                for key in gen.get("keys", []):
                    k = key["key"]
                    labels = {"generator": g, "key": k, "process": p}
                    fams["flakekit_segment_step"].add(key.get("step"), **labels)
                    for buf in key.get("buffers", []):
                        slot = buf.get("slot")
                        fams["flakekit_segment_buffer_ready"].add(bool(buf.get("ready")), slot=slot, **labels)
                        idle = buf.get("idle") or 0
                        fams["flakekit_segment_buffer_remaining"].add(idle, slot=slot, **labels)
                        step = buf.get("step") or 0
                        fams["flakekit_segment_buffer_fill_ratio"].add(idle / step if step else 0.0, slot=slot, **labels)
                    fetches = key.get("fetches", 0)
                    fams["flakekit_segment_fetches_total"].add(fetches, **labels)
                    fams["flakekit_segment_fetch_failures_total"].add(key.get("fetch_failures", 0), **labels)
                    mean = key.get("fetch_ms_mean") or 0.0
                    fams["flakekit_segment_fetch_duration_seconds"].add(mean * fetches / 1e3, "_sum", **labels)
                    fams["flakekit_segment_fetch_duration_seconds"].add(fetches, "_count", **labels)
                    fams["flakekit_segment_fetch_duration_max_seconds"].add((key.get("fetch_ms_max") or 0.0) / 1e3, **labels)
                    fams["flakekit_segment_fetch_duration_last_seconds"].add((key.get("fetch_ms_last") or 0.0) / 1e3, **labels)
                    fams["flakekit_segment_waits_total"].add(key.get("waits", 0), **labels)
                    fams["flakekit_segment_unavailable_total"].add(key.get("unavailable", 0), **labels)
        for g, waited, n in snap["events"]["clock_rollbacks"]:
            fams["flakekit_clock_rollbacks_total"].add(n, generator=g, waited=str(bool(waited)).lower(), process=p)
        for kind, n in snap["events"]["alerts"].items():
            fams["flakekit_alerts_total"].add(n, kind=kind, process=p)
        http = snap["http"]
        for route, status, n in sorted(http["requests"]):
            fams["flakekit_http_requests_total"].add(n, route=route, code=status, process=p)
        fam = fams["flakekit_http_request_duration_seconds"]
        for route, h in sorted(http["latency"].items()):
            cumulative = 0
            for bound, n in zip(LATENCY_BUCKETS_S, h):
                cumulative += n
                fam.add(cumulative, "_bucket", route=route, process=p, le=repr(bound))
            fam.add(h[-1], "_bucket", route=route, process=p, le="+Inf")
            fam.add(h[-2] / 1e9, "_sum", route=route, process=p)
            fam.add(h[-1], "_count", route=route, process=p)
        fams["flakekit_http_connections"].add(http["connections"], process=p)
        fams["flakekit_http_rejected_connections_total"].add(http["rejected_connections"], process=p)
    out: list[str] = []
    for fam in fams.values():
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        out.extend(fam.samples)
    return "\n".join(out) + "\n"
