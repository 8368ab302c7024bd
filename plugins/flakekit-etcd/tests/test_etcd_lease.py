"""The etcd allocator in one process on a real etcd: claims, epochs, the one lease, the
fence, a revoked lease, records."""

from __future__ import annotations

import json
import time

import pytest
from etcdhelpers import allocator, etcdctl, generator

from flakekit.errors import LeaseError, LeaseLostError, WorkerExhaustedError
from flakekit.testing.refusals import assert_refused_and_close
from flakekit.testing.requests import lease_request as req
from flakekit.testing.waiting import seconds_until_raises

FAST = {"ttl": "3s", "connect_timeout": "5s"}


def kv(endpoints: str, key: str) -> dict | None:
    """A key as etcdctl sees it (create_revision, mod_revision, lease, value)."""
    out = json.loads(etcdctl(endpoints, "get", key, "-w", "json"))
    kvs = out.get("kvs") or []
    return kvs[0] if kvs else None


def lease_hex(alloc) -> str:
    return f"{alloc.store.session_id:x}"


class TestClaims:
    def test_epoch_is_the_claim_transactions_revision(self, etcd_endpoints, ns):
        """The claim is created by the txn, on the process's lease; the lease's epoch is
        the claim's create revision; the record has no lease."""
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        claim = kv(etcd_endpoints, f"/flakekit/{ns}/claims/{lease.worker_id}")
        record = kv(etcd_endpoints, f"/flakekit/{ns}/workers/{lease.worker_id}")
        assert claim is not None and record is not None
        assert lease.epoch == claim["create_revision"] == record["create_revision"]
        assert claim["lease"] == a.store.session_id
        assert not record.get("lease")
        a.close()

    def test_lowest_free_id_epochs_grow_and_a_release_is_reused(self, ns):
        """Ids 0, 1, 2; a released id comes back (quarantine 0) with a higher epoch and
        the released holder's mark."""
        allocs = [allocator(ns, quarantine=0, **FAST) for _ in range(3)]
        leases = [a.acquire(req()) for a in allocs]
        assert [x.worker_id for x in leases] == [0, 1, 2]
        last = time.time_ns()
        allocs[1].release(leases[1], last)
        allocs[1].close()
        again = allocator(ns, quarantine=0, **FAST)
        lease = again.acquire(req())
        assert lease.worker_id == 1 and lease.epoch > max(x.epoch for x in leases)
        assert lease.not_before_ns >= last - 1_000_000
        for a in (*allocs, again):
            a.close()

    def test_ttl_is_what_etcd_granted(self, ns):
        """The lease TTL is the granted one: etcd 3.4 answers the 3 s asked for."""
        a = allocator(ns, quarantine=0, **FAST)
        a.acquire(req())
        assert a.session_ms == 3000 and a.store.session.granted_ms == 3000
        a.close()

    def test_close_revokes_the_lease(self, etcd_endpoints, ns):
        """Closing without a release revokes the lease: the claim is gone at once (the
        record stays, so a successor still waits out lease + quarantine)."""
        a = allocator(ns, quarantine=0, **FAST)
        a.acquire(req())
        a.close()
        assert kv(etcd_endpoints, f"/flakekit/{ns}/claims/0") is None
        assert kv(etcd_endpoints, f"/flakekit/{ns}/workers/0") is not None


class TestFence:
    def test_release_is_fenced_on_the_claims_revision_and_lease(self, etcd_endpoints, ns):
        """The claim deleted behind the holder's back and put again on another lease
        (the record untouched): the old holder's release must not mark the record
        released nor delete the other claim."""
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        key = f"/flakekit/{ns}/claims/{lease.worker_id}"
        other = etcdctl(etcd_endpoints, "lease", "grant", "30").split()[1]
        etcdctl(etcd_endpoints, "put", key, "someone-else", f"--lease={other}")
        a.release(lease, time.time_ns())
        assert kv(etcd_endpoints, key)["lease"] == int(other, 16)
        record = json.loads(etcdctl(etcd_endpoints, "get", f"/flakekit/{ns}/workers/0",
                                    "--print-value-only"))
        assert record["state"] == "held"
        a.close()
        etcdctl(etcd_endpoints, "lease", "revoke", other)

    def test_renewal_fails_once_the_claim_is_not_ours(self, etcd_endpoints, ns):
        """Same tampering: the renewal raises LeaseLostError instead of extending."""
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        key = f"/flakekit/{ns}/claims/{lease.worker_id}"
        etcdctl(etcd_endpoints, "del", key)
        etcdctl(etcd_endpoints, "put", key, "someone-else")
        assert_refused_and_close(a, LeaseLostError, a.renew, lease, time.time_ns())

    def test_heartbeat_is_fenced_on_the_claim(self, etcd_endpoints, ns):
        """The heartbeat itself (after the claim was read) is one txn conditioned on the
        claim: with the claim gone meanwhile it writes nothing."""
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        etcdctl(etcd_endpoints, "del", f"/flakekit/{ns}/claims/{lease.worker_id}")
        before = kv(etcd_endpoints, f"/flakekit/{ns}/workers/0")["mod_revision"]
        assert a._heartbeat(lease.worker_id, a.store.session_id, b"{}", 2.0) is None
        assert kv(etcd_endpoints, f"/flakekit/{ns}/workers/0")["mod_revision"] == before
        a.close()


class TestRevoked:
    def test_keepalive_after_revoke_is_lost_at_once(self, etcd_endpoints, ns):
        """A keep-alive answering no TTL (the lease is gone) is LeaseLostError and the
        store is LOST: the allocator knows without waiting for the deadline."""
        a = allocator(ns, quarantine=0, watch=False, **FAST)
        lease = a.acquire(req())
        etcdctl(etcd_endpoints, "lease", "revoke", lease_hex(a))
        with pytest.raises(LeaseLostError):
            a.renew(lease, time.time_ns())
        assert a.store.state == "lost" and a.lost
        a.close()

    @pytest.mark.parametrize("watch", [True, False], ids=["watch", "renewal-only"])
    def test_revoked_lease_stops_the_generator_within_the_ttl(
            self, etcd_endpoints, ns, watch, record_property):
        """`etcdctl lease revoke` from outside: the generator refuses before a successor
        could count the TTL out (its deadline is the last renewal's, sent before the
        revoke returned; the keep-alive, every TTL/3, or the watch hint tells it sooner:
        the measured time is recorded, speed is the benchmarks' business), and no ID
        comes after."""
        gen = generator(ns, quarantine=0, watch=watch, **FAST)
        gen.start()
        gen.next_id()
        time.sleep(0.2)   # the watch is set up
        t0 = time.monotonic()
        etcdctl(etcd_endpoints, "lease", "revoke", lease_hex(gen.keeper.allocator))
        revoked = time.monotonic()
        stopped = seconds_until_raises(gen.next_id, LeaseError, revoked, 3.0)
        if stopped is None:   # this thread got no CPU for 3 s: the deadline has passed now
            with pytest.raises(LeaseError):
                gen.next_id()
        else:
            record_property("stop_s", round(revoked - t0 + stopped, 3))
            print(f"revoke -> stop: {revoked - t0 + stopped:.3f} s (watch={watch})")
        assert_refused_and_close(gen, LeaseError, gen.next_id)

    def test_successor_waits_lease_plus_quarantine_after_a_revoke(self, etcd_endpoints, ns):
        """etcd keeps no time: after the holder's lease was revoked the id stays
        unclaimable for lease + quarantine, measured by the claimant from when it first
        saw the claim gone; then it is taken with a higher epoch, and the old holder's
        renewal is refused."""
        first = allocator(ns, quarantine=0, **FAST)
        old = first.acquire(req(0))
        etcdctl(etcd_endpoints, "lease", "revoke", lease_hex(first))
        second = allocator(ns, quarantine=0, **FAST)
        t0 = time.monotonic()
        with pytest.raises(WorkerExhaustedError):
            second.acquire(req(0))
        while True:
            try:
                taken = second.acquire(req(0))
                break
            except WorkerExhaustedError:
                time.sleep(0.1)
        waited = time.monotonic() - t0
        assert waited >= first._lease_ms / 1000 - 0.05
        assert taken.worker_id == 0 and taken.epoch > old.epoch
        assert_refused_and_close(first, LeaseLostError, first.renew, old, time.time_ns())
        second.close()


class TestRecords:
    def test_records_show_holder_epoch_lease_and_ttl_left(self, ns):
        a = allocator(ns, quarantine=0, **FAST)
        lease = a.acquire(req())
        (row,) = [r for r in a.records() if r.worker_id == lease.worker_id]
        assert row.state == "held" and row.mine and row.epoch == lease.epoch
        assert row.holder.startswith("10.9.8.7:8080/")
        assert row.extra["lease"] == f"0x{a.store.session_id:x}"
        assert 0 < row.extra["ttl_left"] <= 3
        a.close()


class TestOneLeasePerProcess:
    def test_allocators_of_a_process_share_one_lease(self, etcd_endpoints, ns):
        """Two generators' allocators in one process (same endpoints, TTL, credentials):
        one etcd lease holds both claims; closing one deletes its claim only, the lease
        lives on for the other; the last one out revokes it."""
        # a TTL nothing here waits for, which a starved test process cannot outlive
        a, b = allocator(ns, quarantine=0, ttl="60s"), allocator(ns, quarantine=0, ttl="60s")
        la, lb = a.acquire(req()), b.acquire(req())
        lease = a.store.session_id
        assert lease is not None and b.store.session_id == lease
        for w in (la.worker_id, lb.worker_id):
            assert kv(etcd_endpoints, f"/flakekit/{ns}/claims/{w}")["lease"] == lease
        a.close()
        assert kv(etcd_endpoints, f"/flakekit/{ns}/claims/{la.worker_id}") is None
        b.renew(lb, time.time_ns())
        ttl = json.loads(etcdctl(etcd_endpoints, "lease", "timetolive", f"{lease:x}",
                                 "-w", "json"))["ttl"]
        assert ttl > 0
        b.close()
        ttl = json.loads(etcdctl(etcd_endpoints, "lease", "timetolive", f"{lease:x}",
                                 "-w", "json"))["ttl"]
        assert ttl <= 0   # revoked with the last allocator
        other = allocator(ns, quarantine=0, ttl="4s")
        other.acquire(req())
        assert other.store.session_id != lease   # other settings, another lease
        other.close()

    def test_a_lost_lease_is_lost_for_every_allocator_on_it(self, etcd_endpoints, ns):
        a, b = allocator(ns, quarantine=0, **FAST), allocator(ns, quarantine=0, **FAST)
        la, lb = a.acquire(req()), b.acquire(req())
        old = a.store.session_id
        etcdctl(etcd_endpoints, "lease", "revoke", lease_hex(a))
        with pytest.raises(LeaseLostError):
            a.renew(la, time.time_ns())
        assert b.lost is not None          # told at once, before its own renewal
        with pytest.raises(LeaseLostError):
            b.renew(lb, time.time_ns())
        again = a.acquire(req())           # a new lease for the process
        assert a.store.session_id not in (None, old)
        assert again.worker_id not in (la.worker_id, lb.worker_id)   # those wait
        a.close()
        b.close()
