"""Why ``workers`` schema version 2 adds ``system_nodes_service_seen (service, last_seen)``;
prints numbers, asserts nothing.

A Sonyflake service (65,536 worker ids) whose range is full except one row silent for
two hours: each acquire walks the reclaim tiers (7 d, 1 d, 1 h) and takes that row. Timed:
the 1 h tier query alone, and the whole ``acquire()``, with the index and after dropping
it, on PostgreSQL (a fresh database on the given server).

Usage: .venv/bin/python benchmarks/bench_workers_index.py [--pg ADMIN_URL] [--runs N]
           [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import add_switches
from sqlalchemy import create_engine, text

from flakekit.leases.lease import LeaseRequest
from flakekit.sql.schema import init_schema
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import fresh_database
from flakekit.values.clock import MonotonicClock

TIER_QUERY = (
    "SELECT machine_id FROM system_nodes WHERE service = 'svc' AND machine_id <= 65535 "
    "AND machine_id >= 0 AND version < 2147483647 AND last_seen < now() - interval '1 hour' "
    "ORDER BY machine_id LIMIT 1 FOR UPDATE SKIP LOCKED"
)


def _age(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE system_nodes SET last_seen = now() - interval '2 hours', "
                          "holder = 'gone', issued_until = 0 "
                          "WHERE service = 'svc' AND machine_id = 65000"))


def _measure(engine, runs: int) -> tuple[float, float]:
    query = []
    for _ in range(runs):
        with engine.begin() as conn:
            t = time.perf_counter()
            conn.execute(text(TIER_QUERY)).all()
            query.append(time.perf_counter() - t)
    acquire = []
    for _ in range(runs):
        _age(engine)
        alloc = SqlWorkerAllocator(engine=engine, service="svc", clock=MonotonicClock(),
                                   host="10.9.9.9", port=1, max_start_wait_ns=10**12)
        t = time.perf_counter()
        lease = alloc.acquire(LeaseRequest("svc", 65535, "", 1))
        acquire.append(time.perf_counter() - t)
        assert lease.worker_id == 65000
    return statistics.median(query) * 1e3, statistics.median(acquire) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=20)
    add_switches(parser, quick="5 runs instead of 20")
    args = parser.parse_args()
    if args.quick:
        args.runs = min(args.runs, 5)
    with fresh_database(args.pg) as url:
        engine = create_engine(url)
        try:
            init_schema(engine, "workers")
            with engine.begin() as conn:
                for service in ("svc", "other"):
                    conn.execute(text(
                        "INSERT INTO system_nodes (service, machine_id, host, port, slot, "
                        "version, holder, last_seen) SELECT :s, g, '10.0.0.1', g, 0, 1, 'h', "
                        "now() FROM generate_series(0, 65535) g"), {"s": service})
                conn.execute(text("ANALYZE system_nodes"))
            with_index = _measure(engine, args.runs)
            with engine.begin() as conn:
                conn.execute(text("DROP INDEX system_nodes_service_seen"))
                conn.execute(text("ANALYZE system_nodes"))
            without = _measure(engine, args.runs)
        finally:
            engine.dispose()
    if args.json:
        print(json.dumps({"rows_per_service": 65536, "runs": args.runs,
                          "tier_query_ms": {"with_index": with_index[0], "without": without[0]},
                          "acquire_ms": {"with_index": with_index[1], "without": without[1]}},
                         indent=2))
        return
    print(f"65,536 rows per service, median of {args.runs}:")
    print(f"  1h tier query:   {with_index[0]:7.2f} ms with the index, "
          f"{without[0]:7.2f} ms without")
    print(f"  whole acquire(): {with_index[1]:7.2f} ms with the index, "
          f"{without[1]:7.2f} ms without")


if __name__ == "__main__":
    main()
