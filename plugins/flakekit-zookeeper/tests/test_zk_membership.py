"""ZooKeeper cluster membership (issue 12, item 2) on a real ZooKeeper: the
MembershipContract suite, plus ZooKeeper's own failure drills (a session expired from
outside, a connection blip shorter than the session, processes racing for one node id,
compare-and-set proposals from several clients, a dead view watch), registration and
one-line errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flakekit_zookeeper import ZooKeeperMembershipSettings
from flakekit_zookeeper.membership import ZkMembership
from zkhelpers import expire_session

from flakekit.assembly.kit import build_kit
from flakekit.cluster.store_contracts import MemberLease
from flakekit.errors import BackendError, LeaseLostError
from flakekit.testing import TcpProxy
from flakekit.testing.cluster_draws import DrawingClients, check_order, owns
from flakekit.testing.configs import assert_build_refused, assert_field_error
from flakekit.testing.membership_builders import join_request as request
from flakekit.testing.membership_builders import member_path, membership_config
from flakekit.testing.membership_contract import AddressedMembershipContract
from flakekit.testing.plugin_hosts import plugin_host_fixture
from flakekit.testing.waiting import wait_until
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member

NS = 1_000_000_000

plugin_host = plugin_host_fixture()


@pytest.fixture
def made() -> list[ZkMembership]:
    return []


@pytest.fixture
def make(zk_hosts, root, made, closing):
    """``make(**kw)``: a new ZkMembership (a new session: another process, as ZooKeeper
    sees it) under this test's root; closed after the test."""
    def make(hosts: str | None = None, **kw: Any) -> ZkMembership:
        m = closing(ZkMembership(hosts or zk_hosts, MonotonicClock(), root=root, **kw))
        made.append(m)
        return m
    return make


class TestZkMembershipContract(AddressedMembershipContract):
    """Each membership is its own ZooKeeper session; ``expire`` ends the holder's session
    on the server, as after a crash."""

    factory = "flakekit_zookeeper.membership:ZkMembership"
    address_fixture = "zk_hosts"
    first_version = 0

    @pytest.fixture
    def expire(self, made, zk, zk_hosts, root):
        def expire(cluster: str, lease: MemberLease) -> None:
            path = member_path(root, cluster, lease.member.node)
            owner = zk.exists(path).ephemeralOwner
            holder = next(m for m in made
                          if m.connection is not None and m.connection.session_id == owner)
            expire_session(holder.connection.client, zk_hosts)
            wait_until(lambda: zk.exists(path) is None)
            # the holder's client reconnects on a new session: the contract reads through it
            # next (a read during the reconnect is a ConnectionLoss, not what is tested)
            assert holder.wait_connected(30)
        return expire


# -- the lease is the session ------------------------------------------------------------------
def test_the_session_is_the_lease(make, ns):
    """Without ``session_timeout`` the session is the join's lease; a configured one wins;
    the deadline is the session less a fifth (the safety window) from the send time."""
    m = make()
    before = time.monotonic_ns()
    lease = m.acquire(request(ns, lease_s=3.0))
    assert lease.ttl == pytest.approx(3.0)
    assert before + 2.4 * NS <= lease.deadline_ns <= time.monotonic_ns() + 2.4 * NS
    assert m.renew_interval == pytest.approx(1.0)
    fixed = make(session_timeout_s=5.0).acquire(request(ns, "n2", lease_s=3.0))
    assert fixed.ttl == pytest.approx(5.0)


def test_the_member_znode_is_ephemeral_and_its_czxid_is_the_epoch(make, zk, root, ns):
    m = make()
    lease = m.acquire(request(ns))
    data, stat = zk.get(member_path(root, ns, "n1"))
    assert stat.ephemeralOwner == m.connection.session_id
    assert stat.czxid == lease.epoch
    assert lease.holder.encode() in data
    view = m.propose(ns, 0, [lease.member])
    _, vstat = zk.get(f"{root}/clusters/{ns}/view")
    assert view is not None and view.changed_at_ms == vstat.mtime  # ZooKeeper's clock


def test_a_deleted_member_znode_means_lost(make, zk, root, ns):
    """Someone deletes the znode (an operator, a bug): the next renewal says lost."""
    m = make()
    lease = m.acquire(request(ns))
    zk.delete(member_path(root, ns, "n1"))
    with pytest.raises(LeaseLostError, match="gone"):
        m.renew(lease, 0)


def test_session_expiry_means_lost_and_another_process_joins(make, zk, zk_hosts, root, ns):
    """The holder's session expires on the server (as after a long pause): its renewal
    raises LeaseLostError (never BackendError once reconnected), it shows as lapsed, and
    a second process joins the node at once with a higher incarnation."""
    first, second = make(), make()
    lease = first.acquire(request(ns))
    old_session = first.connection.session_id
    expire_session(first.connection.client, zk_hosts)
    wait_until(lambda: zk.exists(member_path(root, ns, "n1")) is None)
    # kazoo learns of the expiry only when it next hears from the server (a loaded
    # machine: seconds after the znode went), then opens a new session
    wait_until(lambda: first.connection.connected
               and first.connection.session_id != old_session, 30,
               what="kazoo on a new session after the expiry")
    with pytest.raises(LeaseLostError, match="gone"):
        first.renew(lease, 0)
    assert {i.node: i.state for i in second.members(ns)} == {"n1": "lapsed"}
    taken = second.acquire(request(ns))
    assert taken.epoch > lease.epoch and taken.holder != lease.holder
    with pytest.raises(LeaseLostError):
        first.renew(lease, 0)
    first.release(lease, 0)   # fenced: the new holder's znode stays
    assert second.renew(taken, 0).epoch == taken.epoch
    # the old process can join again under another node id on its new session
    assert first.acquire(request(ns, "n2")).epoch > taken.epoch


def test_client_side_expiry_is_lost_although_the_znode_lives(make, zk, root, ns):
    """kazoo's own trick: the client alone thinks its session expired and opens a new
    one, while the server keeps the old session's znode until it times out. The znode
    is not ours any more (another session owns it): lost, not renewed."""
    from kazoo.protocol.connection import _SESSION_EXPIRED

    m = make()
    lease = m.acquire(request(ns, lease_s=4.0))
    old_session = m.connection.session_id
    m.connection.client._call(_SESSION_EXPIRED, None)
    wait_until(lambda: m.connection.connected and m.connection.session_id != old_session)
    assert zk.exists(member_path(root, ns, "n1")).ephemeralOwner == old_session
    with pytest.raises(LeaseLostError, match="session"):
        m.renew(lease, 0)


def test_a_blip_shorter_than_the_session_is_no_loss(make, zk_hosts, ns):
    """The connection is cut for less than the session: renewals meanwhile raise
    BackendError (the keeper keeps the old deadline, never past it), and once kazoo is
    back on the same session the renewal succeeds with the same incarnation."""
    proxy = TcpProxy.in_front_of(zk_hosts)
    try:
        m = make(hosts=proxy.address)
        lease = m.acquire(request(ns, lease_s=6.0))
        session = m.connection.session_id
        proxy.cut()
        wait_until(lambda: not m.connection.connected, 5)
        with pytest.raises(BackendError) as caught:
            m.renew(lease, 0)
        assert not isinstance(caught.value, LeaseLostError)
        assert "\n" not in str(caught.value)
        time.sleep(0.5)
        proxy.restore()
        assert m.wait_connected(5)
        assert m.connection.session_id == session
        renewed = m.renew(lease, 0)
        assert renewed.epoch == lease.epoch and renewed.deadline_ns > lease.deadline_ns
        assert [(i.node, i.state) for i in m.members(ns)] == [("n1", "alive")]
    finally:
        proxy.stop()


def test_a_renewal_during_a_stall_is_bounded(make, zk_hosts, ns):
    """A connection that answers nothing (packets dropped): the renewal gives up within
    its timeout with BackendError instead of hanging the keeper."""
    proxy = TcpProxy.in_front_of(zk_hosts)
    try:
        m = make(hosts=proxy.address, connect_timeout_s=1.0)
        lease = m.acquire(request(ns, lease_s=6.0))
        proxy.stall()
        started = time.monotonic()
        with pytest.raises(BackendError) as caught:
            m.renew(lease, 0)
        assert not isinstance(caught.value, LeaseLostError)
        assert time.monotonic() - started < 6.0   # bounded, well inside the session
    finally:
        proxy.unstall()
        proxy.stop()


# -- the view watch: a hint ---------------------------------------------------------------------
def test_a_failing_watch_callback_does_not_stop_renewals(make, ns):
    """A callback that raises is logged; the watch is re-armed and renewals go on."""
    m, other = make(), make()
    lease = m.acquire(request(ns))
    fired = threading.Event()

    def broken() -> None:
        fired.set()
        raise RuntimeError("consumer bug")

    m.watch_view(ns, broken)
    assert other.propose(ns, 0, [Member("x")]) is not None
    assert fired.wait(5)
    fired.clear()
    assert other.propose(ns, 1, [Member("y")]) is not None
    assert fired.wait(5)   # re-armed after the failure
    assert m.renew(lease, 0).view_epoch == 2


def test_the_watch_is_rearmed_after_a_blip(make, zk_hosts, ns):
    """kazoo drops watches when the connection drops; the membership arms it again once
    connected, calls back if the view moved meanwhile, and hears the next change."""
    proxy = TcpProxy.in_front_of(zk_hosts)
    try:
        m, other = make(hosts=proxy.address), make()
        m.acquire(request(ns, lease_s=6.0))
        calls: list[int] = []
        m.watch_view(ns, lambda: calls.append(1))
        time.sleep(0.2)
        assert calls == []
        proxy.cut()
        wait_until(lambda: not m.connection.connected, 5)
        heard = len(calls)   # kazoo's NONE event on the drop is no change: no call
        assert other.propose(ns, 0, [Member("x")]) is not None   # while cut off
        proxy.restore()
        assert m.wait_connected(5)
        wait_until(lambda: len(calls) > heard, 5)   # the view moved while unarmed
        heard = len(calls)
        assert other.propose(ns, 1, [Member("y")]) is not None
        wait_until(lambda: len(calls) > heard, 5)
    finally:
        proxy.stop()


# -- errors and registration --------------------------------------------------------------------
def test_registered_as_membership_zookeeper(plugin_host, zk_hosts, tmp_path, monkeypatch):
    """``[cluster] membership = {type = "zookeeper", ...}`` builds a ZkMembership
    (connected only on first use) with the settings given."""
    monkeypatch.chdir(tmp_path)
    assert "zookeeper" in plugin_host.memberships.names()
    table = {"type": "zookeeper", "hosts": zk_hosts, "root": "/fk-reg",
             "session_timeout": "6s", "safety_window": "1s"}
    kit = build_kit(membership_config(table), plugin_host)
    try:
        m = kit.membership
        assert isinstance(m, ZkMembership) and m.connection is None
        assert (m.hosts, m.root, m.session_timeout_s, m.safety_window_ns) == (
            zk_hosts, "/fk-reg", 6.0, NS)
    finally:
        kit.close()


@pytest.mark.parametrize(("settings", "message"), [
    ({"session_timeout": "500ms"}, r"^cluster\.membership\.session_timeout: 'session_timeout' "
                                   r"must be at least 1s"),
    ({"session_timeout": "4s", "safety_window": "2s"},
     r"^cluster\.membership\.safety_window: 'safety_window' must be less than half"),
    ({"root": "flakekit"}, r"^cluster\.membership\.root: .*znode path"),
    ({"hosts": 2181}, r"^cluster\.membership\.hosts: "),
    ({"session_timout": "4s"}, r"^cluster\.membership\.session_timout: unknown key; .*did you "
                               r"mean 'session_timeout'\?"),
], ids=["session-floor", "safety", "root", "hosts", "typo"])
def test_bad_settings_fail_in_one_line(plugin_host, tmp_path, monkeypatch, settings, message):
    monkeypatch.chdir(tmp_path)
    assert_build_refused(membership_config({"type": "zookeeper", **settings}), plugin_host, message)


def test_settings_cross_checks_name_their_field():
    assert_field_error(ZooKeeperMembershipSettings,
                       {"session_timeout": "4s", "safety_window": "3s"}, "safety_window",
                       starts="")


# -- the cluster runtime on ZooKeeper ---------------------------------------------------------
@pytest.mark.slow
def test_cluster_nodes_on_zookeeper_hand_off_and_survive_an_expiry(zk_hosts, root, ns):
    """Two ClusterNodes (real threads, the default keeper) whose membership is ZooKeeper
    and whose fence is the in-memory store: they agree on a view; drains move the key
    back and forth with no duplicate ID (I1) and per-key real-time order (I2); a node
    whose session is expired from outside stops serving, rejoins on a new session, and
    the cluster goes on."""
    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.settings import ClusterSettings
    from flakekit.generators.segment import SegmentSettings
    from flakekit.testing.memory_cluster import MemoryClusterStore
    from flakekit.values.owners import owner_of

    clock = MonotonicClock()
    store = MemoryClusterStore(clock)
    store.add_key("hot", step=50)
    memberships = {n: ZkMembership(zk_hosts, clock, root=root) for n in ("a", "b", "admin")}
    nodes: dict[str, ClusterNode] = {}
    try:
        for name in "ab":
            node = ClusterNode(ClusterSettings(ns, name, f"http://{name}:1", lease=3.0,
                                               handoff_wait=2.0, debounce=0.05),
                               memberships[name], clock)
            node.add_strict("hot", store.fence(name), SegmentSettings(wait_budget="500ms"))
            nodes[name] = node.start()
        wait_until(lambda: all(len(n.status()["members"]) == 2 and
                               n.status()["epoch"] == nodes["a"].status()["epoch"]
                               for n in nodes.values()), 20)

        def served_by(name: str) -> None:
            wait_until(lambda: owns(nodes[name], "hot"), 30)
            time.sleep(0.05)

        admin = memberships["admin"]
        both = [nodes[n].member for n in "ab"]
        owner = owner_of("hot", both).node
        other = "b" if owner == "a" else "a"
        with DrawingClients(nodes, "hot", pause_s=0.0002, moving_pause_s=0.001) as clients:
            for _ in range(2):   # four planned hand-offs
                served_by(owner)
                nodes[owner].drain()
                served_by(other)
                admin.set_draining(ns, owner, False)
                admin.propose(ns, admin.view(ns).epoch, both)
            served_by(owner)
            # the owner's session expires behind its back: it learns at its next renewal
            # (lost), stops, and rejoins on a new session with a new incarnation; whichever
            # node then owns the key serves it again
            before = {i.node: i.incarnation for i in admin.members(ns)}
            expired = memberships[owner].connection.session_id
            expire_session(memberships[owner].connection.client, zk_hosts)
            wait_until(lambda: {i.node: i.state for i in admin.members(ns)}.get(owner)
                       == "alive" and {i.node: i.incarnation for i in admin.members(ns)}[owner]
                       > before[owner], 30)
            assert memberships[owner].connection.session_id != expired
            wait_until(lambda: any(owns(n, "hot") for n in nodes.values()), 30)
            time.sleep(0.1)
        check_order(clients.records)
        print(f"zk cluster drill: {len(clients.records)} IDs, "
              f"{sum(n.stats()['handoffs'] for n in nodes.values())} hand-offs")
    finally:
        for node in nodes.values():
            node.close()
        for m in memberships.values():
            m.close()


def test_a_znode_left_by_a_failed_join_of_ours_is_taken_back(make, root, ns):
    """A join whose commit went through but whose read back failed leaves a member znode
    on our session with no lease handed out: the next join removes it and joins. A node
    this membership does hold is refused, naming our own session."""
    m = make()
    m.view(ns)   # connected
    m.connection.client.create(member_path(root, ns, "n1"), b'{"holder": "half-join"}',
                               ephemeral=True, makepath=True)
    lease = m.acquire(request(ns))
    assert m.renew(lease, 0).epoch == lease.epoch
    with pytest.raises(BackendError, match="own session"):
        m.acquire(request(ns))
