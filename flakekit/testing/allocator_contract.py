"""``AllocatorContract``: the promises every worker-id allocator keeps, as tests.

Modelled on APScheduler 4's data-store suite: a test module subclasses the class and
provides a ``make_allocator`` fixture; every test method then runs against that
allocator on its real backend::

    class TestSqlOnPostgres(AllocatorContract):
        @pytest.fixture
        def make_allocator(self, pg_url): ...

``make_allocator()`` returns a new allocator on the same backend and namespace with an
identity of its own (another process, as the backend sees it); the fixture closes what
it made. Class flags switch off what an allocator does not promise (each test says why
it is skipped), and the optional fixtures ``pass_time`` and ``expire`` let a binding
move time and end a lease behind its holder's back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from flakekit.errors import LeaseLostError
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.testing.contract_clock import OnWallClock

__all__ = ["AllocatorContract"]

MakeAllocator = Callable[[], Any]


class AllocatorContract(OnWallClock):
    """Subclass and provide the fixture ``make_allocator``."""

    #: two live acquirers never share an id (False: the id is configured, e.g. static)
    exclusive: bool = True
    #: a released id can be taken by another acquirer (False: ids are owned for good)
    reusable: bool = True
    #: leases carry a deadline that renewals move (False: leases never expire)
    expires: bool = True
    #: the largest worker id the contract asks for (the layout's range)
    max_worker_id: int = 1023

    def request(self, max_worker_id: int | None = None) -> LeaseRequest:
        top = self.max_worker_id if max_worker_id is None else max_worker_id
        return LeaseRequest("contract", top, "", 0)

    @pytest.fixture
    def expire(self) -> Callable[[WorkerLease], None]:
        """``expire(lease)``: make the backend treat ``lease`` as lapsed, as after a
        crash of its holder (override where the backend can be made to)."""
        pytest.skip("this binding cannot end a lease behind its holder's back")

    def _skip_unless(self, flag: bool, why: str) -> None:
        if not flag:
            pytest.skip(why)

    # -- acquire ---------------------------------------------------------------------------
    def test_acquire_gives_an_id_in_range_with_a_future_deadline(self, make_allocator,
                                                                  monotonic_ns):
        """A lease's id fits the layout's worker range; its deadline is ahead (or None:
        never expires); it names a holder and a positive epoch."""
        lease = make_allocator().acquire(self.request())
        assert 0 <= lease.worker_id <= self.max_worker_id
        assert lease.epoch >= 1 and lease.holder
        if self.expires:
            assert lease.deadline_ns is not None and lease.deadline_ns > monotonic_ns()
        else:
            assert lease.deadline_ns is None

    def test_acquire_respects_a_small_range(self, make_allocator):
        """With a one-id range the only id handed out is 0."""
        assert make_allocator().acquire(self.request(0)).worker_id == 0

    def test_two_acquirers_never_share_an_id(self, make_allocator):
        """Leases held at the same time by different acquirers have different ids."""
        self._skip_unless(self.exclusive, "the id is configured, not leased")
        leases = [make_allocator().acquire(self.request()) for _ in range(4)]
        ids = [lease.worker_id for lease in leases]
        assert len(set(ids)) == len(ids), ids

    # -- renew -----------------------------------------------------------------------------
    def test_renew_keeps_the_id_and_extends(self, make_allocator, pass_time):
        """A renewal keeps id and epoch and moves the deadline forward."""
        alloc = make_allocator()
        lease = alloc.acquire(self.request())
        pass_time(0.01)
        renewed = alloc.renew(lease, time.time_ns())
        assert (renewed.worker_id, renewed.epoch) == (lease.worker_id, lease.epoch)
        if self.expires:
            assert lease.deadline_ns is not None and renewed.deadline_ns is not None
            assert renewed.deadline_ns > lease.deadline_ns
        else:
            assert renewed.deadline_ns is None

    def test_renew_after_the_id_was_taken_elsewhere_raises(self, make_allocator):
        """Released, then taken by another acquirer: the old lease's renewal is refused
        with LeaseLostError (never a silent success)."""
        self._skip_unless(self.reusable, "a released id is not handed to anyone else")
        first, second = make_allocator(), make_allocator()
        old = first.acquire(self.request(0))
        first.release(old, time.time_ns())
        taken = second.acquire(self.request(0))
        assert taken.worker_id == old.worker_id
        with pytest.raises(LeaseLostError):
            first.renew(old, time.time_ns())
        second.renew(taken, time.time_ns())  # the new holder keeps it

    def test_renew_after_the_lease_lapsed_and_was_taken_raises(self, make_allocator, expire):
        """A holder whose lease lapsed (as the backend sees it) and whose id was taken
        over learns it at its next renewal: LeaseLostError."""
        self._skip_unless(self.reusable, "a lapsed id is not handed to anyone else")
        first, second = make_allocator(), make_allocator()
        old = first.acquire(self.request(0))
        expire(old)
        taken = second.acquire(self.request(0))
        assert taken.worker_id == old.worker_id and taken.epoch > old.epoch
        with pytest.raises(LeaseLostError):
            first.renew(old, time.time_ns())

    # -- release ---------------------------------------------------------------------------
    def test_release_lets_the_id_be_taken_again_after_the_mark(self, make_allocator):
        """After a release the id goes to the next acquirer, whose lease carries the
        released holder's high-water mark (it must not stamp IDs before it)."""
        self._skip_unless(self.reusable, "a released id is not handed to anyone else")
        first, second = make_allocator(), make_allocator()
        old = first.acquire(self.request(0))
        issued_until = time.time_ns()
        first.release(old, issued_until)
        again = second.acquire(self.request(0))
        assert again.worker_id == old.worker_id
        assert again.epoch > old.epoch
        assert again.not_before_ns >= issued_until - 1_000_000  # the mark, to the ms

    def test_an_owned_id_survives_release(self, make_allocator):
        """Where ids are owned for good, release does not hand the id to someone else."""
        self._skip_unless(not self.reusable and self.exclusive, "ids are recyclable here")
        first, second = make_allocator(), make_allocator()
        old = first.acquire(self.request())
        first.release(old, time.time_ns())
        assert second.acquire(self.request()).worker_id != old.worker_id

    # -- records, close --------------------------------------------------------------------
    def test_records_show_the_holder(self, make_allocator):
        """records() lists a held id, marked as this allocator's own."""
        alloc = make_allocator()
        lease = alloc.acquire(self.request())
        mine = [r for r in alloc.records() if r.worker_id == lease.worker_id]
        assert mine and mine[0].mine, alloc.records()

    def test_records_of_another_allocator_show_it_as_not_mine(self, make_allocator):
        """Another allocator of the namespace lists the same id, but not as its own."""
        self._skip_unless(self.exclusive, "a configured id has no registry to share")
        holder, other = make_allocator(), make_allocator()
        lease = holder.acquire(self.request())
        seen = [r for r in other.records() if r.worker_id == lease.worker_id]
        assert seen and not seen[0].mine, other.records()

    def test_close_is_idempotent(self, make_allocator):
        """close() may be called twice, after a release or without any acquire."""
        alloc = make_allocator()
        lease = alloc.acquire(self.request())
        alloc.release(lease, time.time_ns())
        alloc.close()
        alloc.close()
        idle = make_allocator()
        idle.close()
        idle.close()
