"""etcd cluster membership (issue 13, item 2) on a real etcd: the MembershipContract suite,
plus etcd's own drills (a lease revoked from outside, processes racing for one node id,
compare-and-set proposals from several clients, a leader change in a 3-member cluster,
compaction under a watch), the key layout, registration and one-line errors.

Every test has a root of its own (``/{ns}``), deleted afterwards."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcdhelpers import SCRIPT, compact_history, etcdctl, member_pid
from etcdhelpers import leader as etcd_leader
from flakekit_etcd import EtcdMembershipSettings
from flakekit_etcd.membership import EtcdMembership

from flakekit.assembly.kit import build_kit
from flakekit.cluster.member_lease import NEVER, MemberEvents, MemberSource, MemberTarget
from flakekit.cluster.store_contracts import JoinRequest, MemberLease
from flakekit.errors import BackendError, LeaseLostError
from flakekit.leases.keeper import LeaseKeeper
from flakekit.testing import TcpProxy
from flakekit.testing.configs import assert_build_refused, assert_field_error
from flakekit.testing.membership_builders import join_request as request
from flakekit.testing.membership_builders import member_path as member_key
from flakekit.testing.membership_builders import membership_config
from flakekit.testing.membership_contract import AddressedMembershipContract
from flakekit.testing.plugin_hosts import plugin_host_fixture
from flakekit.testing.services import script_service
from flakekit.testing.waiting import wait_until
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member

NS = 1_000_000_000

plugin_host = plugin_host_fixture()


def get_json(endpoints: str, key: str) -> dict[str, Any] | None:
    """The key as etcdctl sees it: {value (decoded JSON), lease, create_revision, ...}."""
    out = json.loads(etcdctl(endpoints, "get", key, "-w", "json"))
    kvs = out.get("kvs") or []
    if not kvs:
        return None
    import base64

    kv = kvs[0]
    return {**kv, "value": json.loads(base64.b64decode(kv["value"]))}


def revoke(endpoints: str, lease: int) -> None:
    etcdctl(endpoints, "lease", "revoke", f"{lease:x}")


@pytest.fixture
def make(etcd_endpoints, root, closing):
    """``make(**kw)``: a new EtcdMembership (its own leases: another process, as etcd
    sees it) under this test's root; closed after the test."""
    def make(endpoints: str | None = None, **kw: Any) -> EtcdMembership:
        return closing(EtcdMembership(endpoints or etcd_endpoints, MonotonicClock(),
                                      root=root, **kw))
    return make


class TestEtcdMembershipContract(AddressedMembershipContract):
    """Each membership grants its own leases; ``expire`` revokes the holder's lease with
    etcdctl, as if it had run out after a crash."""

    factory = "flakekit_etcd.membership:EtcdMembership"
    address_fixture = "etcd_endpoints"
    watch_settle_s = 0.3   # the watch thread creates its watch

    @pytest.fixture
    def expire(self, etcd_endpoints, root):
        def expire(cluster: str, lease: MemberLease) -> None:
            key = member_key(root, cluster, lease.member.node)
            kv = get_json(etcd_endpoints, key)
            assert kv is not None
            revoke(etcd_endpoints, int(kv["lease"]))
            assert get_json(etcd_endpoints, key) is None
        return expire


# -- the lease --------------------------------------------------------------------------------
def test_the_ttl_is_the_joins_lease_rounded_up(make, ns):
    """Without ``ttl`` the TTL is the join's lease in whole seconds, rounded up, at least
    2 s; a configured ttl wins; the deadline is the TTL less a fifth from the send."""
    m = make()
    before = time.monotonic_ns()
    lease = m.acquire(request(ns, lease_s=2.5))
    assert lease.ttl == 3.0
    assert before + 2.4 * NS <= lease.deadline_ns <= time.monotonic_ns() + 2.4 * NS
    assert m.renew_interval == pytest.approx(1.0)
    assert make().acquire(request(ns, "n2", lease_s=1.0)).ttl == 2.0
    assert make(ttl_s=5).acquire(request(ns, "n3", lease_s=3.0)).ttl == 5.0


def test_the_member_key_is_on_our_lease_and_its_revision_is_the_epoch(make, etcd_endpoints,
                                                                       root, ns):
    """The member key carries the join's lease, its create revision is the incarnation,
    the roster entry has no lease, the view is JSON with its epoch."""
    m = make()
    lease = m.acquire(request(ns))
    kv = get_json(etcd_endpoints, member_key(root, ns, "n1"))
    assert kv is not None and int(kv["create_revision"]) == lease.epoch
    assert int(kv["lease"]) == m.lease_of(lease)
    assert kv["value"]["holder"] == lease.holder and kv["value"]["lease_ms"] == 4000
    roster = get_json(etcd_endpoints, f"{root}/clusters/{ns}/nodes/n1")
    assert roster is not None and "lease" not in roster and roster["value"]["state"] == "joined"
    view = m.propose(ns, 0, [lease.member])
    stored = get_json(etcd_endpoints, f"{root}/clusters/{ns}/view")
    assert view is not None and stored is not None and "lease" not in stored
    assert stored["value"]["epoch"] == 1
    assert stored["value"]["changed_at_ms"] == view.changed_at_ms   # the proposer's clock
    info = next(i for i in m.members(ns) if i.node == "n1")
    assert info.lease_ms == 4000 and 0 < info.expires_in_ms <= 4000


def test_a_revoked_lease_is_lost_and_the_deadline_never_extended(make, etcd_endpoints, ns):
    """The member's lease revoked from outside (etcdctl lease revoke): the next renewal
    raises LeaseLostError (keep-alive TTL <= 0), every later one too; under the keeper
    the target's deadline goes to NEVER and no renewal sent after the revoke ever
    extended it."""
    m = make()
    req = request(ns, lease_s=3.0)
    extends: list[int] = []

    class Recording(MemberTarget):
        def extend(self, deadline_ns: int | None, stamp_until_ns: int | None = None) -> None:
            if deadline_ns is not None:
                extends.append(deadline_ns)
            super().extend(deadline_ns, stamp_until_ns)

    target = Recording(lambda reason: None)
    keeper: LeaseKeeper[MemberLease] = LeaseKeeper(
        source=MemberSource(m, lambda epoch: None), request=req, clock=MonotonicClock(),
        events=MemberEvents(lambda: None), on_lease_lost="stop")
    lease = keeper.start(target)
    try:
        assert keeper.renew_once()
        revoke(etcd_endpoints, m.lease_of(lease) or 0)
        revoked_at = time.monotonic_ns()
        keeper.renew_once()
        assert keeper.lost is not None and "TTL <= 0" in keeper.lost, keeper.lost
        assert target.deadline_ns == NEVER
        reach = round((lease.ttl * 4 / 5) * NS)   # deadline = send + TTL - a fifth
        assert extends and all(d - reach <= revoked_at for d in extends), (extends, revoked_at)
        with pytest.raises(LeaseLostError):
            m.renew(lease, 0)
    finally:
        keeper.close()
    assert {i.node: i.state for i in m.members(ns)} == {"n1": "lapsed"}


def test_the_deadline_counts_from_the_keepalives_send_time(make, etcd_endpoints, ns):
    """Through a proxy that delays every request by 0.2 s: the renewed deadline is the
    TTL less the safety window from *before* the keep-alive was sent, not from its
    answer (nor from the read after it)."""
    host, _, port = etcd_endpoints.split(",")[0].rpartition(":")
    proxy = TcpProxy(int(port), delay_s=0.2, target_host=host)
    proxy.start()
    try:
        m = make(endpoints=proxy.address)
        lease = m.acquire(request(ns, lease_s=5.0))
        before = time.monotonic_ns()
        renewed = m.renew(lease, 0)
        after = time.monotonic_ns()
        reach = round(renewed.ttl * 4 / 5 * NS)
        assert after - before >= 0.4 * NS              # two delayed calls
        assert before <= renewed.deadline_ns - reach < before + 0.1 * NS
    finally:
        proxy.stop()


def test_a_deleted_or_replaced_member_key_means_lost(make, etcd_endpoints, root, ns):
    """Someone deletes the member key and puts another (an operator, a bug): the
    keep-alive still works, the renewal's read says lost, naming what it found."""
    m = make()
    lease = m.acquire(request(ns))
    key = member_key(root, ns, "n1")
    etcdctl(etcd_endpoints, "del", key)
    etcdctl(etcd_endpoints, "put", key, json.dumps({"holder": "someone-else"}))
    with pytest.raises(LeaseLostError, match="someone-else"):
        m.renew(lease, 0)


def test_a_draining_mark_keeps_the_lease(make, etcd_endpoints, root, ns):
    """set_draining rewrites the member value by mod_revision and keeps its lease; the
    renewal (fenced on create revision and lease) goes on."""
    m = make()
    lease = m.acquire(request(ns))
    assert m.set_draining(ns, "n1", True)
    kv = get_json(etcd_endpoints, member_key(root, ns, "n1"))
    assert kv is not None and int(kv["lease"]) == m.lease_of(lease)
    assert kv["value"]["state"] == "draining"
    assert m.renew(lease, 0).epoch == lease.epoch


def test_the_refusal_names_holder_and_lease(make, ns):
    first, second = make(), make()
    lease = first.acquire(request(ns))
    with pytest.raises(BackendError) as caught:
        second.acquire(request(ns))
    text = str(caught.value)
    assert lease.holder in text and f"0x{first.lease_of(lease):x}" in text
    assert "held by a live process" in text and "\n" not in text


# -- the view watch: a hint ---------------------------------------------------------------------
def test_watch_off_starts_no_watch(make, ns):
    m, other = make(watch=False), make()
    lease = m.acquire(request(ns))
    calls: list[int] = []
    m.watch_view(ns, lambda: calls.append(1))
    assert other.propose(ns, 0, [Member("x")]) is not None
    time.sleep(0.3)
    assert calls == [] and m.renew(lease, 0).view_epoch == 1


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "renewal-only"])
def test_compaction_renewals_still_read_the_new_epoch(make, etcd_endpoints, root, ns, watch):
    """The history compacted (physically) under the member's watch, then the view moved
    twice: each renewal reads the newest epoch, with or without the watch."""
    m, other = make(watch=watch), make()
    # a long lease: 50 etcdctl runs may take tens of seconds in a niced background lane
    lease = m.acquire(request(ns, lease_s=120.0))
    m.watch_view(ns, lambda: None)
    assert other.propose(ns, 0, [Member("x")]) is not None
    compact_history(etcd_endpoints, f"{root}/noise")
    assert other.propose(ns, 1, [Member("y")]) is not None
    assert m.renew(lease, 0).view_epoch == 2
    assert other.propose(ns, 2, [Member("z")]) is not None
    assert m.renew(lease, 0).view_epoch == 3


# -- leader change ------------------------------------------------------------------------------
@pytest.fixture
def own_cluster(etcd_endpoints, tmp_path) -> Iterator[tuple[str, Path]]:
    """A 3-member cluster of this test's own (the drill kills one member)."""
    svc = tmp_path / "svc"
    with script_service(SCRIPT, svc, "cluster-start", "cluster-stop",
                        "ETCD_CLUSTER_ENDPOINTS") as endpoints:
        yield endpoints, svc


@pytest.mark.slow
def test_leader_change_is_no_false_loss(own_cluster):
    """Kill the leader the membership talks to (listed first), DEFAULT lease (10 s): the
    renewals move to another member, the lease survives the election (same incarnation,
    no LeaseLostError, the member key alive on the new leader), the deadline never
    lapses, and the view epoch is still read."""
    endpoints, svc = own_cluster
    leader = etcd_leader(endpoints)
    rest = [e for e in endpoints.split(",") if e != leader]
    m = EtcdMembership(",".join([leader, *rest]), MonotonicClock(), root="/leader-drill")
    target = MemberTarget(lambda reason: None)
    keeper: LeaseKeeper[MemberLease] = LeaseKeeper(
        source=MemberSource(m, lambda epoch: None),
        request=JoinRequest("c", Member("n1", "http://n1:1")), clock=MonotonicClock(),
        events=MemberEvents(lambda: None), on_lease_lost="stop")
    try:
        lease0 = keeper.start(target)
        assert m.propose("c", 0, [lease0.member]) is not None
        killed_at = time.monotonic()
        os.kill(member_pid(svc, leader), signal.SIGKILL)
        lapsed = False
        recovered = None
        tries = 0
        while time.monotonic() - killed_at < 20:   # renew through the election
            if time.monotonic_ns() >= target.deadline_ns:
                lapsed = True
            tries += 1
            if keeper.renew_once():
                recovered = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        assert recovered is not None, "no renewal succeeded within 20 s of the leader's death"
        assert keeper.lost is None and not lapsed
        lease = keeper.lease
        assert lease is not None and lease.epoch == lease0.epoch and lease.view_epoch == 1
        alive = json.loads(etcdctl(",".join(rest), "lease", "timetolive",
                                   f"{m.lease_of(lease):x}", "-w", "json"))
        assert int(alive["ttl"]) > 0
        kv = get_json(",".join(rest), member_key("/leader-drill", "c", "n1"))
        assert kv is not None and int(kv["create_revision"]) == lease.epoch
        print(f"\nleader change: killed {leader}; first good renewal {recovered:.2f} s after "
              f"({tries} tries, {keeper.renew_failures} failed), no loss")
    finally:
        keeper.close()
        m.close()


# -- errors and registration --------------------------------------------------------------------
def _config(membership: dict[str, Any], lease: str = "10s"):
    return membership_config(membership, lease=lease)


def test_registered_as_membership_etcd(plugin_host, etcd_endpoints, tmp_path, monkeypatch):
    """``[cluster] membership = {type = "etcd", ...}`` builds an EtcdMembership (nothing
    connected) with the settings given; it grants leases in whole seconds."""
    monkeypatch.chdir(tmp_path)
    assert "etcd" in plugin_host.memberships.names()
    kit = build_kit(_config({"type": "etcd", "endpoints": etcd_endpoints, "root": "/fk-reg",
                             "ttl": "6s", "safety_window": "1s", "watch": False}),
                    plugin_host)
    try:
        m = kit.membership
        assert isinstance(m, EtcdMembership) and m._session is None
        assert (m.endpoints, m.root, m.ttl_s, m.safety_window_ns, m.watch) == (
            etcd_endpoints, "/fk-reg", 6, NS, False)
        assert m.lease_granularity == 1.0
    finally:
        kit.close()


def test_endpoints_default_to_the_environment(plugin_host, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ETCD_ENDPOINTS", "10.1.2.3:2379")
    kit = build_kit(_config({"type": "etcd"}), plugin_host)
    try:
        assert kit.membership.endpoints == "10.1.2.3:2379"
    finally:
        kit.close()


@pytest.mark.parametrize(("settings", "lease", "message"), [
    ({"ttl": "1s"}, "10s", r"^cluster\.membership\.ttl: 'ttl' must be at least 2s"),
    ({"ttl": "2500ms"}, "10s", r"^cluster\.membership\.ttl: 'ttl' must be whole seconds"),
    ({"ttl": "4s", "safety_window": "2s"}, "10s",
     r"^cluster\.membership\.safety_window: 'safety_window' must be less than half"),
    ({"endpoints": "nohost:"}, "10s", r"^cluster\.membership\.endpoints: 'endpoints' "),
    ({"username": "u"}, "10s", r"^cluster\.membership\.password: 'password' must be set too"),
    ({"tll": "4s"}, "10s", r"^cluster\.membership\.tll: unknown key; .*did you mean 'ttl'\?"),
    ({}, "2s", r"^cluster\.lease: 2s is less than 3 x the lease granularity of membership "
               r"'etcd' \(1s\)"),
], ids=["ttl-floor", "ttl-whole", "safety", "endpoints", "auth", "typo", "granularity"])
def test_bad_settings_fail_in_one_line(plugin_host, tmp_path, monkeypatch, settings, lease,
                                       message):
    monkeypatch.chdir(tmp_path)
    assert_build_refused(_config({"type": "etcd", **settings}, lease=lease), plugin_host,
                         message)


def test_settings_cross_checks_name_their_field():
    assert_field_error(EtcdMembershipSettings, {"ttl": "4s", "safety_window": "3s"},
                       "safety_window", starts="")


def test_a_safety_window_over_half_the_granted_ttl_is_refused(make, ns):
    """A configured window that leaves less than half the granted TTL: refused at the
    join (the lease it granted is revoked)."""
    with pytest.raises(ValueError, match="safety_window"):
        make(safety_window_ns=2 * NS).acquire(request(ns, lease_s=3.0))


def test_watch_threads_end(make, ns):
    """Stopping a watch (or closing) leaves no watch thread behind for long."""
    m = make()
    m.watch_view(ns, lambda: None)
    time.sleep(0.2)
    m.close()
    wait_until(lambda: not any(t.name == f"flakekit-etcd-view-{ns}" and t.is_alive()
                               for t in threading.enumerate()), 5)
