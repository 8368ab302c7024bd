"""mode = "lease": ephemeral claims, lowest free id, epochs, quarantine, session = lease."""

from __future__ import annotations

import json
import time

import pytest
from zkhelpers import allocator, expire_session, generator

from flakekit.errors import (
    ClockMovedBackwardsError,
    LeaseError,
    LeaseLostError,
    WorkerExhaustedError,
)
from flakekit.testing import EventRecorder
from flakekit.testing.drills import parse_ids, spawn, write_config
from flakekit.testing.requests import lease_request as req
from flakekit.testing.waiting import seconds_until_raises, wait_until
from flakekit.values.events import Events

FAST = {"session_timeout": "2s", "safety_window": "0.5s", "connect_timeout": "5s"}


class TestClaims:
    def test_lowest_free_id_and_epochs(self, zk, ns):
        """Ids go 0, 1, 2; a released id comes back with a higher epoch after quarantine 0."""
        allocs = [allocator(ns, quarantine=0, **FAST) for _ in range(3)]
        leases = [a.acquire(req()) for a in allocs]
        assert [x.worker_id for x in leases] == [0, 1, 2]
        assert all(x.epoch == 1 for x in leases)
        owner = zk.exists(f"/flakekit/{ns}/claims/1").ephemeralOwner
        assert owner == allocs[1]._conn.session_id
        allocs[1].release(leases[1], time.time_ns())
        allocs[1].close()
        again = allocator(ns, quarantine=0, **FAST)
        lease = again.acquire(req())
        assert (lease.worker_id, lease.epoch) == (1, 2)
        assert lease.not_before_ns > 0  # the previous holder's high-water mark
        for a in (*allocs, again):
            a.close()

    def test_high_water_mark_is_the_leases_bound_until_a_clean_release(self, zk, ns):
        """While held, the worker node's mark is the holder's clock + the lease (what a
        crash could have stamped, for a successor to wait past); a clean release writes
        the exact last ID instead."""
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        mark = json.loads(zk.get(f"/flakekit/{ns}/workers/0")[0])["issued_until"]
        assert mark >= time.time_ns() // 1_000_000 + a._lease_ms - 1000
        a.renew(lease, 0)
        renewed = json.loads(zk.get(f"/flakekit/{ns}/workers/0")[0])["issued_until"]
        assert renewed >= mark
        last = time.time_ns()
        a.release(lease, last)
        released = json.loads(zk.get(f"/flakekit/{ns}/workers/0")[0])["issued_until"]
        assert released == -(-last // 1_000_000)
        a.close()

    def test_quarantine_keeps_a_released_id(self, ns):
        """A released id is not claimed again until the quarantine is over."""
        a = allocator(ns, quarantine="1.5s", **FAST)
        first = a.acquire(req())
        a.release(first, time.time_ns())
        a.close()
        b = allocator(ns, quarantine="1.5s", **FAST)
        assert b.acquire(req()).worker_id == 1
        recs = {r.worker_id: r for r in b.records()}
        assert recs[0].state == "quarantined" and recs[1].state == "held" and recs[1].mine
        time.sleep(1.6)
        c = allocator(ns, quarantine="1.5s", **FAST)
        lease = c.acquire(req())
        assert (lease.worker_id, lease.epoch) == (0, 2)
        b.close()
        c.close()

    def test_exhausted_never_takes_a_live_id(self, ns):
        """When every id is held or quarantined: WorkerExhaustedError and an alert."""
        rec = EventRecorder()
        a, b = allocator(ns, **FAST), allocator(ns, quarantine="60s", **FAST)
        a.acquire(req(1))
        lease = b.acquire(req(1))
        b.release(lease, time.time_ns())
        c = allocator(ns, events=Events(rec), quarantine="60s", **FAST)
        with pytest.raises(WorkerExhaustedError, match="1 held, 1 in quarantine"):
            c.acquire(req(1))
        assert "flakekit_alert" in rec.names()
        for x in (a, b, c):
            x.close()

    def test_failed_acquire_leaves_no_connection(self, ns, tmp_path):
        """An acquire that fails (ids exhausted; leaf: clock behind) closes its ZooKeeper
        client: nothing calls close() on an allocator whose generator never started
        (Kit.close closes started generators only), so kazoo's threads would leak."""
        import threading

        from flakekit.testing import ManualClock

        a = allocator(ns, **FAST)
        a.acquire(req(0))
        before = threading.active_count()
        b = allocator(ns, **FAST)
        with pytest.raises(WorkerExhaustedError):
            b.acquire(req(0))
        assert b._conn is None
        clock = ManualClock()
        leaf = allocator(ns, mode="leaf", clock=clock, cache_dir=str(tmp_path), **FAST)
        leaf.release(leaf.acquire(req()), 0)
        leaf.close()
        clock.step(-30)
        late = allocator(ns, mode="leaf", clock=clock, cache_dir=str(tmp_path), **FAST)
        with pytest.raises(ClockMovedBackwardsError):
            late.acquire(req())
        assert late._conn is None
        deadline = time.monotonic() + 3
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert threading.active_count() <= before
        a.close()

    def test_renew_pushes_the_deadline(self, ns):
        """renew() moves the deadline to (now + session - safety) and keeps the claim."""
        a = allocator(ns, **FAST)
        lease = a.acquire(req())
        assert a.renew_interval == pytest.approx(2 / 3, abs=0.01)
        time.sleep(0.3)
        new = a.renew(lease, time.time_ns())
        assert new.deadline_ns > lease.deadline_ns
        assert new.deadline_ns - time.monotonic_ns() <= 1.5e9
        a.close()

    def test_claim_taken_away_means_lost(self, zk, ns):
        """If the claim znode is gone, renew raises LeaseLostError (not a retryable error)."""
        a = allocator(ns, **FAST)
        lease = a.acquire(req())
        zk.delete(f"/flakekit/{ns}/claims/0")
        with pytest.raises(LeaseLostError, match="gone"):
            a.renew(lease, 0)
        a.close()


class TestSessionExpiry:
    def test_expiry_stops_the_generator_and_restart_gets_a_new_id(self, zk_hosts, ns):
        """Server-side session expiry: the generator stops, then restarts with a new id."""
        rec = EventRecorder()
        gen = generator(ns, events=Events(rec), quarantine="5s", **FAST)
        gen.start()
        assert gen.worker_id == 0
        gen.next_id()
        alloc = gen.keeper.allocator
        t0 = time.monotonic()
        expire_session(alloc._conn.client, zk_hosts)
        # before the 5 s quarantine a successor waits out (how soon: printed, not timed)
        stopped = seconds_until_raises(gen.next_id, LeaseError, t0, 5, interval=0.001)
        assert stopped is not None, "still issuing 5 s after the session expired"
        print(f"session expiry -> stop: {stopped:.3f} s")
        wait_until(lambda: gen.keeper.lost is not None, max(0.0, 5 - (time.monotonic() - t0)),
                   interval=0.01)
        assert "flakekit_lease_lost" in rec.names()
        with pytest.raises(LeaseLostError):
            gen.next_id()
        gen.restart()
        assert gen.worker_id == 1  # 0 is in quarantine
        assert gen.next_id() > 0
        gen.close()
        print(f"expiry: generator stopped {stopped * 1000:.0f} ms after the forced expiry")

    def test_expiry_then_automatic_new_id(self, zk_hosts, ns):
        """on_lease_lost="restart" (lease mode's default from config): after a forced
        expiry the generator stops at once, then goes on by itself under a new id."""
        gen = generator(ns, quarantine="5s", on_lease_lost="restart", **FAST)
        gen.start()
        before = gen.next_id()
        expire_session(gen.keeper.allocator._conn.client, zk_hosts)
        t0 = time.monotonic()
        refused = resumed = None
        while time.monotonic() - t0 < 10 and resumed is None:
            try:
                after = gen.next_id()
                if refused is not None:
                    resumed = time.monotonic() - t0
            except LeaseError:
                refused = refused or time.monotonic() - t0
            time.sleep(0.001)
        assert refused is not None and resumed is not None, (refused, resumed)
        assert gen.worker_id == 1 and gen.lease.epoch >= 1  # 0 is in quarantine
        assert after > before
        gen.close()
        print(f"expiry: refused after {refused * 1000:.0f} ms, "
              f"new id after {resumed * 1000:.0f} ms")


class TestProcesses:
    def test_concurrent_processes_get_distinct_ids(self, tmp_path, zk_hosts, ns):
        """Four processes started at once: four worker ids, no duplicate ID."""
        cfg = write_config(tmp_path, ns, f'{{ type = "zookeeper", hosts = "{zk_hosts}", '
                                         'mode = "lease", session_timeout = "2s" }')
        procs = [spawn(cfg, ns, "--seconds", "1") for _ in range(4)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), [p.stderr.read() for p in procs]
        workers = sorted(int(o.split("LEASE ")[1].split()[0]) for o in outs)
        assert workers == [0, 1, 2, 3]
        ids = [i for o in outs for i, _ in parse_ids(o)]
        assert len(ids) == len(set(ids)) and len(ids) > 100
