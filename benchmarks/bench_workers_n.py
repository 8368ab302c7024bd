"""``workers = N``: IDs/s of one generator holding N worker ids, against its N-fold cap.

    .venv/bin/python benchmarks/bench_workers_n.py            # best of 5 x ~1 s per row
    .venv/bin/python benchmarks/bench_workers_n.py --quick    # best of 3 x ~0.3 s
    .venv/bin/python benchmarks/bench_workers_n.py --json

Rows: Sonyflake (39/8/16 at 10 ms: 25,600 IDs/s per machine id) with 1 and 64 machine
ids, whose cap is 64 x 25,600 = 1,638,400 IDs/s; Snowflake (41/10/12 at 1 ms: 4,096,000
IDs/s per worker) with 1 and 2 ids; and sonyflake-turbo (C) with the same 64 machine ids,
side by side. Timed like bench_ids.py (its ``run``: chunks of ~0.1 s of
``[f() for _ in repeat(None, n)]``); every flakekit ID of the timed runs is checked
(unique, strictly increasing). The ``static`` allocator with ``worker_id = "0-63"`` is the
one-line way to get the 64 ids; with ``sql`` it is ``workers = 64``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt_rate, md_table
from bench_ids import Check, Result, add_timing_switches, run, run_rows


def bench(repeats: int, seconds: float) -> list[Result]:
    from flakekit.builtin.layouts import SNOWFLAKE, SONYFLAKE
    from flakekit.builtin.static import StaticAllocator, StaticSettings
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.values.clock import MonotonicClock

    opts: dict[str, Any] = {"repeats": repeats, "seconds": seconds}
    results: list[Result] = []

    def flakekit_row(label: str, layout: Any, ids: Any, n: int) -> None:
        gen = SnowflakeGenerator(layout, MonotonicClock(),
                                 StaticAllocator(StaticSettings(worker_id=ids)),
                                 name="bench", workers=n).start()
        cap = layout.capacity().ids_per_second_per_worker * n
        check = Check()
        res = run(label, gen.next_id, cap=cap, check=check.ids, **opts)
        res.checked = check.summary()
        results.append(res)
        gen.close()

    flakekit_row("flakekit sonyflake, workers = 1", SONYFLAKE, 1, 1)
    flakekit_row("flakekit sonyflake, workers = 64", SONYFLAKE, "0-63", 64)
    flakekit_row("flakekit snowflake, workers = 1", SNOWFLAKE, 1, 1)
    flakekit_row("flakekit snowflake, workers = 2", SNOWFLAKE, "1-2", 2)
    try:
        import sonyflake_turbo
    except ImportError:
        print("sonyflake-turbo not installed (pip install -e '.[benchmarks]'); skipped",
              file=sys.stderr)
    else:
        turbo = sonyflake_turbo.SonyFlake(*range(64))
        check = Check()
        res = run("sonyflake-turbo SonyFlake(*range(64)) (C)", turbo.__next__,
                  cap=25_600 * 64, check=check.ids, **opts)
        res.checked = check.summary()
        results.append(res)
    return results


def table(results: list[Result]) -> str:
    header = ("generator", "IDs/s best", "median", "ns/ID", "cap (N x per id)", "% of cap",
              "vs 4.096M")
    rows = [(r.name, fmt_rate(r.best), fmt_rate(r.median), f"{1e9 / r.best:,.0f}",
             fmt_rate(r.cap), f"{100 * r.best / r.cap:.1f}%" if r.cap else "-",
             f"{r.best / 4_096_000:.2f}x") for r in results]
    lines = md_table(header, rows)
    notes = [f"* {r.name}: {r.checked}" for r in results if r.checked]
    return "\n".join([*lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_switches(parser)
    args = parser.parse_args(argv)
    return run_rows(args, bench, lambda r: {
        "name": r.name, "best": r.best, "median": r.median, "cap": r.cap,
        "share_of_cap": r.best / r.cap if r.cap else None, "checked": r.checked},
        "row", table)


if __name__ == "__main__":
    sys.exit(main())
