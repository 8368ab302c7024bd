"""``MembershipContract``: the promises every cluster membership store keeps, as tests.

Like :class:`~flakekit.testing.allocator_contract.AllocatorContract`: a test module
subclasses the class and provides a ``make_membership`` fixture; every test method then
runs against that store on its real backend::

    class TestSqlMembershipOnPostgres(MembershipContract):
        @pytest.fixture
        def make_membership(self, pg_url, closing): ...

``make_membership()`` returns a new :class:`~flakekit.cluster.store_contracts.Membership` on
the same backend (another process, as the store sees it); the fixture closes what it
made. Every test uses a cluster name of its own (the ``cluster`` fixture). Optional
fixtures: ``monotonic_ns`` and ``pass_time`` (the memberships' clock, when the binding
controls it) and ``expire(cluster, lease)``: make the store treat ``lease`` as lapsed,
as after a crash of its holder (without it the take-over tests are skipped);
``make_with_safety_window(ns)``: a membership configured with that safety window;
``membership_process``: how another process makes a membership on the same store (the
race of processes, ``flakekit.testing.membership_joiner``).

Nothing here depends on a particular store: SQL, ZooKeeper and etcd bindings run the
same tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from flakekit.cluster.store_contracts import (
    JoinRequest,
    MemberLease,
    Membership,
    ReadsViewAndMembers,
)
from flakekit.errors import BackendError, LeaseLostError
from flakekit.testing.contract_clock import OnWallClock
from flakekit.testing.threads import in_threads
from flakekit.testing.waiting import wait_until
from flakekit.values.cluster import Member, View

__all__ = ["AddressedMembershipContract", "MembershipContract"]

MakeMembership = Callable[[], Any]


class MembershipContract(OnWallClock):
    """Subclass and provide the fixture ``make_membership``."""

    #: the lease the tests ask for, seconds (a store may grant another: the lease says)
    lease_s: float = 10.0
    #: proposal rounds of the race test (``proposers`` on the same seen epoch each)
    race_rounds: int = 5
    #: how many memberships race in each round of the race test
    proposers: int = 2
    #: the store calls a ``watch_view`` callback on a new view (False: a hint it may drop)
    watch_calls_back: bool = False
    #: seconds a new watch needs before it sees changes (a watch thread setting up)
    watch_settle_s: float = 0.0
    #: the address ``make_unreachable`` points at, named by its errors
    unreachable_where: str = "127.0.0.1:1"
    #: the version (renewal counter) of a member record right after its join, where the
    #: store promises one (None: only its moves are checked)
    first_version: int | None = None
    #: a drain mark rewrites the member record and so moves its version too
    drain_moves_version: bool = False

    # -- fixtures a binding may override ----------------------------------------------------
    @pytest.fixture
    def cluster(self) -> str:
        """A cluster name no other test uses."""
        return f"contract-{uuid.uuid4().hex[:10]}"

    @pytest.fixture
    def make_unreachable(self) -> MakeMembership:
        """``make_unreachable()``: a membership whose store is at an address nothing
        listens on, ``unreachable_where`` (override to run the one-line error tests)."""
        pytest.skip("this binding has no unreachable store to point at")

    @pytest.fixture
    def expire(self) -> Callable[[str, MemberLease], None]:
        """``expire(cluster, lease)``: the store treats ``lease`` as lapsed."""
        pytest.skip("this binding cannot end a lease behind its holder's back")

    @pytest.fixture
    def make_with_safety_window(self) -> Callable[[int], Any]:
        """``make_with_safety_window(ns)``: a new membership configured with that safety
        window (override to run the serve-share test)."""
        pytest.skip("this binding makes no membership with a configured safety window")

    @pytest.fixture
    def membership_process(self) -> tuple[str, list[Any], dict[str, Any]]:
        """``(factory, args, kwargs)``: how another process makes a membership on this
        store, ``factory`` (``module:name``) called with ``*args, clock, **kwargs``, JSON
        values (override to run the race of processes)."""
        pytest.skip("this binding cannot make its membership in another process")

    # -- helpers ----------------------------------------------------------------------------
    def request(self, cluster: str, node: str = "n1", weight: int = 1) -> JoinRequest:
        return JoinRequest(cluster, Member(node, f"http://{node}.test:8080", weight),
                           self.lease_s)

    @staticmethod
    def info(membership: Any, cluster: str, node: str) -> Any:
        found = [m for m in membership.members(cluster) if m.node == node]
        assert len(found) == 1, membership.members(cluster)
        return found[0]

    # -- the protocol ----------------------------------------------------------------------
    def test_meets_the_protocol(self, make_membership: MakeMembership, cluster: str) -> None:
        """A Membership by structure; after a join it renews at most every third of the
        granted lease (two renewals may fail before it ends); it names its store."""
        membership = make_membership()
        assert isinstance(membership, Membership)
        lease = membership.acquire(self.request(cluster))
        assert membership.renew_interval is not None
        assert 0 < membership.renew_interval <= lease.ttl / 3 + 1e-9
        assert isinstance(membership.where, str) and membership.where

    # -- join / renew / release ------------------------------------------------------------
    def test_join_gives_a_lease(self, make_membership: MakeMembership, cluster: str,
                                monotonic_ns: Callable[[], int]) -> None:
        """A join returns the member, a holder token, a positive incarnation, the view
        epoch (0: no view yet) and a deadline ahead but within the granted lease."""
        before = monotonic_ns()
        lease = make_membership().acquire(self.request(cluster))
        assert lease.member == Member("n1", "http://n1.test:8080", 1)
        assert lease.holder and lease.epoch >= 1 and lease.view_epoch == 0
        assert lease.ttl > 0 and lease.deadline_ns is not None
        assert before < lease.deadline_ns <= monotonic_ns() + lease.ttl * 1e9

    def test_deadline_is_before_the_lease_ends(self, make_membership: MakeMembership,
                                               cluster: str,
                                               monotonic_ns: Callable[[], int]) -> None:
        """The holder stops a safety margin before the store could give its record to
        another process: the deadline is less than a lease after the send time."""
        membership = make_membership()
        before = monotonic_ns()
        lease = membership.acquire(self.request(cluster))
        assert lease.deadline_ns is not None and lease.deadline_ns < before + lease.ttl * 1e9
        before = monotonic_ns()
        renewed = membership.renew(lease, 0)
        assert renewed.deadline_ns is not None
        assert renewed.deadline_ns < before + renewed.ttl * 1e9

    def test_renew_keeps_the_record_and_extends(self, make_membership: MakeMembership,
                                                cluster: str,
                                                pass_time: Callable[[float], None]) -> None:
        """A renewal keeps holder and incarnation and moves the deadline forward."""
        membership = make_membership()
        lease = membership.acquire(self.request(cluster))
        pass_time(0.05)
        renewed = membership.renew(lease, 0)
        assert (renewed.holder, renewed.epoch, renewed.member) == (
            lease.holder, lease.epoch, lease.member)
        assert lease.deadline_ns is not None and renewed.deadline_ns is not None
        assert renewed.deadline_ns > lease.deadline_ns

    def test_a_second_join_of_a_live_node_is_refused(self, make_membership: MakeMembership,
                                                     cluster: str) -> None:
        """Another process with the same node id is refused while the lease is live,
        with one line naming the live holder; the holder keeps renewing."""
        first, second = make_membership(), make_membership()
        lease = first.acquire(self.request(cluster))
        with pytest.raises(BackendError) as caught:
            second.acquire(self.request(cluster))
        message = str(caught.value)
        assert lease.holder in message and "\n" not in message, message
        first.renew(lease, 0)

    def test_racing_joins_of_one_node_admit_one(self, make_membership: MakeMembership,
                                                cluster: str) -> None:
        """Two processes join the same node id at the same moment: exactly one wins."""
        stores = [make_membership() for _ in range(2)]

        def join(i: int) -> MemberLease | BackendError:
            try:
                return stores[i].acquire(self.request(cluster))
            except BackendError as exc:
                return exc

        got = in_threads(join, 2)
        assert sum(isinstance(g, MemberLease) for g in got) == 1, got

    def test_other_nodes_join_beside(self, make_membership: MakeMembership,
                                     cluster: str) -> None:
        """Different node ids are different records; the same node id in another
        cluster is another record too."""
        membership = make_membership()
        a = membership.acquire(self.request(cluster, "a"))
        b = make_membership().acquire(self.request(cluster, "b"))
        elsewhere = make_membership().acquire(self.request(cluster + "-other", "a"))
        assert a.holder != b.holder and elsewhere.holder != a.holder
        assert [m.node for m in membership.members(cluster)] == ["a", "b"]

    def test_release_leaves_and_the_node_can_join_again(self, make_membership: MakeMembership,
                                                        cluster: str) -> None:
        """After a release the record is ``left``, the old lease cannot renew, and a new
        process joins the node at once with a higher incarnation."""
        first, second = make_membership(), make_membership()
        old = first.acquire(self.request(cluster))
        first.release(old, 0)
        assert self.info(first, cluster, "n1").state == "left"
        with pytest.raises(LeaseLostError):
            first.renew(old, 0)
        again = second.acquire(self.request(cluster))
        assert again.epoch > old.epoch and again.holder != old.holder
        first.release(old, 0)  # fenced: a stale release changes nothing
        second.renew(again, 0)
        assert self.info(second, cluster, "n1").state == "alive"

    def test_taken_over_after_the_lease_lapsed(self, make_membership: MakeMembership,
                                               cluster: str,
                                               expire: Callable[[str, MemberLease], None]) -> None:
        """A holder whose lease lapsed (as the store sees it) is taken over by a new
        join with a higher incarnation; the old holder's renewal raises LeaseLostError
        and its release does not touch the new holder's record."""
        first, second = make_membership(), make_membership()
        old = first.acquire(self.request(cluster))
        expire(cluster, old)
        assert self.info(first, cluster, "n1").state == "lapsed"
        new = second.acquire(self.request(cluster))
        assert new.epoch > old.epoch and new.holder != old.holder
        with pytest.raises(LeaseLostError):
            first.renew(old, 0)
        first.release(old, 0)
        renewed = second.renew(new, 0)
        assert renewed.epoch == new.epoch
        assert self.info(second, cluster, "n1").holder == new.holder

    @pytest.mark.slow
    def test_processes_joining_one_node_at_once_admit_one(
            self, membership_process: tuple[str, list[Any], dict[str, Any]],
            cluster: str) -> None:
        """Three processes join node ``n1`` at the same instant: exactly one joins, the
        others are refused with one BackendError line naming the live holder."""
        factory, args, kwargs = membership_process
        start_at = time.time() + 3.0
        procs = [subprocess.Popen(
            [sys.executable, "-m", "flakekit.testing.membership_joiner", factory,
             json.dumps(args), json.dumps(kwargs), cluster, str(start_at)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
        errors: list[str] = []
        try:
            lines = [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]
        finally:
            for p in procs:
                errors.append(p.communicate(input="", timeout=30)[1][-1000:])
        assert sum(line.startswith("JOINED ") for line in lines) == 1, (lines, errors)
        refused = [line for line in lines if line.startswith("REFUSED ")]
        assert len(refused) == 2, (lines, errors)
        assert all("BackendError" in r and "held by a live process" in r and "|" not in r
                   for r in refused), refused

    # -- members ---------------------------------------------------------------------------
    def test_members_show_states(self, make_membership: MakeMembership, cluster: str) -> None:
        """alive (expires within the lease), draining, left; holder and incarnation."""
        membership = make_membership()
        a = membership.acquire(self.request(cluster, "a", weight=3))
        b = make_membership().acquire(self.request(cluster, "b"))
        make_membership().acquire(self.request(cluster, "c"))
        info = self.info(membership, cluster, "a")
        assert info.state == "alive" and info.serving
        assert info.member == Member("a", "http://a.test:8080", 3)
        assert (info.holder, info.incarnation) == (a.holder, a.epoch)
        assert 0 < info.expires_in_ms <= a.ttl * 1000
        # the lease the record holds: a new owner of a crashed member's keys waits it out
        assert info.lease_ms == round(a.ttl * 1000)
        assert membership.set_draining(cluster, "c", True)
        membership.release(b, 0)
        states = {m.node: m.state for m in membership.members(cluster)}
        assert states == {"a": "alive", "b": "left", "c": "draining"}

    def test_every_renewal_moves_the_member_version(self, make_membership: MakeMembership,
                                                    cluster: str) -> None:
        """Where a store reports a version (a renewal counter: what a claimer times a
        lapse from), every renewal moves it (a drain mark too, where it rewrites the
        record), also of a draining member, which keeps its mark; the record's
        fingerprint (holder, incarnation) stays; the renewal after a new view reads its
        epoch."""
        m, other = make_membership(), make_membership()
        lease = m.acquire(self.request(cluster))
        first = self.info(other, cluster, "n1")
        if first.version is None:
            pytest.skip("this store reports no renewal counter")
        if self.first_version is not None:
            assert first.version == self.first_version
        renewed = m.renew(lease, 0)
        assert self.info(other, cluster, "n1").version == first.version + 1
        assert other.set_draining(cluster, "n1", True)
        assert other.propose(cluster, 0, [Member("x")]) is not None
        again = m.renew(renewed, 0)
        after = self.info(other, cluster, "n1")
        moves = 3 if self.drain_moves_version else 2
        assert after.state == "draining" and after.version == first.version + moves
        assert after.fingerprint[:2] == first.fingerprint[:2]
        assert again.view_epoch == 1

    def test_the_deadline_is_within_the_serve_share_whatever_the_window(
            self, make_with_safety_window: Callable[[int], Any], cluster: str,
            monotonic_ns: Callable[[], int]) -> None:
        """Configured with a safety window of 1 ns, a holder's renewed deadline is still
        at most ``serve_share`` of the lease after the renewal's send (claimers count on
        it, issue 24)."""
        m = make_with_safety_window(1)
        lease = m.acquire(self.request(cluster))
        renewed = m.renew(lease, 0)   # its send was before now
        share = getattr(m, "serve_share", 1.0)
        assert renewed.deadline_ns is not None
        assert renewed.deadline_ns <= monotonic_ns() + share * lease.ttl * 1e9

    def test_lapsed_members_show_as_lapsed(self, make_membership: MakeMembership,
                                           cluster: str,
                                           expire: Callable[[str, MemberLease], None]) -> None:
        """A member whose lease ran out on the store's clock is ``lapsed``, with a
        non-positive ``expires_in_ms``."""
        membership = make_membership()
        lease = membership.acquire(self.request(cluster))
        expire(cluster, lease)
        info = self.info(membership, cluster, "n1")
        assert info.state == "lapsed" and not info.serving and info.expires_in_ms <= 0

    def test_draining_and_back(self, make_membership: MakeMembership, cluster: str) -> None:
        """set_draining marks a member (not serving, still renewing) and unmarks it;
        an unknown or departed node gives False."""
        membership = make_membership()
        lease = membership.acquire(self.request(cluster))
        assert membership.set_draining(cluster, "n1", True)
        assert self.info(membership, cluster, "n1").state == "draining"
        assert not self.info(membership, cluster, "n1").serving
        membership.renew(lease, 0)  # a draining member keeps its lease
        assert self.info(membership, cluster, "n1").state == "draining"
        assert membership.set_draining(cluster, "n1", False)
        assert self.info(membership, cluster, "n1").state == "alive"
        assert not membership.set_draining(cluster, "nobody", True)
        membership.release(lease, 0)
        assert not membership.set_draining(cluster, "n1", True)

    # -- the view --------------------------------------------------------------------------
    def test_no_view_before_the_first_proposal(self, make_membership: MakeMembership,
                                               cluster: str) -> None:
        assert make_membership().view(cluster) == View(cluster, 0, ())

    def test_propose_writes_the_next_epoch(self, make_membership: MakeMembership,
                                           cluster: str) -> None:
        """propose(seen, members) writes seen + 1 with the members sorted by node and the
        store's time; every membership reads the same view back."""
        membership = make_membership()
        members = [Member("b", "http://b:1", 2), Member("a", "http://a:1")]
        first = membership.propose(cluster, 0, members)
        assert first is not None and first.epoch == 1
        assert first.members == (Member("a", "http://a:1"), Member("b", "http://b:1", 2))
        assert first.changed_at_ms > 0
        assert make_membership().view(cluster) == first
        second = membership.propose(cluster, 1, members[:1])
        assert second is not None and second.epoch == 2 and second.nodes() == ("b",)
        assert second.changed_at_ms >= first.changed_at_ms
        assert membership.view(cluster) == second

    def test_view_and_members_in_one_round_read_what_each_reads(
            self, make_membership: MakeMembership, cluster: str) -> None:
        """A membership that reads both at once (``ReadsViewAndMembers``, what a node
        polls) reads the view and the member records its ``view`` and ``members`` read."""
        membership = make_membership()
        together = membership
        if not isinstance(together, ReadsViewAndMembers):
            pytest.skip("this membership reads the view and the members apart")
        assert together.view_and_members(cluster) == (View(cluster, 0, ()), [])
        membership.acquire(self.request(cluster, "a", weight=3))
        make_membership().acquire(self.request(cluster, "b"))
        proposed = membership.propose(cluster, 0, [Member("a", "http://a.test:8080", 3)])
        view, infos = together.view_and_members(cluster)
        assert view == proposed == membership.view(cluster)
        apart = membership.members(cluster)
        assert [(i.member, i.state, i.holder, i.incarnation, i.lease_ms) for i in infos] == [
            (i.member, i.state, i.holder, i.incarnation, i.lease_ms) for i in apart]
        assert [i.node for i in infos] == ["a", "b"]

    def test_propose_on_a_stale_epoch_changes_nothing(self, make_membership: MakeMembership,
                                                      cluster: str) -> None:
        """A proposal whose seen epoch is not the stored one returns None and leaves the
        view as it was (epoch 0 once a view exists, an older or a future epoch)."""
        membership = make_membership()
        view = membership.propose(cluster, 0, [Member("a")])
        assert view is not None
        assert membership.propose(cluster, 0, [Member("b")]) is None
        assert membership.propose(cluster, 7, [Member("b")]) is None
        moved = membership.propose(cluster, 1, [Member("c")])
        assert moved is not None
        assert membership.propose(cluster, 1, [Member("b")]) is None
        assert membership.view(cluster) == moved

    def test_two_proposers_on_one_epoch_exactly_one_wins(self, make_membership: MakeMembership,
                                                         cluster: str) -> None:
        """Round after round (the first view too), ``proposers`` clients that saw the same
        epoch race: exactly one wins, every client then reads its view, and the epochs
        grow by one per round."""
        stores = [make_membership() for _ in range(self.proposers)]
        epochs = []
        for round_ in range(self.race_rounds):
            seen = stores[0].view(cluster).epoch

            def propose(i: int, seen: int = seen, round_: int = round_) -> View | None:
                return stores[i].propose(cluster, seen, [Member(f"n{i}-{round_}")])

            got = in_threads(propose, self.proposers)
            won = [v for v in got if v is not None]
            assert len(won) == 1, got
            assert won[0].epoch == seen + 1
            assert all(s.view(cluster) == won[0] for s in stores)
            epochs.append(won[0].epoch)
        assert epochs == list(range(1, self.race_rounds + 1))

    def test_free_running_proposers_never_share_an_epoch(self, make_membership: MakeMembership,
                                                         cluster: str) -> None:
        """Four clients read-then-propose as fast as they can: every epoch is won exactly
        once, with no gaps, each client's epochs strictly increase, and the stored view
        is the last winner's."""
        stores = [make_membership() for _ in range(4)]
        wins: list[list[View]] = [[] for _ in stores]

        def run(i: int) -> None:
            for _ in range(15):
                seen = stores[i].view(cluster).epoch
                view = stores[i].propose(cluster, seen, [Member(f"c{i}")])
                if view is not None:
                    wins[i].append(view)

        in_threads(run, 4)
        epochs = sorted(v.epoch for w in wins for v in w)
        assert epochs == list(range(1, len(epochs) + 1)), epochs
        for w in wins:
            assert [v.epoch for v in w] == sorted({v.epoch for v in w})
        last = max((v for w in wins for v in w), key=lambda v: v.epoch)
        assert stores[0].view(cluster) == last

    def test_the_view_outlives_its_members(self, make_membership: MakeMembership,
                                           cluster: str) -> None:
        """Every member leaving deletes nothing: the epoch never goes back, and the next
        proposal (even of an empty view) continues from it."""
        membership = make_membership()
        lease = membership.acquire(self.request(cluster))
        view = membership.propose(cluster, 0, [lease.member])
        assert view is not None
        membership.release(lease, 0)
        membership.close()
        later = make_membership()
        assert later.view(cluster) == view
        empty = later.propose(cluster, view.epoch, [])
        assert empty is not None and empty.epoch == view.epoch + 1 and empty.members == ()
        assert later.view(cluster).epoch == view.epoch + 1

    def test_join_and_renew_read_the_view_epoch(self, make_membership: MakeMembership,
                                                cluster: str) -> None:
        """A join reads the current epoch, and each renewal re-reads it: a member learns
        of a new view at its next renewal even without a watch."""
        membership, other = make_membership(), make_membership()
        assert other.propose(cluster, 0, [Member("x")]) is not None
        lease = membership.acquire(self.request(cluster))
        assert lease.view_epoch == 1
        assert other.propose(cluster, 1, [Member("x"), Member("n1")]) is not None
        renewed = membership.renew(lease, 0)
        assert renewed.view_epoch == 2

    def test_watch_view_takes_a_callback_and_none(self, make_membership: MakeMembership,
                                                  cluster: str) -> None:
        """watch_view is a hint: it accepts a callback and None (stop) without error."""
        membership = make_membership()
        membership.watch_view(cluster, lambda: None)
        membership.watch_view(cluster, None)

    def test_the_watch_hints_and_a_dead_watch_still_learns_at_renewal(
            self, make_membership: MakeMembership, cluster: str) -> None:
        """Where the store calls back (``watch_calls_back``): the watch hears a new view;
        once stopped it hears nothing, and the next renewal still reads the new epoch."""
        self._skip_unless_watch()
        membership, other = make_membership(), make_membership()
        lease = membership.acquire(self.request(cluster))
        calls: list[float] = []
        membership.watch_view(cluster, lambda: calls.append(time.monotonic()))
        time.sleep(self.watch_settle_s)   # the watch thread has created its watch
        assert other.propose(cluster, 0, [Member("x")]) is not None
        wait_until(lambda: calls, 30, what="the watch callback")   # a hint: no deadline
        assert membership.renew(lease, 0).view_epoch == 1
        membership.watch_view(cluster, None)
        heard = len(calls)
        assert other.propose(cluster, 1, [Member("y")]) is not None
        time.sleep(0.3)   # nothing may arrive: a wait for silence cannot poll
        assert len(calls) == heard
        assert membership.renew(lease, 0).view_epoch == 2

    def _skip_unless_watch(self) -> None:
        if not self.watch_calls_back:
            pytest.skip("this store's watch_view is a hint it may drop (no callback)")

    def test_bad_input_is_refused_before_the_store(self, make_membership: MakeMembership,
                                                   cluster: str) -> None:
        """A view listing a node twice, or a negative seen epoch, is a ValueError."""
        membership = make_membership()
        with pytest.raises(ValueError):
            membership.propose(cluster, 0, [Member("a"), Member("a", "x")])
        with pytest.raises(ValueError):
            membership.propose(cluster, -1, [Member("a")])
        assert membership.view(cluster).epoch == 0

    def test_an_unreachable_store_fails_in_one_line(self, make_unreachable: MakeMembership,
                                                    cluster: str) -> None:
        """Join, view, members and propose against a store nobody answers at: one
        BackendError line naming the address; after close, one naming the close."""
        membership = make_unreachable()
        try:
            for call in (lambda: membership.acquire(self.request(cluster)),
                         lambda: membership.view(cluster),
                         lambda: membership.members(cluster),
                         lambda: membership.propose(cluster, 0, [Member("a")])):
                with pytest.raises(BackendError) as caught:
                    call()
                message = str(caught.value)
                assert self.unreachable_where in message and "\n" not in message, message
        finally:
            membership.close()
        with pytest.raises(BackendError, match="closed"):
            membership.view(cluster)

    def test_bad_names_are_refused_before_the_store(self, make_unreachable: MakeMembership
                                                    ) -> None:
        """A cluster or node name the store cannot hold, or a weight out of range, is a
        ValueError naming the field, raised before any call (the store is unreachable)."""
        membership = make_unreachable()
        try:
            with pytest.raises(ValueError, match="cluster"):
                membership.view("a/b")
            with pytest.raises(ValueError, match="node"):
                membership.acquire(JoinRequest("c", Member("x/y"), 4.0))
            with pytest.raises(ValueError, match="weight"):
                membership.acquire(JoinRequest("c", Member("x", weight=0), 4.0))
        finally:
            membership.close()

    def test_close_is_idempotent(self, make_membership: MakeMembership, cluster: str) -> None:
        membership = make_membership()
        membership.release(membership.acquire(self.request(cluster)), 0)
        membership.close()
        membership.close()


class AddressedMembershipContract(MembershipContract):
    """The binding of a membership reached at an address and kept under a root of the
    test's own, made as ``factory(address, clock, root=..., **settings)`` (ZooKeeper,
    etcd): several clients race, the watch calls back, a drain mark rewrites the record.

    The binding names ``factory`` (``module:name``) and ``address_fixture`` (the fixture
    giving the store's address); the test module provides ``make(**settings)`` (a new
    membership under the test's root) and ``root``."""

    factory: str = ""
    address_fixture: str = ""
    proposers = 4        # several clients on each round of the CAS race
    race_rounds = 8
    watch_calls_back = True
    drain_moves_version = True

    @pytest.fixture
    def make_membership(self, make: Callable[..., Any]) -> MakeMembership:
        return make

    @pytest.fixture
    def make_with_safety_window(self, make: Callable[..., Any]) -> Callable[[int], Any]:
        return lambda window_ns: make(safety_window_ns=window_ns)

    @pytest.fixture
    def make_unreachable(self, closing: Callable[[Any], Any]) -> MakeMembership:
        import importlib

        from flakekit.values.clock import MonotonicClock

        module, _, name = self.factory.partition(":")
        cls = getattr(importlib.import_module(module), name)
        return lambda: closing(cls(self.unreachable_where, MonotonicClock(),
                                   connect_timeout_s=0.5))

    @pytest.fixture
    def membership_process(self, request: pytest.FixtureRequest,
                           root: str) -> tuple[str, list[Any], dict[str, Any]]:
        return self.factory, [request.getfixturevalue(self.address_fixture)], {"root": root}
