"""Cost curve: the SQL worker registry as it fills (0 -> 1,000 of 1,024 ids taken), and
256 concurrent starters, on PostgreSQL and MariaDB (and SQLite for the fill curve).

    .venv/bin/python benchmarks/bench_cost_registry.py            # fill curve + 256 starters
    .venv/bin/python benchmarks/bench_cost_registry.py --quick    # fill curve only, fewer rounds
    .venv/bin/python benchmarks/bench_cost_registry.py --json

Fill curve: a ``snowflake`` service (worker ids 0..1023) on a fresh database; live leases
are taken one by one by allocators with their own host identities (as starting processes
would), and at each level (0, 64, 256, 512, 768, 900, 1,000 taken) a probe process
identity does ``acquire()`` + ``release()`` several times: median and p90 of the acquire.
Starters: 256 threads, each its own allocator and identity, released together behind a
barrier, sharing a 40-connection pool; every id must come out distinct.

The table says where the cost stops being flat and why; the PNG goes to
``docs/images/cost-registry.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from _common import emit, pyplot, save_plot, start_together, time_acquire
from sqlalchemy import create_engine

from flakekit.leases.lease import LeaseRequest
from flakekit.sql.schema import init_schema
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import fresh_database
from flakekit.values.clock import MonotonicClock

IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images" / "cost-registry.png"
LEVELS = [0, 64, 256, 512, 768, 900, 1000]
MAX_ID = 1023
SERVERS = {
    "PostgreSQL": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "MariaDB": "mysql+pymysql://root@127.0.0.1:3306/test",
}


def allocator(engine, i: int) -> SqlWorkerAllocator:
    return SqlWorkerAllocator(engine=engine, service="bench", clock=MonotonicClock(),
                              host=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", port=1)


@contextlib.contextmanager
def database(name: str, url: str | None):
    """A fresh database on the server (or a SQLite file), its URL."""
    if name == "SQLite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/registry.db"
        return
    with fresh_database(url) as fresh:
        yield fresh


def fill_curve(url: str, rounds: int) -> list[dict]:
    engine = create_engine(url, pool_size=5, max_overflow=5)
    init_schema(engine, "workers")
    req = LeaseRequest("bench", MAX_ID, "", 0)
    taken = 0
    rows = []
    try:
        for level in LEVELS:
            while taken < level:  # live leases held by other "processes"
                allocator(engine, 1 + taken).acquire(req)
                taken += 1
            times = []
            probe = allocator(engine, 60_000)
            for _ in range(rounds):
                time_acquire(probe, req, times)
            times.sort()
            rows.append({"taken": level, "median_ms": statistics.median(times) * 1e3,
                         "p90_ms": times[min(len(times) - 1, int(len(times) * 0.9))] * 1e3})
    finally:
        engine.dispose()
    return rows


def starters(url: str, count: int = 256, pool: int = 40) -> dict:
    engine = create_engine(url, pool_size=pool, max_overflow=0, pool_timeout=300)
    init_schema(engine, "workers")
    req = LeaseRequest("bench", MAX_ID, "", 0)
    allocators = [allocator(engine, i) for i in range(count)]
    took, got, errors, wall = start_together(lambda a: a.acquire(req).worker_id, allocators)
    engine.dispose()
    return {"starters": count, "pool": pool, "wall_ms": wall * 1e3,
            "acquires_per_s": len(got) / wall, "median_ms": statistics.median(took) * 1e3,
            "p90_ms": took[int(len(took) * 0.9)] * 1e3, "max_ms": took[-1] * 1e3,
            "distinct": len(set(got)) == len(got), "acquired": len(got), "errors": errors[:3]}


def flat_note(rows: list[dict]) -> str:
    base = rows[0]["median_ms"]
    for r in rows:
        if r["median_ms"] > 2 * base:
            return (f"stops being flat at {r['taken']:,} taken ({r['median_ms']:.2f} ms, "
                    f"{r['median_ms'] / base:.1f}x the empty registry's {base:.2f} ms)")
    return (f"stays flat up to {rows[-1]['taken']:,} of {MAX_ID + 1:,} taken "
            f"({base:.2f} -> {rows[-1]['median_ms']:.2f} ms)")


def report(curves: dict[str, list[dict]], crowd: dict[str, dict]) -> str:
    names = list(curves)
    lines = ["Acquire latency (median / p90, ms) as the registry fills:", "",
             "| ids taken of 1,024 | " + " | ".join(names) + " |",
             "|---:|" + "---:|" * len(names)]
    for i, level in enumerate(LEVELS):
        cells = [f"{curves[n][i]['median_ms']:.2f} / {curves[n][i]['p90_ms']:.2f}" for n in names]
        lines.append(f"| {level:,} | " + " | ".join(cells) + " |")
    lines += ["", "Where the cost stops being flat, and why (from these numbers):", ""]
    for name in names:
        lines.append(f"* **{name}**: {flat_note(curves[name])}.")
    lines.append("* Why (flakekit/sql/workers.py): one acquire is one transaction with a "
                 "fixed number of statements -- the service's acquire lock, the search for "
                 "a free or reclaimable row through the service's index, the claim, and a "
                 "`COUNT(*)` of the service's rows for the capacity alert (over 80% taken "
                 "it also raises a `worker-capacity` alert). Only the count and the search "
                 "grow with the rows, and at 1,024 rows both stay well below one round trip; "
                 "so the curve is flat within the noise of this machine, and a jump in one "
                 "level (a p90 far above its median) is another process's load, not the "
                 "registry.")
    if crowd:
        lines += ["", "256 concurrent starters (threads, one allocator and identity each, a "
                  "40-connection pool):", "",
                  "| server | all done | acquires/s | per starter median / p90 / max | ids "
                  "distinct |",
                  "|---|---:|---:|---:|---|"]
        for name, c in crowd.items():
            ok = "yes" if c["distinct"] and c["acquired"] == c["starters"] else \
                f"**no** ({c['acquired']} acquired; {'; '.join(c['errors'])})"
            lines.append(f"| {name} | {c['wall_ms']:.0f} ms | {c['acquires_per_s']:.0f} | "
                         f"{c['median_ms']:.0f} / {c['p90_ms']:.0f} / {c['max_ms']:.0f} ms "
                         f"| {ok} |")
        lines.append("")
        lines.append("* Why a starter in the crowd waits much longer than a single acquire: "
                     "acquires of one service take the service's acquire lock, so they run "
                     "one after another (and 40 at a time hold a pool connection); the "
                     "per-starter time is mostly the queue, and acquires/s is what one "
                     "service's registry sustains on that server.")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in curves.items():
        (line,) = ax.plot([r["taken"] for r in rows], [r["median_ms"] for r in rows], "o-",
                          label=f"{name} median")
        ax.plot([r["taken"] for r in rows], [r["p90_ms"] for r in rows], ":", alpha=0.6,
                color=line.get_color(), label=f"{name} p90")
    ax.set_xlabel("worker ids already taken (of 1,024)")
    ax.set_ylabel("acquire() latency (ms)")
    ax.set_title("SQL worker registry: acquire as it fills")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_plot(plt, fig, IMAGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="5 probe rounds per level and no 256-starter run")
    parser.add_argument("--pg", default=SERVERS["PostgreSQL"])
    parser.add_argument("--mariadb", default=SERVERS["MariaDB"])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    logging.getLogger("flakekit").setLevel(logging.ERROR)  # the capacity ALERTs are expected
    rounds = args.rounds or (5 if args.quick else 15)
    servers = {"PostgreSQL": args.pg, "MariaDB": args.mariadb, "SQLite": None}
    curves: dict[str, list[dict]] = {}
    crowd: dict[str, dict] = {}
    skipped: list[str] = []
    for name, url in servers.items():
        try:
            with database(name, url) as db:
                curves[name] = fill_curve(db, rounds)
            print(f"  {name}: fill curve done", file=sys.stderr)
            if name != "SQLite" and not args.quick:
                with database(name, url) as db:
                    crowd[name] = starters(db)
                print(f"  {name}: 256 starters done", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - a server that is not running is skipped
            skipped.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            print(f"  {name} skipped: {skipped[-1]}", file=sys.stderr)
    if not curves:
        print("no database reachable", file=sys.stderr)
        return 1
    image = None if args.no_plot else plot(curves)
    text = report(curves, crowd)
    if skipped:
        text += "\n\nSkipped: " + "; ".join(skipped)
    emit({"curves": curves, "starters": crowd, "skipped": skipped, "rounds": rounds},
         text, image, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
