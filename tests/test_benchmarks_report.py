"""benchmarks/run_all.py: its plan runs every script issue 24's report needs, and the report
rendered from canned results has every target row with its figure, target and verdict.

Nothing is run or timed: the results are canned JSON in the shape the scripts print.
"""

from __future__ import annotations

import datetime as dt
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def run_all() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("run_all")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_full_plan_runs_every_required_command(run_all: Any) -> None:
    names = run_all.discover()
    shown = {n: run_all.command(n, False, {"--json", "--quick"})[1] for n in names}
    assert "--duration 5" in shown["bench_server"]
    assert "--wrk" in shown["bench_cluster_wrk"]
    assert "--json" in shown["bench_cluster_wrk"]
    assert "--quick" in shown["bench_cluster"]
    assert "--membership zk" in shown["bench_cluster_handoff_zk"]
    assert "--handoffs-only" in shown["bench_cluster_handoff_sql"]
    # five crash hand-offs per membership: bench_cluster's own run is the first SQL one
    assert run_all.runs_of("bench_cluster", False) + run_all.runs_of(
        "bench_cluster_handoff_sql", False) == 5
    assert run_all.runs_of("bench_cluster_handoff_zk", False) == 5
    for name in ("bench_ids", "bench_startup", "bench_server"):
        assert name in names and "--json" in shown[name]
    # every bench_*.py script is in the plan or run by discovery, in the report's order
    scripts = {p.stem for p in BENCHMARKS.glob("bench_*.py")}
    assert scripts <= set(names)


def _stack(name: str, single: float, batch_ids: float, p999: float) -> dict[str, Any]:
    row = {"rps": single, "errors": 0, "non2xx": 0, "p50_ms": 0.3, "p99_ms": 1.0,
           "p999_ms": p999, "max_ms": 5.0, "requests": 1}
    return {"stack": name, "full": row, "paced": {**row, "rps": 25_100.0},
            "batch": {**row, "rps": batch_ids / 1000, "ids_per_s": batch_ids}}


def _handoffs(crash_ms: float, load: str = "1.00 1.00 1.00") -> dict[str, Any]:
    def drill(name: str, gap: float) -> dict[str, Any]:
        return {"drill": name, "detail": "x", "action_ms": 1.0, "old_owner_last_ms": 1.0,
                "new_owner_first_ms": gap, "gap_ms": gap, "raw_gap_ms": gap, "503s": 3,
                "client_gap_ms": gap, "client_errors": {}, "answers": 100, "duplicates": 0,
                "refused": {}, "client_error_messages": {}}
    return {"throughput": [], "handoffs": [drill("planned", 80.0), drill("crash", crash_ms)],
            "membership": "sql", "load_before": load, "load_after": load}


def _started(command: str, best: float, median: float, ratio: float, ratio_median: float,
             cpu: float, cpu_ratio: float, within_target: bool) -> dict[str, Any]:
    """One row of bench_startup's results: ``command``'s start-up in ms (best, median,
    CPU) and as ratios to ``import click``'s."""
    return {"command": command, "best_ms": best, "median_ms": median, "ratio": ratio,
            "ratio_median": ratio_median, "cpu_ms": cpu, "cpu_ratio": cpu_ratio,
            "within_target": within_target}


def canned(run_all: Any) -> list[dict[str, Any]]:
    peers = ["flakekit next_id() (snowflake, monotonic, static)",
             "flakeid make_generator(PRESET_TWITTER).next_id", "snowflake-id next(gen)",
             "sonyflake Sonyflake(...).next_id (default 39/8/16, 10 ms)",
             "sonyflake-turbo SonyFlake(64 machine ids) next()", "uuid-utils uuid7()",
             "python-ulid ULID()"]
    ids = {"repeats": 5, "seconds": 0.6, "skipped": [], "results": [
        {"name": n, "best": 1e6, "median": 1e6, "ns_per_id": 1000.0, "cap": None,
         "checked": "", "note": ""} for n in peers]}
    startup = {"target": 2.5, "next_target_ms": 350.0, "timer": "t", "runs": 30,
               "bytecode": "cached", "python": "3.11", "plugins": [],
               "load": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], "results": [
                   _started('python -c "import click"', 35.0, 37.0, 1.0, 1.0, 35.0, 1.0, True),
                   _started("flakekit --help", 79.0, 84.0, 2.25, 2.28, 80.0, 2.3, True),
                   _started("flakekit layout list", 99.0, 99.0, 2.6, 2.28, 80.0, 2.3, False),
                   _started("flakekit next", 300.0, 320.0, 8.0, 8.0, 290.0, 8.0, True)]}
    server = {"stacks": [_stack("flakekit", 162_000.0, 27.8e6, 1.5),
                         _stack("uvicorn", 54_000.0, 23.4e6, 3.2)], "table": "flakekit ..."}
    owner = {"rps": 30_000.0, "p50_ms": 0.5, "p99_ms": 2.0, "node_cpu_us": 30.0, "errors": 0}
    wrk = {"wrk": {"strict, owner": owner, "plain, owner": {**owner, "rps": 33_000.0},
                   "strict, forwarded": {**owner, "rps": 12_000.0}}, "table": "cluster ..."}
    common = {"ok": True, "seconds": 1.0, "load_before": "1", "load_after": "1", "runs": 1}
    return [
        {"name": "bench_ids", "command": "ids", "data": ids, **common},
        {"name": "bench_startup", "command": "startup", "data": startup, **common},
        {"name": "bench_server", "command": "server", "data": server, **common},
        {"name": "bench_cluster_wrk", "command": "wrk", "data": wrk, **common},
        {"name": "bench_cluster", "command": "cluster --quick", "data": _handoffs(8_800.0),
         **common},
        {"name": "bench_cluster_handoff_sql", "command": "cluster sql", **common, "runs": 4,
         "data_runs": [_handoffs(8_900.0)] * 4},
        {"name": "bench_cluster_handoff_zk", "command": "cluster zk", **common, "runs": 5,
         "data_runs": [_handoffs(8_700.0)] * 4 + [_handoffs(10_400.0)]},
    ]


def test_the_report_has_every_target_row_with_its_verdict(run_all: Any) -> None:
    results = canned(run_all)
    text = run_all.report(results, False, dt.datetime(2026, 12, 5, tzinfo=dt.UTC),
                          "1.00 1.00 1.00")
    rows = {r["row"]: r for r in run_all.target_rows({r["name"]: r for r in results})}
    met = {label: r["met"] for label, r in rows.items()}
    assert met == {
        "HTTP one ID, 2 processes: req/s": True,
        "HTTP batches of 1,000: IDs/s": True,
        "HTTP paced at 25,000 req/s: p99.9": True,
        "cluster: strict key on its owner / plain key, req/s": True,
        "cluster: forwarded / direct, req/s": False,          # 0.40
        "start-up `flakekit --help` vs `import click` (best / median / CPU)": True,
        "start-up `flakekit layout list` vs `import click` (best / median / CPU)": False,
        "`flakekit next`, embedded default (best / median)": True,
        "crash hand-off, SQL membership, five runs (`kill -9`)": True,
        "crash hand-off, ZooKeeper membership, five runs (`kill -9`)": False,  # one 10.4 s
        "every peer beside flakekit (bench_ids.py)": True,
    }
    assert rows["crash hand-off, SQL membership, five runs (`kill -9`)"]["measured"].startswith(
        "worst 8,900 ms of 5 runs")
    assert "### Issue 24's targets: 8 of 11 met" in text
    for label in met:
        assert f"| {label} |" in text
    # each section names its command and the load average around it
    assert "`cluster zk` × 5 runs (1 s; load average 1 before, 1 after)" in text
    assert "Worst crash gap of 5 run(s): **10,400 ms**" in text


def test_a_missing_figure_is_not_met(run_all: Any) -> None:
    rows = run_all.target_rows({})
    assert rows and not any(r["met"] for r in rows)
    assert all(r["measured"] == "not measured" for r in rows)


def test_anchors_follow_mkdocs_slugs(run_all: Any) -> None:
    assert run_all.anchor("Start-up of the commands against `import click`") == (
        "start-up-of-the-commands-against-import-click")
    assert run_all.anchor("workers = N: one generator") == "workers-n-one-generator"
