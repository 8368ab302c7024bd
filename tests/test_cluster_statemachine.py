"""A Hypothesis state machine over several ClusterNodes on the in-memory cluster store with
a manual clock: nodes join, die, pause, get cut off from the store, drain, restart, and
draw IDs anywhere, while the invariants of docs/cluster.md hold after every step:

* I1: no ID of a key is served twice;
* I2: per key, IDs grow in real-time order (the rules run one after another, so every
  successful draw must beat every earlier one), and so do the owner epochs served;
* I3: at any moment at most one node would serve a key, and that node's claim is the
  one the key-owner row holds.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flakekit.cluster.key_state import OWNED
from flakekit.cluster.node import ClusterNode
from flakekit.cluster.settings import ClusterSettings
from flakekit.errors import BackendError, ClusterError, SegmentUnavailableError
from flakekit.generators.segment import SegmentSettings
from flakekit.testing.memory_cluster import keyed_store, manual_node
from flakekit.values.cluster import Member

KEYS = ("k0", "k1", "k2")
NAMES = ("n0", "n1", "n2", "n3")
LEASE = 1.0
SEGMENTS = SegmentSettings(wait_budget="20ms", retry_min="1ms", retry_max="5ms")


class ClusterMachine(RuleBasedStateMachine):
    """Processes: ``running`` (upkeep on every tick), ``paused`` (nothing runs; its state
    is kept), ``dead`` (never runs again, never closes: a crash)."""

    @initialize(renew_lapsed=st.booleans(), lapse_means_stopped=st.booleans(),
                versioned=st.booleans())
    def setup(self, **store_flags: bool) -> None:
        self.store = keyed_store(KEYS, 50, **store_flags)
        self.clock = self.store.clock
        self.procs: list[tuple[str, ClusterNode]] = []   # every process ever started
        self.mode: dict[int, str] = {}
        self.served: dict[str, set[int]] = {k: set() for k in KEYS}
        self.top: dict[str, int] = dict.fromkeys(KEYS, 0)
        self.top_epoch: dict[str, int] = dict.fromkeys(KEYS, 0)
        self.draws = 0
        self._start("n0")

    def _start(self, name: str) -> None:
        node = manual_node(self.store, ClusterSettings("c", name, f"http://{name}", lease=LEASE,
                                                       handoff_wait=0, debounce=0.2),
                           KEYS, SEGMENTS)
        try:
            node.start()
        except BackendError:   # the name is still held by a live (paused/dead) process
            return
        self.procs.append((name, node))
        self.mode[len(self.procs) - 1] = "running"

    def _live(self, mode: str | None = None) -> list[int]:
        return [i for i, m in self.mode.items() if mode is None or m == mode]

    def _current(self, name: str) -> int | None:
        found = [i for i, (n, _) in enumerate(self.procs) if n == name and self.mode.get(i)]
        return found[-1] if found else None

    # -- rules ----------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES))
    def add_or_restart_node(self, name: str) -> None:
        """A process for ``name``: a new node, or a restart (the old one closed first,
        if it is still running)."""
        old = self._current(name)
        if old is not None:
            if self.mode[old] == "paused" or self.store.is_cut(name):
                return
            if self.mode[old] == "running":
                self.procs[old][1].close()
                self.mode[old] = "closed"
        self._start(name)   # after a crash: refused while the dead one's lease lives

    @precondition(lambda self: self._live("running") or self._live("paused"))
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live("running") + self._live("paused")))
        self.mode[i] = "dead"

    @precondition(lambda self: self._live("running"))
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        self.mode[data.draw(st.sampled_from(self._live("running")))] = "paused"

    @precondition(lambda self: self._live("paused"))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        self.mode[data.draw(st.sampled_from(self._live("paused")))] = "running"

    @rule(name=st.sampled_from(NAMES), cut=st.booleans())
    def cut_or_restore(self, name: str, cut: bool) -> None:
        (self.store.cut if cut else self.store.restore)(name)

    @rule(data=st.data(), seconds=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.5]))
    def step(self, data: st.DataObject, seconds: float) -> None:
        self._step(data, seconds)

    # time passing is most of what happens: weigh it (rules are picked uniformly)
    @rule(data=st.data(), seconds=st.sampled_from([0.1, 0.3]))
    def step_short(self, data: st.DataObject, seconds: float) -> None:
        self._step(data, seconds)

    @rule(data=st.data(), seconds=st.sampled_from([0.2, 0.4]))
    def step_medium(self, data: st.DataObject, seconds: float) -> None:
        self._step(data, seconds)

    def _step(self, data: st.DataObject, seconds: float) -> None:
        """Time passes; meanwhile each running node does its upkeep, or only renews (its
        keeper's thread runs, its upkeep thread is stuck), or nothing; then every running
        node is asked for every key."""
        self.clock.advance(seconds)
        for i in self._live("running"):
            node = self.procs[i][1]
            action = data.draw(st.sampled_from(["upkeep", "upkeep", "renew", "none"]))
            if action == "upkeep":
                node.upkeep()
            elif action == "renew":
                node._keeper.renew_once()
        for i in self._live("running"):
            for key in KEYS:
                self._draw(self.procs[i][1], key, None)

    @rule(nodes=st.sets(st.sampled_from(NAMES), min_size=1))
    def propose(self, nodes: set[str]) -> None:
        """Some proposer (or an operator) moves the view to any set of nodes."""
        admin = self.store.membership("admin")
        view = admin.view("c")
        admin.propose("c", view.epoch, [Member(n, f"http://{n}") for n in sorted(nodes)])

    @precondition(lambda self: self._live("running"))
    @rule(data=st.data(), whom=st.sampled_from(NAMES))
    def drain(self, data: st.DataObject, whom: str) -> None:
        node = self.procs[data.draw(st.sampled_from(self._live("running")))][1]
        try:
            node.drain(whom)
        except (ClusterError, BackendError):
            pass

    @precondition(lambda self: self._live("running"))
    @rule(data=st.data(), key=st.sampled_from(KEYS), n=st.sampled_from([None, 1, 7]))
    def draw(self, data: st.DataObject, key: str, n: int | None) -> None:
        self._draw(self.procs[data.draw(st.sampled_from(self._live("running")))][1], key, n)

    def _draw(self, node: ClusterNode, key: str, n: int | None) -> None:
        try:
            if n is None:
                value, epoch = node.next_id(key)
                values = [value]
            else:
                batch, epoch = node.next_ids(key, n)
                values = list(batch)
        except (ClusterError, SegmentUnavailableError):
            return
        for value in values:
            assert value not in self.served[key], f"I1: {key} {value} served twice"
            assert value > self.top[key], f"I2: {key} {value} after {self.top[key]}"
            self.served[key].add(value)
            self.top[key] = value
        assert epoch >= self.top_epoch[key], "owner epoch went back"
        self.top_epoch[key] = epoch
        self.draws += 1

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def single_server(self) -> None:
        """I3: at most one process would serve each key now, under the row's claim."""
        if not hasattr(self, "procs"):
            return
        now = self.clock.monotonic_ns()
        for key in KEYS:
            serving = []
            for i, (name, node) in enumerate(self.procs):
                if self.mode.get(i) not in ("running", "paused", "dead"):
                    continue
                s = node._keys.get(key)
                if (s is not None and s.state == OWNED and s.slot is not None
                        and now < node._target.deadline_ns and s.ok_epoch == node._view_epoch):
                    serving.append((name, s.slot.claim))
            assert len(serving) <= 1, f"I3: {key} served by {serving}"
            if serving:
                name, claim = serving[0]
                row = self.store.owner_row(key)
                assert row is not None and (row.node, row.epoch, row.released) == \
                    (name, claim.epoch, False), f"I3: {name} serves {key} under {claim}, row {row}"

    def teardown(self) -> None:
        for _, node in getattr(self, "procs", []):
            node.close(timeout=0.5)


ClusterMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow], database=None,
)
TestClusterMachine = ClusterMachine.TestCase
