"""The numbers of this process and of its siblings: the snapshot every process publishes
(for /metrics, /ready, /api/v1/status and the monitor page), read back from the run
directory, and the supervisor's view of which processes should be running."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from flakekit.plugin import HasStats, SegmentStats, SnowflakeStats
from flakekit_server.metrics import EVENTS, os_stats
from flakekit_server.service_base import ServiceBase

__all__ = ["RATE_SAMPLES", "STALE_S", "Reports", "describe"]

#: seconds of per-second IDs counts kept per generator (the monitor page's sparklines)
RATE_SAMPLES = 300
#: a snapshot of another process older than this counts as "not ready"
STALE_S = 5.0


class Reports(ServiceBase):
    """The snapshots of an :class:`~flakekit_server.app.IdService`."""

    def snapshot(self) -> dict[str, Any]:
        """This process's numbers (JSON-able), for /metrics, /ready and the monitor page."""
        gens = []
        problems: list[str] = []
        where = f"process {self.process}: " if self.options.workers > 1 else ""
        for name, gen in self.generators.items():
            try:
                stats = gen.stats() if isinstance(gen, HasStats) else None
                service = self.key_services.get(name)
                others = list(service.stats().values()) if service is not None else []
                info = describe(name, self.info[name], stats, others)
            except Exception as exc:  # noqa: BLE001 - a broken stats() is a problem, not a crash
                info = {"name": name, "strategy": self.strategy[name],
                        "kind": _kind(self.info[name]), "ready": False,
                        "problem": f"stats() failed: {exc}"}
            info["issued"] = self.issued_count(name)
            samples = list(self.rate_samples[name])
            info["rate_per_s"] = [after - before for before, after in pairwise(samples)]
            gens.append(info)
            if not info["ready"]:
                problems.append(f"{where}generator {name!r}: {info['problem']}")
        if self.stopping:
            problems.append(f"{where}shutting down")
        cluster = None
        if self.cluster is not None:
            cluster = self.cluster.snapshot()
            lease = (cluster["status"].get("lease") or {}).get("remaining_s")
            if isinstance(lease, (int, float)) and lease <= 0:
                problems.append(f"{where}cluster membership lapsed {-lease:.1f} s ago: no strict "
                                "key is served (the membership store is unreachable?)")
        return {
            "process": self.process, "pid": os.getpid(), "started": self.started,
            "time": time.time(), "ready": not problems, "problems": problems,
            "generators": gens, "http": self.stats.snapshot(), "events": EVENTS.snapshot(),
            "os": os_stats(), "offloaded_batches": self.offloaded, "cluster": cluster,
        }

    def sample_rates(self) -> None:
        """Record the issued counters (called once a second by the process's tick)."""
        for name, ring in self.rate_samples.items():
            ring.append(self.issued_count(name))

    def snapshots(self) -> list[dict[str, Any]]:
        """This process's live snapshot and the latest of every sibling process."""
        own = self.snapshot()
        out = [own]
        if self.run_dir is None:
            return out
        now = time.time()
        for file in sorted(self.run_dir.glob("process-*.json")):
            try:
                snap = json.loads(file.read_text())
            except (OSError, ValueError):
                continue
            if snap.get("process") == self.process:
                continue
            age = now - float(snap.get("time", 0))
            if age > STALE_S:
                snap["stale"] = True
                snap["ready"] = False
                snap["problems"] = [*snap.get("problems", []),
                                    f"process {snap.get('process')}: no report for {age:.0f} s"]
            out.append(snap)
        out.sort(key=lambda s: s["process"])
        return out

    def supervision(self, snaps: list[dict[str, Any]]) -> dict[str, Any]:
        """Expected vs running processes and restarts (the supervisor's ``supervisor.json``);
        a process that is expected but not serving is a problem (so /ready is 503)."""
        expected = self.options.workers
        sup: dict[str, Any] = {}
        if self.run_dir is not None:
            try:
                sup = json.loads((self.run_dir / "supervisor.json").read_text())
            except (OSError, ValueError):
                sup = {}
        known = {p.get("process"): p for p in sup.get("processes", []) if isinstance(p, dict)}
        reporting = {s["process"]: s for s in snaps}
        processes, problems = [], []
        for i in range(expected):
            info = known.get(i, {})
            snap = reporting.get(i)
            running = snap is not None and not snap.get("stale")
            restarts = int(info.get("restarts") or 0)
            processes.append({"process": i, "pid": snap["pid"] if snap else info.get("pid"),
                              "running": running, "restarts": restarts,
                              "last_error": info.get("last_error")})
            if snap is None:  # a stale one already says "no report for N s"
                why = f"; last error: {info['last_error']}" if info.get("last_error") else ""
                problems.append(f"process {i} is not running (restarted {restarts} times{why})")
        return {"expected": expected, "running": sum(p["running"] for p in processes),
                "restarts": sum(p["restarts"] for p in processes), "processes": processes,
                "problems": problems}

    def write_snapshot(self) -> None:
        """Publish this process's snapshot for its siblings (atomic rename)."""
        if self.run_dir is None:
            return
        data = json.dumps(self.snapshot(), default=str)
        tmp = self.run_dir / f".process-{self.process}.tmp"
        tmp.write_text(data)
        os.replace(tmp, self.run_dir / f"process-{self.process}.json")


def _kind(what: Any) -> str:
    """``"time-ordered"`` (a layout, a worker lease), ``"segment"`` (ranges of a key) or
    ``"other"`` (a plugin's strategy with neither)."""
    return "time-ordered" if what.layout is not None else (
        "segment" if what.key is not None else "other")


def describe(name: str, what: Any, stats: Any,
             others: Iterable[SegmentStats] = ()) -> dict[str, Any]:
    """A generator's stats, normalised, with readiness and the reason when not ready;
    ``what`` is its :class:`GeneratorInfo` (``Kit.describe``), ``others`` the stats of the
    other keys its table serves (a segment generator's :class:`SegmentService`)."""
    kind = _kind(what)
    info: dict[str, Any] = {"name": name, "strategy": what.strategy, "kind": kind}
    problem: str | None = None
    if kind == "time-ordered" and isinstance(stats, SnowflakeStats):
        for field in ("layout", "clock", "ids_drawn", "worker_id", "epoch", "lease_remaining_s",
                      "renewals", "renew_failures", "lost", "acquires", "acquire_ns_total"):
            info[field] = getattr(stats, field)
        info["acquire_buckets"] = list(stats.acquire_buckets)
        remaining = stats.lease_remaining_s
        if stats.lost:
            problem = f"lease lost: {stats.lost}"
        elif stats.worker_id is None:
            problem = "no worker lease"
        elif remaining is not None and remaining <= 0:
            problem = (f"lease on worker {stats.worker_id} expired {-remaining:.1f} s ago"
                       " (renewals failing)")
    elif kind == "segment" and isinstance(stats, SegmentStats):
        by_key = {stats.key: stats, **{o.key: o for o in others}}  # its own key first
        keys = []
        empty = []
        for key in by_key.values():
            buffers = [
                {f: getattr(b, f) for f in ("slot", "ready", "start", "position", "end", "step",
                                            "idle")}
                for b in key.buffers
            ]
            entry: dict[str, Any] = {f: getattr(key, f) for f in (
                "key", "step", "min_step", "max_id", "fetches", "fetch_failures", "fetch_ms_last",
                "fetch_ms_max", "fetch_ms_mean", "waits", "unavailable", "last_error")}
            entry["buffers"] = buffers
            keys.append(entry)
            if not any(b["ready"] for b in buffers):
                empty.append(str(entry["key"]))
        info["keys"] = keys
        if stats.closed:
            problem = "closed"
        elif empty:
            problem = f"no buffer ready for key {', '.join(map(repr, empty))}"
    # else: a plugin's strategy or record: nothing to judge
    info["ready"] = problem is None
    info["problem"] = problem
    return info
