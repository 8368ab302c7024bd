"""The Redis paths beside the SQL ones, in one run (docs/redis.md quotes it).

    .venv/bin/python plugins/flakekit-redis/benchmarks/bench_redis.py
    .venv/bin/python plugins/flakekit-redis/benchmarks/bench_redis.py \\
        --redis redis://127.0.0.1:6379/0 \\
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/test

1. A segment fetch (one thread, back to back): the ``redis`` store and the ``sql`` store on
   PostgreSQL, same step.
2. A worker-id renewal and an acquire + release cycle: ``redis`` and ``sql`` (PostgreSQL).
3. A segment generator's ``next_id()`` over each store (the hot path touches neither).

Keys go under a prefix of the run's own (deleted afterwards); PostgreSQL gets a fresh
database.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakekit.leases.lease import LeaseRequest
from flakekit.values.clock import MonotonicClock
from flakekit.values.events import Events

REQ = LeaseRequest("bench", 1023, "10.9.8.7", 8080)
#: the plugin's tests, whose ``redishelpers`` build the store and the allocator
TESTS = Path(__file__).resolve().parents[1] / "tests"


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def cycle(alloc: Any) -> None:
    lease = alloc.acquire(REQ)
    alloc.release(lease, time.time_ns())
    alloc.close()


def holder_numbers(alloc: Any, store: Any, n: int) -> dict[str, float]:
    """A renewal, an acquire + release cycle and ``next_id()`` over ``store``: what each
    path times the same way once its allocator is built."""
    lease = alloc.acquire(REQ)
    out = {"renew": per_call(lambda: alloc.renew(lease, time.time_ns()), n // 4)}
    alloc.release(lease, time.time_ns())
    alloc.close()
    out["acquire+release"] = per_call(lambda: cycle(alloc), 50)
    out["next_id"] = next_id_rate(store)
    return out


def redis_numbers(url: str, n: int) -> dict[str, float]:
    import redis

    sys.path.insert(0, str(TESTS))
    from redishelpers import allocator, seed
    from redishelpers import store as redis_store

    prefix = f"bench{uuid.uuid4().hex[:8]}"
    seed(url, prefix)
    try:
        store = redis_store(url, prefix)
        store.create("k", 1000)
        fetch = per_call(lambda: store.fetch("k"), n)
        alloc = allocator(url, prefix, "b", quarantine="0s")
        return {"fetch": fetch, **holder_numbers(alloc, store, n)}
    finally:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match="{" + prefix + "}*"))
        if keys:
            client.delete(*keys)


def pg_numbers(admin_url: str, n: int) -> dict[str, float]:
    from sqlalchemy import create_engine

    from flakekit.sql.leaf import SqlSegmentStore
    from flakekit.sql.workers import SqlWorkerAllocator
    from flakekit.testing import fresh_database

    with fresh_database(admin_url) as url:
        engine = create_engine(url)
        store = SqlSegmentStore(engine)
        store.create("k", 1000)
        out = {"fetch": per_call(lambda: store.fetch("k"), n)}
        alloc = SqlWorkerAllocator(engine=engine, service="b", clock=MonotonicClock(),
                                   host="10.9.8.7", port=8080, create_schema=True,
                                   events=Events())
        out.update(holder_numbers(alloc, store, n))
        engine.dispose()
        return out


def next_id_rate(store: Any) -> float:
    from flakekit.generators.segment import SegmentGenerator, SegmentSettings

    gen = SegmentGenerator(store, "k", SegmentSettings(), clock=MonotonicClock(),
                           events=Events(), name="b")
    gen.start()
    gen.next_id()
    n = 200_000
    took = per_call(gen.next_id, n)
    gen.close()
    return 1 / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("-n", type=int, default=2000, help="fetches per store")
    args = parser.parse_args()
    rows = {"redis": redis_numbers(args.redis, args.n)}
    try:
        rows["sql (PostgreSQL)"] = pg_numbers(args.pg, args.n)
    except Exception as exc:  # noqa: BLE001 - no PostgreSQL here: Redis alone
        print(f"PostgreSQL skipped: {type(exc).__name__}: {exc}")
    print(f"{'path':18} {'fetch':>10} {'renew':>10} {'acq+rel':>10} {'next_id':>14}")
    for name, r in rows.items():
        print(f"{name:18} {r['fetch'] * 1e3:8.2f}ms {r['renew'] * 1e3:8.2f}ms "
              f"{r['acquire+release'] * 1e3:8.2f}ms {r['next_id'] / 1e6:10.2f}M/s")


if __name__ == "__main__":
    main()
