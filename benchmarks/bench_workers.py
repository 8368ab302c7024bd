"""Benchmarks of the worker allocators; prints numbers, asserts nothing.

1. time to acquire one worker id (single starter), per backend: ``sql`` on SQLite,
   PostgreSQL and MariaDB, and the key-value lease allocators on ZooKeeper (``zookeeper``
   lease mode) and etcd (``etcd``), each both without and with opening the session
   (ZooKeeper's session, etcd's lease grant: what a starting process pays);
2. 256 concurrent starters on PostgreSQL (threads, each its own allocator and token,
   sharing a 40-connection pool -- PostgreSQL's default max_connections is 100, so 256
   separate processes would need a bigger server setting or a pooler);
3. cost of the lease check on ``next_id()``: the same generator on a ``sql`` lease and on
   a ``static`` one, measured in the same run, as a ratio.

Usage: .venv/bin/python benchmarks/bench_workers.py [--pg URL] [--mariadb URL] [--skip-mariadb]
       [--zk HOSTS] [--etcd ENDPOINTS]   (default: ZK_HOSTS / ETCD_ENDPOINTS from the
       environment or ${FLAKEKIT_SVC_DIR:-/tmp/flakekit-svc}/env; skipped when absent)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid

from _common import start_together, time_acquire
from sqlalchemy import create_engine

from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.leases.lease import LeaseRequest
from flakekit.sql.schema import init_schema
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import fresh_database
from flakekit.values.clock import MonotonicClock
from flakekit.values.layout import BitLayout

SNOWFLAKE = BitLayout(name="snowflake", fields=[["time", 41], ["worker", 10], ["sequence", 12]],
                      unit_ns="1ms", epoch_ms=1288834974657)


def alloc(engine, i: int) -> SqlWorkerAllocator:
    return SqlWorkerAllocator(engine=engine, service="bench", clock=MonotonicClock(),
                              host=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", port=1)


def bench_single(label: str, url: str, rounds: int = 200) -> None:
    engine = create_engine(url)
    init_schema(engine, "workers")
    req = LeaseRequest("bench", 1023, "", 0)
    times = []
    for i in range(rounds):
        a = alloc(engine, i % 64)  # 64 host identities: reuse after release, like restarts
        a.ensure_schema()
        time_acquire(a, req, times)
    engine.dispose()
    times.sort()
    print(f"acquire (single, {label}): median {statistics.median(times) * 1e3:.2f} ms, "
          f"p99 {times[int(len(times) * 0.99) - 1] * 1e3:.2f} ms over {rounds} acquire+release")


def bench_concurrent(url: str, starters: int = 256, pool: int = 40) -> None:
    engine = create_engine(url, pool_size=pool, max_overflow=0, pool_timeout=120)
    init_schema(engine, "workers")
    req = LeaseRequest("bench", 1023, "", 0)
    allocators = [alloc(engine, i) for i in range(starters)]
    for a in allocators:
        a.ensure_schema()
    took, got, errors, wall = start_together(lambda a: a.acquire(req).worker_id, allocators)
    engine.dispose()
    assert sorted(got) == list(range(starters)), f"duplicate or missing worker ids! {errors[:3]}"
    print(f"acquire ({starters} concurrent starters, PostgreSQL, pool {pool}): all done in "
          f"{wall * 1e3:.0f} ms ({starters / wall:.0f} acquires/s); per starter median "
          f"{statistics.median(took) * 1e3:.0f} ms, max {took[-1] * 1e3:.0f} ms; ids distinct")


def bench_lease_check(url: str, n: int = 2_000_000, repeats: int = 5) -> None:
    engine = create_engine(url)
    init_schema(engine, "workers")
    clock = MonotonicClock()
    sql_gen = SnowflakeGenerator(SNOWFLAKE, clock, SqlWorkerAllocator(
        engine=engine, service="bench", clock=clock, host="10.0.0.1", port=1), name="sql")
    static_gen = SnowflakeGenerator(SNOWFLAKE, clock, StaticAllocator(StaticSettings(worker_id=5)),
                                    name="static")
    results: dict[str, list[float]] = {"sql": [], "static": []}
    with sql_gen, static_gen:
        for _ in range(repeats):  # interleaved, so drift hits both alike
            for label, gen in (("static", static_gen), ("sql", sql_gen)):
                next_id = gen.next_id
                t0 = time.perf_counter()
                for _ in range(n):
                    next_id()
                results[label].append((time.perf_counter() - t0) / n)
    engine.dispose()
    s, q = min(results["static"]), min(results["sql"])
    print(f"next_id(): static lease {s * 1e9:.0f} ns, sql lease {q * 1e9:.0f} ns, "
          f"ratio sql/static {q / s:.3f} (best of {repeats} x {n:,}; capped by 4096 IDs/ms)")


def _svc_env(name: str) -> str:
    if os.environ.get(name):
        return os.environ[name]
    path = os.path.join(os.environ.get("FLAKEKIT_SVC_DIR", "/tmp/flakekit-svc"), "env")
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == name:
                    return value
    except FileNotFoundError:
        pass
    return ""


def _kv_allocator(kind: str, where: str, service: str, i: int):
    """A zookeeper (lease mode) or etcd allocator, quarantine 0, its own identity."""
    from flakekit.assembly.context import BuildContext
    from flakekit.values.events import Events

    ctx = BuildContext(service, "generators.bench.allocator", None, MonotonicClock(),
                       Events(), None, None, f"10.0.{i // 256 % 256}.{i % 256}", 1, 0)
    if kind == "ZooKeeper":
        from flakekit_zookeeper import ZooKeeperSettings, build_zookeeper_allocator

        return build_zookeeper_allocator(ZooKeeperSettings(
            hosts=where, mode="lease", quarantine="0s"), ctx)
    from flakekit_etcd import EtcdSettings, build_etcd_allocator

    return build_etcd_allocator(EtcdSettings(endpoints=where, quarantine="0s"), ctx)


def bench_kv_single(kind: str, where: str, rounds: int = 200) -> None:
    """Like bench_single: a new allocator per round (a restart), acquire then release.
    ``acquire`` is timed with the session already open, ``connect + acquire`` with it."""
    service = f"bench{uuid.uuid4().hex[:8]}"
    req = LeaseRequest("bench", 1023, "", 0)
    warm, cold = [], []
    for i in range(rounds):
        a = _kv_allocator(kind, where, service, i % 64)
        t0 = time.perf_counter()
        a.store.connect()
        t1 = time.perf_counter()
        lease = a.acquire(req)
        t2 = time.perf_counter()
        warm.append(t2 - t1)
        cold.append(t2 - t0)
        a.release(lease, 0)
        a.close()
    for label, times in (("acquire", warm), ("connect + acquire", cold)):
        times.sort()
        print(f"{label} (single, {kind}): median {statistics.median(times) * 1e3:.2f} ms, "
              f"p99 {times[int(len(times) * 0.99) - 1] * 1e3:.2f} ms over {rounds} "
              "acquire+release")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    p.add_argument("--mariadb", default="mysql+pymysql://root@127.0.0.1:3306/test")
    p.add_argument("--skip-mariadb", action="store_true")
    p.add_argument("--zk", default=_svc_env("ZK_HOSTS"))
    p.add_argument("--etcd", default=_svc_env("ETCD_ENDPOINTS"))
    a = p.parse_args()
    if a.zk:
        bench_kv_single("ZooKeeper", a.zk)
    if a.etcd:
        bench_kv_single("etcd", a.etcd)
    with tempfile.TemporaryDirectory() as tmp:
        bench_single("SQLite", f"sqlite:///{tmp}/bench.db")
        bench_lease_check(f"sqlite:///{tmp}/lease.db")
    with fresh_database(a.pg) as url:
        bench_single("PostgreSQL", url)
    with fresh_database(a.pg) as url:
        bench_concurrent(url)
    if not a.skip_mariadb:
        with fresh_database(a.mariadb) as url:
            bench_single("MariaDB", url)


if __name__ == "__main__":
    main()
