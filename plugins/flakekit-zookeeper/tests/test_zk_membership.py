"""ZooKeeper cluster membership (issue 12, item 2) on a real ZooKeeper: the
MembershipContract suite, plus ZooKeeper's own failure drills (a session expired from
outside, a connection blip shorter than the session, processes racing for one node id,
compare-and-set proposals from several clients, a dead view watch), registration and
one-line errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from flakekit_zookeeper import ZooKeeperMembershipSettings
from flakekit_zookeeper.membership import ZkMembership
from kazoo.client import KazooClient

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.cluster.store_contracts import JoinRequest, MemberLease
from flakekit.errors import BackendError, ConfigError, FieldError, LeaseLostError
from flakekit.pluginhost.host import PluginHost
from flakekit.testing import MembershipContract, TcpProxy
from flakekit.testing.waiting import wait_until
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member

NS = 1_000_000_000


def expire_session(client: KazooClient, hosts: str) -> None:
    """End ``client``'s session on the server (a second client with the same session id
    and password closes it): its ephemerals go, the client goes LOST, then kazoo opens a
    new session by itself."""
    sid, pwd = client.client_id
    dup = KazooClient(hosts=hosts, client_id=(sid, pwd))
    dup.start(timeout=10)
    dup.stop()
    dup.close()


@pytest.fixture
def root(zk, ns):
    """A root znode of this test's own, removed afterwards."""
    path = f"/{ns}"
    yield path
    try:
        zk.delete(path, recursive=True)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


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


def member_path(root: str, cluster: str, node: str) -> str:
    return f"{root}/clusters/{cluster}/members/{node}"


def request(cluster: str, node: str = "n1", lease_s: float = 4.0) -> JoinRequest:
    return JoinRequest(cluster, Member(node, f"http://{node}.test:8080"), lease_s)


class TestZkMembershipContract(MembershipContract):
    """Each membership is its own ZooKeeper session; ``expire`` ends the holder's session
    on the server, as after a crash."""

    proposers = 4        # several clients on each round of the CAS race
    race_rounds = 8
    watch_calls_back = True

    lease_s = 10.0

    @pytest.fixture
    def make_unreachable(self, closing):
        return lambda: closing(ZkMembership(self.unreachable_where, MonotonicClock(),
                                      connect_timeout_s=0.5))

    @pytest.fixture
    def make_membership(self, make):
        return make

    @pytest.fixture
    def expire(self, made, zk, zk_hosts, root):
        def expire(cluster: str, lease: MemberLease) -> None:
            path = member_path(root, cluster, lease.member.node)
            owner = zk.exists(path).ephemeralOwner
            holder = next(m for m in made
                          if m.connection is not None and m.connection.session_id == owner)
            expire_session(holder.connection.client, zk_hosts)
            wait_until(lambda: zk.exists(path) is None)
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
    assert first.wait_connected(10)
    assert first.connection.session_id != old_session   # kazoo opened a new session
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


# -- racing processes and proposers ---------------------------------------------------------
JOINER = textwrap.dedent("""
    import sys, time
    from flakekit_zookeeper.membership import ZkMembership
    from flakekit.cluster.store_contracts import JoinRequest
    from flakekit.values.clock import MonotonicClock
    from flakekit.values.cluster import Member
    hosts, root, cluster, start_at = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    m = ZkMembership(hosts, MonotonicClock(), root=root)
    m.view(cluster)                       # connected before the start line
    time.sleep(max(0.0, start_at - time.time()))
    try:
        lease = m.acquire(JoinRequest(cluster, Member("n1", "http://x:1"), 4.0))
        print("JOINED", lease.epoch, flush=True)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, str(exc).replace(chr(10), "|"), flush=True)
    sys.stdin.read()                      # hold the session until the test says so
    m.close()
""")


@pytest.mark.slow
def test_processes_joining_one_node_at_once_admit_one(zk_hosts, root, ns):
    """Three processes join node ``n1`` at the same instant: exactly one joins, the
    others are refused with one line naming the live holder."""
    start_at = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", JOINER, zk_hosts, root, ns,
                               str(start_at)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        lines = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(timeout=30)
    assert sum(line.startswith("JOINED ") for line in lines) == 1, lines
    refused = [line for line in lines if line.startswith("REFUSED ")]
    assert len(refused) == 2, lines
    assert all("BackendError" in r and "held by a live process" in r and "|" not in r
               for r in refused), refused


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
def _config(membership: dict[str, Any]):
    return parse_config({
        "backends": {"default": {"url": "sqlite:///ids.db"}},
        "generators": {"orders": {"strategy": "segment", "order": "strict"}},
        "cluster": {"name": "ids", "advertise": "http://10.0.0.5:8080",
                    "membership": membership},
    })


@pytest.fixture
def plugin_host() -> PluginHost:
    return PluginHost().load()


def test_registered_as_membership_zookeeper(plugin_host, zk_hosts, tmp_path, monkeypatch):
    """``[cluster] membership = {type = "zookeeper", ...}`` builds a ZkMembership
    (connected only on first use) with the settings given."""
    monkeypatch.chdir(tmp_path)
    assert "zookeeper" in plugin_host.memberships.names()
    kit = build_kit(_config({"type": "zookeeper", "hosts": zk_hosts, "root": "/fk-reg",
                             "session_timeout": "6s", "safety_window": "1s"}), plugin_host)
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
    with pytest.raises(ConfigError, match=message) as caught:
        build_kit(_config({"type": "zookeeper", **settings}), plugin_host)
    assert "\n" not in str(caught.value)


def test_settings_cross_checks_name_their_field():
    with pytest.raises(FieldError) as caught:
        ZooKeeperMembershipSettings(session_timeout="4s", safety_window="3s")
    assert caught.value.field == "safety_window"


# -- the cluster runtime on ZooKeeper ---------------------------------------------------------
@pytest.mark.slow
def test_cluster_nodes_on_zookeeper_hand_off_and_survive_an_expiry(zk_hosts, root, ns):
    """Two ClusterNodes (real threads, the default keeper) whose membership is ZooKeeper
    and whose fence is the in-memory store: they agree on a view; drains move the key
    back and forth with no duplicate ID (I1) and per-key real-time order (I2); a node
    whose session is expired from outside stops serving, rejoins on a new session, and
    the cluster goes on."""
    import bisect

    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.settings import ClusterSettings
    from flakekit.errors import ClusterUnavailableError, KeyMovingError, NotOwnerError
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
        records: list[tuple[int, int, int]] = []
        lock = threading.Lock()
        stop = threading.Event()

        def client(i: int) -> None:
            via = "ab"[i % 2]
            while not stop.is_set():
                start = time.perf_counter_ns()
                try:
                    value, _ = nodes[via].next_id("hot")
                except NotOwnerError as exc:
                    via = exc.owner.node
                    continue
                except (KeyMovingError, ClusterUnavailableError):
                    time.sleep(0.001)
                    continue
                end = time.perf_counter_ns()
                with lock:
                    records.append((start, end, value))
                time.sleep(0.0002)   # keeps the record list small enough to check

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()

        def served_by(name: str) -> None:
            wait_until(lambda: nodes[name].status()["claims"].get("hot", {}).get("state")
                       == "owned", 30)
            time.sleep(0.05)

        admin = memberships["admin"]
        both = [nodes[n].member for n in "ab"]
        owner = owner_of("hot", both).node
        other = "b" if owner == "a" else "a"
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
        wait_until(lambda: {i.node: i.state for i in admin.members(ns)}.get(owner) == "alive"
                   and {i.node: i.incarnation for i in admin.members(ns)}[owner]
                   > before[owner], 30)
        assert memberships[owner].connection.session_id != expired
        wait_until(lambda: any(n.status()["claims"].get("hot", {}).get("state") == "owned"
                               for n in nodes.values()), 30)
        time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(10)
        values = [v for _, _, v in records]
        assert values and len(values) == len(set(values)), "duplicate IDs"
        ends = sorted((e, v) for _, e, v in records)
        best_before, top = [], -1
        for _, v in ends:
            top = max(top, v)
            best_before.append(top)
        for s, _, v in records:
            i = bisect.bisect_left(ends, (s, -1))
            if i:
                assert v > best_before[i - 1], "a later request got a smaller ID (I2)"
        print(f"zk cluster drill: {len(values)} IDs, "
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


def test_a_renewal_moves_the_member_version_and_reads_the_view_after_it(make, ns):
    """Every renewal writes the member znode (``MemberInfo.version`` moves: what a
    claimer times from its first read), even after an operator marked it draining; the
    holder's deadline is at most ``serve_share`` of the session after the renewal's
    send, whatever safety window was configured (issue 24)."""
    m, other = make(safety_window_ns=1), make()
    lease = m.acquire(request(ns, lease_s=6.0))
    first = other.members(ns)[0]
    assert first.version == 0
    renewed = m.renew(lease, 0)   # its send was before now
    assert renewed.deadline_ns <= m.clock.monotonic_ns() + m.serve_share * lease.ttl * 1e9
    assert other.members(ns)[0].version == 1
    assert other.set_draining(ns, "n1", True)
    assert other.propose(ns, 0, [Member("x")]) is not None
    again = m.renew(renewed, 0)
    after = other.members(ns)[0]
    assert after.state == "draining" and after.version == 3
    assert after.fingerprint[:2] == first.fingerprint[:2]
    assert again.view_epoch == 1
