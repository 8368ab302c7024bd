"""A generator process for fault drills (any allocator: the ZooKeeper and etcd plugins'
drills run it): prints its lease, then IDs with the time before each call, until told
to stop (stdin closed) or the first error.

usage: python -m flakekit.testing.drill_worker CONFIG GENERATOR [--retry-exhausted]
           [--seconds S] [--pace MS] [--tolerate] [--start-at MONO_NS]

Lines: ``LEASE <worker> <epoch> <mono_ns> <lease_ms> <deadline_ns>``, ``ID <id> <mono_before_ns>``,
``ERR <ErrorClass> <mono_ns> <message>``, ``END``.

``--tolerate`` keeps going through errors (a blip drill): ``ERR`` is printed once per
run of errors, ``RENEW <worker> <deadline_ns> <mono_ns>`` whenever the lease's deadline
moves, and SIGTERM (like ``flakekit serve``'s) ends the loop, closes the kit (releasing
the lease) and prints ``CLOSED <mono_ns>``.
"""

from __future__ import annotations

import signal
import sys
import time

import flakekit
from flakekit.errors import FlakekitError, WorkerExhaustedError
from flakekit.leases.kv import KvLeaseAllocator


def main() -> int:
    config, name = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    retry = "--retry-exhausted" in args
    seconds = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 3600.0
    pace = float(args[args.index("--pace") + 1]) / 1000 if "--pace" in args else 0.001
    kit = flakekit.load(config)
    gen = kit.get(name)
    if "--start-at" in args:   # a monotonic instant: processes that must start together
        time.sleep(max(0.0, int(args[args.index("--start-at") + 1]) / 1e9 - time.monotonic()))
    while True:
        try:
            gen.start()
            break
        except WorkerExhaustedError:
            if not retry:
                raise
            time.sleep(0.05)
    lease = gen.lease
    alloc = gen.keeper.allocator
    lease_ms = alloc.lease_ms if isinstance(alloc, KvLeaseAllocator) else 0
    print(f"LEASE {lease.worker_id} {lease.epoch} {time.monotonic_ns()} {lease_ms} "
          f"{lease.deadline_ns}", flush=True)
    tolerate = "--tolerate" in args
    stopping: list[int] = []
    if tolerate:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    end = time.monotonic() + seconds
    out = sys.stdout
    failing = False
    deadline = lease.deadline_ns
    while time.monotonic() < end and not stopping:
        before = time.monotonic_ns()
        try:
            i = gen.next_id()
        except Exception as exc:  # noqa: BLE001 - the drills want to see exactly this
            if not tolerate or not isinstance(exc, FlakekitError):
                print(f"ERR {type(exc).__name__} {time.monotonic_ns()} {exc}", flush=True)
                break
            if not failing:
                print(f"ERR {type(exc).__name__} {time.monotonic_ns()} {exc}", flush=True)
            failing = True
            time.sleep(pace)
            continue
        failing = False
        out.write(f"ID {i} {before}\n")
        now = gen.keeper.lease
        if tolerate and now is not None and now.deadline_ns != deadline:
            deadline = now.deadline_ns
            out.write(f"RENEW {now.worker_id} {deadline} {time.monotonic_ns()}\n")
        out.flush()
        time.sleep(pace)
    print("END", flush=True)
    gen.close()   # releases the lease (kit.close() alone may not close a kit.get() one)
    kit.close()
    print(f"CLOSED {time.monotonic_ns()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
