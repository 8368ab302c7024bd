"""Fault drills against real etcd: many processes, restarts, a paused holder, a lost
leader, compaction.

Assertions are about safety (no duplicate ID, no ID outside a valid lease, no false
loss), never about speed; the measured numbers are printed (pytest -s) for the docs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest
from etcdhelpers import compact_history, etcdctl, generator, member_pid
from etcdhelpers import leader as etcd_leader

from flakekit.errors import LeaseError
from flakekit.testing.drills import (
    IssuingThread,
    parse_ids,
    pause_beside,
    read_until,
    spawn,
    tiny_layout,
    write_config,
)
from flakekit.testing.waiting import seconds_until_raises, wait_until

pytestmark = pytest.mark.slow


def _table(endpoints: str, **extra: str) -> str:
    more = "".join(f', {k} = {v}' for k, v in extra.items())
    return f'{{ type = "etcd", endpoints = "{endpoints}", ttl = "2s", quarantine = "0s"{more} }}'


def test_many_processes_get_distinct_ids(tmp_path, etcd_endpoints, ns):
    """Eight processes started at the same instant: while they run side by side they hold
    different worker ids (a process that starts late may take an id another released
    before, never one held), and no ID repeats across them."""
    cfg = write_config(tmp_path, ns, _table(etcd_endpoints))
    at = time.monotonic_ns() + 2_000_000_000
    procs = [spawn(cfg, ns, "--seconds", "2", "--start-at", str(at)) for _ in range(8)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    held = []
    for out in outs:
        lease = next(x for x in out.splitlines() if x.startswith("LEASE ")).split()
        last = max(t for _, t in parse_ids(out))   # before its release
        held.append((int(lease[1]), int(lease[3]), last))
    for k, (wid, start, end) in enumerate(held):
        for wid2, start2, end2 in held[k + 1:]:
            if wid == wid2:   # the same id only one after the other
                assert end < start2 or end2 < start, held
    ids = [i for out in outs for i, _ in parse_ids(out)]
    assert ids and len(ids) == len(set(ids))
    workers = sorted(w for w, _, _ in held)
    print(f"\n8 processes: worker ids {workers}, {len(ids)} IDs, no duplicate")


def test_restart_and_clean_release_reuse(tmp_path, etcd_endpoints, ns):
    """A killed holder's id waits (lease + quarantine); a cleanly released one is taken
    again at once, by the next process, with a higher epoch and IDs above the old ones."""
    cfg = write_config(tmp_path, ns, _table(etcd_endpoints))
    a = spawn(cfg, ns)
    a_lease = read_until(a, "LEASE ").split()
    time.sleep(0.2)
    a.kill()                                   # a crash: no release
    a_out = a.communicate(timeout=30)[0]
    b = spawn(cfg, ns, "--seconds", "0.5")     # a restart right after it
    b_out = b.communicate(timeout=60)[0]
    b_lease = next(x for x in b_out.splitlines() if x.startswith("LEASE ")).split()
    assert a_lease[1] == "0" and b_lease[1] == "1"   # the dead holder's id is not taken
    c = spawn(cfg, ns, "--seconds", "0.5")     # B released 1 cleanly: C takes it at once
    c_out = c.communicate(timeout=60)[0]
    c_lease = next(x for x in c_out.splitlines() if x.startswith("LEASE ")).split()
    assert c_lease[1] == "1" and int(c_lease[2]) > int(b_lease[2])
    b_ids, c_ids = [i for i, _ in parse_ids(b_out)], [i for i, _ in parse_ids(c_out)]
    assert b_ids and c_ids and min(c_ids) > max(b_ids)   # past B's mark
    ids = [i for i, _ in parse_ids(a_out)] + b_ids + c_ids
    assert len(ids) == len(set(ids))


def test_sigstop_past_the_ttl_no_duplicate(tmp_path, etcd_endpoints, ns):
    """A generator paused past its lease while another process claims its id: the
    paused one issues nothing after it resumes, and no ID repeats."""
    cfg = write_config(tmp_path, ns, _table(etcd_endpoints), layout="tiny")
    holder = generator(ns, tiny_layout(), endpoints=etcd_endpoints, ttl="2s", quarantine=0)
    run = pause_beside(holder, cfg, ns)
    assert int(run.b_lease[2]) > int(run.a_lease[2])         # same id, later epoch
    assert run.claimed_at - run.stopped_at >= 2.0e9          # not before the lease could end


def test_leader_change_no_false_loss(etcd_cluster):
    """Kill the leader the client talks to (listed first), with the DEFAULT ttl: the
    client moves to another member, the lease survives the election (no LeaseLostError,
    same id and epoch), IDs keep flowing, and the lease is alive on the new leader."""
    endpoints, svc = etcd_cluster
    leader = etcd_leader(endpoints)
    ordered = ",".join([leader] + [e for e in endpoints.split(",") if e != leader])
    ns = f"leader{time.time_ns() % 10**9}"
    gen = generator(ns, endpoints=ordered, quarantine=0)
    gen.start()
    lease0 = gen.keeper.lease
    issuing = IssuingThread(gen, error_pause_s=0.01).start()
    ids = issuing.ids
    time.sleep(1.0)
    renewals = gen.keeper.renewals
    killed_at = time.monotonic()
    os.kill(member_pid(svc, leader), signal.SIGKILL)
    recovered = None
    with contextlib.suppress(AssertionError):
        wait_until(lambda: gen.keeper.renewals > renewals, 15, interval=0.01)
        recovered = time.monotonic() - killed_at
    time.sleep(1.0)
    issuing.stop(timeout=5)
    errors = [f"{type(exc).__name__}: {exc}" for _, exc in issuing.errors]
    rest = ",".join(e for e in endpoints.split(",") if e != leader)
    new_leader = etcd_leader(rest)
    lease_now = gen.keeper.lease
    alive = json.loads(etcdctl(rest, "lease", "timetolive",
                               f"{gen.keeper.allocator.store.session_id:x}", "-w", "json"))
    gen.close()
    assert recovered is not None, "no renewal succeeded within 15 s of the leader's death"
    assert gen.keeper.lost is None and not any("LeaseLost" in e for e in errors), errors
    assert lease_now is not None and (lease_now.worker_id, lease_now.epoch) == \
        (lease0.worker_id, lease0.epoch)
    assert int(alive["ttl"]) > 0                       # the lease lives on the new leader
    gaps = [b - a for (_, a), (_, b) in zip(ids, ids[1:])]
    after = [i for i, t in ids if t > killed_at * 1e9]
    assert after, "no ID after the leader was killed"
    assert len({i for i, _ in ids}) == len(ids)
    print(f"\nleader change: killed {leader}, new leader {new_leader}; first renewal "
          f"{recovered:.2f} s after, longest gap between IDs {max(gaps) / 1e6:.0f} ms, "
          f"{len(errors)} refusals, no loss")


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "renewal-only"])
def test_compaction_while_watching_renewals_still_see_the_change(etcd_endpoints, ns, watch):
    """The history compacted under the holder's watch, then its claim replaced behind its
    back: the renewal (which re-reads) sees it, with or without the watch's hint; the
    generator stops within TTL/3."""
    gen = generator(ns, endpoints=etcd_endpoints, ttl="3s", quarantine=0, watch=watch)
    gen.start()
    gen.next_id()
    compact_history(etcd_endpoints, f"/flakekit/{ns}/noise")
    key = f"/flakekit/{ns}/claims/{gen.lease.worker_id}"
    t0 = time.monotonic()
    etcdctl(etcd_endpoints, "del", key)
    etcdctl(etcd_endpoints, "put", key, "someone-else")
    stopped = seconds_until_raises(gen.next_id, LeaseError, t0, 5)
    with contextlib.suppress(AssertionError):   # the keeper revokes first, then records why
        wait_until(lambda: gen.keeper.lost is not None, 1.0, interval=0.01)
    lost = gen.keeper.lost
    gen.close()
    assert stopped is not None and lost is not None and "claim" in lost, lost
    assert stopped <= 1.0 + 0.5
    print(f"\ncompaction drill (watch={watch}): stopped {stopped:.3f} s after the claim "
          "was replaced")
