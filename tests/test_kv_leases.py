"""The key-value lease algorithm (flakekit.leases.kv) against the in-memory reference
store (flakekit.testing.memory_kv), on a manual clock. The real-ZooKeeper drills in
plugins/flakekit-zookeeper/tests run the same algorithm against a server."""

from __future__ import annotations

import json

import pytest

from flakekit.errors import BackendError, LeaseLostError, WorkerExhaustedError
from flakekit.leases.kv import KvLeaseAllocator
from flakekit.leases.lease import WorkerLease
from flakekit.testing import ManualClock
from flakekit.testing.memory_kv import MemoryKv, MemoryKvClient
from flakekit.testing.requests import lease_request as req
from flakekit.values.events import Events

S = 1_000_000_000
TTL_MS = 2000
SAFETY = S // 2          # lease_ms = 1500


class Hook:
    def __init__(self) -> None:
        self.alerts: list[tuple[str, str]] = []

    def __getattr__(self, name):
        if name == "flakekit_alert":
            return lambda **kw: self.alerts.append((kw["kind"], kw["message"]))
        return lambda **kw: None


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def make(server: MemoryKv, clock: ManualClock, *, quarantine_s: float = 0.0,
         events: Events | None = None) -> KvLeaseAllocator:
    return KvLeaseAllocator(
        store=server.client(TTL_MS), base="/flakekit/t", clock=clock,
        events=events or Events(), safety_window_ns=SAFETY,
        quarantine_ns=int(quarantine_s * S), connect_timeout_ns=5 * S, generator="t",
    )


@pytest.fixture
def server(clock: ManualClock) -> MemoryKv:
    return MemoryKv(clock)


def holder(server: MemoryKv, clock: ManualClock) -> tuple[KvLeaseAllocator, WorkerLease]:
    """A new allocator on ``server`` and the lease it acquired."""
    a = make(server, clock)
    return a, a.acquire(req())


def watched_holder(server: MemoryKv, clock: ManualClock,
                   ) -> tuple[KvLeaseAllocator, WorkerLease, list[tuple[str, str]]]:
    """A new allocator on ``server`` watched (``pushes``) before it acquired its lease."""
    a = make(server, clock)
    pushed = pushes(a)
    return a, a.acquire(req()), pushed


def pushes(a: KvLeaseAllocator) -> list[tuple[str, str]]:
    """What ``a`` pushes to its watcher, ``(kind, reason)``, from now on."""
    pushed: list[tuple[str, str]] = []
    a.watch(lambda kind, reason: pushed.append((kind, reason)))
    return pushed


def record(server: MemoryKv, wid: int) -> dict:
    return json.loads(server.nodes[f"/flakekit/t/workers/{wid}"].data)


def store(alloc: KvLeaseAllocator) -> MemoryKvClient:
    assert isinstance(alloc.store, MemoryKvClient)
    return alloc.store


class TestClaims:
    def test_lowest_free_id_and_epoch_per_claim(self, clock, server):
        allocs = [make(server, clock) for _ in range(3)]
        leases = [a.acquire(req()) for a in allocs]
        assert [x.worker_id for x in leases] == [0, 1, 2]
        assert [x.epoch for x in leases] == [1, 1, 1]
        claim = server.nodes["/flakekit/t/claims/1"]
        assert claim.owner == store(allocs[1]).sid  # attached to the holder's session
        allocs[1].release(leases[1], clock.time_ns())
        again = make(server, clock).acquire(req())
        assert (again.worker_id, again.epoch) == (1, 2)
        assert again.not_before_ns == leases[1].not_before_ns or again.not_before_ns > 0

    def test_quarantine_after_a_clean_release(self, clock, server):
        a = make(server, clock, quarantine_s=30)
        first = a.acquire(req())
        a.release(first, clock.time_ns())
        a.close()
        b = make(server, clock, quarantine_s=30)
        assert b.acquire(req()).worker_id == 1
        states = {r.worker_id: r.state for r in b.records()}
        assert states == {0: "quarantined", 1: "held"}
        clock.advance(29)
        assert make(server, clock, quarantine_s=30).acquire(req()).worker_id == 2
        clock.advance(1.01)
        lease = make(server, clock, quarantine_s=30).acquire(req())
        assert (lease.worker_id, lease.epoch) == (0, 2)

    def test_a_crashed_holder_is_waited_out_for_lease_plus_quarantine(self, clock, server):
        """No release: the claim goes with the session (TTL); the id stays unclaimable
        until mtime + lease + quarantine, and the successor waits past the holder's mark
        (its clock + the lease at the last heartbeat)."""
        a = make(server, clock, quarantine_s=5)
        lease = a.acquire(req())
        mark_ms = record(server, 0)["issued_until"]
        assert mark_ms == clock.time_ns() // 1_000_000 + 1500
        assert lease.stamp_until_ns == mark_ms * 1_000_000
        store(a).suspend()             # the process hangs; nobody keeps the session alive
        clock.advance(2.0)             # the TTL passes
        server.expire_due()
        assert "/flakekit/t/claims/0" not in server.nodes
        b = make(server, clock, quarantine_s=5)
        assert b.acquire(req()).worker_id == 1     # 0: lease + quarantine not over yet
        clock.advance(3.1)             # 5.1 s: the quarantine alone is over, not + lease
        assert make(server, clock, quarantine_s=5).acquire(req()).worker_id == 2
        clock.advance(1.5)             # 6.6 s after the last heartbeat: 1.5 + 5 passed
        c = make(server, clock, quarantine_s=5).acquire(req())
        assert (c.worker_id, c.epoch) == (0, 2)
        assert c.not_before_ns == mark_ms * 1_000_000   # wait past what 0 could have stamped

    def test_exhausted_never_takes_a_live_or_quarantined_id(self, clock, server):
        hook = Hook()
        make(server, clock).acquire(req(1))
        b = make(server, clock, quarantine_s=60)
        b.release(b.acquire(req(1)), clock.time_ns())
        c = make(server, clock, quarantine_s=60, events=Events(hook))
        with pytest.raises(WorkerExhaustedError, match="1 held, 1 in quarantine"):
            c.acquire(req(1))
        assert hook.alerts and hook.alerts[0][0] == "workers-exhausted"
        assert store(c).state == "closed"   # a failed acquire keeps no session

    def test_a_race_lost_on_the_claim_rescans(self, clock, server):
        """Between the scan and the claim another process claims the id: the
        create-if-absent fails, the next scan takes the next id."""
        a, b = make(server, clock), make(server, clock)
        fired = []

        def sneak() -> None:
            if not fired and "/flakekit/t/workers" not in str(server.nodes.keys()):
                fired.append(b.acquire(req()))

        store(a).during_call = sneak
        lease = a.acquire(req())
        assert fired and fired[0].worker_id == 0
        assert lease.worker_id == 1


class TestRenew:
    def test_deadline_from_the_send_time_of_the_renewal(self, clock, server):
        """A reply that takes 0.4 s: the deadline counts from before the request."""
        a, lease = holder(server, clock)
        clock.advance(0.5)
        sent = clock.monotonic_ns()
        store(a).during_call = lambda: clock.advance(0.1)   # four calls: 0.4 s
        new = a.renew(lease, clock.time_ns())
        assert new.deadline_ns == sent + 1500 * 10**6
        assert new.stamp_until_ns >= lease.stamp_until_ns

    def test_suspended_is_not_lost_and_the_same_session_comes_back(self, clock, server):
        a, lease, pushed = watched_holder(server, clock)
        store(a).suspend()
        with pytest.raises(BackendError, match="SUSPENDED"):
            a.renew(lease, 0)
        clock.advance(1.0)               # shorter than the TTL
        store(a).resume()
        assert ("connected", "") in pushed
        assert a.renew(lease, 0).deadline_ns > lease.deadline_ns
        assert not [k for k, _ in pushed if k == "lost"]

    def test_session_expiry_is_pushed_as_lost(self, clock, server):
        a, lease, pushed = watched_holder(server, clock)
        store(a).suspend()
        clock.advance(2.5)               # past the TTL while disconnected
        store(a).resume()
        assert pushed and pushed[-1][0] == "lost" and "expired" in pushed[-1][1]
        with pytest.raises(LeaseLostError):
            a.renew(lease, 0)

    @pytest.mark.parametrize(("change", "message"), [
        pytest.param(lambda nodes: nodes.pop("/flakekit/t/claims/0"), "gone",
                     id="claim_gone_is_lost_not_retryable"),
        pytest.param(lambda nodes: setattr(nodes["/flakekit/t/claims/0"], "owner", 0x999),
                     "another session", id="claim_of_another_session_is_lost"),
    ])
    def test_a_changed_claim(self, clock, server, change, message):
        """The claim deleted, or now another session's: the renewal finds the lease lost."""
        a, lease = holder(server, clock)
        change(server.nodes)
        with pytest.raises(LeaseLostError, match=message):
            a.renew(lease, 0)

    def test_a_heartbeat_that_landed_late_is_still_ours(self, clock, server):
        """The record's version moved under us by our own (timed-out) heartbeat: the
        renewal re-reads it and goes on; a record of another epoch means lost."""
        a, lease = holder(server, clock)
        key = "/flakekit/t/workers/0"
        node = server.nodes[key]
        server.apply([_put(key, node.data, node.version)], 0)   # our own late write
        assert a.renew(lease, 0).deadline_ns is not None
        node = server.nodes[key]
        stolen = json.loads(node.data) | {"epoch": 99}
        server.apply([_put(key, json.dumps(stolen).encode(), node.version)], 0)
        with pytest.raises(LeaseLostError, match="changed hands"):
            a.renew(lease, 0)

    def test_a_deposed_holders_release_is_fenced(self, clock, server):
        """A holder whose record moved on (a newer claim) cannot write its release."""
        a, lease = holder(server, clock)
        key = "/flakekit/t/workers/0"
        node = server.nodes[key]
        newer = json.loads(node.data) | {"epoch": 2, "holder": "other"}
        server.apply([_put(key, json.dumps(newer).encode(), node.version)], 0)
        a.release(lease, clock.time_ns())
        assert record(server, 0)["holder"] == "other"
        assert "/flakekit/t/claims/0" in server.nodes   # nothing of the release applied


class TestEtcdStyle:
    def test_epoch_is_the_claim_revision_and_grows(self, clock):
        server = MemoryKv(clock, style="etcd")
        a = make(server, clock)
        first = a.acquire(req())
        a.release(first, clock.time_ns())
        second = make(server, clock).acquire(req())
        assert second.worker_id == 0 and second.epoch > first.epoch > 0

    def test_without_a_server_clock_the_claimant_measures_the_quarantine(self, clock):
        """No store clock: an id seen free (unchanged) counts its quarantine from the
        claimant's first sight, on its monotonic clock."""
        server = MemoryKv(clock, style="etcd")
        a = make(server, clock, quarantine_s=10)
        a.release(a.acquire(req()), clock.time_ns())
        b = make(server, clock, quarantine_s=10)
        assert b.acquire(req()).worker_id == 1   # 0 first seen free now
        b.close()                                # 1: ended without a release
        clock.advance(9.9)
        assert b.acquire(req()).worker_id == 2   # 0 still in quarantine, 1 just seen
        b.close()
        clock.advance(0.2)
        assert b.acquire(req()).worker_id == 0   # seen free for 10.1 s
        other = make(server, clock, quarantine_s=10)
        assert other.acquire(req()).worker_id == 3   # its own sightings start now

    def test_only_keepalive_keeps_the_lease(self, clock):
        server = MemoryKv(clock, style="etcd")
        a, lease = holder(server, clock)
        for _ in range(5):
            clock.advance(0.6)
            lease = a.renew(lease, clock.time_ns())
        clock.advance(2.1)                  # no keep-alive for longer than the TTL
        with pytest.raises(LeaseLostError):
            a.renew(lease, 0)


def _put(key: str, data: bytes, version: int):
    from flakekit.leases.kv import KvOp

    return KvOp.put(key, data, version)


class TestWithTheGenerator:
    def test_a_successor_waits_past_the_crashed_holders_high_water_mark(self):
        """The holder crashed; the successor's clock is 1 s behind the holder's: its
        generator waits until its clock passes the mark (the holder's clock + the lease)
        before the first ID, so no ID of the successor carries a time the holder may
        have used."""
        from flakekit.builtin.layouts import SNOWFLAKE
        from flakekit.generators.snowflake import SnowflakeGenerator

        server_clock, a_clock, b_clock = ManualClock(), ManualClock(), ManualClock()
        b_clock.step(-1)
        server = MemoryKv(server_clock)
        a = make(server, a_clock)
        held = a.acquire(req())
        server.expire(store(a).sid)               # the holder is gone without a release
        server_clock.advance(2)                   # lease (1.5 s) + quarantine (0) passed
        b_clock.advance(2)
        gen = SnowflakeGenerator(SNOWFLAKE, b_clock, make(server, b_clock), name="t")
        started = b_clock.time_ns()
        gen.start()
        assert gen.lease is not None and gen.lease.worker_id == 0 and gen.lease.epoch == 2
        assert gen.lease.not_before_ns == held.stamp_until_ns
        first = gen.next_id()
        stamp_ms = SNOWFLAKE.decompose(first)["time"] + SNOWFLAKE.epoch_ns // 1_000_000
        assert stamp_ms * 1_000_000 > held.stamp_until_ns
        assert b_clock.time_ns() - started >= S // 2   # it waited on its own clock
        gen.close()
