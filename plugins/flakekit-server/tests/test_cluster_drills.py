"""Fault drills of cluster mode (issue 12 item 8) on real processes: three `flakekit serve`
nodes on loopback, one PostgreSQL database, each node behind its own TCP proxy to it, the
DEFAULT cluster settings (lease 10 s, handoff_wait 2 s, debounce 0.5 s, statement_timeout
30 s): these are the default-settings drills of each property; test_cluster_drills_workers.py
runs them again on a shorter lease and reply limit (every wait here scales with
``cluster.lease_s`` and ``cluster.reply_s``).

Every drill records (start, end, id) of every answer its clients saw and asserts I1 (no
ID twice) and I2 (an answer to a request that started after another ended is larger);
the last test asserts both over everything every drill saw for the key (one cluster is
shared by the module, so the drills also check each other). Each drill prints its figure
(``DRILL ...`` lines: key unavailability in ms, time to recover); run with ``-s`` (or
``-rP``) to see them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import attrs
import pytest
from cluster_testing import (
    STRICT_KEY,
    Cluster,
    Node,
    Record,
    Recorder,
    check_ids,
    metric,
    unavailable_ms,
)
from server_testing import create_keys, dump_dom, fresh_pg, needs_chromium, run_cli, table_rows

from flakekit.values.cluster import Member
from flakekit.values.owners import owner_of

pytestmark = [pytest.mark.slow, pytest.mark.services]

#: a second strict key with a tiny step: its segments run out every few requests
TICKET = "ticket"
#: a strict key with a huge step: the owner's memory outlasts any lease
STOCK = "stock"
LEAF = f"/api/segment/get/{STRICT_KEY}"

#: every answer for STRICT_KEY any drill saw (checked together at the end)
HISTORY: list[Record] = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes of one process (default settings); see :func:`drill_cluster`.
    test_cluster_drills_workers.py runs every drill here again on ``--workers 2`` nodes."""
    yield from drill_cluster(tmp_path_factory, workers=1)


def drill_cluster(tmp_path_factory: pytest.TempPathFactory, workers: int,
                  lease_s: float | None = None,
                  statement_timeout_s: float | None = None) -> Iterator[Cluster]:
    """Three nodes (default settings unless ``lease_s``/``statement_timeout_s`` say) on a
    fresh database; strict keys ``order`` (step 20), ``ticket`` (step 5) and ``stock``
    (step 1,000,000). With ``workers`` > 1 every node is ``serve --workers N`` (each
    process a member ``NODE.i``: a drill's "node" is then all of its processes)."""
    HISTORY.clear()   # one history per cluster
    for url in fresh_pg():
        create_keys(url, {STRICT_KEY: 20, TICKET: 5, STOCK: 1_000_000, "invoice": 100})
        made = Cluster(tmp_path_factory.mktemp("drills"), url, 3, workers, lease_s=lease_s,
                       statement_timeout_s=statement_timeout_s,
                       strict={"orders": STRICT_KEY, "tickets": TICKET, "stocks": STOCK})
        try:
            made.start()
            made.wait_serving()
            made.wait_serving(TICKET)
            made.wait_serving(STOCK)
            yield made
        finally:
            made.close()


def settled(cluster: Cluster, key: str = STRICT_KEY) -> Node:
    """The state every drill starts from: three agreeing nodes, ``key`` served; its owner."""
    return cluster.wait_serving(key, timeout=90, members=3)


def keep(records: list[Record]) -> list[Record]:
    HISTORY.extend(records)
    return records


def refusals_ok(records: list[Record]) -> None:
    """Only IDs or 503 refusals that say when to retry."""
    assert {r.status for r in records} <= {200, 503}, sorted({r.status for r in records})
    bad = [r for r in records if r.status == 503 and not r.retry_after]
    assert not bad, bad[:3]


def ms(ns: int) -> float:
    return round(ns / 1e6, 1)


def first_ok_after(records: list[Record], t: int, epoch_above: int | None = None) -> int | None:
    """End (ns) of the first answered request that started after ``t`` (with an owner
    epoch above ``epoch_above``)."""
    ends = [r.end for r in records if r.id is not None and r.start >= t
            and (epoch_above is None or (r.epoch or 0) > epoch_above)]
    return min(ends, default=None)


def drain(cluster: Cluster, node: str, undo: bool = False) -> dict:
    args = ["cluster", "drain", node, "-c", str(cluster.operator_config), "--json"]
    run = run_cli(*args, *(["--undo"] if undo else []))
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout)


def handoffs_taken(node: Node) -> float:
    return node_metric(node, "flakekit_cluster_handoffs_total")


def node_metric(node: Node, name: str) -> float:
    """A cluster metric summed over the node's members, each asked at its own port
    (with --workers 2 the public port's /metrics shows a sibling's copy, which lagged
    by more than 10 s on a loaded machine)."""
    return sum(metric(node if node.workers == 1 else node.process(m), name, node=m)
               for m in node.members)


def member_names(cluster: Cluster, node: str) -> list[str]:
    """The members node ``node`` joins as (itself, or ``node.i`` per process)."""
    from flakekit.cluster.processes import process_node

    return [node] if cluster.workers == 1 else [process_node(node, i)
                                                 for i in range(cluster.workers)]


def waited_claims(node: Node) -> int:
    """Claims this node made only after waiting out a crashed owner (its log)."""
    assert node.server is not None
    return node.server.log().count("after waiting out the old owner")


# -- 8. two concurrent prefetches used in fetch order --------------------------------------
def test_segment_switches_under_load_keep_order(cluster):
    """Drill 8: twelve clients hammer ``ticket`` (step 5) on its owner, so segments run out
    every few requests, hunger prefetch asks for several at once and fetches overlap
    answers: the owner serves strictly in order (I2) across every segment switch."""
    owner = settled(cluster, TICKET)
    before = cluster.max_id(TICKET)
    t0 = time.monotonic_ns()
    records = Recorder([owner], f"/api/segment/get/{TICKET}", clients=12).run(150)
    took = time.monotonic_ns() - t0
    after = cluster.max_id(TICKET)
    assert {r.status for r in records} == {200}, [r for r in records if r.status != 200][:3]
    check_ids(records)
    assert after - before >= len(records)
    print(f"\nDRILL 8 prefetch: {len(records)} IDs in {ms(took)} ms on {owner.name}, "
          f"max_id {before} -> {after} (step 5: >= {(after - before) // 5} steps fetched), "
          f"no order violation")


# -- 2. add a node ---------------------------------------------------------------------------
def test_added_node_takes_its_keys(cluster):
    """Drill 2: a 4th node starts; the view grows to four, each strict key's owner is the
    HRW owner of the new member list, the key moves to the newcomer in a planned hand-off
    (printed: ms without an answer). Then the 4th stops cleanly (SIGTERM: release, leave)
    and the key moves back."""
    old_owner = settled(cluster)
    view = cluster.wait_agreed()
    members = [Member(m["node"], m["advertise"], m["weight"]) for m in view["members"]]
    # a name HRW gives the key to, so the drill moves it
    name = next(f"n{k}" for k in range(3, 500) if owner_of(STRICT_KEY, [
        *members, *(Member(m, "", 1) for m in member_names(cluster, f"n{k}"))]).node
        in member_names(cluster, f"n{k}"))
    newcomer = cluster.add_node(name)
    recorder = Recorder(cluster.reachable(), clients=6).start()
    time.sleep(0.5)
    t_add = time.monotonic_ns()
    cluster.start(cluster.index(newcomer))
    view4 = cluster.wait_agreed(timeout=60, members=4)
    listed = [Member(m["node"], m["advertise"], m["weight"]) for m in view4["members"]]
    assert sorted(m.node for m in listed) == sorted([*(m.node for m in members),
                                                     *member_names(cluster, name)])
    for key, owner in view4["owners"].items():
        assert owner == owner_of(key, listed).node, (key, owner)
    assert cluster.node(view4["owners"][STRICT_KEY]) is newcomer
    assert cluster.wait_serving(timeout=60, members=4) is newcomer
    time.sleep(1.0)
    newcomer_waited = waited_claims(newcomer)
    t_leave = time.monotonic_ns()
    cluster.stop(cluster.index(newcomer))
    back = cluster.wait_serving(timeout=60, members=3)
    time.sleep(1.0)
    records = keep(recorder.stop())
    refusals_ok(records)
    check_ids(records)
    assert back is old_owner
    assert newcomer_waited == 0 and waited_claims(back) == 0   # both planned
    joined = [r for r in records if t_add <= r.start < t_leave]
    left = [r for r in records if r.start >= t_leave]
    print(f"\nDRILL 2 add node: key {STRICT_KEY!r} {old_owner.name} -> {name}: unavailable "
          f"{unavailable_ms(joined + [r for r in records if r.end <= t_add], t_add)} ms "
          f"(planned); clean stop of {name}, back to {back.name}: unavailable "
          f"{unavailable_ms(records, t_leave)} ms; {len(records)} answers, "
          f"{sum(r.status == 503 for r in records)} 503s ({len(left)} after the stop)")


# -- 3. drain a node with the CLI ------------------------------------------------------------
def test_drain_moves_keys_without_lease_wait(cluster):
    """Drill 3: ``flakekit cluster drain OWNER`` moves its keys at once (planned: the new
    owner never waits out a lease); the drained node owns nothing; ``--undo`` brings it
    back and HRW gives it its keys again."""
    owner = settled(cluster)
    recorder = Recorder(cluster.reachable(), clients=6).start()
    time.sleep(0.5)
    waited_before = {n.name: waited_claims(n) for n in cluster.reachable()}
    t_drain = time.monotonic_ns()
    result = drain(cluster, owner.name)
    assert result["action"] == "drain" and result["epoch"] == result["from_epoch"] + 1
    assert cluster.node(result["moved"][STRICT_KEY]["from"]) is owner
    view = cluster.wait_agreed(timeout=30, members=2)
    assert not set(owner.members) & {m["node"] for m in view["members"]}
    assert not set(owner.members) & set(view["owners"].values())
    new = cluster.wait_serving(timeout=30, members=2)
    assert new is not owner and cluster.node(result["moved"][STRICT_KEY]["to"]) is new
    deadline = time.monotonic() + 10   # /metrics shows a copy at most 1 s old
    while node_metric(owner, "flakekit_cluster_owned_keys") != 0 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node_metric(owner, "flakekit_cluster_owned_keys") == 0
    time.sleep(0.5)
    t_undo = time.monotonic_ns()
    undo = drain(cluster, owner.name, undo=True)
    moved = undo["moved"][STRICT_KEY]
    assert undo["action"] == "undrain" and (
        cluster.node(moved["from"]), cluster.node(moved["to"])) == (new, owner)
    assert cluster.wait_serving(timeout=30, members=3) is owner
    time.sleep(0.5)
    records = keep(recorder.stop())
    refusals_ok(records)
    check_ids(records)
    # planned both ways: no claim waited out a lease
    assert {n.name: waited_claims(n) for n in cluster.reachable()} == waited_before
    drained = unavailable_ms([r for r in records if r.start < t_undo], t_drain)
    undone = unavailable_ms(records, t_undo)
    print(f"\nDRILL 3 drain: {owner.name} -> {new.name} unavailable {drained} ms, --undo "
          f"{new.name} -> {owner.name} unavailable {undone} ms (lease {cluster.lease_s:g} s never "
          f"waited); {len(records)} answers, {sum(r.status == 503 for r in records)} 503s")


# -- 6. lost and regained ownership: never the old segment --------------------------------
def test_regained_owner_never_reuses_its_old_segment(cluster):
    """Drill 6 (tidb #52600): the owner serves part of a segment, loses the key (drain),
    another node serves, the owner regains it (--undo): every ID it serves after regaining
    is above everything anyone served in between, and none comes from the segment it held
    before (a new generator per claim)."""
    owner = settled(cluster)
    first = keep(Recorder([owner], clients=2).run(5))
    old_epoch = {r.epoch for r in first}
    assert len(old_epoch) == 1
    held_to = cluster.max_id()   # the end of the segment(s) the owner holds now
    drain(cluster, owner.name)
    interim = cluster.wait_serving(timeout=30, members=2)
    between = keep(Recorder(cluster.reachable(), clients=3).run(15))
    drain(cluster, owner.name, undo=True)
    assert cluster.wait_serving(timeout=30, members=3) is owner
    regained = keep(Recorder([owner], clients=2).run(10))
    records = first + between + regained
    assert {r.status for r in records} == {200}, [r for r in records if r.status != 200][:3]
    check_ids(records)
    mine_before = max(r.id for r in first)
    in_between = [r.id for r in between]
    after = [r.id for r in regained]
    assert {r.epoch for r in regained}.isdisjoint(old_epoch | {r.epoch for r in between})
    assert min(after) > max(in_between) > mine_before
    print(f"\nDRILL 6 regain: {owner.name} served up to {mine_before} (held to {held_to}), "
          f"{interim.name} served {min(in_between)}..{max(in_between)}, {owner.name} after "
          f"regaining {min(after)}..{max(after)}: old segment not reused")


# -- 9. Leaf clients unchanged through a hand-off ------------------------------------------
def test_plain_leaf_client_round_robin_through_handoff(cluster):
    """Drill 9: a plain HTTP client (urllib, no flakekit header) asks the nodes in turn
    while the key is drained away and back: it gets only 200s (IDs, strictly increasing:
    each request starts after the previous answer) or 503s with Retry-After."""
    owner = settled(cluster)
    nodes = cluster.reachable()
    seen: list[Record] = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            node = nodes[i % len(nodes)]
            i += 1
            start = time.monotonic_ns()
            try:
                with urllib.request.urlopen(node.advertise + LEAF, timeout=30) as resp:
                    body = resp.read()
                    seen.append(Record(start, time.monotonic_ns(), int(body), node.name,
                                       resp.status))
            except urllib.error.HTTPError as err:
                seen.append(Record(start, time.monotonic_ns(), None, node.name, err.code,
                                   retry_after=err.headers.get("Retry-After")))
            except OSError:   # no answer at all: refusals_ok() reports it
                seen.append(Record(start, time.monotonic_ns(), None, node.name, 0))

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    time.sleep(0.5)
    drain(cluster, owner.name)
    cluster.wait_serving(timeout=30, members=2)
    time.sleep(0.5)
    drain(cluster, owner.name, undo=True)
    assert cluster.wait_serving(timeout=30, members=3) is owner
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    records = keep(list(seen))
    refusals_ok(records)
    ids = [r.id for r in records if r.id is not None]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "not strictly increasing"
    check_ids(records)
    print(f"\nDRILL 9 leaf client: {len(ids)} IDs strictly increasing through 2 hand-offs "
          f"round robin over {len(nodes)} nodes, {len(records) - len(ids)} 503s, "
          f"longest gap {unavailable_ms(records)} ms")


# -- 1. SIGSTOP the owner past its lease, then SIGCONT ------------------------------------
@attrs.frozen
class Paused:
    """What a paused-owner drill saw (times: monotonic ns)."""

    owner: Node
    new: Node
    back: Node
    old_epoch: int
    t_pause: int
    t_new: int
    t_resume: int
    during: list[Record]
    woken: list[Record]
    served_before: int


def paused_owner(cluster: Cluster, before_pause: Callable[[Node], None],
                 resume_after_s: float) -> Paused:
    """SIGSTOP the key's owner once ``before_pause(owner)`` returns, wait until another
    node serves the key, SIGCONT ``resume_after_s`` later; clients ask the others all
    along and the paused node from the pause on (they wait in its socket). Asserts the
    refusals, I1 and I2 over everything, and that the woken node answered nothing at or
    under what was served before it woke, nor under the old owner epoch."""
    owner = settled(cluster)
    i = cluster.index(owner)
    others = cluster.others(owner)
    before = keep(Recorder(cluster.reachable(), clients=3).run(10))
    old_epoch = max(r.epoch or 0 for r in before)
    recorder = Recorder(others, clients=4).start()
    time.sleep(0.3)
    before_pause(owner)
    t_pause = time.monotonic_ns()
    cluster.pause(i)
    woken = Recorder([owner], clients=3).start()   # these wait in the paused node's socket
    new = cluster.wait_serving(timeout=90, members=2, among=others)
    time.sleep(resume_after_s)
    t_resume = time.monotonic_ns()
    cluster.resume(i)
    t_new = first_ok_after(recorder.records, t_pause, old_epoch) or t_resume
    time.sleep(3.0)
    woken_records = keep(woken.stop())
    back = settled(cluster)
    time.sleep(0.5)
    during = keep(recorder.stop())
    after = keep(Recorder(cluster.reachable(), clients=3).run(10))
    records = before + during + woken_records + after
    refusals_ok(records)
    check_ids(records)
    served_before = max(r.id for r in records if r.id is not None and r.end < t_resume)
    stale = [r for r in woken_records if r.id is not None and r.id <= served_before]
    assert not stale, stale[:3]
    old = [r for r in woken_records if r.id is not None and (r.epoch or 0) <= old_epoch]
    assert not old, old[:3]
    return Paused(owner, new, back, old_epoch, t_pause, t_new, t_resume, during,
                  woken_records, served_before)


def test_paused_owner_wakes_without_stale_ids(cluster):
    """Drill 1 (Kleppmann's paused process): SIGSTOP the owner past its lease; the others
    take the key over and serve; requests sent to the paused node meanwhile wait in its
    socket; SIGCONT: what the woken node answers is a refusal, a forward, or an ID larger
    than everything served before it woke (never its old segment)."""
    got = paused_owner(cluster, lambda owner: None, resume_after_s=1.0)
    assert got.back is got.owner   # HRW gives it its key again once it is back in the view
    print(f"\nDRILL 1 SIGSTOP owner {got.owner.name}: {got.new.name} served after "
          f"{ms(got.t_new - got.t_pause)} ms (0.8 x lease + margin after its last "
          f"renewal); key unavailable {unavailable_ms(got.during, got.t_pause)} ms; after "
          f"SIGCONT the woken node answered {sum(r.id is not None for r in got.woken)} IDs "
          f"(all > {got.served_before}, epoch > {got.old_epoch}) and "
          f"{sum(r.status == 503 for r in got.woken)} 503s; no stale ID")


# -- 1b. SIGSTOP the owner right after a renewal's COMMIT, SIGCONT once the key moved ----
def test_owner_paused_right_after_a_renewal_never_serves_after_the_takeover(cluster):
    """The edge of the crash hand-off's proof (issue 24): the claimer counts from its
    first read of the owner's renewal counter, and waits only the share of the lease the
    owner serves after that renewal's send (plus a margin). SIGSTOP the owner as soon as
    a renewal of it is committed, so its deadline is as late as it can be; SIGCONT the
    moment another node serves the key: the woken owner's own deadline has passed, so
    what it answers is a refusal, a forward, or an ID under the new owner's epoch --
    never one under its old claim."""
    from sqlalchemy import create_engine, text

    def right_after_a_renewal(owner: Node) -> None:
        # the member holding the claim: the node itself, or one of its processes
        # (`serve --workers 2`: member NODE.i)
        member = cluster.key_owner()[0]
        assert cluster.node(member) is owner, (member, owner.name)
        engine = create_engine(cluster.url)
        query = text("SELECT renewals FROM flakekit_members WHERE node = :n")
        try:
            with engine.connect() as conn:
                seen = conn.execute(query, {"n": member}).scalar()
                give_up = time.monotonic() + 3 * cluster.lease_s
                while time.monotonic() < give_up:
                    conn.rollback()   # a fresh snapshot each read (MariaDB's REPEATABLE READ)
                    if conn.execute(query, {"n": member}).scalar() != seen:
                        return
                    time.sleep(0.002)
                raise AssertionError(f"no renewal of {member} in {3 * cluster.lease_s:g} s")
        finally:
            engine.dispose()

    got = paused_owner(cluster, right_after_a_renewal, resume_after_s=0.0)
    print(f"\nDRILL 1b SIGSTOP owner {got.owner.name} right after a renewal: "
          f"{got.new.name} served after {ms(got.t_new - got.t_pause)} ms; SIGCONT "
          f"{ms(got.t_resume - got.t_pause)} ms after the pause; the woken node answered "
          f"{sum(r.id is not None for r in got.woken)} IDs (all epoch > {got.old_epoch}) "
          f"and {sum(r.status == 503 for r in got.woken)} 503s; nothing under its old claim")


# -- 7. a deposed owner's exit lowers nothing ------------------------------------------
def test_deposed_owner_exit_lowers_nothing(cluster):
    """Drill 7 (tidb #46444): pause the owner, let a new owner serve, then SIGTERM the old
    one while it is still stopped and SIGCONT it: it wakes to a clean exit with a stale
    cache (give-back and release attempted, both fenced). ``leaf_alloc.max_id`` never
    falls below the end of the old owner's range (sampled throughout: its give-back
    would put it there; a new owner handing the key on gives back no lower than its own
    range, which starts above), the fence row is never the old node's again, and the new
    owners' IDs keep increasing."""
    owner = settled(cluster)
    i = cluster.index(owner)
    others = cluster.others(owner)
    keep(Recorder([owner], clients=2).run(5))   # the old owner holds a used segment
    old_end = cluster.max_id()                   # ... which ends here
    recorder = Recorder(others, clients=3).start()
    cluster.pause(i)
    new = cluster.wait_serving(timeout=90, members=2, among=others)
    time.sleep(0.5)
    fence = cluster.key_owner()
    assert cluster.node(fence[0]) is new and not fence[2]
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(cluster.max_id())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.2)
    assert owner.server is not None and owner.pid is not None
    os.kill(owner.pid, signal.SIGTERM)   # pending until it runs again
    t_exit = time.monotonic_ns()
    cluster.resume(i)
    rc = owner.server.proc.wait(30)
    exited = time.monotonic_ns()
    cluster.stop(i)
    time.sleep(1.0)
    sampling.set()
    sampler.join(10)
    records = keep(recorder.stop())
    refusals_ok(records)
    check_ids(records)
    assert rc == 0, owner.server.log()[-3000:] if owner.server else rc
    assert samples and min(samples) >= old_end, (
        f"max_id went below the old owner's range end {old_end}: {samples}")
    now = cluster.key_owner()                 # the deposed exit changed nothing
    assert cluster.node(now[0]) is not owner and not now[2], (fence, now)
    ids = [r.id for r in sorted(records, key=lambda r: r.end) if r.id is not None
           and r.start > t_exit]
    assert ids, "the new owner served nothing after the old one exited"
    cluster.start(i)
    settled(cluster)
    print(f"\nDRILL 7 deposed exit: {owner.name} woke to SIGTERM and exited (rc {rc}) in "
          f"{ms(exited - t_exit)} ms; max_id {samples[0]} -> {samples[-1]} over "
          f"{len(samples)} samples, never lower; fence stayed {fence[0]}@{fence[1]}; "
          f"{new.name} kept serving ({len(ids)} IDs after the exit began)")


# -- 5. the store cut off for one node, then back ----------------------------------------
@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_store_cut_for_owner_then_back(cluster, fault):
    """Drill 5: the owner of ``stock`` (a step of a million: its memory outlasts any
    lease) loses the database: its proxy is cut (connections dropped, new ones refused)
    or stalled (connections open, nothing forwarded; healed by resetting them). It
    serves from memory only until its member deadline (at most a lease after the fault),
    then 503 cluster_unavailable with Retry-After, never a stale ID; the others take the
    key over after lease + margin; the fault heals, the node rejoins and HRW gives it the
    key back; no violation anywhere."""
    owner = settled(cluster, STOCK)
    others = cluster.others(owner)
    path = f"/api/segment/get/{STOCK}"
    on_owner = Recorder([owner], path, clients=2).start()
    elsewhere = Recorder(others, path, clients=3).start()
    time.sleep(0.5)
    old_epoch = max(r.epoch or 0 for r in list(on_owner.records) if r.id is not None)
    t_cut = time.monotonic_ns()
    if fault == "cut":
        owner.proxy.cut()
    else:
        owner.proxy.stall()
    new = cluster.wait_serving(STOCK, timeout=90, members=2, among=others)
    time.sleep(1.0)
    t_heal = time.monotonic_ns()
    if fault == "stall":
        # the proxy dropped what it was sent meanwhile: a request in flight would wait
        # for its answer until the reply limit (35 s; libpq has none of its own, and the
        # proxy's kernel acknowledges keepalives; test_black_holed_node_rejoins_after_the_heal
        # heals so). Heal like a middlebox that restarts: reset those flows (the node sees
        # errors at once, retries on new connections)
        owner.proxy.unstall()
        owner.proxy.cut()
    owner.proxy.restore()
    back = settled(cluster, STOCK)
    time.sleep(1.0)
    cut_records = on_owner.stop()
    records = cut_records + elsewhere.stop()
    refusals_ok(records)
    check_ids(records)
    served_cut = [r for r in cut_records if r.id is not None and t_cut <= r.start < t_heal
                  and (r.epoch or 0) <= old_epoch]
    assert served_cut, "the owner served nothing from memory after the fault"
    last_served = max(r.start for r in served_cut)
    assert last_served < t_cut + cluster.lease_s * 1e9, "served past its member deadline"
    refused = [r for r in cut_records if r.id is None and last_served < r.start < t_heal]
    assert refused and all(r.status == 503 and r.retry_after for r in refused)
    assert {r.code for r in refused} <= {"cluster_unavailable", "key_moving"}, \
        {r.code for r in refused}
    late = [r for r in cut_records if r.id is not None and last_served < r.start < t_heal]
    assert not late, late[:3]
    t_new = first_ok_after(records, t_cut, old_epoch)
    assert t_new is not None
    assert back is owner
    print(f"\nDRILL 5 store {fault} for {owner.name}: it served {len(served_cut)} IDs from "
          f"memory for {ms(last_served - t_cut)} ms after the fault (its member deadline), "
          f"then 503 ({len(refused)} refusals: {sorted({r.code for r in refused})}); "
          f"{new.name} served after {ms(t_new - t_cut)} ms; key unavailable "
          f"{unavailable_ms([r for r in records if r.start < t_heal], t_cut)} ms; after "
          f"the heal back on {back.name}, longest gap {unavailable_ms(records, t_heal)} ms")


# -- 4. restart every node after a hand-off ----------------------------------------------
def test_restart_all_after_handoff(cluster):
    """Drill 4 (tidb #53016): hand the key off (drain), serve through the new owner, stop
    all three nodes (SIGTERM), start them again: the IDs continue above everything served
    before."""
    owner = settled(cluster)
    drain(cluster, owner.name)
    cluster.wait_serving(timeout=30, members=2)
    before = keep(Recorder(cluster.reachable(), clients=3).run(10))
    members = [cluster.index(n) for n in cluster.running()]
    cluster.stop()
    t_start = time.monotonic_ns()
    for i in members:
        cluster.start(i)
    settled(cluster)
    t_ready = time.monotonic_ns()
    after = keep(Recorder(cluster.reachable(), clients=3).run(10))
    records = before + after
    assert {r.status for r in records} == {200}, [r for r in records if r.status != 200][:3]
    check_ids(records)
    top = max(r.id for r in HISTORY if r.id is not None and r.end < t_start)
    assert min(r.id for r in after) > top
    print(f"\nDRILL 4 restart all: serving again {ms(t_ready - t_start)} ms after the "
          f"first start; IDs continue from {min(r.id for r in after)} (> {top}, the largest "
          f"served before)")


# -- the monitor page's cluster panel ---------------------------------------------------
@needs_chromium
def test_monitor_page_shows_the_cluster(cluster, tmp_path):
    """The monitor page (headless Chromium) of the owner and of another node: the members
    with their state, the owner of each strict key, the claim here, and the hand-offs this
    node took (the drills above moved the key to it)."""
    owner = settled(cluster)
    other = cluster.others(owner)[0]
    view = cluster.wait_agreed()
    deadline = time.monotonic() + 10   # the page's copy of the counters is <= 1 s old
    while handoffs_taken(owner) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    taken = int(handoffs_taken(owner))
    assert taken >= 1
    want = sorted(m["node"] for m in view["members"])
    for node in (owner, other):
        # the page shows the node's copy of the view, up to a second old: a member that
        # (re)joined just before the agreed view was read may need one more refresh
        deadline = time.monotonic() + 15
        while True:
            dom = dump_dom(tmp_path, node.advertise + "/")
            assert '<section id="cluster-panel">' in dom, dom[:3000]
            members = table_rows(dom, "cluster-members")
            shown = sorted(r[0].replace(" (this node)", "") for r in members)
            if shown == want or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert shown == want
        # the page's process: the node itself, or (`serve --workers 2`) one of its
        # members NODE.i, whichever process took the connection
        here = [r[0].removesuffix(" (this node)") for r in members
                if r[0].endswith("(this node)")]
        assert len(here) == 1 and cluster.node(here[0]) is node, here
        assert {r[3] for r in members} == {"alive"}
        by_key = {r[0]: r for r in table_rows(dom, "cluster-keys")}
        owning = by_key[STRICT_KEY][1]   # the member holding the claim
        assert cluster.node(owning) is owner
        assert by_key[STRICT_KEY][3] in (("owned",) if here[0] == owning else ("idle", "-"))
        summary = re.search(r'id="cluster-summary"[^>]*>(.*?)<', dom, re.S)
        assert summary and f"view epoch {view['epoch']}" in summary.group(1)
        assert "hrw-xxh64-v1" in summary.group(1)
        if here[0] == owning:
            assert re.search(r"(\d+) hand-off\(s\) taken", summary.group(1))
            assert int(re.search(r"(\d+) hand-off\(s\) taken",
                                 summary.group(1)).group(1)) >= 1
        assert "no hand-off in progress" in dom


# -- a black-holed store connection ----------------------------------------------------
def test_black_holed_node_rejoins_after_the_heal(cluster):
    """The store stalled for the owner of ``stock`` past its member deadline (the proxy
    acknowledges and drops what it is sent: TCP looks healthy, so keepalives and
    tcp_user_timeout never fire), then let through again WITHOUT resetting the
    connections. The request in flight when the stall began never gets an answer; it
    fails once none came for the reply limit (statement_timeout 30 s + 5 s, the
    defaults: ``cluster.reply_s``), its connection is given up, and the node renews its
    membership on a new one. It failed before that limit: libpq has no read timeout, so
    the renewal thread blocked for ever and the node stayed out of the cluster (safe:
    only 503s). Last drill of the module: the owner is killed (-9) at the end."""
    owner = settled(cluster, STOCK)
    owner.proxy.stall()
    stalled = time.monotonic()
    deadline = stalled + 3 * cluster.lease_s
    while time.monotonic() < deadline and owner.get(f"/api/segment/get/{STOCK}")[0] == 200:
        time.sleep(0.2)   # serving from memory until its member deadline
    time.sleep(1.0)
    owner.proxy.unstall()
    age_ms = -1.0
    try:
        # the stuck request fails a reply limit (35 s) after it was sent (at most a
        # renewal interval, a third of the lease, after the stall began); then a renewal
        # or two on a new connection
        while time.monotonic() < stalled + cluster.reply_s + cluster.lease_s / 3 + 20:
            age_ms = max(float(cluster.sql(   # every process of the node renewed
                "SELECT extract(epoch FROM now() - last_seen) * 1000 FROM flakekit_members "
                "WHERE node = :n", n=m)[0][0]) for m in owner.members)
            if age_ms < 3000:   # renewed since the heal
                break
            time.sleep(0.5)
        assert age_ms < 3000, f"{owner.name} has not renewed for {age_ms:.0f} ms after the heal"
        print(f"\nDRILL black hole for {owner.name}: renewed again "
              f"{time.monotonic() - stalled:.1f} s after the stall began")
    finally:
        cluster.kill9(cluster.index(owner))


# -- all drills together -------------------------------------------------------------------
def test_everything_the_clients_saw(cluster):
    """I1 and I2 over every answer for the key in every drill above (one key, one cluster,
    one client clock): the drills never undid each other's order."""
    assert len(HISTORY) > 100
    check_ids(HISTORY)
    print(f"\nDRILLS all: {sum(r.id is not None for r in HISTORY)} IDs, "
          f"{sum(r.id is None for r in HISTORY)} refusals, no duplicate, no order violation")
