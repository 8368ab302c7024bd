"""A drill process: N threads each acquire a worker id at a shared start instant.

Usage: acquire_many.py URL THREADS START_AT_EPOCH_S HOST_PREFIX [PORT]
Prints the acquired ids as one JSON list. Each thread has its own allocator and token,
like separate processes; they share one small connection pool.
"""

from __future__ import annotations

import json
import sys
import time

from sqlalchemy import create_engine

from flakekit.leases.lease import LeaseRequest
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing.threads import in_threads
from flakekit.values.clock import MonotonicClock


def main() -> None:
    url, threads, start_at, prefix = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    port = int(sys.argv[5]) if len(sys.argv) > 5 else None
    options = ({"connect_args": {"timeout": 60}} if url.startswith("sqlite")
               else {"pool_size": 3, "max_overflow": 5, "pool_timeout": 120})
    engine = create_engine(url, **options)
    got: list[int] = []
    errors: list[str] = []

    def run(i: int) -> None:
        alloc = SqlWorkerAllocator(engine=engine, service="many", clock=MonotonicClock(),
                                   host=f"{prefix}.{i + 1}" if port is None else prefix,
                                   port=port or 1)
        alloc.ensure_schema()
        time.sleep(max(0.0, start_at - time.time()))
        try:
            got.append(alloc.acquire(LeaseRequest("many", 1023, "", 0)).worker_id)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"{type(exc).__name__}: {exc}")

    in_threads(run, threads)
    print(json.dumps({"ids": got, "errors": errors}))


if __name__ == "__main__":
    main()
