"""mode = "leaf": Leaf-compatible znodes, the time report, the cache file, the clock check."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from flakekit_zookeeper.errors import ClockBehindReportError
from flakekit_zookeeper.leaf import parse_node_name
from zkhelpers import allocator, generator

import flakekit
from flakekit.errors import BackendError, ConfigError, WorkerExhaustedError
from flakekit.testing import EventRecorder, ManualClock, TcpProxy
from flakekit.testing.drills import tiny_layout
from flakekit.testing.refusals import assert_refused_and_close
from flakekit.testing.requests import lease_request as req
from flakekit.values.events import Events

DOWN = "127.0.0.1:1"  # nothing listens on port 1


def leaf(ns, tmp_path, **kw):
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    return allocator(ns, mode="leaf", connect_timeout="1s", session_timeout="4s", **kw)


def clean_stop(a, lease, clock=time):
    """What a process's clean stop does: its id released (now on ``clock``), closed."""
    a.release(lease, clock.time_ns())
    a.close()


def ran_once(ns, tmp_path, **kw):
    """A Leaf-mode allocator that took its id, released it and closed (its znode and
    cache file stay, as after a clean stop)."""
    a = leaf(ns, tmp_path, **kw)
    clean_stop(a, a.acquire(req()), kw.get("clock") or time)
    return a


class TestConfig:
    def test_chosen_by_name_in_config(self, tmp_path, zk_hosts, ns):
        """`allocator = {type = "zookeeper", mode = ...}` builds through the entry point."""
        cfg = tmp_path / "f.toml"
        cfg.write_text(f"""
[generators.{ns}]
strategy = "snowflake"
allocator = {{ type = "zookeeper", hosts = "{zk_hosts}", mode = "leaf", port = 8080, \
cache_dir = "{tmp_path}" }}
""")
        with flakekit.load(cfg) as kit:
            gen = kit[ns]
            assert gen.worker_id == 0
            assert type(gen.keeper.allocator).__name__ == "LeafAllocator"
            assert gen.next_id() > 0

    @pytest.mark.parametrize(("table", "field"), [
        ('{ type = "zookeeper", mode = "leap" }', "mode"),
        ('{ type = "zookeeper", session_timeout = "4s", safety_window = "3s" }', "safety_window"),
        ('{ type = "zookeeper", session_timeout = "0.5s" }', "session_timeout"),
        ('{ type = "zookeeper", quarantine = "-1s" }', "quarantine"),
        ('{ type = "zookeeper", ip = "not-an-ip", mode = "leaf" }', "ip"),
        ('{ type = "zookeeper", hostz = "x" }', "hostz"),
        ('{ type = "zookeeper", mode = "leaf", port = 0 }', "port"),
    ], ids=["mode", "safety", "session-floor", "quarantine", "ip", "unknown-key", "leaf-port-0"])
    def test_bad_settings_name_the_field(self, tmp_path, table, field):
        """Each wrong setting fails at load time naming generators.g.allocator.<field>."""
        cfg = tmp_path / "f.toml"
        cfg.write_text(f'[generators.g]\nstrategy = "snowflake"\nallocator = {table}\n')
        with pytest.raises(ConfigError) as info:
            flakekit.load(cfg)
        assert f"generators.g.allocator.{field}" in str(info.value)


class TestLeafZnodes:
    def test_sibling_processes_on_one_port_get_their_own_nodes(self, zk, ns, tmp_path):
        """A server's worker processes share ip:port; instance N > 0 gets its own node
        (ip:port.N) and cache file, so two live processes never share a worker id."""
        first, second = leaf(ns, tmp_path), leaf(ns, tmp_path, instance=1)
        leases = [first.acquire(req()), second.acquire(req())]
        assert {x.worker_id for x in leases} == {0, 1}
        assert sorted(zk.get_children(f"/snowflake/{ns}/forever")) == [
            "10.9.8.7:8080-0000000000", "10.9.8.7:8080.1-0000000001"]
        assert first.cache_path != second.cache_path
        second.release(leases[1], time.time_ns())
        again = leaf(ns, tmp_path, instance=1)
        assert again.acquire(req()).worker_id == 1   # instance 1 keeps its id across restarts
        for a in (first, second, again):
            a.close()

    def test_a_live_process_with_the_same_identity_is_refused(self, ns, tmp_path):
        """Two live processes on one ip:port would share a worker id (Leaf's model): the
        second start is refused with what to do; after a clean stop it gets the id."""
        first = leaf(ns, tmp_path)
        lease = first.acquire(req())
        with pytest.raises(WorkerExhaustedError, match="another live process .*uses "
                           "identity 10.9.8.7:8080.*FLAKEKIT_PORT"):
            leaf(ns, tmp_path).acquire(req())
        clean_stop(first, lease)
        later = leaf(ns, tmp_path)
        assert later.acquire(req()).worker_id == lease.worker_id
        later.close()

    def test_creates_leaf_node_and_reuses_it_on_restart(self, zk, ns, tmp_path):
        """A new ip:port gets a sequential node with Leaf's JSON; a restart gets the same id."""
        a = leaf(ns, tmp_path)
        lease = a.acquire(req())
        # the deadline: a process paused past its session issues nothing on resume
        assert lease.worker_id == 0 and lease.deadline_ns is not None
        children = zk.get_children(f"/snowflake/{ns}/forever")
        assert children == ["10.9.8.7:8080-0000000000"]
        data = json.loads(zk.get(f"/snowflake/{ns}/forever/{children[0]}")[0])
        assert set(data) == {"ip", "port", "timestamp"} and data["port"] == "8080"
        clean_stop(a, lease)
        other = leaf(ns, tmp_path, port=9090)
        assert other.acquire(req()).worker_id == 1
        other.close()
        again = leaf(ns, tmp_path)
        lease2 = again.acquire(req())
        assert lease2.worker_id == 0
        again.close()

    def test_reads_existing_leaf_nodes(self, zk, ns, tmp_path):
        """Nodes written by Leaf itself (port as a string, Jackson JSON) map to their seq."""
        base = f"/snowflake/{ns}/forever"
        zk.ensure_path(base)
        for ip in ("10.0.0.1", "10.0.0.2", "10.9.8.7"):
            zk.create(f"{base}/{ip}:8080-", json.dumps(
                {"ip": ip, "port": "8080", "timestamp": int(time.time() * 1000) - 60_000}
            ).encode(), sequence=True)
        a = leaf(ns, tmp_path)
        assert a.acquire(req()).worker_id == 2
        recs = a.records()
        assert [(r.worker_id, r.holder, r.mine) for r in recs] == [
            (0, "10.0.0.1:8080", False), (1, "10.0.0.2:8080", False), (2, "10.9.8.7:8080", True)]
        assert recs[2].state == "reporting" and recs[0].state == "silent"
        a.close()
        assert parse_node_name("10.0.0.1:8080-0000000012") == ("10.0.0.1:8080", 12)
        assert parse_node_name("garbage") is None

    def test_sequence_beyond_layout_is_an_error(self, zk, ns, tmp_path):
        """A sequence number above the layout's worker range fails, naming the node."""
        base = f"/snowflake/{ns}/forever"
        zk.ensure_path(base)
        for ip in ("10.0.0.1", "10.0.0.2"):
            zk.create(f"{base}/{ip}:8080-", b'{"ip":"x","port":"8080","timestamp":0}',
                      sequence=True)
        a = leaf(ns, tmp_path)
        assert_refused_and_close(a, WorkerExhaustedError, a.acquire, req(max_worker_id=1),
                                 match="0000000002.*0..1")

    def test_reports_time_and_moves_the_deadline(self, zk, ns, tmp_path):
        """report() writes now into the node and the cache; the keeper's renew() then
        takes the deadline on from that report (session - safety after it)."""
        clock, rec = ManualClock(), EventRecorder()
        a = leaf(ns, tmp_path, clock=clock, events=Events(rec))
        lease = a.acquire(req())
        clock.advance(5)
        assert a.renew(lease, 0) is lease   # nothing reported since: nothing new
        assert a.report()
        ts = json.loads(zk.get(a.node)[0])["timestamp"]
        assert ts == clock.time_ns() // 1_000_000
        assert json.loads(a.cache_path.read_text())["timestamp"] == ts
        assert a.renew(lease, 0).deadline_ns == clock.monotonic_ns() + a.lease_ns
        clock.step(-2)  # the clock goes back: Leaf skips the report, so do we
        assert not a.report()
        assert json.loads(zk.get(a.node)[0])["timestamp"] == ts
        assert "flakekit_clock_moved_backwards" in rec.names()
        clean_stop(a, lease, clock)

    def test_reporter_thread_runs(self, zk, ns, tmp_path):
        """The background report runs every report_interval (here 0.2 s)."""
        a = leaf(ns, tmp_path, report_interval="0.2s")
        lease = a.acquire(req())
        first = json.loads(zk.get(a.node)[0])["timestamp"]
        deadline = time.monotonic() + 10
        while a.reports < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.reports >= 3
        assert json.loads(zk.get(a.node)[0])["timestamp"] > first
        clean_stop(a, lease)


class TestClockCheck:
    def test_clock_behind_znode_refuses(self, zk, ns, tmp_path):
        """The node's timestamp is later than the clock: start-up fails (Leaf would start)."""
        clock, rec = ManualClock(), EventRecorder()
        a = leaf(ns, tmp_path, clock=clock)
        a.release(a.acquire(req()), 0)
        a.close()
        clock.step(-30)
        b = leaf(ns, tmp_path, clock=clock, events=Events(rec))
        with pytest.raises(ClockBehindReportError, match="30000.000 ms behind"):
            b.acquire(req())
        assert rec.names() == ["flakekit_clock_moved_backwards"]
        b.close()

    def test_clock_behind_cache_refuses_even_if_znode_is_older(self, zk, ns, tmp_path):
        """The cache's time counts too: a later cache timestamp than the clock refuses."""
        clock = ManualClock()
        a = leaf(ns, tmp_path, clock=clock)
        lease = a.acquire(req())
        clock.advance(10)
        a._save(clock.time_ns() // 1_000_000, clean=False)  # cache ahead of the znode
        a.close()
        clock.step(-5)
        b = leaf(ns, tmp_path, clock=clock)
        assert_refused_and_close(b, ClockBehindReportError, b.acquire, req(), match="cache file")
        assert lease.worker_id == 0

    def test_generator_never_stamps_below_last_report(self, ns, tmp_path):
        """A clean release records the high-water mark; the next start waits past it."""
        g = generator(ns, mode="leaf", cache_dir=str(tmp_path), connect_timeout="1s")
        with g:
            first = g.next_id()
            until = g.issued_until_ns()
        g2 = generator(ns, mode="leaf", cache_dir=str(tmp_path), connect_timeout="1s")
        with g2:
            assert g2.lease.not_before_ns >= (until // 1_000_000) * 1_000_000
            assert g2.worker_id == 0
            assert g2.next_id() > first


class TestCache:
    def test_zookeeper_down_starts_from_cache(self, ns, tmp_path):
        """With ZooKeeper unreachable at start-up, the own cache file gives the worker id."""
        rec = EventRecorder()
        a = leaf(ns, tmp_path)
        lease = a.acquire(req())
        clean_stop(a, lease)
        b = leaf(ns, tmp_path, hosts=DOWN, events=Events(rec))
        t0 = time.monotonic()
        lease2 = b.acquire(req())
        assert lease2.worker_id == lease.worker_id and b.source == "cache"
        assert time.monotonic() - t0 < 5
        assert "flakekit_alert" in rec.names()
        clean_stop(b, lease2)

    def test_zookeeper_down_and_cache_ahead_of_clock_refuses(self, ns, tmp_path):
        """Cache timestamp later than the clock, ZooKeeper down: refuse (Leaf starts)."""
        clock = ManualClock()
        ran_once(ns, tmp_path, clock=clock)
        clock.step(-60)
        b = leaf(ns, tmp_path, clock=clock, hosts=DOWN)
        assert_refused_and_close(b, ClockBehindReportError, b.acquire, req(), match="cache file")

    def test_zookeeper_down_without_cache_fails_clearly(self, ns, tmp_path):
        """No cache and no ZooKeeper: a BackendError that says both."""
        b = leaf(ns, tmp_path, hosts=DOWN)
        assert_refused_and_close(b, BackendError, b.acquire, req(),
                                 match="did not answer.*no cache file")

    def test_cloned_cache_file_is_ignored(self, ns, tmp_path):
        """A cache file copied from another ip:port (a cloned image) is not used."""
        a = ran_once(ns, tmp_path, ip="10.0.0.5")
        b = leaf(ns, tmp_path, hosts=DOWN, ip="10.0.0.6")
        b.cache_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(a.cache_path, b.cache_path)
        assert_refused_and_close(b, BackendError, b.acquire, req(), match="another identity")

    def test_cache_file_from_before_instances_still_counts(self, ns, tmp_path):
        """A cache file written before identities had an ``instance`` (0.1.0's first
        release) is instance 0's own file, not a clone: ZooKeeper down, it is used."""
        a = leaf(ns, tmp_path)
        lease = a.acquire(req())
        clean_stop(a, lease)
        raw = json.loads(a.cache_path.read_text())
        del raw["identity"]["instance"]
        a.cache_path.write_text(json.dumps(raw))
        b = leaf(ns, tmp_path, hosts=DOWN)
        assert b.acquire(req()).worker_id == lease.worker_id and b.source == "cache"
        b.close()
        c = leaf(ns, tmp_path, hosts=DOWN, instance=1)   # but never instance 1's
        c.cache_path.write_text(json.dumps(raw))
        assert_refused_and_close(c, BackendError, c.acquire, req(), match="another identity")

    def test_back_online_resumes_reporting(self, zk, zk_hosts, ns, tmp_path):
        """Started from the cache, the reporter finds its znode once ZooKeeper answers."""
        a = ran_once(ns, tmp_path)
        b = leaf(ns, tmp_path, hosts=DOWN)
        lease = b.acquire(req())
        assert b.source == "cache"
        b.hosts = zk_hosts  # "ZooKeeper comes back"
        assert b.report()
        assert b.source == "zookeeper" and b.node == a.node
        clean_stop(b, lease)

    def test_back_online_with_a_later_report_stops_ids(self, zk, zk_hosts, ns, tmp_path):
        """Started from the cache; when ZooKeeper answers, our znode holds a time later
        than this host's clock (a clone reported meanwhile): the allocator alerts, fires
        the clock hook and pushes a loss, so the generator stops issuing."""

        a = ran_once(ns, tmp_path)
        rec = EventRecorder()
        b = leaf(ns, tmp_path, hosts=DOWN, events=Events(rec))
        lease = b.acquire(req())
        pushed: list[tuple[str, str]] = []
        b.watch(lambda kind, reason: pushed.append((kind, reason)))
        node = a.node
        zk.set(node, json.dumps({"ip": "10.9.8.7", "port": "8080",
                                 "timestamp": time.time_ns() // 1_000_000 + 60_000}).encode())
        b.hosts = zk_hosts  # "ZooKeeper comes back"
        assert not b.report()
        assert b.source == "cache"
        assert pushed and pushed[0][0] == "lost" and "a cloned host" in pushed[0][1]
        assert {"flakekit_clock_moved_backwards", "flakekit_alert"} <= set(rec.names())
        clean_stop(b, lease)

    def test_outage_never_blocks_report_release_or_close(self, zk_hosts, ns, tmp_path):
        """ZooKeeper unreachable after start: a report keeps the cache file current and
        returns; release and close return promptly (kazoo queues calls made while
        disconnected until it reconnects, so a plain call hangs the reporter and shutdown)."""
        import threading

        proxy = TcpProxy.in_front_of(zk_hosts)
        a = leaf(ns, tmp_path, hosts=proxy.address, report_interval="0.2s")
        lease = a.acquire(req())
        proxy.cut()
        deadline = time.monotonic() + 5
        while a._conn.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        before = json.loads(a.cache_path.read_text())["timestamp"]
        time.sleep(0.05)
        done: list[object] = []
        worker = threading.Thread(target=lambda: done.append(a.report()), daemon=True)
        worker.start()
        worker.join(3)
        assert done == [False], "report() blocked while ZooKeeper was unreachable"
        assert json.loads(a.cache_path.read_text())["timestamp"] > before
        closer = threading.Thread(target=lambda: (a.release(lease, time.time_ns()), a.close()),
                                  daemon=True)
        closer.start()
        closer.join(5)
        assert not closer.is_alive(), "release/close hung while ZooKeeper was unreachable"
        assert json.loads(a.cache_path.read_text())["clean"] is True
        proxy.stop()

    def test_whole_generator_with_tiny_layout(self, ns, tmp_path):
        """The leaf allocator drives a SnowflakeGenerator end to end."""
        g = generator(ns, tiny_layout(), mode="leaf", cache_dir=str(tmp_path),
                      connect_timeout="1s")
        with g:
            ids = {g.next_id() for _ in range(1000)}
            assert len(ids) == 1000
