"""Lookups per second of the cluster owner map (flakekit/values/owners.py); prints numbers,
asserts nothing.

For 3, 16 and 64 members (weights 1..4 cycling): ``owner_of(key, members)`` (uncached:
the members checked and every replica seed hashed again, then one XXH64 per replica), an
OwnerMap miss (the seeds kept: one XXH64 per replica, what a new key costs) and
``OwnerMap(view).owner`` (cached per key), next to an empty Python call as the unit, so the
ratio travels better than the absolute rate.

Usage: .venv/bin/python benchmarks/bench_owners.py [--seconds S] [--repeats N] [--keys K]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from _common import add_numbers

from flakekit.values.cluster import Member, View
from flakekit.values.owners import HASH_NAME, OwnerMap, _best, _points, owner_of


def rate(fn: Callable[[str], object], keys: list[str], seconds: float, repeats: int
         ) -> tuple[float, float]:
    """(best, median) calls per second of ``fn(key)`` over ``keys`` in a tight loop."""
    rates = []
    for _ in range(repeats):
        calls = 0
        start = time.perf_counter()
        while True:
            for key in keys:
                fn(key)
            calls += len(keys)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        rates.append(calls / elapsed)
    return max(rates), statistics.median(rates)


def members(n: int) -> tuple[Member, ...]:
    return tuple(Member(f"idgen-{i}", f"http://10.0.0.{i}:8080", 1 + i % 4) for i in range(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_numbers(parser, {"seconds": "per repeat (default 0.5)", "keys": "distinct keys looked up"},
                seconds=0.5, repeats=5, keys=1000)
    args = parser.parse_args()
    keys = [f"biz_tag_{i}" for i in range(args.keys)]

    def empty(key: str) -> None:
        return None

    base, _ = rate(empty, keys, args.seconds, args.repeats)
    print(f"{HASH_NAME}: {args.keys} keys, best of {args.repeats} x {args.seconds:g} s")
    print(f"empty Python call: {base / 1e6:.2f} M calls/s (the unit of the ratio column)\n")
    print(f"{'members':>7} {'replicas':>8}  {'lookup':<22} {'best /s':>12} {'median /s':>12} "
          f"{'ns/lookup':>10} {'x empty call':>12}")
    for n in (3, 16, 64):
        view = members(n)
        replicas = sum(m.weight for m in view)
        owners = OwnerMap(View("bench", 1, view))
        owners.owners(keys)   # warm: the cached rows measure the cache hit
        points = _points(view)
        rows: list[tuple[str, Callable[[str], object]]] = [
            ("owner_of (uncached)", lambda k, v=view: owner_of(k, v)),
            ("OwnerMap miss", lambda k, p=points: _best(k.encode(), p)),
            ("OwnerMap.owner (cached)", owners.owner),
        ]
        for label, fn in rows:
            best, median = rate(fn, keys, args.seconds, args.repeats)
            print(f"{n:>7} {replicas:>8}  {label:<22} {best:>12,.0f} {median:>12,.0f} "
                  f"{1e9 / best:>10.0f} {base / best:>12.1f}")


if __name__ == "__main__":
    main()
