"""ClusterNode on the in-memory cluster store: joining, the view, owner routing, planned
and crash hand-off, a cut store, drain, and the tidb bug history (#52600, #46444).

Most tests drive the nodes by hand (``threads=False``, a manual clock shared with the
store), so every step is deterministic; the last one runs real threads across hand-offs
and checks I1 (no duplicate) and I2 (per-key real-time order).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import closing

import pytest

from flakekit.cluster.node import HANDOFF_MARGIN_MIN_S, HANDOFF_MARGIN_SHARE, ClusterNode
from flakekit.cluster.settings import ClusterSettings
from flakekit.cluster.store_contracts import KeyClaim
from flakekit.errors import (
    ClusterError,
    ClusterUnavailableError,
    ConfigError,
    FieldError,
    KeyMovingError,
    NotOwnerError,
)
from flakekit.generators.segment import SegmentSettings
from flakekit.testing import wait_until
from flakekit.testing.cluster_draws import DrawingClients, check_order, owns
from flakekit.testing.memory_cluster import MemoryClusterStore, keyed_store, manual_node
from flakekit.values.clock import MonotonicClock
from flakekit.values.owners import owner_of

LEASE = 3.0
WAIT = LEASE + max(HANDOFF_MARGIN_MIN_S, HANDOFF_MARGIN_SHARE * LEASE)
KEYS = [f"k{i}" for i in range(12)]
SEGMENTS = SegmentSettings(wait_budget="200ms")


class Harness:
    """Nodes on one memory store and one manual clock; ``tick()`` is a round of upkeep."""

    def __init__(self, *, handoff_wait: float = 0.0, **store_flags: bool) -> None:
        """``store_flags``: the store's ``renew_lapsed``, ``lapse_means_stopped`` and
        ``versioned`` (all off by default)."""
        self.store = keyed_store(KEYS, 100, **store_flags)
        self.clock = self.store.clock
        self.nodes: dict[str, ClusterNode] = {}
        self.handoff_wait = handoff_wait

    def add(self, name: str, weight: int = 1, lease: float = LEASE) -> ClusterNode:
        node = manual_node(
            self.store, ClusterSettings("c", name, f"http://{name}:8080", weight=weight,
                                        lease=lease, handoff_wait=self.handoff_wait,
                                        debounce=0.5), KEYS, SEGMENTS)
        self.nodes[name] = node.start()
        return node

    def tick(self, seconds: float = 0.0, *, skip: tuple[str, ...] = ()) -> None:
        self.clock.advance(seconds)
        for name, node in self.nodes.items():
            if name not in skip:
                node.upkeep()

    def settle(self, *, skip: tuple[str, ...] = ()) -> None:
        """Enough rounds for a view proposal (after debounce) and the claims after it."""
        for _ in range(4):
            self.tick(0.6, skip=skip)

    def owner(self, key: str, via: str | None = None) -> ClusterNode:
        node = self.nodes[via or next(iter(self.nodes))]
        return self.nodes[node.owner(key).node]

    def started(self, names: str) -> list[ClusterNode]:
        """Nodes ``names`` added and settled on one view."""
        for name in names:
            self.add(name)
        self.settle()
        return [self.nodes[name] for name in names]

    def key_of(self, node: ClusterNode) -> str:
        """The first key ``node`` owns."""
        return next(k for k in KEYS if self.owner(k) is node)

    def until_dropped(self, dead: str, by: ClusterNode, within: float = 8 * LEASE,
                      each_round: Callable[[], object] = lambda: None) -> int:
        """Upkeep (0.25 s rounds, then ``each_round()``) without node ``dead`` until ``by``
        applied a newer view than ``dead`` (one without it, once its record lapsed), within
        ``within`` seconds: the clock's time then."""
        waited = 0.0
        while True:
            self.tick(0.25, skip=(dead,))
            waited += 0.25
            dropped = by.status()["epoch"] > self.nodes[dead].status()["epoch"]
            assert dropped or waited < within, f"{dead} not dropped within {within} s"
            each_round()
            if dropped:
                return self.clock.monotonic_ns()

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


@pytest.fixture
def cluster():
    with closing(Harness()) as h:
        yield h


# -- settings -----------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"weight": 0}, "weight"), ({"weight": 65}, "weight"), ({"weight": True}, "weight"),
    ({"lease": 0}, "lease"), ({"lease": "soon"}, "lease"), ({"handoff_wait": -1}, "handoff_wait"),
    ({"debounce": -0.1}, "debounce"), ({"node": ""}, "node"), ({"name": 7}, "name"),
    ({"advertise": "10.0.0.5:8080"}, "advertise"),
])
def test_settings_refuse_bad_fields_in_one_line(kwargs, field):
    """Each bad field is refused with a one-line message naming it."""
    args = {"name": "c", "node": "n1"} | kwargs
    with pytest.raises(FieldError) as err:
        ClusterSettings(**args)
    assert err.value.field == field
    assert field in str(err.value) and "\n" not in str(err.value)


def test_settings_take_durations():
    """Durations read as seconds or as duration strings."""
    s = ClusterSettings("c", "n1", lease="1500ms", handoff_wait="2s", debounce=0)
    assert (s.lease, s.handoff_wait, s.debounce, s.weight) == (1.5, 2.0, 0.0, 1)


# -- joining and the view -----------------------------------------------------------------
def test_first_node_joins_and_proposes_the_first_view_at_once(cluster):
    """An empty view needs no debounce: the first node is routable right after start."""
    a = cluster.add("a")
    view = cluster.store.membership("x").view("c")
    assert view.epoch == 1 and view.nodes() == ("a",)
    assert a.status()["epoch"] == 1
    assert {a.owner(k).node for k in KEYS} == {"a"}
    assert a.next_id("k0") == (1, 1)


def test_view_change_is_proposed_once_after_the_debounce(cluster):
    """Several nodes see the same difference; after the debounce one CAS wins and every
    node ends on the same view."""
    cluster.add("a")
    cluster.add("b")
    cluster.add("c")
    cluster.tick(0.2)
    assert cluster.store.membership("x").view("c").nodes() == ("a",)  # still debouncing
    cluster.settle()
    view = cluster.store.membership("x").view("c")
    assert view.nodes() == ("a", "b", "c")
    assert {n.status()["epoch"] for n in cluster.nodes.values()} == {view.epoch}
    won = sum(n.stats()["proposals"] - n.stats()["proposals_lost"] for n in cluster.nodes.values())
    assert won == view.epoch   # every epoch was written by exactly one proposal


def test_owner_routing_and_not_owner_refusal(cluster):
    """The owner serves (with its claim epoch); any other node refuses naming the owner."""
    cluster.started("abc")
    epoch = cluster.nodes["a"].status()["epoch"]
    for key in KEYS:
        owner = cluster.owner(key)
        value, claim_epoch = owner.next_id(key)
        assert claim_epoch <= epoch and value >= 1
        batch, claim_epoch2 = owner.next_ids(key, 5)
        assert claim_epoch2 == claim_epoch and list(batch)[0] > value
        for other in cluster.nodes.values():
            if other is not owner:
                with pytest.raises(NotOwnerError) as err:
                    other.next_id(key)
                assert err.value.owner == owner.member and err.value.epoch == epoch
    assert len({cluster.owner(k).member.node for k in KEYS}) > 1   # the keys are spread
    status = cluster.nodes["b"].status()
    assert status["hash"] == "hrw-xxh64-v1" and set(status["owners"]) >= set(KEYS)
    assert {m["state"] for m in status["members"]} == {"alive"}


def test_a_key_that_is_not_strict_is_refused(cluster):
    a = cluster.add("a")
    assert a.is_strict("k0") and not a.is_strict("nope")
    with pytest.raises(ClusterError, match="not a strict key"):
        a.next_id("nope")


def test_a_resolver_makes_every_matching_key_strict(cluster):
    """add_strict(function): keys it accepts are strict, claimed on first use."""
    cluster.store.add_key("orders.eu", step=10)
    a = cluster.add("a")
    a.add_strict(lambda key: key.startswith("orders."), cluster.store.fence("a"), SEGMENTS)
    assert a.is_strict("orders.eu") and not a.is_strict("users")
    assert a.next_id("orders.eu") == (1, 1)
    assert a.status()["claims"]["orders.eu"] == {"epoch": 1, "state": "owned"}


# -- hand-off -----------------------------------------------------------------------------
def _served(cluster, keys=KEYS):
    return {key: cluster.owner(key).next_id(key)[0] for key in keys}


def test_planned_handoff_by_drain_moves_every_key_without_waiting(cluster):
    """Drain: the old owner stops, gives back and releases; the new owners claim at once
    (no lease wait) and continue above everything served before."""
    cluster.started("abc")
    before = _served(cluster)
    a = cluster.nodes["a"]
    moving = [k for k in KEYS if cluster.owner(k) is a]
    assert moving
    view = a.drain()
    assert "a" not in view.nodes()
    assert cluster.store.membership("x").members("c")[0].state == "draining"
    cluster.tick(0.0)   # no time passes: a planned hand-off needs no lease wait
    cluster.tick(0.0)
    after = _served(cluster)
    for key in KEYS:
        assert after[key] > before[key]
        assert cluster.owner(key) is not a
    for key in moving:
        with pytest.raises(NotOwnerError):
            a.next_id(key)
        row = cluster.store.owner_row(key)
        assert row is not None and row.node != "a" and not row.released
    assert a.status()["claims"][moving[0]]["state"] == "idle"
    assert sum(n.stats()["handoffs"] for n in cluster.nodes.values()) >= len(KEYS) + len(moving)


def test_crash_handoff_waits_lease_plus_margin(cluster):
    """A dead owner never releases: the new owner claims only after lease + margin on its
    own clock since it first saw itself the owner; meanwhile the key is moving and keys
    that do not move are served as before."""
    a, b = cluster.started("ab")
    mine_a = [k for k in KEYS if cluster.owner(k) is a]
    mine_b = [k for k in KEYS if cluster.owner(k) is b]
    assert mine_a and mine_b
    before = _served(cluster)
    # a dies (stops renewing); b proposes a view without it once its lease lapses
    # keys not moving are unaffected all along
    seen_at = cluster.until_dropped("a", b, 2 * LEASE,
                                    each_round=lambda: [b.next_id(k) for k in mine_b])
    key = mine_a[0]
    with pytest.raises(KeyMovingError) as err:
        b.next_id(key)
    assert 0 < err.value.retry_after <= WAIT
    # up to just short of lease + margin: still moving (b renews all along)
    while cluster.clock.monotonic_ns() + 0.3e9 < seen_at + WAIT * 1e9:
        cluster.tick(0.25, skip=("a",))
        with pytest.raises(KeyMovingError):
            b.next_id(key)
    # after it: claimed with waited=True, above all the dead owner served
    cluster.tick(0.3, skip=("a",))
    value, epoch = b.next_id(key)
    assert value > before[key] and epoch == b.status()["epoch"]
    assert cluster.clock.monotonic_ns() - seen_at >= WAIT * 1e9
    # the "dead" node, should it wake up, serves nothing: its deadline is long gone
    with pytest.raises(ClusterUnavailableError):
        a.next_id(key)
    assert b.stats()["refused_moving"] >= 2


def test_crash_handoff_waits_the_dead_owners_longer_lease(cluster):
    """Nodes configured with different leases: a short-lease node that takes a crashed
    long-lease owner's key waits out the owner's lease (which it read from the member
    record), not its own, so the old owner has stopped before the new one serves."""
    long_lease = 4 * LEASE
    cluster.add("a", lease=long_lease)
    cluster.add("b")
    cluster.settle()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    key = cluster.key_of(a)
    a.next_id(key)
    deadline_a = a._keeper.lease.deadline_ns   # the last instant a may serve
    seen_at = cluster.until_dropped("a", b)  # a stops renewing; b proposes without it
    own_wait = WAIT * 1e9
    while cluster.clock.monotonic_ns() < seen_at + own_wait + 1e9:   # past b's own wait
        cluster.tick(0.25, skip=("a",))
        with pytest.raises(KeyMovingError):
            b.next_id(key)
    for _ in range(200):
        cluster.tick(0.25, skip=("a",))
        try:
            b.next_id(key)
            break
        except KeyMovingError:
            continue
    assert cluster.clock.monotonic_ns() > deadline_a
    assert cluster.clock.monotonic_ns() - seen_at >= long_lease * 1e9


@pytest.mark.parametrize("renew_lapsed", [False, True])
def test_crash_handoff_is_at_once_where_a_lapsed_record_proves_the_owner_stopped(renew_lapsed):
    """On a store whose lapsed record proves its holder's deadline has passed (SQL,
    ZooKeeper), the new owner takes a crashed owner's key as soon as the view moves,
    without waiting lease + margin again; the dead owner's own deadline is already over,
    and should it wake and renew, it serves nothing under its old claim."""
    with closing(Harness(lapse_means_stopped=True, renew_lapsed=renew_lapsed)) as h:
        a, b = h.started("ab")
        key = h.key_of(a)
        served = a.next_id(key)[0]
        deadline_a = a._keeper.lease.deadline_ns
        seen_at = h.until_dropped("a", b)
        h.tick(0.05, skip=("a",))   # one round: the claim
        value, epoch = b.next_id(key)
        assert value > served and epoch == b.status()["epoch"]
        assert h.clock.monotonic_ns() > deadline_a        # a had stopped
        assert h.clock.monotonic_ns() - seen_at < WAIT * 1e9 / 2   # no second lease wait
        # a wakes up: whatever its store allows, it never serves the key again
        h.tick(0.05)
        with pytest.raises((ClusterUnavailableError, NotOwnerError, KeyMovingError)):
            a.next_id(key)
        after, _ = b.next_id(key)
        assert after > value


def test_store_cut_serves_until_the_deadline_then_refuses(cluster):
    """Cut off from the store, an owner serves from memory until its member deadline,
    then refuses with ClusterUnavailableError (never a stale ID); once the store is back
    it rejoins and serves above everything before."""
    a = cluster.add("a")
    key = "k0"
    first, _ = a.next_id(key)
    cluster.store.cut("a")
    last = first
    deadline_in = a.status()["lease"]["remaining_s"]
    assert deadline_in is not None and 0 < deadline_in <= LEASE
    t = 0.0
    while t + 0.5 < deadline_in:
        cluster.tick(0.5)
        t += 0.5
        value, _ = a.next_id(key)   # no I/O on the hot path
        assert value > last
        last = value
    cluster.tick(deadline_in - t)
    with pytest.raises(ClusterUnavailableError) as err:
        a.next_id(key)
    assert "lease" in str(err.value) and err.value.retry_after > 0
    with pytest.raises(ClusterUnavailableError):
        a.next_ids(key, 3)
    assert a.stats()["refused_unavailable"] >= 2
    cluster.store.restore("a")
    cluster.tick(LEASE)    # the lapsed lease is lost: the node joins again
    cluster.tick(0.1)
    value, _ = a.next_id(key)
    assert value > last


def test_drain_of_another_node_and_of_the_last_node(cluster):
    """Any node can drain another; draining the last serving node changes nothing."""
    a, b = cluster.started("ab")
    view = a.drain("b")
    assert view.nodes() == ("a",)
    cluster.tick(0.0)
    cluster.tick(0.0)
    assert all(cluster.owner(k) is a for k in KEYS)
    assert {k for k, c in b.status()["claims"].items() if c["state"] != "idle"} == set()
    assert a.drain("a").nodes() == ("a",)   # nobody could take over
    with pytest.raises(ClusterError, match="no member"):
        a.drain("zz")


def test_keys_that_do_not_move_keep_their_claim_and_segments(cluster):
    """A node joining moves only some keys; the others keep their claim epoch and go on
    counting through the same segment (no gap, no refusal)."""
    cluster.started("ab")
    before = {k: cluster.owner(k).next_id(k) for k in KEYS}
    owners_before = {k: cluster.owner(k).member.node for k in KEYS}
    cluster.add("c")
    cluster.settle()
    stay = [k for k in KEYS if cluster.owner(k).member.node == owners_before[k]]
    moved = [k for k in KEYS if k not in stay]
    assert stay and moved
    for key in stay:
        value, epoch = cluster.owner(key).next_id(key)
        assert (value, epoch) == (before[key][0] + 1, before[key][1])
    for key in moved:
        assert cluster.owner(key).next_id(key)[0] > before[key][0]


def test_reclaim_never_reuses_an_old_segment():
    """tidb #52600: a node that lost a key (it missed the views in between while paused)
    and regained it must start from a fresh segment above what the interim owner
    served, not count on through its old buffer."""
    with closing(Harness(renew_lapsed=True)) as h:   # a store that lets a lapsed holder renew
        a, b = h.started("ab")
        key = h.key_of(a)
        old, _ = a.next_id(key)
        admin = h.store.membership("admin")
        # a pauses; the view moves the key to b (epoch E+1)...
        e = admin.view("c").epoch
        admin.propose("c", e, [b.member])
        h.tick(0.1, skip=("a",))
        h.clock.advance(WAIT)
        h.tick(0.1, skip=("a",))
        interim, _ = b.next_id(key)
        assert interim > old
        # ... and back to a (E+2) before a wakes up: a sees E -> E+2, a gap
        admin.propose("c", e + 1, [a.member, b.member])
        h.tick(0.0, skip=("a",))
        with pytest.raises(ClusterUnavailableError):   # woken, before any upkeep
            a.next_id(key)
        a.upkeep()
        h.tick(0.0)
        value, epoch = a.next_id(key)
        assert value > interim, "reused the segment it held before losing the key"
        assert epoch == e + 2
        fetched = [ev for ev in h.store.events if ev.kind == "fetch" and ev.key == key]
        assert [ev.node for ev in fetched][-1] == "a"


def test_a_deposed_owner_closing_lowers_nothing(cluster):
    """tidb #46444: an owner whose claim was taken over gives back nothing on close(), even
    where the max_id compare-and-set alone would let it."""
    a = cluster.add("a")
    key = "k0"
    a.next_id(key)
    top = cluster.store.max_id(key)
    # another node takes the key over (as after waiting out a's lease), before fetching
    assert cluster.store.fence("b").claim_key(KeyClaim(key, "b", 99), waited=True)
    a.close()
    assert cluster.store.max_id(key) == top
    assert not [ev for ev in cluster.store.events if ev.kind == "give_back" and ev.key == key]


def test_a_clean_close_gives_back_and_releases(cluster):
    """The contrast: a current owner's close() returns its unused tail and releases, so
    the next owner continues right after the last ID served."""
    a = cluster.add("a")
    value, _ = a.next_id("k0")
    a.close()
    assert cluster.store.max_id("k0") == value + 1
    row = cluster.store.owner_row("k0")
    assert row is not None and row.released
    b = cluster.add("b")
    cluster.settle()   # the view drops the node that left
    assert b.next_id("k0")[0] == value + 1


def test_waiting_callers_get_the_key_when_the_planned_handoff_lands():
    """With handoff_wait, a caller at the new owner waits (on a condition) until the old
    owner released, instead of failing."""
    with closing(Harness(handoff_wait=5.0)) as h:
        a, b = h.started("ab")
        key = h.key_of(a)
        before, _ = a.next_id(key)
        a.drain()
        b.upkeep()   # b applies the view; a has not released yet
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(b.next_id(key)[0]))
        t.start()
        time.sleep(0.05)
        assert t.is_alive()    # waiting
        a.upkeep()             # a releases
        h.clock.advance(0.1)   # b's next claim attempt is due (it polls while waiting)
        t.join(5)
        assert got and got[0] > before


def test_membership_lost_to_another_incarnation_refuses_then_rejoins(cluster):
    """A lease lost (the record lapsed on the store) revokes at once; the node rejoins."""
    a = cluster.add("a")
    first, _ = a.next_id("k0")
    cluster.store.expire("c", "a")
    a.upkeep()   # the renewal finds the lease lapsed: lost, then a new join
    a.upkeep()
    value, _ = a.next_id("k0")
    assert value > first


# -- concurrent callers across hand-offs (real clock, real threads) ----------------------------
def test_concurrent_callers_across_handoffs_keep_i1_and_i2():
    """Threads drawing through a routing client while the key moves back and forth:
    no duplicate (I1), and a request that starts after another ended gets a larger ID (I2)."""
    clock = MonotonicClock()
    store = MemoryClusterStore(clock, renew_interval=0.1)
    store.add_key("hot", step=50)
    nodes: dict[str, ClusterNode] = {}
    for name in "ab":
        node = ClusterNode(ClusterSettings("c", name, f"http://{name}", lease=1.0,
                                           handoff_wait=2.0, debounce=0.05),
                           store.membership(name), clock)
        # a caller waits for a segment as long as a starved fetch thread may need (no
        # speed assumed: the property is I1/I2, not how soon a refill comes)
        node.add_strict("hot", store.fence(name), SegmentSettings(wait_budget="30s"))
        nodes[name] = node.start()
    try:
        wait_until(lambda: min(n.status()["epoch"] for n in nodes.values()) >= 2, 10)
        admin = store.membership("admin")

        def served_by(name: str) -> None:   # until the hand-off landed (no speed assumed)
            wait_until(lambda: owns(nodes[name], "hot"), 30, what=f"{name} taking the key")
            time.sleep(0.05)   # let the clients draw there for a moment

        both = [nodes[n].member for n in "ab"]
        owner = owner_of("hot", both).node
        other = "b" if owner == "a" else "a"
        with DrawingClients(nodes, "hot", 6) as clients:
            for _ in range(4):   # eight hand-offs: drain the owner, then bring it back
                served_by(owner)
                nodes[owner].drain()
                served_by(other)
                admin.set_draining("c", owner, False)
                admin.propose("c", admin.view("c").epoch, both)
            served_by(owner)
        check_order(clients.records)
        assert sum(n.stats()["handoffs"] for n in nodes.values()) >= 9
    finally:
        for node in nodes.values():
            node.close()


def test_a_renewal_that_reveals_a_newer_view_stops_the_hot_path_at_once(cluster):
    """The keeper's renewal extends the deadline; if it read a newer view epoch, the key
    must stop being served before that view is applied (the upkeep thread may be stuck,
    and the new owner's wait counts from the epoch, not from this node's upkeep)."""
    a, b = cluster.started("ab")
    key = cluster.key_of(a)
    a.next_id(key)
    admin = cluster.store.membership("admin")
    admin.propose("c", admin.view("c").epoch, [b.member])
    assert a._keeper.renew_once()          # the renewal thread, not the upkeep
    with pytest.raises(KeyMovingError):    # refused (not yet applied), never served
        a.next_id(key)
    a.upkeep()
    with pytest.raises(NotOwnerError):
        a.next_id(key)


def test_a_node_with_other_strict_keys_is_refused_at_its_join():
    """Config drift (issue 20): a node whose strict keys differ from the serving
    members' (a key missing, or one more) is refused at start with one line naming the
    nodes and the keys it can tell, and leaves again: it never serves, and the others'
    keys stay where they are. The same config joins."""
    with closing(Harness()) as h:
        a = h.add("a")
        h.settle()
        served = {k: a.next_id(k)[0] for k in KEYS}
        drifted = manual_node(   # lacks KEYS[0]
            h.store, ClusterSettings("c", "b", "http://b:8080", handoff_wait=0, debounce=0.5),
            KEYS[1:], SEGMENTS)
        with pytest.raises(ConfigError) as refused:
            drifted.start()
        line = str(refused.value)
        assert "\n" not in line and "node 'b' refused" in line and "node(s) a" in line
        assert f"strict on the cluster but not here: {KEYS[0]!r}" in line
        assert {m.node: m.state for m in h.store.membership("x").members("c")}["b"] == "left"
        drifted.close()
        h.tick(1.0)
        assert all(a.next_id(k)[0] > served[k] for k in KEYS)   # nothing moved
        b = h.add("b")   # the same strict keys: it joins and takes its share
        h.settle()
        assert {h.owner(k).member.node for k in KEYS} == {"a", "b"}
        assert b.status()["epoch"] == a.status()["epoch"]


# -- the event loop's path (issue 24 item 3) ---------------------------------------------
def test_try_next_id_serves_from_memory_and_never_refuses_or_waits(cluster):
    """try_next_id/try_next_ids: the owner's IDs from memory with the claim epoch, in
    order with next_id; None (never an error, never a wait) on another node, past the
    member deadline and while a newer view is not applied; other_owner names the owner
    from the applied view."""
    a, b = cluster.started("ab")
    key = cluster.key_of(a)
    first, epoch = a.next_id(key)
    got = a.try_next_id(key)
    assert got is not None and got[0] > first and got[1] == epoch
    batch = a.try_next_ids(key, 5)
    assert batch is not None and list(batch[0])[0] > got[0] and batch[1] == epoch
    assert a.other_owner(key) is None
    assert b.try_next_id(key) is None and b.try_next_ids(key, 5) is None
    owner, view_epoch = b.other_owner(key)
    assert owner == a.member and view_epoch == b.status()["epoch"]
    # a renewal that reveals a newer view: nothing from memory until it is applied
    admin = cluster.store.membership("admin")
    admin.propose("c", admin.view("c").epoch, [b.member])
    assert a._keeper.renew_once()
    assert a.try_next_id(key) is None and a.other_owner(key) is None
    with pytest.raises(KeyMovingError):
        a.next_id(key)


def test_try_next_id_refuses_past_the_member_deadline(cluster):
    """Cut off from the store: served from memory until the member deadline, then None
    (next_id then says why: ClusterUnavailableError)."""
    a = cluster.add("a")
    key = "k0"
    a.next_id(key)
    cluster.store.cut("a")
    remaining = a.status()["lease"]["remaining_s"]
    assert a.try_next_id(key) is not None
    cluster.tick(remaining)
    assert a.try_next_id(key) is None and a.try_next_ids(key, 2) is None
    assert a.other_owner(key) is None
    with pytest.raises(ClusterUnavailableError):
        a.next_id(key)


def test_a_stopped_key_is_not_served_while_a_newer_view_waits_to_be_applied(cluster):
    """A key stopped under a claim (a fetch found it fenced, a release under way) keeps
    its generator until the release closes it. If meanwhile a renewal or a poll reads a
    view epoch newer than the applied one, the node's view epoch is "not applied yet";
    the hot path must not take that for the stopped key's epoch and serve what is left
    of the old claim's segment (an ID under a claim another node may already hold: I2
    broken, seen in the two-process cluster drills)."""
    a = cluster.add("a")
    first, claim_epoch = a.next_id("k0")
    st = a._keys["k0"]
    slot = st.slot
    assert slot is not None and slot.gen is not None
    a._fenced(st, slot.claim)          # the claim was taken over: stop serving it
    a._lease_view(a.status()["epoch"] + 1)   # a renewal read a newer view, not applied yet
    assert st.slot is slot             # its generator still holds the rest of the segment
    assert a.try_next_id("k0") is None
    with pytest.raises((KeyMovingError, NotOwnerError, ClusterUnavailableError)):
        a.next_id("k0")
    with pytest.raises((KeyMovingError, NotOwnerError, ClusterUnavailableError)):
        a.next_ids("k0", 3)
