"""Fault drills against real ZooKeeper: a paused process, a lost leader.

Assertions are about safety only (no duplicate ID, no ID outside a valid session), never
about speed; the measured numbers are printed (pytest -s) for the docs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from zkhelpers import ensemble_pid, ensemble_roles, generator

from flakekit.testing.drills import (
    IssuingThread,
    pause_beside,
    tiny_layout,
    write_config,
)
from flakekit.testing.waiting import wait_until

pytestmark = pytest.mark.slow


def test_sigstop_past_session_timeout_no_duplicate(tmp_path, zk_hosts, ns):
    """A generator paused past its session while another process claims its id: the
    paused one issues nothing after it resumes, and no ID repeats."""
    table = (f'{{ type = "zookeeper", hosts = "{zk_hosts}", mode = "lease", '
             'session_timeout = "2s", safety_window = "0.5s", quarantine = 0 }')
    cfg = write_config(tmp_path, ns, table, layout="tiny")
    holder = generator(ns, tiny_layout(), hosts=zk_hosts, session_timeout="2s",
                       safety_window="0.5s", quarantine=0)
    run = pause_beside(holder, cfg, ns)
    assert int(run.b_lease[2]) == int(run.a_lease[2]) + 1    # same id, epoch + 1
    assert run.claimed_at - run.stopped_at >= 1.0e9          # not before the session could end


def test_leader_loss_no_id_without_session(zk_ensemble, ns):
    """SIGSTOP the ensemble's leader under a client pinned to a follower: IDs stop within
    the lease (session - safety after the last confirmed contact), resume only after a
    confirmed renewal, and never repeat."""
    hosts, svc = zk_ensemble
    leader, follower = ensemble_roles(hosts)
    gen = generator(ns, hosts=f"127.0.0.1:{follower}", session_timeout="2s",
                    safety_window="0.5s", quarantine=0, connect_timeout="10s")
    gen.start()
    alloc = gen.keeper.allocator
    lease_ns = alloc._lease_ms * 1_000_000
    renewals: list[int] = []  # monotonic t0 of every confirmed contact

    class Recording:
        """Delegates to the allocator and notes each confirmed contact."""

        def __getattr__(self, name):
            return getattr(alloc, name)

        def renew(self, lease, until):
            new = alloc.renew(lease, until)
            renewals.append(new.deadline_ns - lease_ns)
            return new

        def acquire(self, request):
            new = alloc.acquire(request)
            renewals.append(new.deadline_ns - lease_ns)
            return new

    renewals.append(gen.lease.deadline_ns - lease_ns)
    gen.keeper.allocator = Recording()
    issuing = IssuingThread(gen, restart_on_lost=True).start()
    issued, errors = issuing.ids, issuing.errors
    wait_until(lambda: len(issued) > 100, 10, what="IDs before the pause")
    pid = ensemble_pid(svc, leader)
    paused_at = time.monotonic_ns()
    os.kill(pid, signal.SIGSTOP)
    try:   # paused until the generator has stopped and its lease is over, 7 s at most
        with contextlib.suppress(AssertionError):
            wait_until(lambda: errors and time.monotonic_ns() > paused_at + lease_ns + 10**9,
                       7)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.monotonic_ns()
    wait_until(lambda: any(r > resumed_at for r in renewals) and issued[-1][1] > resumed_at,
               30, what="IDs after the leader came back")
    issuing.stop()
    gen.close()
    ids = [i for i, _ in issued]
    assert len(ids) == len(set(ids))
    info = (f"renewals (s from pause): {[(r - paused_at) / 1e9 for r in renewals]}; "
            f"errors: {[(t - paused_at) / 1e9 for t, _ in errors[:3]]}...{len(errors)}")
    before_pause = [r for r in renewals if r < paused_at]
    assert before_pause, info
    last_contact = max(before_pause)
    recovered = min((r for r in renewals if r > paused_at), default=None)
    during = [t for _, t in issued if t > paused_at and (recovered is None or t < recovered)]
    # nothing issued later than session - safety after the last confirmed contact
    assert all(t <= last_contact + lease_ns for t in during), info
    gap_start = max((t for t in during), default=paused_at)
    after = [t for _, t in issued if recovered is not None and t >= recovered]
    assert errors, f"the generator never stopped; {info}"
    assert after, f"IDs never resumed after the ensemble recovered; {info}"
    print(f"\nleader loss: IDs stopped {(gap_start - paused_at) / 1e9:.2f} s after the leader "
          f"was paused (lease bound {(last_contact + lease_ns - paused_at) / 1e9:.2f} s), "
          f"resumed {(min(after) - paused_at) / 1e9:.2f} s after it; "
          f"{len(errors)} refused calls, {len(ids)} IDs, no duplicate")
