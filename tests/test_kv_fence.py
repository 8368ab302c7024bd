"""Stores whose epoch is a revision (etcd) fence every heartbeat and release on the claim
(``KvOp.check``: its version, i.e. the revision that created it, and its session), and a
CHANGED hint makes the holder renew at once. Against the in-memory etcd-style store."""

from __future__ import annotations

import json

from flakekit.leases.kv import KvLeaseAllocator, KvOp, KvState
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.testing import ManualClock
from flakekit.testing.memory_kv import MemoryKv, MemoryKvClient
from flakekit.values.events import Events

S = 1_000_000_000
CLAIM, RECORD = "/flakekit/t/claims/0", "/flakekit/t/workers/0"


def make(server: MemoryKv, clock: ManualClock) -> KvLeaseAllocator:
    return KvLeaseAllocator(
        store=server.client(2000), base="/flakekit/t", clock=clock, events=Events(),
        safety_window_ns=S // 2, quarantine_ns=0, connect_timeout_ns=5 * S, generator="t")


def holding() -> tuple[ManualClock, MemoryKv, KvLeaseAllocator, WorkerLease]:
    """An allocator on a fresh etcd-style store that holds worker 0:
    (clock, store, allocator, lease)."""
    clock = ManualClock()
    server = MemoryKv(clock, style="etcd")
    a = make(server, clock)
    return clock, server, a, a.acquire(LeaseRequest("t", 3, "", 0))


def replace_claim(server: MemoryKv) -> None:
    """The claim deleted and put again by another session; the record untouched."""
    other, _ = server.open_session(2000)
    del server.nodes[CLAIM]
    server.apply([KvOp.create(CLAIM, b"x", session=True)], other)


def test_check_op_conditions_on_version_and_owner():
    server = MemoryKv(ManualClock(), style="etcd")
    sid, _ = server.open_session(2000)
    (rev,) = server.apply([KvOp.create("/k", b"", session=True)], sid)
    assert server.apply([KvOp.check("/k", rev, owner=sid)], sid) is not None
    assert server.apply([KvOp.check("/k", rev, owner=sid + 1)], sid) is None
    assert server.apply([KvOp.check("/k", rev + 5)], sid) is None
    assert server.apply([KvOp.check("/gone", 1)], sid) is None


def test_heartbeat_is_refused_once_the_claim_is_not_ours():
    """The claim replaced between the renewal's read and its write: the heartbeat
    writes nothing (without the fence it would extend a lease on a lost claim)."""
    clock, server, a, lease = holding()
    before = server.nodes[RECORD].version
    replace_claim(server)
    assert a._heartbeat(lease.worker_id, a.store.session_id or 0, b"{}", 1.0) is None
    assert server.nodes[RECORD].version == before


def test_release_does_not_touch_a_claim_that_is_not_ours():
    clock, server, a, lease = holding()
    replace_claim(server)
    a.release(lease, clock.time_ns())
    assert CLAIM in server.nodes                          # the other's claim stays
    assert json.loads(server.nodes[RECORD].data)["state"] == "held"


def test_changed_hint_asks_for_a_renewal_now():
    _, server, a, _ = holding()
    pushed: list[str] = []
    a.watch(lambda kind, reason: pushed.append(kind))
    store = a.store
    assert isinstance(store, MemoryKvClient)
    a._on_state(KvState.CHANGED)
    assert pushed == ["connected"]
