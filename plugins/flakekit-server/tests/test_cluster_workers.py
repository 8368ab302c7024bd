"""Drills of a cluster node on several processes (``serve --workers 2`` with ``[cluster]``):
each process is member ``NODE.i`` on a private port of its own (docs/server.md). Real
nodes, a real PostgreSQL database (and ZooKeeper once); clients record what they saw.
What a node of several processes adds to the drills of test_cluster_drills_workers.py:
one process killed (not the node), one identity started twice, the client's routing to
a process, a drain of both members, a start-up cut short.

Asserted in every drill: no ID twice (I1), per key strictly increasing as clients see it
(I2), and no ID outside a valid lease: an answer never carries a lower owner epoch than
one a client had already seen finish (a deposed process never serves after its
successor), and every ID lies below the fenced ``max_id`` of the key.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
from cluster_testing import STRICT_KEY, Cluster, Record, Recorder, check_ids
from server_testing import Server, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.services]

WORKERS = 2
#: the kill drills here wait out a lease; test_cluster_serve.py's
#: test_harness_owner_killed_key_moves_on is the default-settings (10 s) kill drill, so
#: these run on half of it (every margin is a share of the lease)
SHORT_LEASE_S = 5.0


def in_lease(cluster: Cluster, records: list[Record]) -> None:
    """No ID outside a valid lease, as clients can tell: answers in real-time order never
    go back to a lower owner epoch, and every ID was fetched through the fence."""
    served = sorted((r for r in records if r.id is not None), key=lambda r: r.start)
    by_end = sorted(served, key=lambda r: r.end)
    seen, j = 0, 0
    for rec in served:
        while j < len(by_end) and by_end[j].end < rec.start:
            seen = max(seen, by_end[j].epoch or 0)
            j += 1
        assert rec.epoch is not None and rec.epoch >= seen, (
            f"{rec} answered under owner epoch {rec.epoch} after epoch {seen} was seen")
    assert max(r.id for r in served) <= cluster.max_id()   # type: ignore[type-var]


def invariants(cluster: Cluster, records: list[Record]) -> None:
    check_ids(records)
    in_lease(cluster, records)


def answers_ok(records: list[Record]) -> None:
    """IDs, 503s saying when to retry, or (status 0) a connection the kill cut."""
    assert {r.status for r in records} <= {0, 200, 503}, sorted({r.status for r in records})
    bad = [r for r in records if r.status == 503 and not r.retry_after]
    assert not bad, bad[:3]


def members_in(view: dict) -> set[str]:
    return {m["node"] for m in view["members"]}


def test_members_ports_and_routing(start_cluster):
    """Two nodes of two processes: four members ``n0.0 .. n1.1`` advertising their own
    ports; any process of any node answers the strict key (forwarded once to the owning
    process), and a request at the owner's own port is served there."""
    cluster = start_cluster(2, workers=WORKERS)
    view = cluster.wait_agreed()
    assert members_in(view) == {"n0.0", "n0.1", "n1.0", "n1.1"}
    for m in view["members"]:
        node = cluster.node(m["node"])
        assert m["advertise"] == f"http://127.0.0.1:{node.member_port(m['node'])}"
    assert "cluster members n0.0 .. n0.1 on ports" in cluster.nodes[0].server.banner
    records = Recorder(cluster.running(), clients=4).run(25)
    assert {r.status for r in records} == {200}
    invariants(cluster, records)
    owner = view["owners"][STRICT_KEY]
    status, _, _ = cluster.node(owner).server.get(f"/api/segment/get/{STRICT_KEY}")
    assert status == 200
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", cluster.node(owner).member_port(owner))
    conn.request("GET", f"/api/segment/get/{STRICT_KEY}")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("X-Flakekit-Relayed-From") is None
    conn.close()


def test_client_routes_to_the_owning_process(start_cluster):
    """flakekit's client, given one node's public URL, reads the view (four members, each
    with its own URL) and sends the strict key straight to the owning process's port."""
    from flakekit.client import Client

    cluster = start_cluster(2, workers=WORKERS)
    owner = cluster.wait_agreed()["owners"][STRICT_KEY]
    node = cluster.node(owner)
    with Client(f"http://127.0.0.1:{cluster.nodes[0].port}") as client:
        ids = [client.next_id("orders") for _ in range(20)]
        view = client.view()
        assert view is not None
        assert {m.node for m in view.members} == {"n0.0", "n0.1", "n1.0", "n1.1"}
        assert client.routing.owner_base("orders") == \
            f"http://127.0.0.1:{node.member_port(owner)}"
    assert ids == sorted(ids) and len(set(ids)) == 20


def test_owner_process_killed_is_restarted_and_the_key_moves_safely(start_cluster):
    """kill -9 the one process that owns the key, under load: its supervisor restarts it
    as the same member (refused while its old lease is current, then incarnation + 1),
    the key moves to another member after the lease, and the clients saw no duplicate,
    no step back, no answer from a deposed process."""
    cluster = start_cluster(2, workers=WORKERS, lease_s=SHORT_LEASE_S)
    owner = cluster.wait_agreed()["owners"][STRICT_KEY]
    node = cluster.node(owner)
    before = Recorder(cluster.running(), clients=3).run(15)
    incarnation = cluster.sql("SELECT incarnation FROM flakekit_members WHERE node = :n",
                              n=owner)[0][0]
    recorder = Recorder(cluster.running(), clients=4).start()
    pid = cluster.kill9_member(owner)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:   # restarted: the same member, a new incarnation
        rows = cluster.sql("SELECT incarnation, state FROM flakekit_members WHERE node = :n",
                           n=owner)
        if rows and rows[0][0] > incarnation and rows[0][1] == "alive":
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"{owner} was not restarted:\n{cluster.logs()}")
    cluster.wait_serving(timeout=90)
    assert node.process_pid(owner) != pid
    assert "is held by a live process" in node.server.log()   # the fence refused the early restarts
    records = before + recorder.stop() + Recorder(cluster.running(), clients=2).run(15)
    answers_ok(records)
    invariants(cluster, records)
    print(f"\nWORKERS kill -9 of process {owner}: {sum(r.id is not None for r in records)} "
          f"IDs, {sum(r.status == 503 for r in records)} refusals, "
          f"{sum(r.status == 0 for r in records)} cut connections")


def test_whole_node_killed_then_restarted(start_cluster):
    """kill -9 every process of the owner's node: the other node's members take the
    key after the lease; the node restarted reclaims its own member ids (incarnation
    + 1), and the IDs continue above everything served."""
    cluster = start_cluster(2, workers=WORKERS, lease_s=SHORT_LEASE_S)
    owner = cluster.node(cluster.wait_agreed()["owners"][STRICT_KEY])
    other = cluster.others(owner)[0]
    before = Recorder(cluster.running(), clients=3).run(15)
    recorder = Recorder([other], clients=3).start()
    cluster.kill9(cluster.index(owner))
    view = cluster.wait_agreed(timeout=90, members=1)
    assert members_in(view) == set(other.members)
    cluster.wait_serving(timeout=90, members=1)
    during = recorder.stop()
    cluster.start(cluster.index(owner))
    view = cluster.wait_agreed(timeout=90, members=2)
    assert members_in(view) == {*owner.members, *other.members}
    cluster.wait_serving(timeout=90)
    after = Recorder(cluster.running(), clients=3).run(15)
    records = before + during + after
    answers_ok(records)
    assert {r.status for r in after} == {200}
    invariants(cluster, records)
    rows = dict(cluster.sql("SELECT node, incarnation FROM flakekit_members"))
    assert all(rows[m] == 2 for m in owner.members), rows


def test_drain_moves_every_process_of_the_node(start_cluster):
    """``flakekit cluster drain n0`` drains both members of n0 in one view change (a
    planned hand-off: no lease wait); ``--undo`` brings both back. SIGTERM then leaves
    every member ``left`` with no claim held."""
    cluster = start_cluster(2, workers=WORKERS)
    owner = cluster.node(cluster.wait_agreed()["owners"][STRICT_KEY])
    recorder = Recorder(cluster.running(), clients=4).start()
    time.sleep(0.5)
    run = run_cli("cluster", "drain", owner.name, "-c", str(cluster.operator_config), "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["members"] == owner.members and result["epoch"] > result["from_epoch"]
    assert set(result["view"]) == set(cluster.others(owner)[0].members)
    cluster.wait_serving(timeout=60, members=1)
    records = recorder.stop()
    answers_ok(records)
    assert not [r for r in records if r.status == 0]
    invariants(cluster, records)
    run = run_cli("cluster", "drain", owner.name, "--undo", "-c",
                  str(cluster.operator_config))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"undrained '{owner.name}' (members {', '.join(owner.members)})" in run.stdout
    cluster.wait_agreed(timeout=60, members=2)
    cluster.stop()
    rows = cluster.sql("SELECT node, state FROM flakekit_members")
    assert sorted(rows) == sorted((m, "left") for n in cluster.nodes for m in n.members)
    held = cluster.sql("SELECT owner_node FROM flakekit_key_owner WHERE NOT released")
    assert held == [], held


def test_one_identity_twice_is_refused(start_cluster, tmp_path):
    """A second ``serve --workers 2 --node n0`` (other ports) while n0 runs: every
    process's join is refused by the membership (the record is held by a live
    process), so it exits naming the holder; n0 keeps serving, the members are still
    the first node's."""
    cluster = start_cluster(1, workers=WORKERS)
    node = cluster.nodes[0]
    view = cluster.wait_agreed()
    from cluster_testing import free_ports

    port = free_ports(1 + WORKERS)
    twin = Server(node.config, "--port", str(port), "--node", node.name, "--advertise",
                  f"http://127.0.0.1:{port}", "--workers", str(WORKERS), tmp=tmp_path,
                  wait=False)
    try:
        rc = twin.proc.wait(90)
    finally:
        twin.stop()
    assert rc != 0
    assert "held by a live process" in twin.log(), twin.log()[-2000:]
    again = cluster.wait_agreed()
    assert again["members"] == view["members"]
    assert node.get(f"/api/segment/get/{STRICT_KEY}")[0] == 200


def test_zookeeper_owner_process_killed(start_cluster):
    """The kill -9 of the owning process with members in ZooKeeper (the fence in SQL)."""
    pytest.importorskip("flakekit_zookeeper")
    hosts = os.environ.get("ZK_HOSTS", "127.0.0.1:2181")
    membership = (f'{{ type = "zookeeper", hosts = "{hosts}", '
                  f'root = "/flakekit-workers-{uuid.uuid4().hex[:8]}" }}')
    cluster = start_cluster(2, workers=WORKERS, membership=membership)
    owner = cluster.wait_agreed()["owners"][STRICT_KEY]
    before = Recorder(cluster.running(), clients=3).run(15)
    recorder = Recorder(cluster.running(), clients=4).start()
    pid = cluster.kill9_member(owner)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:   # restarted, and the four members agree again
        try:
            if cluster.node(owner).process_pid(owner) != pid:
                break
        except OSError:
            pass
        time.sleep(0.5)
    cluster.wait_agreed(timeout=90)
    cluster.wait_serving(timeout=90)
    records = before + recorder.stop() + Recorder(cluster.running(), clients=2).run(15)
    answers_ok(records)
    invariants(cluster, records)


def test_sigterm_of_a_supervisor_mid_start_leaves_no_member_alive(start_cluster):
    """SIGTERM to a second node while its processes join: none of its members stays
    ``alive`` (each left, or never joined)."""
    cluster = start_cluster(1, workers=WORKERS)
    node = cluster.add_node("n1")
    cluster.start(cluster.index(node), wait=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not cluster.sql(
            "SELECT node FROM flakekit_members WHERE node LIKE 'n1.%' AND state = 'alive'"):
        time.sleep(0.05)
    assert node.server is not None
    server, node.server = node.server, None
    server.proc.send_signal(signal.SIGTERM)
    server.stop(timeout=150)   # the supervisor waits up to 120 s for a start-up to end
    alive = cluster.sql("SELECT node FROM flakekit_members WHERE node LIKE 'n1.%' "
                        "AND state = 'alive'")
    assert alive == [], f"{alive}\n{server.log()[-6000:]}"
