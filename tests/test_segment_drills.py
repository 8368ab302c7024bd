"""Segment mode fault drills: real processes, a cut or slowed database (loopback proxy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url

from flakekit.errors import SegmentUnavailableError
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import TcpProxy, proxied, wait_until

pytestmark = pytest.mark.slow

WORKER = r"""
import sys
from sqlalchemy import create_engine
from flakekit.generators.segment import SegmentGenerator, SegmentSettings
from flakekit.sql.leaf import SqlSegmentStore

url, key, n, close = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "close"
kw = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
store = SqlSegmentStore(create_engine(url, **kw))
gen = SegmentGenerator(store, key, SegmentSettings(wait_budget="30s", max_step=2000)).start()
out = sys.stdout
done = 0
while done < n:
    if done % 7 == 3:
        ids = list(gen.next_ids(5))
    else:
        ids = [gen.next_id() for _ in range(50)]
    done += len(ids)
    out.write("\n".join(map(str, ids)) + "\n")
    out.flush()
if close:
    gen.close()
"""


def spawn(url: str, key: str, n: int, close: bool = True) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, key, str(n), "close" if close else "keep"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def read_ids(text: str) -> list[int]:
    return [int(line) for line in text.split()]


def store_for(url: str) -> SqlSegmentStore:
    return SqlSegmentStore(create_engine(url))


class TestProcesses:
    def test_several_processes_one_key(self, db_url):
        """Four processes on one key with a tiny step: no duplicate, each one increasing."""
        store = store_for(db_url)
        store.create("shared", 20)
        procs = [spawn(db_url, "shared", 3000) for _ in range(4)]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(read_ids(out))
        every = [i for ids in results for i in ids]
        assert len(every) == len(set(every))
        for ids in results:
            assert len(ids) >= 3000
            assert ids == sorted(ids) and len(ids) == len(set(ids))
        store.engine.dispose()

    def test_kill_9_never_reissues(self, sqlite_url):
        """A process killed with SIGKILL loses its buffers; its successor never repeats an ID."""
        store = store_for(sqlite_url)
        store.create("k", 1000)
        proc = spawn(sqlite_url, "k", 10**9, close=False)
        seen: list[int] = []
        assert proc.stdout is not None
        while len(seen) < 500:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            seen.append(int(line))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        after = SegmentGenerator(store, "k").start()
        later = [after.next_id() for _ in range(2000)]
        after.close()
        assert min(later) > max(seen)
        store.engine.dispose()


def _server_url(request, name: str) -> str:
    return request.getfixturevalue(name)


@pytest.fixture(params=[
    pytest.param("pg_url", marks=pytest.mark.postgresql),
    pytest.param("mariadb_url", marks=pytest.mark.mariadb),
])
def server_url(request) -> str:
    """A fresh PostgreSQL or MariaDB database (the ones a proxy can stand in front of)."""
    return request.getfixturevalue(request.param)


def behind_proxy(url: str, tcp_proxy, step: int) -> tuple[SqlSegmentStore, TcpProxy, Engine]:
    """Key ``k`` (step ``step``) made by a store on ``url`` directly, a proxy to the
    database server, and a pre-pinging engine on ``url`` through that proxy."""
    direct = store_for(url)
    direct.create("k", step)
    proxy = tcp_proxy(make_url(url).port)
    return direct, proxy, create_engine(proxied(url, proxy), pool_pre_ping=True)


class TestProxy:
    def test_outage_ride_through_and_recovery(self, server_url, tcp_proxy):
        """Database cut: IDs flow from the buffers, then SegmentUnavailableError after the
        budget, then IDs again once the database is back."""
        direct, proxy, engine = behind_proxy(server_url, tcp_proxy, 500)
        settings = SegmentSettings(wait_budget="300ms", retry_min="20ms", retry_max="100ms",
                                   dynamic_step=False)
        gen = SegmentGenerator(SqlSegmentStore(engine), "k", settings).start()
        ids = [gen.next_id() for _ in range(100)]         # past 10%: next buffer fetched
        wait_until(lambda: gen.stats().buffers[1].ready, 10, what="the next buffer",
                   interval=0.01)
        proxy.cut()
        with pytest.raises(SegmentUnavailableError) as info:
            while True:
                ids.append(gen.next_id())
        assert len(ids) == 1000                            # both buffers were served
        assert "wait_budget" in str(info.value)
        assert gen.stats().fetch_failures >= 1
        proxy.restore()
        deadline = time.monotonic() + 15
        while True:
            try:
                ids.append(gen.next_id())
                break
            except SegmentUnavailableError:
                assert time.monotonic() < deadline, "no recovery"
        ids += list(gen.next_ids(700))
        gen.close()
        assert len(ids) == len(set(ids)) and ids == sorted(ids)
        engine.dispose()
        direct.engine.dispose()

    def test_slow_database_is_hidden_by_prefetch(self, server_url, tcp_proxy):
        """With 50 ms added to every round trip, no next_id() ever waits for the database."""
        direct, proxy, engine = behind_proxy(server_url, tcp_proxy, 20_000)
        gen = SegmentGenerator(SqlSegmentStore(engine), "k").start()
        proxy.delay_s = 0.05
        worst = 0
        until = time.monotonic() + 2.0
        count = 0
        while time.monotonic() < until:                   # ~ 50k IDs/s, paced
            for _ in range(500):
                t0 = time.perf_counter_ns()
                gen.next_id()
                worst = max(worst, time.perf_counter_ns() - t0)
            count += 500
            time.sleep(0.01)
        stats = gen.stats()
        gen.close()
        assert stats.fetches >= 2
        assert stats.fetch_ms_mean >= 45               # the database really was slow
        assert stats.waits == 0                        # and no caller ever waited for it
        print(f"\n{count} IDs, worst next_id {worst / 1e6:.3f} ms, "
              f"fetch mean {stats.fetch_ms_mean:.1f} ms")
        engine.dispose()
        direct.engine.dispose()
