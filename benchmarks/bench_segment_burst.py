"""A burst from 10k to 5M IDs/s against a database 50 ms away: calls that waited for a
refill, with hunger off (Leaf's double buffer and dynamic step alone) and on.

    .venv/bin/python benchmarks/bench_segment_burst.py
    .venv/bin/python benchmarks/bench_segment_burst.py --url mysql+pymysql://root@127.0.0.1:3306/test
    .venv/bin/python benchmarks/bench_segment_burst.py --burst-rate 2000000 --delay-ms 20

PostgreSQL (or MariaDB) sits behind ``flakekit.testing.TcpProxy`` adding ``--delay-ms``
to every round trip. The demand is open-loop, in real time: every look brings
the calls that arrived since the last look (rate x elapsed real time), taken in chunks of
``--chunk`` calls with ``try_next_ids(chunk)``, which never waits. Calls the buffers in
memory cannot cover are counted as calls that waited for a refill (as callers would
have, each up to ``wait_budget``). Python
cannot make 5M single calls a second, so the chunks stand for the calls; the generator's
logic (prefetch point, switch, hunger, Leaf's step) is the same for both. Default settings
otherwise (table step 1,000, ``max_step`` 1,000,000, ``hunger_max`` 16).
"""

from __future__ import annotations

import argparse
import time

from _common import add_numbers
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import TcpProxy, fresh_database, proxied


def one_run(url: str, hunger: bool, args: argparse.Namespace) -> dict[str, float]:
    key = f"burst_{'on' if hunger else 'off'}"
    setup = SqlSegmentStore(create_engine(url))
    setup.create(key, args.step)
    setup.engine.dispose()
    proxy = TcpProxy(make_url(url).port or 5432).start()
    engine = create_engine(proxied(url, proxy), pool_pre_ping=True)
    gen = SegmentGenerator(SqlSegmentStore(engine), key, SegmentSettings(
        hunger=hunger, hunger_max=args.hunger_max)).start()
    proxy.delay_s = args.delay_ms / 1000
    phases = [(args.calm_s, args.calm_rate), (args.burst_s, args.burst_rate),
              (args.calm_s, args.calm_rate)]
    waited = [0, 0, 0]
    demanded = [0, 0, 0]
    served = 0
    last = -1
    peak = 1
    chunk = args.chunk
    try:
        for phase, (seconds, rate) in enumerate(phases):
            start = time.perf_counter()
            end = start + seconds
            while True:
                now = time.perf_counter()
                if now >= end:
                    break
                calls = int(rate * (now - start)) - demanded[phase]   # arrived meanwhile
                demanded[phase] += calls
                while calls > 0:
                    n = min(chunk, calls)
                    batch = gen.try_next_ids(n)
                    if batch is None:   # these calls, and the rest that arrived, wait
                        waited[phase] += calls
                        break
                    assert batch.ranges[0][0] > last, "IDs went back"
                    last = batch.ranges[-1][-1]
                    served += n
                    calls -= n
                peak = max(peak, gen.prefetch_distance)
                if rate * (time.perf_counter() - start) - demanded[phase] < 1:
                    time.sleep(0.0005)   # calm: nothing due yet
        stats = gen.stats()
        return {"waited_calm": waited[0] + waited[2], "waited_burst": waited[1],
                "burst_calls": demanded[1], "fetches": stats.fetches, "peak": peak,
                "end_distance": gen.prefetch_distance, "step": stats.step,
                "fetch_ms": stats.fetch_ms_mean, "served": served}
    finally:
        gen.close()
        engine.dispose()
        proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="admin URL of PostgreSQL or MariaDB")
    add_numbers(parser, {"step": "the key's table step", "chunk": "calls per try_next_ids()"},
                delay_ms=50.0, step=1000, calm_rate=10_000, burst_rate=5_000_000, calm_s=1.0,
                burst_s=2.0, hunger_max=16, chunk=500)
    args = parser.parse_args()
    with fresh_database(args.url) as url:
        rows = {label: one_run(url, hunger, args) for label, hunger in
                (("hunger off (before)", False), ("hunger on (after)", True))}
    backend = make_url(args.url).get_backend_name()
    print(f"{backend} + {args.delay_ms:g} ms per round trip; {args.calm_rate:,}/s for "
          f"{args.calm_s:g} s, {args.burst_rate:,}/s for {args.burst_s:g} s, "
          f"{args.calm_rate:,}/s for {args.calm_s:g} s; table step {args.step:,}, "
          f"hunger_max {args.hunger_max}\n")
    header = ("", "calls that waited (burst)", "% of burst calls", "waited (calm)",
              "round trips", "peak distance", "distance at end", "Leaf step at end",
              "mean fetch ms")
    table = [header]
    for label, r in rows.items():
        table.append((label, f"{r['waited_burst']:,.0f}",
                      f"{100 * r['waited_burst'] / max(r['burst_calls'], 1):.1f}%",
                      f"{r['waited_calm']:,.0f}", f"{r['fetches']:.0f}", f"{r['peak']:.0f}",
                      f"{r['end_distance']:.0f}", f"{r['step']:,.0f}", f"{r['fetch_ms']:.1f}"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                                for j, (c, w) in enumerate(zip(row, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    off, on = rows.values()
    if on["waited_burst"]:
        cut = off["waited_burst"] / on["waited_burst"]
        print(f"\nhunger cuts the calls that waited {cut:.1f}x")


if __name__ == "__main__":
    main()
