"""The proposer's debounce is honoured between renewals: a difference in the members that
falls due is proposed then, not at the next renewal or view re-read (which a membership
with a renewal thread does only every lease/3: 3.3 s with the default lease, while the
debounce is 0.5 s). Found by the leave drill of plugins/flakekit-server (a clean stop of a
node left its keys unowned for up to two renewal intervals)."""

from __future__ import annotations

from flakekit.cluster.node import ClusterNode
from flakekit.cluster.settings import ClusterSettings
from flakekit.testing import ManualClock
from flakekit.testing.memory_cluster import MemoryClusterStore


def node(store: MemoryClusterStore, clock: ManualClock, name: str) -> ClusterNode:
    settings = ClusterSettings("c", name, f"http://{name}:8080", lease=10.0, debounce=0.5)
    return ClusterNode(settings, store.membership(name), clock, threads=False).start()


def test_a_debounced_difference_is_proposed_when_it_falls_due():
    """Node b joins a one-node view; its own upkeep proposes the view with both members
    once the debounce has passed, though no renewal or view re-read is due yet."""
    clock = ManualClock()
    # renewals run on the keeper's own thread (an hour apart here), as with SQL, ZooKeeper
    # and etcd: the node's upkeep renews nothing and gets no renewal hint
    store = MemoryClusterStore(clock, renew_interval=3600.0)
    a = node(store, clock, "a")
    b = node(store, clock, "b")
    try:
        assert store.membership("x").view("c").nodes() == ("a",)
        clock.advance(0.2)
        b.upkeep()
        assert store.membership("x").view("c").nodes() == ("a",)   # still debouncing
        clock.advance(0.4)
        b.upkeep()
        assert store.membership("x").view("c").nodes() == ("a", "b")
        assert b.status()["epoch"] == 2
    finally:
        b.close()
        a.close()
