"""Segment mode throughput and tail latency, next to the snowflake generator, in one run.

    .venv/bin/python benchmarks/bench_segment.py                   # SQLite file + PostgreSQL proxy
    .venv/bin/python benchmarks/bench_segment.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python benchmarks/bench_segment.py --quick --json      # fewer calls, JSON out

1. ``next_id()`` and ``next_ids(1000)`` IDs/s in one thread (segment vs snowflake).
2. ``next_id()`` p50/p99/p99.9/max while every database round trip takes +50 ms (a
   loopback TCP proxy in front of PostgreSQL or MariaDB), with the number of calls that
   had to wait for a refill. The key's table step is large enough for the prefetch to
   stay ahead (Leaf's advice: about 10 minutes of peak traffic).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from _common import add_switches, best_rate
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from flakekit.api import snowflake as snowflake_generator
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import fresh_database

#: print tables unless --json (then one JSON document at the end)
QUIET = False


def say(*args: object) -> None:
    if not QUIET:
        print(*args)


def rate(fn, n: int) -> float:
    """Calls per second of ``fn`` over ``n`` calls (best of 3)."""
    def loop() -> None:
        for _ in range(n):
            fn()
    return best_rate(loop, n)


def batch_rate(fn, size: int, calls: int) -> float:
    """IDs per second of ``fn(size)`` over ``calls`` calls (best of 3)."""
    def loop() -> None:
        for _ in range(calls):
            fn(size)
    return best_rate(loop, size * calls)


def throughput(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlSegmentStore(create_engine(f"sqlite:///{tmp}/bench.db"))
        store.create("bench", 1_000_000)
        gen = SegmentGenerator(store, "bench", SegmentSettings()).start()
        snow = snowflake_generator(worker_id=1)
        results = {
            "segment next_id()": rate(gen.next_id, n),
            "snowflake next_id()": rate(snow.next_id, n),
            "segment next_ids(1000)": batch_rate(gen.next_ids, 1000, max(1, n // 1000)),
            "snowflake next_ids(1000)": batch_rate(snow.next_ids, 1000, max(1, n // 1000)),
        }
        gen.close()
        snow.close()
        store.engine.dispose()
    say(f"throughput, one thread, {n:,} calls (best of 3):")
    for name, value in results.items():
        say(f"  {name:26s} {value / 1e6:8.2f} M IDs/s")
    say(f"  segment / snowflake next_id(): "
        f"{results['segment next_id()'] / results['snowflake next_id()']:.2f}x")
    return results


def percentile(sorted_ns: list[int], p: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * p))] / 1e3


def latency(admin_url: str, n: int, step: int, delay: float, max_step: int) -> dict:
    from flakekit.testing.proxy import TcpProxy

    with fresh_database(admin_url) as url:
        store = SqlSegmentStore(create_engine(url))
        store.create("bench", step)
        store.engine.dispose()
        proxy = TcpProxy(make_url(url).port or 5432)
        proxy.start()
        engine = create_engine(make_url(url).set(host="127.0.0.1", port=proxy.port),
                               pool_pre_ping=True)
        proxy.delay_s = delay
        gen = SegmentGenerator(SqlSegmentStore(engine), "bench",
                               SegmentSettings(wait_budget="5s", max_step=max_step)).start()
        snow = snowflake_generator(worker_id=2)
        clock = time.perf_counter_ns
        report = {}
        for name, fn in (("segment", gen.next_id), ("snowflake", snow.next_id)):
            samples = [0] * n
            for i in range(n):
                t0 = clock()
                fn()
                samples[i] = clock() - t0
            samples.sort()
            report[name] = samples
        stats = gen.stats()
        gen.close()
        snow.close()
        proxy.stop()
        engine.dispose()
    backend = make_url(admin_url).get_backend_name()
    say(f"\nnext_id() latency, {n:,} calls, {backend} behind a proxy adding {delay * 1000:.0f} ms "
        f"per round trip (table step {step:,}, max_step {max_step:,}):")
    say(f"  {'':10s} {'p50 µs':>8s} {'p99 µs':>8s} {'p99.9 µs':>9s} {'max µs':>10s}")
    out: dict = {"backend": backend, "calls": n, "delay_ms": delay * 1000, "step": step,
                 "max_step": max_step, "fetches": stats.fetches,
                 "fetch_ms_mean": stats.fetch_ms_mean, "waits": stats.waits, "latency_us": {}}
    for name, samples in report.items():
        say(f"  {name:10s} {percentile(samples, .5):8.2f} {percentile(samples, .99):8.2f} "
            f"{percentile(samples, .999):9.2f} {samples[-1] / 1e3:10.1f}")
        out["latency_us"][name] = {"p50": percentile(samples, .5), "p99": percentile(samples, .99),
                                   "p99.9": percentile(samples, .999), "max": samples[-1] / 1e3}
    say(f"  segment fetches {stats.fetches}, mean fetch {stats.fetch_ms_mean:.1f} ms, "
        f"calls that waited for a refill: {stats.waits}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5_000_000, help="calls per throughput run")
    parser.add_argument("--latency-n", type=int, default=3_000_000)
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="admin URL of PostgreSQL or MariaDB for the latency run ('' to skip)")
    parser.add_argument("--step", type=int, default=4_000_000,
                        help="the key's table step (Leaf: ~10 min of peak traffic; here ~0.5 s)")
    parser.add_argument("--max-step", type=int, default=16_000_000,
                        help="cap of the dynamic step (Leaf's 1,000,000 cannot keep up with "
                        "~7M IDs/s when a fetch takes 200 ms)")
    parser.add_argument("--delay-ms", type=float, default=50)
    add_switches(parser, quick="500,000 calls per run, not millions")
    args = parser.parse_args()
    global QUIET
    QUIET = args.json
    if args.quick:
        args.n, args.latency_n = min(args.n, 500_000), min(args.latency_n, 500_000)
    data: dict = {"throughput_ids_per_s": throughput(args.n)}
    if args.url:
        data["latency"] = latency(args.url, args.latency_n, args.step, args.delay_ms / 1000,
                                  args.max_step)
    if args.json:
        print(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
