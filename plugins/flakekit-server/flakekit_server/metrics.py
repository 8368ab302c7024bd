"""Prometheus text format: request counters and latency, generator and lease numbers.

Every number comes from a *snapshot* (a JSON-able dict, see :mod:`flakekit_server.app`);
with several processes each one writes its snapshot to a shared run directory and
``/metrics`` renders them all, labelled ``process="N"``. So any process answers for all.
"""

from __future__ import annotations

import bisect
import functools
import os
import platform
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from flakekit.plugin import LATENCY_BUCKETS_S as FETCH_BUCKETS_S

__all__ = ["ALERT_KINDS", "EVENTS", "FIRST_BUCKET_NS", "LATENCY_BUCKETS_S", "RequestStats",
           "bucket", "new_histogram", "os_stats", "render"]

#: request latency histogram bounds, seconds
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 0.5, 1.0, 2.5)
_BOUNDS_NS = [round(b * 1e9) for b in LATENCY_BUCKETS_S]


#: alert kinds flakekit and its plugins raise: their counters start at 0 (a counter missing
#: until its first event breaks ``rate()`` and ``increase()`` over the first one)
ALERT_KINDS = ("segment-unavailable", "worker-bad-row", "worker-capacity", "worker-reclaim",
               "workers-exhausted", "zookeeper-leaf-clock", "zookeeper-leaf-mismatch",
               "zookeeper-unreachable")   # docs/operations.md lists them


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0  # pragma: no cover


def os_stats() -> dict[str, float]:
    """This process's CPU, memory and file descriptors from /proc, as Prometheus' client
    library reads them (``process_*``); empty where /proc is missing (not Linux)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()   # after the command name
        ticks = os.sysconf("SC_CLK_TCK")
        max_fds = float("inf")
        with open("/proc/self/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    max_fds = float("inf") if soft == "unlimited" else float(soft)
        return {
            "cpu_seconds": (int(fields[11]) + int(fields[12])) / ticks,
            "virtual_memory_bytes": float(fields[20]),
            "resident_memory_bytes": float(int(fields[21]) * os.sysconf("SC_PAGE_SIZE")),
            "start_time_seconds": _boot_time() + int(fields[19]) / ticks,
            "open_fds": float(len(os.listdir("/proc/self/fd"))),
            "max_fds": max_fds,
        }
    except (OSError, IndexError, ValueError):
        return {}


def new_histogram() -> list[int]:
    """Bucket counts (``LATENCY_BUCKETS_S`` and +Inf), then the sum (ns) and the count."""
    return [0] * (len(_BOUNDS_NS) + 3)


class RequestStats:
    """Requests by route and status, latency histograms by route (event-loop thread only).

    The Leaf ID URLs' successful answers are counted apart, in one histogram per route
    that the transport updates in place (:meth:`ok_histogram`: no tuple, no Counter, no
    call per request); :meth:`snapshot` adds them to the rest, so ``/metrics`` is the same.
    """

    __slots__ = ("connections", "latency", "ok", "rejected_connections", "requests")

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency: dict[str, list[int]] = {}   # route -> bucket counts + [sum_ns, count]
        self.ok: dict[Any, tuple[str, list[int]]] = {}   # key -> route, its 200s' histogram
        self.connections = 0
        self.rejected_connections = 0

    def observe(self, route: str, status: int, elapsed_ns: int) -> None:
        self.requests[route, status] += 1
        h = self.latency.get(route)
        if h is None:
            h = self.latency[route] = new_histogram()
        h[bisect.bisect_left(_BOUNDS_NS, elapsed_ns)] += 1
        h[-2] += elapsed_ns
        h[-1] += 1

    def ok_histogram(self, key: Any, route: str) -> list[int]:
        """A histogram of 200 answers counted under ``route`` (one per ``key``, e.g. per
        URL, so its count is also that URL's), for the caller to update in place
        (``h[bucket(ns)] += 1; h[-2] += ns; h[-1] += 1``)."""
        got = self.ok.get(key)
        if got is None:
            got = self.ok[key] = (route, new_histogram())
        return got[1]

    def snapshot(self) -> dict[str, Any]:
        requests = Counter(self.requests)
        latency = {route: list(h) for route, h in self.latency.items()}
        for route, ok in self.ok.values():
            if not ok[-1]:
                continue
            requests[route, 200] += ok[-1]
            merged = latency.setdefault(route, new_histogram())
            for i, n in enumerate(ok):
                merged[i] += n
        return {
            "requests": [[route, status, n] for (route, status), n in requests.items()],
            "latency": latency,
            "connections": self.connections,
            "rejected_connections": self.rejected_connections,
        }


#: the bucket of a latency in ns (an index into a histogram of :func:`new_histogram`)
bucket = functools.partial(bisect.bisect_left, _BOUNDS_NS)
#: latencies below this many ns fall in the first bucket (the transport's shortcut)
FIRST_BUCKET_NS = _BOUNDS_NS[0]


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
    if not labels:
        return ""
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


#: Prometheus' standard process metrics (``os_stats`` key -> family), per server process
PROCESS_FAMILIES = [
    ("cpu_seconds", "process_cpu_seconds_total", "counter",
     "Total user and system CPU time spent in seconds."),
    ("virtual_memory_bytes", "process_virtual_memory_bytes", "gauge",
     "Virtual memory size in bytes."),
    ("resident_memory_bytes", "process_resident_memory_bytes", "gauge",
     "Resident memory size in bytes."),
    ("start_time_seconds", "process_start_time_seconds", "gauge",
     "Start time of the process since unix epoch in seconds."),
    ("open_fds", "process_open_fds", "gauge", "Number of open file descriptors."),
    ("max_fds", "process_max_fds", "gauge", "Maximum number of open file descriptors."),
]

#: every family /metrics exposes, one a line: its name after ``flakekit_``, its kind and
#: its help text (a line that starts with spaces goes on with the one before; ``*process``:
#: the process families above, at that place)
_FAMILY_TABLE = """
build_info gauge Always 1; the labels name the flakekit, server plugin and Python versions.
*process
server_ready gauge 1 while this process is ready (every lease valid, every segment key has a
    buffer).
server_processes_expected gauge Worker processes the server runs (--workers).
server_processes_running gauge Worker processes serving now.
server_process_running gauge 1 while this worker process serves.
server_process_restarts_total counter Times the supervisor restarted this worker process.
server_start_time_seconds gauge Unix time the process started serving.
ids_issued_total counter IDs handed out over HTTP, by generator.
generator_ready gauge 1 while the generator can issue IDs.
worker_id gauge The worker id a snowflake generator leased.
lease_epoch gauge The epoch (fencing token) of the worker lease.
lease_remaining_seconds gauge Seconds left on the worker lease (+Inf: never expires; negative:
    lapsed).
lease_renewals_total counter Successful lease renewals.
lease_renew_failures_total counter Failed lease renewals.
lease_losses_total counter Worker leases lost (the generator stopped issuing).
clock_rollbacks_total counter Times the wall clock stepped back (waited: waited it out).
alerts_total counter Alerts raised (e.g. worker-reclaim, worker-capacity).
segment_step gauge The current (dynamic) step of a segment key.
segment_buffer_ready gauge 1 if the buffer (current/next) holds IDs.
segment_buffer_remaining gauge IDs left in the buffer.
segment_buffer_fill_ratio gauge Share of the buffer's segment still unused (0..1).
segment_fetches_total counter Segments fetched from the database.
segment_fetch_failures_total counter Failed segment fetches.
segment_fetch_duration_seconds histogram Database fetch latency per key.
lease_acquire_duration_seconds histogram Worker-lease acquire latency (successful acquires,
    re-acquires included).
segment_fetch_duration_max_seconds gauge Slowest database fetch per key.
segment_fetch_duration_last_seconds gauge Latest database fetch per key.
segment_waits_total counter Requests that waited for a refill (both buffers empty).
segment_unavailable_total counter Requests refused: no refill within the wait budget.
http_requests_total counter HTTP requests by route and status code.
http_request_duration_seconds histogram Time from a request's first byte to its response, by route.
http_connections gauge Open HTTP connections.
http_rejected_connections_total counter Connections refused over --max-connections.
http_offloaded_batches_total counter Large batches made in a worker thread, off the event loop.
cluster_view_epoch gauge The cluster view epoch this node serves by.
cluster_members gauge Members of the cluster by state (alive, draining, lapsed, left).
cluster_owned_keys gauge Strict keys this node owns in the current view.
cluster_lease_remaining_seconds gauge Seconds left on this node's membership lease.
cluster_handoffs_total counter Strict keys this node took over (hand-offs completed).
cluster_handoff_duration_seconds histogram Time from seeing a new owner epoch to serving the key.
cluster_forwards_total counter Requests forwarded to a strict key's owner, by result.
cluster_misdirected_total counter 421 answers: a client that routes by its view asked the wrong
    node.
cluster_refused_total counter 503 answers for strict keys, by reason.
"""


def _families(table: str) -> list[tuple[str, str, str]]:
    """``(name, kind, help)`` of each family of ``table``, in its order."""
    rows: list[str] = []
    for line in table.strip().splitlines():
        if line.startswith(" "):
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    out = []
    for row in rows:
        if row == "*process":
            out += [(name, kind, help_) for _, name, kind, help_ in PROCESS_FAMILIES]
            continue
        name, kind, help_ = row.split(" ", 2)
        out.append(("flakekit_" + name, kind, help_))
    return out


FAMILIES = _families(_FAMILY_TABLE)

#: members' states in the view (their series start at 0)
MEMBER_STATES = ("alive", "draining", "lapsed", "left")


def _cluster(fams: dict[str, _Family], cluster: Mapping[str, Any], p: str) -> None:
    """The cluster families of one process (``ClusterHttp.snapshot()``)."""
    status = cluster.get("status") or {}
    node = str(status.get("node", ""))
    fams["flakekit_cluster_view_epoch"].add(status.get("epoch", 0), node=node, process=p)
    states = Counter({s: 0 for s in MEMBER_STATES})
    for member in status.get("members") or []:
        states[str(member.get("state", "alive"))] += 1
    for state, n in sorted(states.items()):
        fams["flakekit_cluster_members"].add(n, state=state, process=p)
    owners = status.get("owners") or {}
    fams["flakekit_cluster_owned_keys"].add(sum(1 for o in owners.values() if o == node),
                                            node=node, process=p)
    lease = (status.get("lease") or {}).get("remaining_s")
    if lease is not None:
        fams["flakekit_cluster_lease_remaining_seconds"].add(lease, node=node, process=p)
    handoffs = int(cluster.get("handoffs", 0))
    fams["flakekit_cluster_handoffs_total"].add(handoffs, node=node, process=p)
    _histogram(fams["flakekit_cluster_handoff_duration_seconds"], FETCH_BUCKETS_S,
               cluster.get("handoff_buckets"), cluster.get("handoff_count", 0),
               cluster.get("handoff_sum_ms", 0.0) / 1e3, node=node, process=p)
    for result, n in sorted((cluster.get("forwards") or {}).items()):
        fams["flakekit_cluster_forwards_total"].add(n, result=result, node=node, process=p)
    fams["flakekit_cluster_misdirected_total"].add(cluster.get("misdirected", 0), node=node,
                                                   process=p)
    for reason, n in sorted((cluster.get("refused") or {}).items()):
        fams["flakekit_cluster_refused_total"].add(n, reason=reason, node=node, process=p)


def _histogram(fam: Any, bounds: tuple[float, ...], buckets: Any, count: int, total_s: float,
               **labels: Any) -> None:
    """One Prometheus histogram series: cumulative ``_bucket`` samples per bound, ``+Inf``,
    ``_sum`` and ``_count``."""
    cumulative = 0
    for bound, n in zip(bounds, buckets or [0] * (len(bounds) + 1)):
        cumulative += n
        fam.add(cumulative, "_bucket", le=repr(bound), **labels)
    fam.add(count, "_bucket", le="+Inf", **labels)
    fam.add(total_s, "_sum", **labels)
    fam.add(count, "_count", **labels)


def _supervision(fams: dict[str, Any], supervision: Mapping[str, Any]) -> None:
    fams["flakekit_server_processes_expected"].add(supervision["expected"])
    fams["flakekit_server_processes_running"].add(supervision["running"])
    for proc in supervision["processes"]:
        p = str(proc["process"])
        fams["flakekit_server_process_running"].add(bool(proc["running"]), process=p)
        fams["flakekit_server_process_restarts_total"].add(proc["restarts"], process=p)


def _lease(fams: dict[str, Any], gen: Mapping[str, Any], events: Mapping[str, Any],
           p: str) -> None:
    """The series of a time-ordered generator: its worker lease and clock."""
    g = gen["name"]
    w = "" if gen.get("worker_id") is None else gen["worker_id"]
    if gen.get("worker_id") is not None:
        fams["flakekit_worker_id"].add(gen["worker_id"], generator=g, process=p)
        fams["flakekit_lease_epoch"].add(gen.get("epoch"), generator=g, process=p, worker=w)
        remaining = gen.get("lease_remaining_s")
        fams["flakekit_lease_remaining_seconds"].add(
            float("inf") if remaining is None else remaining, generator=g, process=p, worker=w)
    fams["flakekit_lease_renewals_total"].add(gen.get("renewals", 0), generator=g, process=p)
    _histogram(fams["flakekit_lease_acquire_duration_seconds"], FETCH_BUCKETS_S,
               gen.get("acquire_buckets"), gen.get("acquires", 0),
               gen.get("acquire_ns_total", 0) / 1e9, generator=g, process=p)
    fams["flakekit_lease_renew_failures_total"].add(gen.get("renew_failures", 0),
                                                    generator=g, process=p)
    fams["flakekit_lease_losses_total"].add(events["lease_lost"].get(g, 0), generator=g,
                                            process=p)
    rollbacks = {(r[0], bool(r[1])): r[2] for r in events["clock_rollbacks"]}
    for waited in (False, True):   # both series from start, at 0
        fams["flakekit_clock_rollbacks_total"].add(
            rollbacks.get((g, waited), 0), generator=g, waited=str(waited).lower(), process=p)


def _segment_key(fams: dict[str, Any], key: Mapping[str, Any], g: str, p: str) -> None:
    """The series of one key of a segment generator: its buffers and fetches."""
    labels = {"generator": g, "key": key["key"], "process": p}
    fams["flakekit_segment_step"].add(key.get("step"), **labels)
    for buf in key.get("buffers", []):
        slot = buf.get("slot")
        fams["flakekit_segment_buffer_ready"].add(bool(buf.get("ready")), slot=slot, **labels)
        idle = buf.get("idle") or 0
        fams["flakekit_segment_buffer_remaining"].add(idle, slot=slot, **labels)
        step = buf.get("step") or 0
        fams["flakekit_segment_buffer_fill_ratio"].add(idle / step if step else 0.0,
                                                       slot=slot, **labels)
    fetches = key.get("fetches", 0)
    fams["flakekit_segment_fetches_total"].add(fetches, **labels)
    fams["flakekit_segment_fetch_failures_total"].add(key.get("fetch_failures", 0), **labels)
    mean = key.get("fetch_ms_mean") or 0.0
    _histogram(fams["flakekit_segment_fetch_duration_seconds"], FETCH_BUCKETS_S,
               key.get("fetch_buckets"), fetches, mean * fetches / 1e3, **labels)
    fams["flakekit_segment_fetch_duration_max_seconds"].add(
        (key.get("fetch_ms_max") or 0.0) / 1e3, **labels)
    fams["flakekit_segment_fetch_duration_last_seconds"].add(
        (key.get("fetch_ms_last") or 0.0) / 1e3, **labels)
    fams["flakekit_segment_waits_total"].add(key.get("waits", 0), **labels)
    fams["flakekit_segment_unavailable_total"].add(key.get("unavailable", 0), **labels)


def _http(fams: dict[str, Any], snap: Mapping[str, Any], p: str) -> None:
    http = snap["http"]
    for route, status, n in sorted(http["requests"]):
        fams["flakekit_http_requests_total"].add(n, route=route, code=status, process=p)
    fam = fams["flakekit_http_request_duration_seconds"]
    for route, h in sorted(http["latency"].items()):
        _histogram(fam, LATENCY_BUCKETS_S, h[:len(LATENCY_BUCKETS_S)], h[-1], h[-2] / 1e9,
                   route=route, process=p)
    fams["flakekit_http_connections"].add(http["connections"], process=p)
    fams["flakekit_http_rejected_connections_total"].add(http["rejected_connections"],
                                                         process=p)
    fams["flakekit_http_offloaded_batches_total"].add(snap.get("offloaded_batches", 0),
                                                      process=p)


def _process(fams: dict[str, Any], snap: Mapping[str, Any]) -> None:
    """Every series of one process's snapshot."""
    p = str(snap["process"])
    ostats = snap.get("os", {})
    for key, name, _, _ in PROCESS_FAMILIES:
        if key in ostats:
            fams[name].add(ostats[key], process=p)
    fams["flakekit_server_ready"].add(snap["ready"], process=p)
    fams["flakekit_server_start_time_seconds"].add(snap["started"], process=p)
    for gen in snap["generators"]:
        g = gen["name"]
        fams["flakekit_ids_issued_total"].add(gen["issued"], generator=g, process=p)
        fams["flakekit_generator_ready"].add(gen["ready"], generator=g, process=p)
        if gen.get("kind") == "time-ordered":  # a worker lease to report
            _lease(fams, gen, snap["events"], p)
        else:
            for key in gen.get("keys", []):
                _segment_key(fams, key, g, p)
    snowflakes = {gen["name"] for gen in snap["generators"]
                  if gen.get("kind") == "time-ordered"}
    for g, waited, n in snap["events"]["clock_rollbacks"]:
        if g not in snowflakes:   # (a generator's own series are written above)
            fams["flakekit_clock_rollbacks_total"].add(
                n, generator=g, waited=str(bool(waited)).lower(), process=p)
    alerts = {kind: 0 for kind in ALERT_KINDS} | snap["events"]["alerts"]
    for kind, n in sorted(alerts.items()):
        fams["flakekit_alerts_total"].add(n, kind=kind, process=p)
    _http(fams, snap, p)
    if snap.get("cluster"):
        _cluster(fams, snap["cluster"], p)


def render(snapshots: Iterable[Mapping[str, Any]],
           supervision: Mapping[str, Any] | None = None) -> str:
    """Prometheus text exposition (version 0.0.4) of every process's snapshot, and of the
    supervision (expected vs running processes, restarts)."""
    from flakekit import __version__ as version
    from flakekit_server import __version__ as server_version

    fams = {name: _Family(name, kind, help_) for name, kind, help_ in FAMILIES}
    fams["flakekit_build_info"].add(1, version=version, server_version=server_version,
                                    python=platform.python_version())
    if supervision is not None:
        _supervision(fams, supervision)
    for snap in snapshots:
        _process(fams, snap)
    out: list[str] = []
    for fam in fams.values():
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        out.extend(fam.samples)
    return "\n".join(out) + "\n"


def durability_metrics(databases: Mapping[str, Mapping[str, Any]]) -> str:
    """``flakekit_database_synchronous`` (1: commits replicated synchronously) and
    ``flakekit_database_failovers_total`` per backend (docs/replicated-databases.md)."""
    lines = ["# HELP flakekit_database_synchronous 1 when the backend's commits are "
             "replicated synchronously (label verdict: what a commit survives)",
             "# TYPE flakekit_database_synchronous gauge"]
    for name, d in databases.items():
        labels = _labels({"backend": name, "verdict": d.get("verdict") or "unknown"})
        lines.append(f"flakekit_database_synchronous{labels} "
                     f"{1 if d.get('synchronous') else 0}")
    lines += ["# HELP flakekit_database_failovers_total database fail-overs detected",
              "# TYPE flakekit_database_failovers_total counter"]
    for name, d in databases.items():
        lines.append(f"flakekit_database_failovers_total{_labels({'backend': name})} "
                     f"{int(d.get('failovers') or 0)}")
    return "\n".join(lines) + "\n"
