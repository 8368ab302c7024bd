"""A generator process for the drills: prints its lease, then IDs with the time before
each call, until told to stop (stdin closed) or the first error.

usage: zk_drill_worker.py CONFIG GENERATOR [--retry-exhausted] [--seconds S] [--pace MS]

Lines: ``LEASE <worker> <epoch> <mono_ns>``, ``ID <id> <mono_before_ns>``,
``ERR <ErrorClass> <mono_ns> <message>``, ``END``.
"""

from __future__ import annotations

import sys
import time

import flakekit
from flakekit.errors import WorkerExhaustedError


def main() -> int:
    config, name = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    retry = "--retry-exhausted" in args
    seconds = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 3600.0
    pace = float(args[args.index("--pace") + 1]) / 1000 if "--pace" in args else 0.001
    kit = flakekit.load(config)
    gen = kit.get(name)
    while True:
        try:
            gen.start()
            break
        except WorkerExhaustedError:
            if not retry:
                raise
            time.sleep(0.05)
    lease = gen.lease
    print(f"LEASE {lease.worker_id} {lease.epoch} {time.monotonic_ns()}", flush=True)
    end = time.monotonic() + seconds
    out = sys.stdout
    while time.monotonic() < end:
        before = time.monotonic_ns()
        try:
            i = gen.next_id()
        except Exception as exc:  # the drills want to see exactly this
            print(f"ERR {type(exc).__name__} {time.monotonic_ns()} {exc}", flush=True)
            break
        out.write(f"ID {i} {before}\n")
        out.flush()
        time.sleep(pace)
    print("END", flush=True)
    kit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
