"""Hand-off windows of cluster mode per membership store, default settings (issue 20).

Two nodes in this process on a fresh PostgreSQL database (segments and key fence), the
second started 1.7 s after the first; the key is the first one's. ``planned``: drain the
owner, time until the other node answers the key. ``crash``: right after one of the
owner's renewals its threads stop and nothing is released (as after ``kill -9``); time
until the other node answers::

    . /tmp/flakekit-svc/env; export ZK_HOSTS ETCD_ENDPOINTS
    .venv/bin/python benchmarks/bench_handoff_windows.py planned sql 5
    .venv/bin/python benchmarks/bench_handoff_windows.py crash sql 5
    .venv/bin/python benchmarks/bench_handoff_windows.py crash etcd 5

ZooKeeper's crash needs a real process kill (its client keeps the session alive by
itself): ``crash zk`` starts two real ``flakekit serve`` nodes (bench_cluster.py's
launcher) on ZooKeeper membership, the second 1.7 s after the first, ``kill -9``s the
key's owner right after one of its renewals (its member znode's version moved: the
worst moment, its deadline as late as it gets) and times until the other node answers::

    .venv/bin/python benchmarks/bench_handoff_windows.py crash zk 5
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from flakekit.cluster.node import ClusterNode
from flakekit.cluster.settings import ClusterSettings
from flakekit.cluster.store_contracts import Membership
from flakekit.errors import FlakekitError
from flakekit.generators.segment import SegmentSettings
from flakekit.sql import schema
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.membership import SqlMembership
from flakekit.testing.databases import fresh_server_database
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member, View
from flakekit.values.owners import OwnerMap

NEVER = -(2**63)


def membership(store: str, engine: Engine, root: str) -> Membership:
    if store == "sql":
        return SqlMembership(engine, MonotonicClock(), create_schema=True)
    if store == "zk":
        from flakekit_zookeeper.membership import ZkMembership
        return ZkMembership(os.environ["ZK_HOSTS"], MonotonicClock(), root=root)
    from flakekit_etcd.membership import EtcdMembership
    return EtcdMembership(os.environ["ETCD_ENDPOINTS"], MonotonicClock(), root=root)


def first_answer(node: ClusterNode, key: str) -> None:
    while True:
        try:
            node.next_id(key)
            return
        except FlakekitError:
            time.sleep(0.002)


def one_run(mode: str, store: str) -> float:
    root = f"/fk-bench-{uuid.uuid4().hex[:8]}"
    with fresh_server_database("postgresql") as url:
        engine = create_engine(url)
        schema.upgrade_schema(engine, "cluster")
        fence = SqlSegmentStore(engine)
        pair = View("c", 1, (Member("a", "http://a:1"), Member("b", "http://b:1")))
        key = next(f"k{i}" for i in range(100) if OwnerMap(pair).owner(f"k{i}").node == "a")
        fence.create(key, 1000)
        nodes = []
        for name in "ab":
            node = ClusterNode(ClusterSettings("c", name, f"http://{name}:1", handoff_wait=0),
                               membership(store, engine, root))
            # a store each, as in two processes (one remembers its own last range)
            node.add_strict(key, SqlSegmentStore(engine), SegmentSettings())
            nodes.append(node.start())
            time.sleep(1.7)
        a, b = nodes
        first_answer(a, key)
        if mode == "planned":
            started = time.monotonic()
            a.drain()
        else:
            deadline = a._target.deadline_ns
            while a._target.deadline_ns == deadline:   # right after a renewal
                time.sleep(0.001)
            a._stop.set()
            a._wake.set()
            a._keeper.source.renew = _crashed   # type: ignore[method-assign]
            a._keeper.source.release = lambda *_: None   # type: ignore[method-assign]
            a._target.deadline_ns = NEVER
            started = time.monotonic()
        first_answer(b, key)
        took = time.monotonic() - started
        b.close()
        a.close()   # a crashed one too: its threads and watches end (it releases nothing)
        engine.dispose()
        return took


def process_crash(store: str) -> float:
    """``kill -9`` of a real ``flakekit serve`` owner (ZooKeeper membership): time until
    the other node answers the key."""
    from bench_cluster import (
        NODE_KEY,
        STRICT_GEN,
        STRICT_KEY,
        Node,
        cli,
        http_get,
        wait_agreed,
        wait_serving,
        write_config,
    )

    assert store == "zk", "only ZooKeeper needs real processes here"
    from kazoo.client import KazooClient

    tmp = Path(tempfile.mkdtemp(prefix="fk-bench-handoff-"))
    nodes: list[Node] = []
    root = f"/fk-bench-{uuid.uuid4().hex[:8]}"
    zk = KazooClient(hosts=os.environ["ZK_HOSTS"])
    zk.start(timeout=10)
    try:
        with fresh_server_database("postgresql") as url:
            config = tmp / "cluster.toml"
            write_config(config, url, membership=(
                f'{{ type = "zookeeper", hosts = "{os.environ["ZK_HOSTS"]}", '
                f'root = "{root}" }}'))
            for args in (("db", "init"), *(("segments", "create", key, "--step", "1000")
                                           for key in (STRICT_KEY, NODE_KEY))):
                done = cli(*args, "--config", str(config))
                if done.returncode != 0:
                    raise SystemExit(f"flakekit {' '.join(args)}: {done.stdout}{done.stderr}")
            for name in ("n0", "n1"):
                nodes.append(Node(name, config, tmp))
                nodes[-1].start()
                time.sleep(1.7)
            view = wait_agreed(nodes, 2)
            owner, other = sorted(nodes, key=lambda n: n.name != view["owners"][STRICT_KEY])
            wait_serving(owner)
            assert owner.proc is not None
            znode = f"{root}/clusters/bench/members/{owner.name}"
            seen = zk.get(znode)[1].version
            while zk.get(znode)[1].version == seen:   # a renewal lands (every lease/3)
                time.sleep(0.002)
            owner.stop(signal.SIGKILL)
            started = time.monotonic()
            while http_get(other.port, f"/api/v1/next/{STRICT_GEN}?count=1")[0] != 200:
                time.sleep(0.002)
            return time.monotonic() - started
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)
        zk.stop()
        zk.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _crashed(*_: object) -> None:
    raise FlakekitError("crashed")


def main() -> None:
    mode, store = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    run = process_crash if (mode, store) == ("crash", "zk") else (
        lambda store: one_run(mode, store))
    took = []
    for i in range(runs):
        took.append(run(store))
        print(f"run {i + 1}: {took[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
    print(f"{mode} hand-off, {store}: " + ", ".join(f"{t * 1000:.0f} ms" for t in took)
          + f"; max {max(took) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
