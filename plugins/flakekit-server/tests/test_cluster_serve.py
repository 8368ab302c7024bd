"""Cluster mode over HTTP (issue 12): three real `flakekit serve` nodes on loopback, one
PostgreSQL database; a strict key served in order through any node."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_testing import (
    STRICT_KEY,
    Cluster,
    Recorder,
    check_ids,
    cluster_config,
    metric,
)
from server_testing import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.services]

LEAF = f"/api/segment/get/{STRICT_KEY}"


def test_cluster_endpoint_agrees(trio):
    """/api/v1/cluster: every node reports the same epoch, hash, members and owner."""
    views = trio.views()
    assert len(views) == 3
    shared = {json.dumps({k: v[k] for k in ("epoch", "hash", "members", "owners")},
                         sort_keys=True) for v in views.values()}
    assert len(shared) == 1
    view = next(iter(views.values()))
    assert view["hash"] == "hrw-xxh64-v1" and view["epoch"] >= 1
    assert sorted(m["node"] for m in view["members"]) == ["n0", "n1", "n2"]
    for m in view["members"]:
        assert m["state"] == "alive" and m["weight"] == 1
        assert m["advertise"] == trio.node(m["node"]).advertise
    assert view["owners"][STRICT_KEY] in {"n0", "n1", "n2"}
    assert "claims" not in view            # the runtime's internals stay inside
    for name, v in views.items():
        assert v["node"] == name and v["lease"]["remaining_s"] > 0
    status, headers, body = trio.nodes[0].get("/api/v1/cluster", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_all_nodes_answer_in_strict_order(trio):
    """Concurrent clients on all three nodes: every answer 200, no ID twice, and per the
    clients' clocks an answer to a later request is larger (I2); every answer carries the
    owner's epoch."""
    records = Recorder(trio.running(), clients=9).run(60)
    assert len(records) == 540
    assert {r.status for r in records} == {200}, [r for r in records if r.status != 200][:5]
    check_ids(records)
    epochs = {r.epoch for r in records}
    assert None not in epochs and len(epochs) == 1


def test_leaf_client_through_any_node(trio):
    """A Leaf client (plain GET, body parsed as a long) works through a node that does not
    own the key: the request is forwarded once, the owner's answer relayed with its
    epoch header; the node counts the forward."""
    owner = trio.owner_of()
    other = trio.others(owner)[0]
    before = metric(other, "flakekit_cluster_forwards_total", result="ok")
    seen = []
    for node in trio.running():
        with urllib.request.urlopen(node.advertise + LEAF, timeout=10) as resp:
            seen.append(int(resp.read().decode()))
            assert resp.headers["X-Flakekit-Owner-Epoch"].isdigit()
            assert resp.headers["Content-Type"].startswith("text/plain")
            # a relayed answer names the node it came from; the owner's own does not
            assert resp.headers.get("X-Flakekit-Relayed-From") == (
                None if node is owner else owner.name)
    assert seen == sorted(seen) and len(set(seen)) == 3
    assert metric(other, "flakekit_cluster_forwards_total", result="ok") == before + 1
    # the JSON API too, batches included: the owner makes them
    status, data = other.json("/api/v1/next/orders?count=5")
    assert status == 200 and data["count"] == 5 and data["ids"][0] > seen[-1]
    assert data["ids"] == sorted(data["ids"])


def test_view_epoch_header_gets_421(trio):
    """A client that routes by its view (X-Flakekit-View-Epoch) and asks a non-owner
    gets 421 with the owner, its URL and the view epoch; the owner serves it."""
    view = trio.wait_agreed()
    owner = trio.node(view["owners"][STRICT_KEY])
    other = trio.others(owner)[0]
    before = metric(other, "flakekit_cluster_misdirected_total")
    headers = {"X-Flakekit-View-Epoch": str(view["epoch"])}
    for path in (LEAF, "/api/v1/next/orders"):
        status, hdrs, body = other.get(path, headers)
        assert status == 421, body
        data = json.loads(body)
        assert (data["owner"], data["advertise"], data["epoch"]) == (
            owner.name, owner.advertise, view["epoch"])
        assert data["error"] == "misdirected" and hdrs["content-type"] == "application/json"
    status, hdrs, body = owner.get(LEAF, headers)
    assert status == 200 and int(body) > 0 and hdrs["x-flakekit-owner-epoch"].isdigit()
    status, _, body = other.get(LEAF, {"X-Flakekit-View-Epoch": "soon"})
    assert status == 400 and b"X-Flakekit-View-Epoch" in body
    assert metric(other, "flakekit_cluster_misdirected_total") == before + 2


def test_forwarded_request_is_never_forwarded_again(trio):
    """A request already forwarded (X-Flakekit-Forwarded-By) that reaches a non-owner is
    answered 503 with Retry-After: one hop at most."""
    owner = trio.owner_of()
    other = trio.others(owner)[0]
    forwards = metric(other, "flakekit_cluster_forwards_total", result="ok")
    refused = metric(other, "flakekit_cluster_refused_total", reason="forwarded_not_owner")
    status, hdrs, body = other.get(LEAF, {"X-Flakekit-Forwarded-By": "n9"})
    assert status == 503 and hdrs["retry-after"] == "1"
    data = json.loads(body)
    assert data["error"] == "not_owner" and "'n9'" in data["message"]
    assert metric(other, "flakekit_cluster_refused_total",
                  reason="forwarded_not_owner") == refused + 1
    assert metric(other, "flakekit_cluster_forwards_total", result="ok") == forwards


def test_metrics_and_status_show_the_cluster(trio):
    """/metrics: view epoch, members by state, owned keys, hand-off families from zero;
    /api/v1/status carries the cluster for the monitor page."""
    view = trio.wait_agreed()
    owner = trio.node(view["owners"][STRICT_KEY])
    assert metric(owner, "flakekit_cluster_view_epoch") == view["epoch"]
    assert metric(owner, "flakekit_cluster_owned_keys") == 1
    assert metric(trio.others(owner)[0], "flakekit_cluster_owned_keys") == 0
    assert metric(owner, "flakekit_cluster_members", state="alive") == 3
    text = owner.get("/metrics")[2].decode()
    assert "# TYPE flakekit_cluster_handoff_duration_seconds histogram" in text
    assert metric(owner, "flakekit_cluster_handoff_duration_seconds_bucket", le="+Inf") >= 0
    for reason in ("key_moving", "cluster_unavailable", "forwarded_not_owner", "owner_unreachable"):
        assert f'flakekit_cluster_refused_total{{reason="{reason}",node="{owner.name}"' in text
    status, body = owner.json("/api/v1/status")
    assert status == 200, body
    assert body["processes"][0]["cluster"]["status"]["owners"] == {STRICT_KEY: owner.name}


def test_plain_keys_stay_per_node(trio):
    """A key without order = "strict" is served by every node itself (Leaf's behaviour):
    no owner epoch, no forward."""
    for node in trio.running():
        status, headers, body = node.get("/api/segment/get/invoice")
        assert status == 200 and body.isdigit() and "x-flakekit-owner-epoch" not in headers


@pytest.mark.parametrize(("args", "field"), [
    # each process advertises a port of its own: a URL is needed, and fixed ports
    (["--port", "0", "--member-port", "20000"], "--advertise"),
    (["--port", "0", "--advertise", "http://127.0.0.1:1"], "--member-port"),
    (["--port", "20000", "--member-port", "19999", "--advertise", "http://127.0.0.1:1"],
     "--member-port"),    # the private ports 19999-20000 take in the public one
    (["--port", "65535", "--advertise", "http://127.0.0.1:1"], "--member-port"),
])
def test_workers_with_cluster_bad_ports_exit_2(tmp_path, cluster_db, args, field):
    """--workers 2 with [cluster] needs --advertise and fixed private ports beside the
    public one: refused before anything starts, one line naming the flag."""
    config = cluster_config(tmp_path / "c.toml", cluster_db)
    assert field in _serve_refused(config, "--workers", "2", "--node", "n0", *args)


def _serve_refused(config: Path, *args: str) -> str:
    """``flakekit serve --config CONFIG ARGS`` exits 2 with one line and no traceback;
    that line."""
    run = run_cli("serve", "--config", str(config), *args)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    return run.stderr


def test_member_port_without_cluster_workers_exit_2(tmp_path, cluster_db):
    """--member-port with one process: it names the processes' ports, so it is refused."""
    config = cluster_config(tmp_path / "c.toml", cluster_db)
    assert "--member-port" in _serve_refused(config, "--port", "0", "--member-port", "20000",
                                             "--node", "n0", "--advertise", "http://127.0.0.1:1")


def test_bad_advertise_flag_exit_2(tmp_path, cluster_db):
    """--advertise is checked as the config's advertise is, and named."""
    config = cluster_config(tmp_path / "c.toml", cluster_db)
    assert "--advertise" in _serve_refused(config, "--port", "0", "--node", "n0",
                                           "--advertise", "10.0.0.5:8080")


def test_node_flag_without_cluster_exit_2(tmp_path):
    """--node on a config without [cluster]: a usage error, one line."""
    from server_testing import sqlite_config

    stderr = _serve_refused(sqlite_config(tmp_path, {"invoice": 10}), "--port", "0",
                            "--node", "n0")
    assert "--node" in stderr and "[cluster]" in stderr, stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_harness_owner_killed_key_moves_on(start_cluster, workers):
    """The drill harness end to end (round 2 builds on it): kill -9 the owner under load;
    the two others agree on a view without it, a new owner serves the key, and what the
    clients saw has no duplicate and keeps I2 (refusals while the key moves are 503s).
    With ``workers=2`` every node is ``serve --workers 2`` (two members) and the whole
    node is killed."""
    cluster = start_cluster(3, workers=workers)
    owner = cluster.owner_of()
    index = cluster.nodes.index(owner)
    survivors = cluster.others(owner)
    before = Recorder(cluster.running(), clients=3).run(20)
    recorder = Recorder(survivors, clients=4).start()
    cluster.kill9(index)
    view = cluster.wait_agreed(timeout=90, members=2)
    assert not set(owner.members) & {m["node"] for m in view["members"]}
    assert cluster.node(view["owners"][STRICT_KEY]) in survivors
    moved = cluster.wait_serving()
    new_owner = cluster.wait_agreed()["owners"][STRICT_KEY]
    after = Recorder(survivors, clients=2).run(20)
    records = before + recorder.stop() + after
    assert {r.status for r in records} <= {200, 503}, {r.status for r in records}
    assert {r.status for r in after} == {200}, [r for r in after if r.status != 200][:3]
    check_ids(records)
    new_epochs = {r.epoch for r in after}
    assert len(new_epochs) == 1 and new_epochs.pop() > max(r.epoch for r in before)
    # the owning process's own /metrics (its port with --workers 2): a copy <= 1 s old
    at = moved if workers == 1 else moved.process(new_owner)
    deadline = time.monotonic() + 10
    while metric(at, "flakekit_cluster_handoffs_total", node=new_owner) < 1 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(at, "flakekit_cluster_handoffs_total", node=new_owner) >= 1
    assert metric(at, "flakekit_cluster_handoff_duration_seconds_count", node=new_owner) >= 1


def test_node_and_advertise_from_the_environment(tmp_path, cluster_db, start_server):
    """$FLAKEKIT_NODE / $FLAKEKIT_ADVERTISE name the node when no flag does (one config
    file for every node); a one-node cluster owns every strict key."""
    from cluster_testing import _cluster_tables

    from flakekit.testing.databases import free_port

    config = cluster_config(tmp_path / "c.toml", cluster_db)
    _cluster_tables(cluster_db)
    port = free_port()
    server = start_server(config, "--port", str(port), env={
        "FLAKEKIT_NODE": "env-node", "FLAKEKIT_ADVERTISE": f"http://127.0.0.1:{port}"})
    deadline = time.monotonic() + 30
    view: dict = {}
    while time.monotonic() < deadline:
        status, view = server.json("/api/v1/cluster")
        if status == 200 and view.get("owners"):
            break
        time.sleep(0.2)
    assert view["node"] == "env-node"
    assert view["members"] == [{"node": "env-node", "advertise": f"http://127.0.0.1:{port}",
                                "weight": 1, "state": "alive"}]
    assert view["owners"] == {STRICT_KEY: "env-node"}
    deadline = time.monotonic() + 30
    status = 0
    while status != 200 and time.monotonic() < deadline:
        status, headers, body = server.get(LEAF)
        time.sleep(0.1)
    assert status == 200 and body.isdigit() and headers["x-flakekit-owner-epoch"].isdigit()


def _member_row(cluster: Cluster, node: str) -> tuple[str, int] | None:
    rows = cluster.sql("SELECT state, renewals FROM flakekit_members WHERE node = :n", n=node)
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def test_sigterm_at_any_moment_of_the_start_up_leaves_cleanly(tmp_path, cluster_db):
    """SIGTERM at three moments of a real node's start-up (issue 20): while Python still
    imports (no handler yet: it dies, but it never joined), while its join's INSERT is
    held 1.5 s on its database path, and as soon as its member row reads ``alive``. After
    every exit its row is ``left`` or absent, never ``alive``, and no key stays claimed
    by it; once the handlers are in, the exit is the graceful one (status 0)."""
    cluster = Cluster(tmp_path, cluster_db, 3)
    try:
        moments = dict(zip(("importing", "joining", "joined"), cluster.nodes, strict=True))
        for moment, node in moments.items():
            if moment == "joining":
                node.proxy.stall_at(b"INSERT INTO flakekit_members", hold_s=1.5)
            cluster.start(cluster.index(node), wait=False)
            assert node.server is not None
            proc = node.server.proc
            deadline = time.monotonic() + 60
            if moment == "joining":
                assert node.proxy.marker_hit.wait(60), node.server.log()
            while moment == "joined" and _member_row(cluster, node.name) != ("alive", 0):
                assert proc.poll() is None and time.monotonic() < deadline, node.server.log()
                time.sleep(0.005)
            rc = node.server.stop()
            node.server = None
            row = _member_row(cluster, node.name)
            assert row is None or row[0] == "left", (moment, row)
            if moment != "importing":
                assert row is not None and rc == 0, (moment, rc, row)
            claimed = cluster.sql("SELECT biz_tag FROM flakekit_key_owner WHERE owner_node = "
                                  ":n AND NOT released", n=node.name)
            assert claimed == [], (moment, claimed)
    finally:
        cluster.close()
