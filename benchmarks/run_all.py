"""Every benchmark in one run, and one markdown report with the ratios (docs/ includes it).

    .venv/bin/python benchmarks/run_all.py                     # full (tens of minutes)
    .venv/bin/python benchmarks/run_all.py --quick             # about 3 minutes
    .venv/bin/python benchmarks/run_all.py --quick --out docs/benchmarks-report.md
    .venv/bin/python benchmarks/run_all.py --only bench_ids,bench_startup

Runs each ``benchmarks/bench_*.py`` in its own process, one after another (found by
name, so a benchmark added later is run too). A script that offers ``--json`` is run with
it and rendered here as tables; one that does not is run as it is and its output is
quoted. ``--quick`` passes ``--quick`` to the scripts that have it and skips the long
ones marked below. A script that fails or times out is listed with its last lines; the
others still run. The report names the machine, the load and every command, so the
numbers can be reproduced; ratios are to peers measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "docs" / "benchmarks-report.md"

#: per script: extra arguments (full, quick), timeout seconds (full, quick), and whether
#: --quick skips it; scripts not listed get their --json/--quick from their --help
PLAN: dict[str, dict[str, Any]] = {
    "bench_ids": {"timeout": (900, 120)},
    "bench_startup": {"timeout": (900, 300)},
    "bench_segment": {"timeout": (1200, 150)},
    "bench_cost_keys": {"timeout": (1800, 150)},
    "bench_cost_registry": {"timeout": (1800, 240)},
    "bench_workers_index": {"timeout": (900, 240), "quick_skip": True},
    "bench_workers": {"timeout": (900, 240), "quick_skip": True},
    "bench_server": {"args": ([], ["--duration", "3"]), "timeout": (1200, 180),
                     "quick_skip": True},
    # a second run of a script: "script" names it, "json" False quotes its text
    "bench_server_mixed": {"script": "bench_server", "json": False,
                           "args": (["--mixed", "--duration", "10"],
                                    ["--mixed", "--duration", "3"]),
                           "timeout": (600, 180)},
}
#: the order of the report (others follow, by name)
ORDER = ["bench_ids", "bench_startup", "bench_segment", "bench_cost_keys",
         "bench_cost_registry", "bench_workers", "bench_workers_index", "bench_server",
         "bench_server_mixed"]


def discover() -> list[str]:
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    names += [n for n, plan in PLAN.items() if plan.get("script") in names]
    return [n for n in ORDER if n in names] + [n for n in sorted(names) if n not in ORDER]


def options(script: Path) -> set[str]:
    """The switches a script's ``--help`` mentions (of --json and --quick)."""
    try:
        out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                             text=True, timeout=60, cwd=ROOT).stdout
    except subprocess.TimeoutExpired:
        return set()
    return {flag for flag in ("--json", "--quick") if flag in out}


def run_one(name: str, quick: bool) -> dict[str, Any]:
    plan = PLAN.get(name, {})
    script = HERE / f"{plan.get('script', name)}.py"
    has = options(script)
    if not plan.get("json", True):
        has.discard("--json")
    args = list(plan.get("args", ([], []))[1 if quick else 0])
    if quick and "--quick" in has:
        args.append("--quick")
    if "--json" in has:
        args.append("--json")
    timeout = plan.get("timeout", (1800, 180))[1 if quick else 0]
    argv = [sys.executable, str(script), *args]
    shown = shlex.join([".venv/bin/python", f"benchmarks/{script.name}", *args])
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-600:]
        return {"name": name, "command": shown, "ok": False, "seconds": timeout,
                "error": f"timed out after {timeout} s",
                "stderr": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {"name": name, "command": shown, "seconds": seconds,
                              "ok": proc.returncode == 0, "stderr": proc.stderr[-1500:]}
    if proc.returncode != 0:
        result["error"] = f"exit status {proc.returncode}"
    if "--json" in has and proc.stdout.strip():
        try:
            result["data"] = json.loads(proc.stdout[proc.stdout.index("{"):])
        except ValueError:
            result["text"] = proc.stdout
    else:
        result["text"] = proc.stdout
    return result


# -- rendering ------------------------------------------------------------------------------
def rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def render_ids(data: dict) -> list[str]:
    rows = data["results"]
    flakekit = next(r for r in rows if r["name"].startswith("flakekit next_id()"))
    lines = ["| generator | IDs/s best | median | ns/ID | flakekit next_id() / this | "
             "this / its cap |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cap = f"{r['best'] / r['cap']:.0%}" if r["cap"] else "no cap"
        lines.append(f"| {r['name']} | {rate(r['best'])} | {rate(r['median'])} | "
                     f"{r['ns_per_id']:,.0f} | {flakekit['best'] / r['best']:.2f}× | {cap} |")
    lines.append("")
    lines += [f"* {r['name']}: {'; '.join(x for x in (r['checked'], r['note']) if x)}"
              for r in rows if r["checked"] or r["note"]]
    if data.get("skipped"):
        lines.append(f"* not installed, skipped: {', '.join(data['skipped'])} "
                     "(`pip install -e '.[benchmarks]'`)")
    lines.append(f"* best of {data['repeats']} repeats × ~{data['seconds']:g} s each")
    return lines


def render_startup(data: dict) -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_startup", HERE / "bench_startup.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.table(data).splitlines()


def render_segment(data: dict) -> list[str]:
    t = data["throughput_ids_per_s"]
    lines = ["| one thread | IDs/s |", "|---|---:|"]
    lines += [f"| {name} | {rate(v)} |" for name, v in t.items()]
    lines.append(f"| segment / snowflake `next_id()` | "
                 f"{t['segment next_id()'] / t['snowflake next_id()']:.2f}× |")
    lat = data.get("latency")
    if lat:
        lines += ["", f"`next_id()` latency, {lat['calls']:,} calls, {lat['backend']} behind a "
                  f"proxy adding {lat['delay_ms']:.0f} ms per round trip (step {lat['step']:,}):",
                  "", "| | p50 µs | p99 µs | p99.9 µs | max µs |", "|---|---:|---:|---:|---:|"]
        for name, v in lat["latency_us"].items():
            lines.append(f"| {name} | {v['p50']:.2f} | {v['p99']:.2f} | {v['p99.9']:.2f} | "
                         f"{v['max']:.1f} |")
        lines += ["",
                  f"Segment fetches {lat['fetches']}, mean fetch {lat['fetch_ms_mean']:.1f} ms, "
                  f"calls that waited for a refill: {lat['waits']}."]
    return lines


def render_workers_index(data: dict) -> list[str]:
    return ["| 65,536 rows per service, median of " + str(data["runs"]) + " | with the index | "
            "without | ratio |", "|---|---:|---:|---:|",
            *(f"| {label} | {v['with_index']:.2f} ms | {v['without']:.2f} ms | "
              f"{v['without'] / v['with_index']:.1f}× |"
              for label, v in (("1 h tier query", data["tier_query_ms"]),
                               ("whole acquire()", data["acquire_ms"])))]


def render_workers_n(data: dict) -> list[str]:
    lines = ["| generator | IDs/s best | median | ns/ID | cap (N × per id) | best / cap | "
             "best / 4.096M |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in data["results"]:
        lines.append(f"| {r['name']} | {rate(r['best'])} | {rate(r['median'])} | "
                     f"{1e9 / r['best']:,.0f} | {rate(r['cap'])} | {r['best'] / r['cap']:.1%} | "
                     f"{r['best'] / 4_096_000:.2f}× |")
    lines.append("")
    lines += [f"* {r['name']}: {r['checked']}" for r in data["results"] if r.get("checked")]
    return lines


def render_table_field(data: dict) -> list[str]:
    lines = data["table"].splitlines()
    if data.get("image"):
        rel = os.path.relpath(data["image"], ROOT / "docs")
        lines += ["", f"![{Path(rel).stem}]({rel})"]
    return lines


RENDER = {"bench_ids": render_ids, "bench_startup": render_startup,
          "bench_segment": render_segment, "bench_workers_index": render_workers_index,
          "bench_cost_keys": render_table_field, "bench_cost_registry": render_table_field,
          "bench_cluster": render_table_field, "bench_workers_n": render_workers_n}
TITLES = {
    "bench_ids": "IDs per second against the peers",
    "bench_startup": "Start-up of the commands that need no database",
    "bench_segment": "Segment mode: throughput and tail latency",
    "bench_cost_keys": "Cost curve: segment keys in one service",
    "bench_cost_registry": "Cost curve: the SQL worker registry",
    "bench_workers": "SQL worker allocator: acquire, starters, lease check",
    "bench_workers_index": "Why the workers schema has an index",
    "bench_server": "HTTP server",
    "bench_server_mixed": "HTTP server: single IDs beside 100,000-ID batches",
    "bench_cluster": "Cluster mode: owner, forwarding node, client library; hand-offs",
    "bench_owners": "Cluster mode: owner-map lookups with 3, 16 and 64 members",
    "bench_segment_burst": "Segment mode: a burst against a database 50 ms away (hunger prefetch)",
    "bench_workers_n": "workers = N: one generator holding N worker ids, against its cap",
}


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def report(results: list[dict], quick: bool, started: dt.datetime, load: str) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [
        "<!-- written by benchmarks/run_all.py; do not edit by hand -->",
        f"Run {started:%Y-%m-%d %H:%M} UTC{' (--quick)' if quick else ''}: CPython "
        f"{platform.python_version()} on {platform.machine()}, {cores} cores, "
        f"load average {load} at the start (a shared machine: compare ratios, and the best "
        "with the median, not absolute numbers across runs).",
        "",
    ]
    for r in results:
        out += [f"### {TITLES.get(r['name'], r['name'])}", "",
                f"`{r['command']}` ({r['seconds']:.0f} s)", ""]
        if r.get("skipped"):
            out += [f"Skipped: {r['skipped']}", ""]
            continue
        if not r["ok"]:
            tail = "\n".join(r.get("stderr", "").strip().splitlines()[-6:])
            out += [f"**Failed** ({r.get('error')}):", "", "```text", tail or "(no output)",
                    "```", ""]
            if not r.get("data") and not r.get("text"):
                continue
        if r.get("data") is not None and r["name"] in RENDER:
            try:
                out += RENDER[r["name"]](r["data"]) + [""]
                continue
            except (KeyError, TypeError, ValueError, StopIteration, ZeroDivisionError) as exc:
                out += [f"(could not render the JSON: {type(exc).__name__}: {exc})", ""]
        body = r.get("text") or (json.dumps(r["data"], indent=2) if r.get("data") else "")
        out += ["```text", body.strip() or "(no output)", "```", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 3 minutes in all")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the markdown report")
    parser.add_argument("--only", default=None, help="comma-separated script names")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    load = load_average()
    names = discover()
    if args.only:
        wanted = {n.strip().removesuffix(".py") for n in args.only.split(",")}
        names = [n for n in names if n in wanted]
    results = []
    for name in names:
        if args.quick and PLAN.get(name, {}).get("quick_skip"):
            results.append({"name": name, "command": f".venv/bin/python benchmarks/{name}.py",
                            "seconds": 0, "ok": True,
                            "skipped": "long; run without --quick to include it"})
            print(f"{name}: skipped (--quick)", file=sys.stderr)
            continue
        print(f"{name} ...", file=sys.stderr, flush=True)
        result = run_one(name, args.quick)
        results.append(result)
        print(f"{name}: {'ok' if result['ok'] else result.get('error')} "
              f"({result['seconds']:.0f} s)", file=sys.stderr)
    text = report(results, args.quick, started, load)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
