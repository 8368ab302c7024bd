"""Every benchmark in one run, and one markdown report with the ratios (docs/ includes it).

    .venv/bin/python benchmarks/run_all.py                     # full: about 13 minutes
    .venv/bin/python benchmarks/run_all.py --quick             # about 4 minutes
    .venv/bin/python benchmarks/run_all.py --quick --out /tmp/report.md
    .venv/bin/python benchmarks/run_all.py --only bench_ids,bench_startup
    .venv/bin/python benchmarks/run_all.py --plan              # the commands, nothing run

Runs each ``benchmarks/bench_*.py`` in its own process, one after another (found by
name, so a benchmark added later is run too), with the arguments of ``PLAN`` below; a
script that offers ``--json`` is run with it and rendered as tables, one that does not is
quoted. Some scripts run more than once (``runs``: the cluster's crash hand-off five times
on SQL and five times on ZooKeeper membership, worst case reported). ``--quick`` passes
``--quick`` (or shorter settings) to every script, runs each once and skips the long ones
marked below. A script that fails or times out is listed with its last lines; the others
still run. The report starts with issue 24's targets (figure, target, met?) and names the
machine, the load average before and after every script, and every command, so each
figure can be reproduced; ratios are to peers measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import fmt_ms, fmt_rate, load_average

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "docs" / "benchmarks-report.md"
#: the test services' addresses (ZooKeeper, etcd), read when the environment lacks them
SERVICES_ENV = Path("/tmp/flakekit-svc/env")

#: per entry: "script" (default: the entry's name), "args" (full, quick), "timeout"
#: seconds per run (full, quick), "runs" (full, quick), "json" (False: quote the text even
#: if the script has --json), "quick_skip", "needs" (environment variables; missing: the
#: entry is skipped with a note). Scripts not listed run with their --help's --json/--quick.
PLAN: dict[str, dict[str, Any]] = {
    "bench_ids": {"args": (["--repeats", "5", "--seconds", "0.6"], ["--quick"]),
                  "timeout": (300, 120)},
    "bench_startup": {"args": ([], ["--quick"]), "timeout": (600, 300)},
    "bench_server": {"args": (["--duration", "5", "--repeats", "3"], ["--duration", "2"]),
                     "timeout": (300, 180)},
    "bench_server_mixed": {"script": "bench_server", "args": (["--mixed", "--duration", "5"],
                                                              ["--mixed", "--duration", "2"]),
                           "timeout": (300, 180)},
    "bench_cluster_wrk": {"script": "bench_cluster",
                          "args": (["--wrk", "--duration", "4", "--repeats", "3"],
                                   ["--wrk", "--duration", "2", "--repeats", "1"]),
                          "timeout": (300, 180)},
    "bench_cluster": {"args": (["--quick"], ["--quick"]), "timeout": (400, 300)},
    "bench_cluster_handoff_sql": {"script": "bench_cluster", "runs": (4, 1),
                                  "args": (["--quick", "--handoffs-only"],) * 2,
                                  "timeout": (240, 240)},
    "bench_cluster_handoff_zk": {"script": "bench_cluster", "runs": (5, 1), "needs": ["ZK_HOSTS"],
                                 "args": (["--quick", "--handoffs-only", "--membership", "zk"],)
                                 * 2, "timeout": (240, 240)},
    "bench_handoff_windows": {"args": (["planned", "sql", "3"], ["planned", "sql", "1"]),
                              "timeout": (300, 120)},
    "bench_segment": {"timeout": (600, 300)},
    "bench_segment_burst": {"timeout": (300, 120)},
    # 100,000 keys in the table (refresh, cold key), at most 10,000 served (memory per key
    # is flat; serving all 100,000 took most of the script's 200 s)
    "bench_cost_keys": {"args": (["--max-served", "10000"], ["--quick"]),
                        "timeout": (600, 400)},
    "bench_cost_registry": {"timeout": (600, 400)},
    "bench_workers": {"timeout": (600, 240), "quick_skip": True},
    "bench_workers_index": {"timeout": (300, 240)},
    "bench_workers_n": {"args": (["--repeats", "3", "--seconds", "0.6"], ["--quick"]),
                        "timeout": (300, 120)},
    "bench_owners": {"args": (["--repeats", "3"], ["--repeats", "3", "--seconds", "0.3"]),
                     "timeout": (300, 120)},
}
#: the order of the report (others follow, by name)
ORDER = ["bench_ids", "bench_startup", "bench_server", "bench_server_mixed",
         "bench_cluster_wrk", "bench_cluster", "bench_cluster_handoff_sql",
         "bench_cluster_handoff_zk", "bench_handoff_windows", "bench_owners", "bench_segment",
         "bench_segment_burst", "bench_cost_keys", "bench_cost_registry", "bench_workers",
         "bench_workers_index", "bench_workers_n"]
#: the peers of bench_ids.py (the ``benchmarks`` extra): the report checks each was measured
PEERS = ["flakeid", "snowflake-id", "sonyflake", "sonyflake-turbo", "uuid-utils", "python-ulid"]
#: the crash hand-off target: under one lease (the default, 10 s)
LEASE_MS = 10_000.0


def discover() -> list[str]:
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    names += [n for n, plan in PLAN.items() if plan.get("script") in names]
    return [n for n in ORDER if n in names] + [n for n in sorted(names) if n not in ORDER]


@functools.cache
def options(script: Path) -> frozenset[str]:
    """The switches a script's ``--help`` mentions (of --json and --quick)."""
    try:
        out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                             text=True, timeout=60, cwd=ROOT).stdout
    except subprocess.TimeoutExpired:
        return frozenset()
    return frozenset(flag for flag in ("--json", "--quick") if flag in out)


def services_env() -> dict[str, str]:
    """This environment, plus the test services' addresses when it lacks them."""
    env = dict(os.environ)
    try:
        lines = SERVICES_ENV.read_text().splitlines()
    except OSError:
        return env
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and value and key.strip() and key.strip() not in env:
            env[key.strip()] = value.strip()
    return env


def command(name: str, quick: bool, has: set[str] | None = None) -> tuple[list[str], str]:
    """(the script and its arguments, the command as the report shows it)."""
    plan = PLAN.get(name, {})
    script = HERE / f"{plan.get('script', name)}.py"
    args = list(plan.get("args", ([], []))[1 if quick else 0])
    has = set(options(script) if has is None else has)
    if not plan.get("json", True):
        has.discard("--json")
    if "args" not in plan and quick and "--quick" in has:
        args.append("--quick")
    if "--json" in has:
        args.append("--json")
    return [str(script), *args], shlex.join([".venv/bin/python", f"benchmarks/{script.name}",
                                              *args])


def runs_of(name: str, quick: bool) -> int:
    return int(PLAN.get(name, {}).get("runs", (1, 1))[1 if quick else 0])


def run_one(name: str, quick: bool, env: dict[str, str]) -> dict[str, Any]:
    """Run ``name`` (``runs`` times): its data (or text), the command, the load average
    before and after, and the seconds it took."""
    plan = PLAN.get(name, {})
    argv, shown = command(name, quick)
    timeout = plan.get("timeout", (1800, 180))[1 if quick else 0]
    count = runs_of(name, quick)
    result: dict[str, Any] = {"name": name, "command": shown, "runs": count, "ok": True,
                              "load_before": load_average(), "stderr": ""}
    missing = [k for k in plan.get("needs", []) if not env.get(k)]
    if missing:
        result.update(seconds=0.0, load_after=result["load_before"],
                      skipped=f"{', '.join(missing)} not set (the test services' env file "
                              f"{SERVICES_ENV})")
        return result
    start = time.perf_counter()
    outs: list[dict[str, Any]] = []
    for i in range(count):
        one = _run_process([sys.executable, *argv], timeout, env)
        outs.append(one)
        if count > 1:
            print(f"  {name} run {i + 1}/{count}: {'ok' if one['ok'] else one['error']}",
                  file=sys.stderr, flush=True)
    result["seconds"] = time.perf_counter() - start
    result["load_after"] = load_average()
    result["ok"] = all(o["ok"] for o in outs)
    bad = next((o for o in outs if not o["ok"]), None)
    if bad:
        result["error"], result["stderr"] = bad["error"], bad["stderr"]
    if count > 1:
        result["data_runs"] = [o.get("data") for o in outs]
        result["data"] = next((o["data"] for o in outs if o.get("data") is not None), None)
    else:
        result.update({k: v for k, v in outs[0].items() if k in ("data", "text")})
    return result


def _run_process(argv: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or b""
        tail = err.decode(errors="replace") if isinstance(err, bytes) else err
        return {"ok": False, "error": f"timed out after {timeout} s", "stderr": tail[-1500:]}
    out: dict[str, Any] = {"ok": proc.returncode == 0, "stderr": proc.stderr[-1500:]}
    if proc.returncode != 0:
        out["error"] = f"exit status {proc.returncode}"
    if "--json" in argv and proc.stdout.strip():
        try:
            out["data"] = json.loads(proc.stdout[min(i for i in (proc.stdout.find("{"),
                                                                  proc.stdout.find("["))
                                                     if i >= 0):])
        except ValueError:
            out["text"] = proc.stdout
    else:
        out["text"] = proc.stdout
    return out


# -- rendering ------------------------------------------------------------------------------
def rate(value: float | None) -> str:
    return fmt_rate(value, none="-")


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


def render_text_field(data: dict) -> list[str]:
    return ["```text", *data["table"].splitlines(), "```"]


def crash_and_planned(data: dict | None) -> tuple[dict | None, dict | None]:
    drills = {d["drill"]: d for d in (data or {}).get("handoffs", [])}
    return drills.get("crash"), drills.get("planned")


def handoff_runs(results: dict[str, dict], membership: str) -> list[tuple[str, dict | None]]:
    """(command, data) of every bench_cluster run on ``membership`` with hand-off drills."""
    out: list[tuple[str, dict | None]] = []
    names = ["bench_cluster", "bench_cluster_handoff_sql"] if membership == "sql" else [
        "bench_cluster_handoff_zk"]
    for name in names:
        r = results.get(name)
        if not r or r.get("skipped"):
            continue
        datas = r.get("data_runs") or [r.get("data")]
        out += [(r["command"], d) for d in datas]
    return out


def render_handoffs(result: dict, results: dict[str, dict]) -> list[str]:
    membership = "zk" if result["name"].endswith("_zk") else "sql"
    runs = handoff_runs(results, membership)
    label = {"sql": "SQL", "zk": "ZooKeeper"}[membership]
    lines = [f"Crash hand-off (`kill -9` of the key's owner, 3 nodes, default lease 10 s) and "
             f"the planned hand-off before it, every run on {label} membership of this report"
             + (" (the `bench_cluster.py --quick` run above first)" if membership == "sql"
                else "") + ":", "",
             "| run | command | load before / after | took | planned: longest gap | crash: "
             "longest gap | crash: old owner's last / new owner's first answer | crash: 503s | "
             "flakekit.client errors | duplicates |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|---:|"]

    for i, (cmd, data) in enumerate(runs, 1):
        crash, planned = crash_and_planned(data)
        if data is None or crash is None or planned is None:
            lines.append(f"| {i} | `{cmd}` | | | failed | failed | | | | |")
            continue
        lines.append(
            f"| {i} | `{cmd}` | {data['load_before']} / {data['load_after']} | "
            f"{data.get('seconds', 0):.0f} s | {fmt_ms(planned['gap_ms'])} | "
            f"{fmt_ms(crash['gap_ms'])} | "
            f"{fmt_ms(crash['old_owner_last_ms'])} / {fmt_ms(crash['new_owner_first_ms'])} | "
            f"{crash['503s']:,} | {crash['client_errors'] or 'none'} | "
            f"{planned['duplicates'] + crash['duplicates']} |")
    gaps = [c["gap_ms"] for c in (crash_and_planned(d)[0] for _, d in runs) if c]
    if gaps:
        lines += ["", f"Worst crash gap of {len(gaps)} run(s): **{max(gaps):,.0f} ms** "
                  f"(best {min(gaps):,.0f} ms); the target is under one lease "
                  f"({LEASE_MS:,.0f} ms)."]
    return lines


RENDER: dict[str, Callable[[dict], list[str]]] = {
    "bench_ids": render_ids, "bench_startup": render_startup,
    "bench_segment": render_segment, "bench_workers_index": render_workers_index,
    "bench_cost_keys": render_table_field, "bench_cost_registry": render_table_field,
    "bench_cluster": render_table_field, "bench_workers_n": render_workers_n,
    "bench_server": render_text_field, "bench_server_mixed": render_text_field,
    "bench_cluster_wrk": render_text_field}
TITLES = {
    "bench_ids": "IDs per second against the peers",
    "bench_startup": "Start-up of the commands against `import click`",
    "bench_segment": "Segment mode: throughput and tail latency",
    "bench_cost_keys": "Cost curve: segment keys in one service",
    "bench_cost_registry": "Cost curve: the SQL worker registry",
    "bench_workers": "SQL worker allocator: acquire, starters, lease check",
    "bench_workers_index": "Why the workers schema has an index",
    "bench_server": "HTTP server against uvicorn (2 processes each)",
    "bench_server_mixed": "HTTP server: single IDs beside 100,000-ID batches",
    "bench_cluster_wrk": "Cluster request path with wrk: strict vs plain key, forwarded vs "
                         "direct",
    "bench_cluster": "Cluster mode: owner, forwarding node, client library; hand-offs",
    "bench_cluster_handoff_sql": "Cluster crash hand-off, SQL membership: every run",
    "bench_cluster_handoff_zk": "Cluster crash hand-off, ZooKeeper membership: every run",
    "bench_handoff_windows": "Planned hand-off window, in one process (SQL membership)",
    "bench_owners": "Cluster mode: owner-map lookups with 3, 16 and 64 members",
    "bench_segment_burst": "Segment mode: a burst against a database 50 ms away (hunger prefetch)",
    "bench_workers_n": "workers = N: one generator holding N worker ids, against its cap",
}


# -- issue 24's targets ---------------------------------------------------------------------
def _section(name: str) -> str:
    return f"[{name}](#{anchor(TITLES.get(name, name))})"


def anchor(title: str) -> str:
    """The id mkdocs (toc's default slugify) gives a heading."""
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", value).strip().lower())


#: issue 24's figures: key -> (the row's label, the target)
TARGETS = {
    "single": ("HTTP one ID, 2 processes: req/s", "≥ 140,000 req/s"),
    "batch": ("HTTP batches of 1,000: IDs/s", "≥ 10M IDs/s and ahead of uvicorn"),
    "paced": ("HTTP paced at 25,000 req/s: p99.9", "< 5 ms"),
    "strict": ("cluster: strict key on its owner / plain key, req/s", "≥ 0.80"),
    "forwarded": ("cluster: forwarded / direct, req/s", "≥ 0.50"),
    "startup": ("start-up of every no-database command vs `import click`",
                "≤ 2.5× (best, median, CPU)"),
    "next": ("`flakekit next`, embedded default (best / median)", "≤ 350 ms"),
    "peers": ("every peer beside flakekit (bench_ids.py)", ", ".join(PEERS)),
}
#: a figure: (what was measured, whether it meets the target)
Figure = tuple[str, bool]


def _row(what: tuple[str, str], figure: Figure | None, source: str) -> dict[str, Any]:
    measured, met = figure or (None, False)
    return {"row": what[0], "target": what[1], "measured": measured or "not measured",
            "met": bool(met) if measured else False, "source": source}


def _rows(keys: tuple[str, ...], figures: dict[str, Figure], source: str
          ) -> list[dict[str, Any]]:
    return [_row(TARGETS[k], figures.get(k), source) for k in keys]


def target_rows(results: dict[str, dict]) -> list[dict[str, Any]]:
    """Issue 24's figures from this run's results, each with its target and whether it is
    met (a figure not measured is not met)."""
    def data(name: str) -> dict | None:
        return (results.get(name) or {}).get("data")

    rows = _rows(("single", "batch", "paced"), _server_figures(data("bench_server")),
                 "bench_server")
    rows += _rows(("strict", "forwarded"), _wrk_figures(data("bench_cluster_wrk")),
                  "bench_cluster_wrk")
    rows += _startup_rows(data("bench_startup"))
    for membership, label in (("sql", "SQL"), ("zk", "ZooKeeper")):
        rows.append(_handoff_row(results, membership, label))
    return rows + _rows(("peers",), _peer_figures(data("bench_ids")), "bench_ids")


def _handoff_row(results: dict[str, dict], membership: str, label: str) -> dict[str, Any]:
    runs = handoff_runs(results, membership)
    crashes = [c for c in (crash_and_planned(d)[0] for _, d in runs) if c]
    gaps = [c["gap_ms"] for c in crashes]
    dupes = sum(c["duplicates"] for c in crashes)
    figure = None
    if gaps:
        figure = (f"worst {max(gaps):,.0f} ms of {len(gaps)} runs (best {min(gaps):,.0f} ms), "
                  f"{dupes} duplicates",
                  len(gaps) == len(runs) >= 5 and max(gaps) < LEASE_MS and not dupes)
    return _row((f"crash hand-off, {label} membership, five runs (`kill -9`)",
                 f"every run < {LEASE_MS:,.0f} ms (one lease), no duplicate"), figure,
                "bench_cluster_handoff_" + membership)


def _peer_figures(data: dict | None) -> dict[str, Figure]:
    if not data:
        return {}
    seen = [p for p in PEERS if any(r["name"].startswith(p + " ") for r in data["results"])]
    missing = [p for p in PEERS if p not in seen]
    return {"peers": (f"{len(seen)} of {len(PEERS)}"
                      + (f"; missing: {', '.join(missing)}" if missing else ""), not missing)}


def _server_figures(data: dict | None) -> dict[str, Figure]:
    stacks = {s["stack"]: s for s in (data or {}).get("stacks", [])}
    fk, uv = stacks.get("flakekit"), stacks.get("uvicorn")
    if not fk:
        return {}
    single, batch, paced = fk["full"]["rps"], fk["batch"]["ids_per_s"], fk["paced"]
    uv_batch = uv["batch"]["ids_per_s"] if uv else None
    return {
        "single": (f"{single:,.0f}" + (f" (uvicorn {uv['full']['rps']:,.0f}, "
                                       f"{single / uv['full']['rps']:.2f}×)" if uv else ""),
                   single >= 140_000),
        "batch": (f"{rate(batch)}" + (f" (uvicorn {rate(uv_batch)})" if uv_batch else ""),
                  batch >= 10e6 and (uv_batch is None or batch > uv_batch)),
        "paced": (f"{paced['p999_ms']:.2f} ms at {paced['rps']:,.0f} req/s achieved",
                  paced["p999_ms"] < 5)}


def _wrk_figures(data: dict | None) -> dict[str, Figure]:
    if not data:
        return {}
    best = data["wrk"]
    owner, plain, fwd = best["strict, owner"], best["plain, owner"], best["strict, forwarded"]
    strict, forwarded = owner["rps"] / plain["rps"], fwd["rps"] / owner["rps"]
    # three decimals: a ratio just under its target must not print as the target
    return {"strict": (f"{strict:.3f} ({owner['rps']:,.0f} / {plain['rps']:,.0f})",
                       strict >= 0.8),
            "forwarded": (f"{forwarded:.3f} ({fwd['rps']:,.0f} / {owner['rps']:,.0f})",
                          forwarded >= 0.5)}


def _startup_rows(data: dict | None) -> list[dict[str, Any]]:
    source = "bench_startup"
    if not data:
        return _rows(("startup", "next"), {}, source)
    rows = []
    for r in data["results"][1:]:
        if r["command"] == "flakekit next":
            rows.append(_row(TARGETS["next"], (
                f"{r['best_ms']:.0f} / {r['median_ms']:.0f} ms",
                max(r["best_ms"], r["median_ms"]) <= data["next_target_ms"]), source))
        else:
            rows.append(_row((f"start-up `{r['command']}` vs `import click` (best / median / "
                              "CPU)", f"≤ {data['target']:g}× each"), (
                f"{r['ratio']:.2f}× / {r['ratio_median']:.2f}× / {r['cpu_ratio']:.2f}×",
                max(r["ratio"], r["ratio_median"], r["cpu_ratio"]) <= data["target"]), source))
    return rows


def render_targets(rows: list[dict[str, Any]], results: dict[str, dict]) -> list[str]:
    def command_of(source: str) -> str:
        names = ["bench_cluster", source] if source == "bench_cluster_handoff_sql" else [source]
        shown = [f"`{results[n]['command'].removeprefix('.venv/bin/python benchmarks/')}`"
                 + (f" × {results[n]['runs']}" if results[n].get("runs", 1) > 1 else "")
                 for n in names if n in results]
        return " + ".join(shown) or "not run"

    met = sum(r["met"] for r in rows)
    lines = [f"### Issue 24's targets: {met} of {len(rows)} met", "",
             "| figure | target | measured | met? | section: command |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['row']} | {r['target']} | {r['measured']} | "
              f"{'yes' if r['met'] else '**no**'} | {_section(r['source'])}: "
              f"{command_of(r['source'])} |" for r in rows]
    return lines


# -- the report -----------------------------------------------------------------------------
def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
        mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                          if ln.startswith("MemTotal")))
        memory = f", {mem_kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        memory = ""
    return (f"CPython {platform.python_version()} on {platform.machine()} "
            f"({model or 'unknown CPU'}), {cores} cores{memory}, Linux {platform.release()}")


def report(results: list[dict], quick: bool, started: dt.datetime, load: str,
           load_end: str | None = None, total: float | None = None) -> str:
    by_name = {r["name"]: r for r in results}
    took = f", {total / 60:.1f} min in all" if total is not None else ""
    out = [
        "<!-- written by benchmarks/run_all.py; do not edit by hand -->",
        f"Run {started:%Y-%m-%d %H:%M} UTC{' (--quick)' if quick else ''}{took}: {machine()}; "
        f"load average {load} at the start, {load_end or load} at the end. Each section gives "
        "its command and the load average before and after it (on a shared machine compare "
        "ratios, and the best with the median, not absolute numbers across runs).",
        "",
    ]
    if not quick or any(r["name"] in ("bench_server", "bench_startup") for r in results):
        out += render_targets(target_rows(by_name), by_name) + [""]
    for r in results:
        runs = f" × {r['runs']} runs" if r.get("runs", 1) > 1 else ""
        out += [f"### {TITLES.get(r['name'], r['name'])}", "",
                f"`{r['command']}`{runs} ({r['seconds']:.0f} s; load average "
                f"{r.get('load_before', '?')} before, {r.get('load_after', '?')} after)", ""]
        if r.get("skipped"):
            out += [f"Skipped: {r['skipped']}", ""]
            continue
        if not r["ok"]:
            tail = "\n".join(r.get("stderr", "").strip().splitlines()[-6:])
            out += [f"**Failed** ({r.get('error')}):", "", "```text", tail or "(no output)",
                    "```", ""]
        if r["name"].startswith("bench_cluster_handoff_"):
            out += render_handoffs(r, by_name) + [""]
            continue
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
    parser.add_argument("--quick", action="store_true", help="about 4 minutes in all")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the markdown report")
    parser.add_argument("--only", default=None, help="comma-separated entries of the plan")
    parser.add_argument("--plan", action="store_true", help="print the commands and stop")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    load = load_average()
    names = discover()
    if args.only:
        wanted = {n.strip().removesuffix(".py") for n in args.only.split(",")}
        if wanted - set(names):
            parser.error(f"not in the plan: {', '.join(sorted(wanted - set(names)))} "
                         f"(the plan: {', '.join(names)})")
        names = [n for n in names if n in wanted]
    if args.plan:
        for name in names:
            skip = " (skipped: --quick)" if args.quick and PLAN.get(name, {}).get(
                "quick_skip") else ""
            print(f"{name}: {command(name, args.quick)[1]} x {runs_of(name, args.quick)}{skip}")
        return 0
    print(f"{machine()}; load average {load}", file=sys.stderr)
    env = services_env()
    results = []
    for name in names:
        if args.quick and PLAN.get(name, {}).get("quick_skip"):
            results.append({"name": name, "command": command(name, False)[1], "seconds": 0,
                            "ok": True, "skipped": "long; run without --quick to include it"})
            print(f"{name}: skipped (--quick)", file=sys.stderr)
            continue
        print(f"{name}: start, load average {load_average()}", file=sys.stderr, flush=True)
        result = run_one(name, args.quick, env)
        results.append(result)
        status = result.get("skipped") and "skipped" or (
            "ok" if result["ok"] else result.get("error"))
        print(f"{name}: {status} ({result['seconds']:.0f} s), load average "
              f"{result['load_after']}", file=sys.stderr, flush=True)
    total = time.perf_counter() - t0
    text = report(results, args.quick, started, load, load_average(), total)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({total / 60:.1f} min)", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
