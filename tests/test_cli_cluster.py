"""``flakekit cluster status`` and ``flakekit cluster drain`` (issue 12, item 7) on real
SQLite and PostgreSQL databases: members joined through the SQL membership, views
proposed by compare-and-set, claims in the key-owner table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from flakekit.cluster.store_contracts import JoinRequest, KeyClaim
from flakekit.pluginhost.host import PluginHost
from flakekit.pluginhost.markers import hookimpl
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.membership import SqlMembership
from flakekit.testing.cli import run_cli, run_error_line
from flakekit.testing.databases import free_port, fresh_server_database
from flakekit.testing.waiting import wait_until
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member
from flakekit.values.owners import OwnerMap

KEYS = ["orders", "invoices", "coupons", "returns", "carts"]  # web-1 owns coupons, returns
WEB1 = Member("web-1", "http://127.0.0.1:8001")
WEB2 = Member("web-2", "http://127.0.0.1:8002", 2)


pytestmark = pytest.mark.usefixtures("no_node_identity")


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgresql), "sqlite"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ids.db'}"
        return
    with fresh_server_database("postgresql") as db:
        yield db


def _write_config(tmp_path, url, keys=KEYS, cluster="ids"):
    gens = "".join(f'\n[generators.{k}]\nstrategy = "segment"\norder = "strict"\n' for k in keys)
    path = tmp_path / "flakekit.toml"
    path.write_text(f'[backends.default]\nurl = "{url}"\n\n[cluster]\nname = "{cluster}"\n'
                    f'{gens}\n[generators.audit]\nstrategy = "segment"\n')
    return str(path)


@pytest.fixture
def cluster(tmp_path, url):
    """Two joined members (web-1, web-2) and the view of both at epoch 1."""
    engine = create_engine(url)
    membership = SqlMembership(engine, MonotonicClock(), create_schema=True)
    leases = [membership.acquire(JoinRequest("ids", m, 60.0)) for m in (WEB1, WEB2)]
    view = membership.propose("ids", 0, [WEB1, WEB2])
    assert view is not None and view.epoch == 1
    yield membership, _write_config(tmp_path, url), view, leases
    engine.dispose()


def _status(capsys, config):
    code, out, err = run_cli(capsys, "cluster", "status", "--json", "-c", config)
    assert (code, err) == (0, ""), err
    return json.loads(out)


def _settled(report) -> bool:
    [orders] = report["strict"]
    return orders["claim"] is not None and orders["claim"]["node"] == orders["owner"]


def _settled_report(report):
    """``report`` once both nodes serve and the key's claim is its owner's, else None."""
    return report if sorted(report["view"]) == ["web-1", "web-2"] and _settled(report) else None


def test_status_lists_members_view_and_owners(capsys, cluster):
    membership, config, view, _ = cluster
    report = _status(capsys, config)
    assert (report["cluster"], report["epoch"], report["hash"]) == ("ids", 1, "hrw-xxh64-v1")
    assert report["view"] == ["web-1", "web-2"]
    assert [(m["node"], m["state"], m["in_view"], m["weight"], m["advertise"])
            for m in report["members"]] == [
        ("web-1", "alive", True, 1, WEB1.advertise), ("web-2", "alive", True, 2, WEB2.advertise)]
    assert all(0 < m["lease_left_s"] <= 60 for m in report["members"])
    owners = OwnerMap(view)
    assert {s["key"]: s["owner"] for s in report["strict"]} == {
        k: owners.owner(k).node for k in KEYS}
    assert {s["owner"] for s in report["strict"]} == {"web-1", "web-2"}  # the keys spread
    assert all(s["claim"] is None for s in report["strict"]) and report["claims"] == []
    assert report["changed_at"] is not None


def test_status_shows_claims(capsys, cluster, url):
    _, config, view, _ = cluster
    store = SqlSegmentStore(create_engine(url))
    owner = OwnerMap(view).owner("orders").node
    assert store.claim_key(KeyClaim("orders", owner, 1), waited=False)
    report = _status(capsys, config)
    [orders] = [s for s in report["strict"] if s["key"] == "orders"]
    assert orders["claim"]["node"] == owner and orders["claim"]["epoch"] == 1
    assert orders["claim"]["released"] is False
    assert [c["key"] for c in report["claims"]] == ["orders"]
    store.engine.dispose()


def test_status_text(capsys, cluster):
    _, config, _, _ = cluster
    code, out, err = run_cli(capsys, "cluster", "status", "-c", config)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("cluster 'ids': view epoch 1, changed ")
    assert "(web-1, web-2); hash hrw-xxh64-v1; membership sql at " in lines[0]
    assert lines[1].split() == ["NODE", "STATE", "IN", "VIEW", "WEIGHT", "LEASE", "ADVERTISE"]
    assert lines[2].split()[:4] == ["web-1", "alive", "yes", "1"] and "s left" in lines[2]
    assert any(line.split()[:2] == ["orders", "orders"] for line in lines)


def test_status_of_a_member_that_left(capsys, cluster):
    membership, config, _, leases = cluster
    membership.release(leases[1], 0)
    report = _status(capsys, config)
    web2 = report["members"][1]
    assert (web2["node"], web2["state"], web2["lease_left_s"]) == ("web-2", "left", None)


def test_status_before_any_member(capsys, tmp_path, url):
    config = _write_config(tmp_path, url, keys=["orders"], cluster="empty")
    SqlMembership(create_engine(url), MonotonicClock(), create_schema=True).ensure_schema()
    report = _status(capsys, config)
    assert (report["epoch"], report["members"], report["view"]) == (0, [], [])
    assert report["strict"] == [{"generator": "orders", "key": "orders", "owner": None,
                                 "claim": None}]
    code, out, _ = run_cli(capsys, "cluster", "status", "-c", config)
    assert code == 0 and "no members yet" in out


def test_drain_moves_the_nodes_keys(capsys, cluster):
    membership, config, view, _ = cluster
    before = OwnerMap(view)
    mine = [k for k in KEYS if before.owner(k).node == "web-1"]
    assert mine  # the fixture's keys put some on web-1
    code, out, err = run_cli(capsys, "cluster", "drain", "web-1", "-c", config)
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[0] == "drained 'web-1': view epoch 1 -> 2 (web-2)"
    assert sorted(lines[1:-1]) == sorted(f"  {k}: web-1 -> web-2" for k in mine)
    assert lines[-1] == f"  {len(mine)} strict keys moved, {len(KEYS) - len(mine)} kept their owner"
    new = membership.view("ids")
    assert (new.epoch, new.nodes()) == (2, ("web-2",))
    states = {i.node: i.state for i in membership.members("ids")}
    assert states == {"web-1": "draining", "web-2": "alive"}
    report = _status(capsys, config)
    assert {s["owner"] for s in report["strict"]} == {"web-2"}

    # a second drain: nothing moves
    code, out, _ = run_cli(capsys, "cluster", "drain", "web-1", "-c", config)
    assert (code == 0
            and out == "'web-1' is already out of view epoch 2; marked draining, nothing moves\n")
    assert membership.view("ids").epoch == 2

    # --undo puts it back (it is alive): the keys go home
    code, out, err = run_cli(capsys, "cluster", "drain", "web-1", "--undo", "-c", config)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "undrained 'web-1': view epoch 2 -> 3 (web-1, web-2)"
    assert sorted(out.splitlines()[1:-1]) == sorted(f"  {k}: web-2 -> web-1" for k in mine)
    view3 = membership.view("ids")
    assert view3.members == (WEB1, WEB2)
    assert {i.node: i.state for i in membership.members("ids")} == {"web-1": "alive",
                                                                    "web-2": "alive"}
    after = OwnerMap(view3)
    assert all(after.owner(k) == before.owner(k) for k in KEYS)


def test_drain_json(capsys, cluster):
    _, config, view, _ = cluster
    code, out, _ = run_cli(capsys, "cluster", "drain", "web-2", "--json", "-c", config)
    assert code == 0
    result = json.loads(out)
    moved = {k for k in KEYS if OwnerMap(view).owner(k).node == "web-2"}
    assert (result["from_epoch"], result["epoch"], result["view"]) == (1, 2, ["web-1"])
    assert set(result["moved"]) == moved
    assert all(m == {"from": "web-2", "to": "web-1"} for m in result["moved"].values())


def test_undo_of_a_member_that_left(capsys, cluster):
    membership, config, _, leases = cluster
    assert run_cli(capsys, "cluster", "drain", "web-2", "-c", config)[0] == 0
    membership.release(leases[1], 0)
    code, out, _ = run_cli(capsys, "cluster", "drain", "web-2", "--undo", "-c", config)
    assert code == 0
    assert (out == "'web-2' is no longer draining; it is left: it rejoins the view when its node "
                   "is up again\n")
    assert membership.view("ids").nodes() == ("web-1",)


def test_drain_the_last_member_is_refused(capsys, cluster):
    membership, config, _, _ = cluster
    assert run_cli(capsys, "cluster", "drain", "web-2", "-c", config)[0] == 0
    code, out, err = run_cli(capsys, "cluster", "drain", "web-1", "-c", config)
    assert (code, out) == (2, "")
    assert err == ("error: NODE: 'web-1' is the only member of view epoch 2: no node would own "
                   "the strict keys; start another node first\n")
    assert membership.view("ids").nodes() == ("web-1",)
    # nothing half-done: the refused drain put its draining mark back
    assert {m.node: m.state for m in membership.members("ids")}["web-1"] == "alive"


def test_drain_an_unknown_node(capsys, cluster):
    _, config, _, _ = cluster
    err = run_error_line(capsys, "cluster", "drain", "web-3", "-c", config)
    assert err.startswith("error: NODE: unknown member 'web-3'; known: web-1, web-2; did you mean")


def test_no_cluster_section(capsys, tmp_path):
    path = tmp_path / "plain.toml"
    path.write_text('[generators.a]\nstrategy = "segment"\n')
    for args in (["status"], ["drain", "web-1"]):
        code, out, err = run_cli(capsys, "cluster", *args, "-c", str(path))
        assert (code, out) == (2, "")
        assert err == (f"error: cluster: {path} has no [cluster] section; add one (name, "
                       "advertise, membership) or pass the cluster's config with -c\n")


def test_bad_cluster_config_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[cluster]\nname = "ids"\nweight = 0\n')
    code, _, err = run_cli(capsys, "cluster", "status", "-c", str(path))
    assert code == 2 and err.startswith("error: cluster.weight: expected an integer from 1 to 64")


@pytest.mark.postgresql
def test_unreachable_store_is_one_line(capsys, tmp_path):
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    config = _write_config(tmp_path, url, keys=["orders"])
    for args in (["status"], ["drain", "web-1"]):
        err = run_error_line(capsys, "cluster", *args, "-c", config, code=1)
        assert err.startswith("error: "), err
        assert "Traceback" not in err and "127.0.0.1" in err


def test_missing_tables_on_a_server_say_what_to_run(capsys, tmp_path):
    with fresh_server_database("postgresql") as db:
        config = _write_config(tmp_path, db, keys=["orders"])
        err = run_error_line(capsys, "cluster", "status", "-c", config, code=1)
    assert "flakekit db" in err, err


def test_kit_cluster_node_serves_strict_keys_and_status_sees_it(capsys, tmp_path, url):
    """``kit.cluster_node()`` (what the server builds): the strict generators are served
    through it on the owner, refused on the other node; status shows the claim, and
    closing the kit releases it."""
    from flakekit.assembly.config import load_config
    from flakekit.assembly.kit import build_kit
    from flakekit.errors import NotOwnerError
    from flakekit.pluginhost.host import get_host

    SqlMembership(create_engine(url), MonotonicClock(), create_schema=True).ensure_schema()
    config = _write_config(tmp_path, url, keys=["orders"])
    kits = [build_kit(load_config(config), get_host(), node=m.node, advertise=m.advertise)
            for m in (WEB1, WEB2)]
    try:
        kits[0].strict_generators()[0].store.create("orders", 100)
        nodes = [kit.cluster_node() for kit in kits]
        assert (nodes[1].member.node, nodes[1].member.advertise) == (WEB2.node, WEB2.advertise)
        assert kits[0].cluster_node() is nodes[0]  # built once
        nodes[0].start()  # alone: proposes the view of itself and claims the key
        assert kits[0]["orders"].next_id() == 1
        assert list(kits[0]["orders"].next_ids(2)) == [2, 3]
        nodes[1].start()
        nodes[1].upkeep()
        if nodes[1].owner("orders").node == "web-1":
            with pytest.raises(NotOwnerError):
                kits[1]["orders"].next_id()
        # the second node's view may move the key: the claim follows the owner once the
        # hand-off is done (a planned one waits for the old owner's release)
        # (both nodes in the view, and the claim where the owner is: in one report, since
        # the view may still move between two reads)
        report = wait_until(lambda: _settled_report(_status(capsys, config)),
                            timeout=60, interval=0.2)
        [orders] = report["strict"]
        assert orders["claim"]["node"] == orders["owner"]
        assert orders["claim"]["released"] is False
        assert {m["node"] for m in report["members"]} == {"web-1", "web-2"}
    finally:
        for kit in kits:
            kit.close()
    report = _status(capsys, config)
    assert report["strict"][0]["claim"]["released"] is True
    assert {m["state"] for m in report["members"]} == {"left"}


def test_status_of_a_lapsed_member(capsys, cluster):
    membership, config, _, _ = cluster
    web3 = Member("web-3", "http://127.0.0.1:8003")
    membership.acquire(JoinRequest("ids", web3, 1.0))
    deadline = time.monotonic() + 10
    while {i.node: i.state for i in membership.members("ids")}["web-3"] != "lapsed":
        assert time.monotonic() < deadline, "a 1 s lease did not lapse in 10 s"
        time.sleep(0.1)
    report = _status(capsys, config)
    [m3] = [m for m in report["members"] if m["node"] == "web-3"]
    assert (m3["state"], m3["in_view"]) == ("lapsed", False) and m3["lease_left_s"] <= 0
    code, out, _ = run_cli(capsys, "cluster", "status", "-c", config)
    [line] = [line for line in out.splitlines() if line.split()[:1] == ["web-3"]]
    assert line.split()[1:3] == ["lapsed", "no"] and "s ago" in line


class RacyPlugin:
    """The SQL membership, where another proposer moves the view just before this
    process's first compare-and-set (a node proposing at the same moment)."""

    @hookimpl
    def flakekit_register_memberships(self, register):
        class Racy(SqlMembership):
            raced = False

            def propose(self, cluster, seen_epoch, members):
                if not self.raced:
                    self.raced = True
                    assert super().propose(cluster, seen_epoch, [WEB1, WEB2, WEB3]) is not None
                return super().propose(cluster, seen_epoch, members)

        register("racy", lambda settings, ctx: Racy(ctx.backends.engine("default"), ctx.clock))


WEB3 = Member("web-3", "http://127.0.0.1:8003")


def test_drain_retries_when_another_proposer_wins(cluster):
    """The first compare-and-set loses (the view moved to epoch 2 meanwhile): drain re-reads
    the view and proposes epoch 3 without the node, from the view that won."""
    from flakekit.assembly.config import load_config
    from flakekit.assembly.kit import build_kit
    from flakekit.cli.cluster import drain_node

    membership, config, _, _ = cluster
    membership.acquire(JoinRequest("ids", WEB3, 60.0))
    text = Path(config).read_text().replace('name = "ids"\n', 'name = "ids"\nmembership = "racy"\n')
    Path(config).write_text(text)
    host = PluginHost().load(entrypoints=False, extra=[RacyPlugin()])
    kit = build_kit(load_config(config), host, as_member=False)
    try:
        result = drain_node(kit, "web-1")
    finally:
        kit.close()
    assert (result["from_epoch"], result["epoch"], result["view"]) == (2, 3, ["web-2", "web-3"])
    view = membership.view("ids")
    assert (view.epoch, view.nodes()) == (3, ("web-2", "web-3"))


def test_db_init_creates_the_cluster_tables_where_they_are_used(capsys, tmp_path):
    """``db init`` puts the membership tables in the membership's backend and the key-owner
    table beside each strict generator's segments (another backend here)."""
    from sqlalchemy import inspect

    members_db, segments_db = tmp_path / "members.db", tmp_path / "segments.db"
    path = tmp_path / "flakekit.toml"
    path.write_text(
        f'[backends.default]\nurl = "sqlite:///{members_db}"\n'
        f'[backends.seg]\nurl = "sqlite:///{segments_db}"\n\n'
        '[cluster]\nname = "ids"\nadvertise = "http://127.0.0.1:8001"\n\n'
        '[generators.orders]\nstrategy = "segment"\norder = "strict"\n'
        'store = { type = "sql", backend = "seg" }\n')
    code, out, err = run_cli(capsys, "db", "init", "-c", str(path))
    assert (code, err) == (0, ""), err
    for db in (members_db, segments_db):
        tables = set(inspect(create_engine(f"sqlite:///{db}")).get_table_names())
        assert {"flakekit_members", "flakekit_cluster_view", "flakekit_key_owner"} <= tables, (db,
                                                                                               tables)
    assert "leaf_alloc" in set(inspect(create_engine(f"sqlite:///{segments_db}")).get_table_names())
