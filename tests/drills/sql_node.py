"""A drill process: one SnowflakeGenerator on the ``sql`` allocator, printing what it does.

Usage: sql_node.py URL --host H --port P [--worker-bits B] [--count N | --run]
                   [--heartbeat S] [--tier S] [--safety S] [--release|--no-release]

Prints ``LEASE <worker> <epoch> <not_before_ns>`` once, then one line per event:
``ID <id> <mono_ns>`` or ``ERR <ErrorClass> <mono_ns>`` (at most one ERR line per
second of errors), and ``CLOSED <checked-out connections>`` after a clean close. Lines
are written unbuffered so a SIGSTOP/kill -9 loses nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from sqlalchemy import create_engine

from flakekit.errors import FlakekitError
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.values.clock import MonotonicClock
from flakekit.values.layout import BitLayout

NS = 1_000_000_000


def out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--host", default="10.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--service", default="drill")
    p.add_argument("--worker-bits", type=int, default=1)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--run", action="store_true")
    p.add_argument("--heartbeat", type=float, default=0.3)
    p.add_argument("--tier", type=float, default=3.0)
    p.add_argument("--safety", type=float, default=1.0)
    p.add_argument("--interval", type=float, default=0.002)
    p.add_argument("--no-release", action="store_true")
    a = p.parse_args()

    layout = BitLayout(name="drill", fields=[["time", 41], ["worker", a.worker_bits],
                                             ["sequence", 22 - a.worker_bits]],
                       unit_ns="1ms", epoch_ms=1288834974657)
    clock = MonotonicClock()
    engine = create_engine(a.url, connect_args={"connect_timeout": 2}
                           if a.url.startswith("postgresql") else {})
    alloc = SqlWorkerAllocator(
        engine=engine, service=a.service, clock=clock, host=a.host, port=a.port,
        heartbeat_ns=int(a.heartbeat * NS), tiers_ns=(int(a.tier * NS),),
        safety_window_ns=int(a.safety * NS), create_schema=True,
    )
    gen = SnowflakeGenerator(layout, clock, alloc, name="drill", host=a.host, port=a.port)
    gen.start()
    lease = gen.lease
    out(f"LEASE {lease.worker_id} {lease.epoch} {lease.not_before_ns}")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    issued, last_err = 0, 0
    try:
        while a.run or issued < a.count:
            try:
                new_id = gen.next_id()
            except FlakekitError as exc:
                now = time.monotonic_ns()
                if now - last_err > NS:
                    out(f"ERR {type(exc).__name__} {now}")
                    last_err = now
            else:
                out(f"ID {new_id} {time.monotonic_ns()}")
                issued += 1
            if a.interval:
                time.sleep(a.interval)
    except KeyboardInterrupt:
        pass
    if a.no_release:
        os._exit(0)
    gen.close()
    out(f"CLOSED {engine.pool.checkedout()}")  # connections still checked out (0)
    sys.exit(0)


if __name__ == "__main__":
    main()
