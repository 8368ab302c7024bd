"""The ``[cluster]`` section and ``order`` of segment generators (issue 12, item 1): every
bad value is refused in one line naming its dotted path and the fix, at build time and
before any connection; defaults; ``$FLAKEKIT_NODE`` / ``$FLAKEKIT_ADVERTISE``."""

from __future__ import annotations

import json
import socket

import pytest

from flakekit.assembly.cluster_spec import ADVERTISE_ENV, NODE_ENV, resolve_cluster
from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.assembly.strict import StrictSegment
from flakekit.errors import ClusterError, ConfigError, ContractError, UnknownNameError
from flakekit.generators.segment import SegmentGenerator
from flakekit.pluginhost.host import PluginHost
from flakekit.pluginhost.markers import hookimpl
from flakekit.testing.cli import run_cli
from flakekit.testing.databases import free_port

ADVERTISE = "http://10.0.0.5:8080"


@pytest.fixture(autouse=True)
def _no_identity_env(monkeypatch):
    monkeypatch.delenv(NODE_ENV, raising=False)
    monkeypatch.delenv(ADVERTISE_ENV, raising=False)


def _config(cluster=None, generators=None, url="sqlite:///ids.db", **extra):
    data = {"backends": {"default": {"url": url}},
            "generators": generators if generators is not None else {
                "orders": {"strategy": "segment", "order": "strict"}}}
    if cluster is not None:
        data["cluster"] = cluster
    return parse_config({**data, **extra})


def _cluster(**keys):
    return {"name": "ids", "advertise": ADVERTISE, **keys}


def _build(host, cluster=None, generators=None, **kw):
    return build_kit(_config(cluster, generators), host, **kw)


# -- defaults ---------------------------------------------------------------------------------
def test_defaults(host):
    kit = _build(host, {"name": "ids", "advertise": ADVERTISE})
    spec = kit.config.cluster
    assert spec.membership.type == "sql"
    assert spec.membership.settings == {"backend": "default"}
    assert (spec.weight, spec.lease_ns, spec.handoff_wait_ns) == (1, 10 * 10**9, 2 * 10**9)
    assert kit.cluster.node == socket.gethostname()
    assert kit.cluster.node_from == "the host name"
    assert kit.cluster.advertise == ADVERTISE
    assert type(kit.membership).__name__ == "SqlMembership"
    [strict] = kit.strict_generators()
    assert (strict.name, strict.key, strict.order) == ("orders", "orders", "strict")
    kit.close()


def test_values_are_read(host):
    kit = _build(host, _cluster(node="web-1", weight=3, lease="30s", handoff_wait="500ms",
                                membership={"backend": "default"}))
    spec = kit.config.cluster
    assert (kit.cluster.node, spec.weight, spec.lease_ns, spec.handoff_wait_ns) == (
        "web-1", 3, 30 * 10**9, 500 * 10**6)
    assert spec.membership.type == "sql"  # type defaults to sql
    kit.close()


def test_cluster_settings_of_the_kit(host):
    """What the server builds its ClusterNode from: seconds, as ClusterSettings takes them."""
    pytest.importorskip("flakekit.cluster.settings")
    kit = _build(host, _cluster(node="web-1", weight=2, lease="6s", handoff_wait="1s"))
    s = kit.cluster_settings()
    assert (s.name, s.node, s.advertise, s.weight, s.lease, s.handoff_wait) == (
        "ids", "web-1", ADVERTISE, 2, 6.0, 1.0)
    # the server's --node / --advertise win over everything
    s = kit.cluster_settings(node="web-9", advertise="http://b.example:8443/")
    assert (s.node, s.advertise) == ("web-9", "http://b.example:8443")
    kit.close()


def test_segment_order_defaults_to_node(host):
    kit = _build(host, generators={"orders": {"strategy": "segment"}})
    assert isinstance(kit.get("orders"), SegmentGenerator)
    assert kit.specs["orders"].settings.order == "node"
    assert kit.config.cluster is None and kit.membership is None and kit.cluster is None
    assert kit.strict_generators() == []
    kit.close()


def test_no_connection_at_build_time(host):
    """Building a cluster config opens no connection: the backend may be down."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    kit = build_kit(_config(_cluster(), url=url), host)
    assert kit.membership is not None and kit.strict_generators()
    kit.close()


# -- the environment --------------------------------------------------------------------------
def test_env_gives_node_and_advertise(host, monkeypatch):
    monkeypatch.setenv(NODE_ENV, "pod-7")
    monkeypatch.setenv(ADVERTISE_ENV, "http://10.1.2.3:9000")
    kit = _build(host, {"name": "ids"})
    assert (kit.cluster.node, kit.cluster.node_from) == ("pod-7", "$FLAKEKIT_NODE")
    assert (kit.cluster.advertise, kit.cluster.advertise_from) == (
        "http://10.1.2.3:9000", "$FLAKEKIT_ADVERTISE")
    kit.close()


def test_env_overrides_the_file(host, monkeypatch):
    """One config file for every node: each node's identity comes from where it runs."""
    monkeypatch.setenv(NODE_ENV, "pod-7")
    monkeypatch.setenv(ADVERTISE_ENV, "http://10.1.2.3:9000")
    kit = _build(host, _cluster(node="web-1"))
    assert (kit.cluster.node, kit.cluster.advertise) == ("pod-7", "http://10.1.2.3:9000")
    kit.close()


def test_explicit_values_override_the_env(monkeypatch):
    monkeypatch.setenv(NODE_ENV, "pod-7")
    spec = _config(_cluster()).cluster
    resolved = resolve_cluster(spec, node="web-2", advertise="http://h:1")
    assert (resolved.node, resolved.node_from, resolved.advertise) == ("web-2", "--node",
                                                                       "http://h:1")
    with pytest.raises(ConfigError, match=r"^--advertise: 'h:1': the scheme must be http"):
        resolve_cluster(spec, advertise="h:1")
    with pytest.raises(ConfigError, match=r"^--node: 'a b' is not a valid node id"):
        resolve_cluster(spec, node="a b")


@pytest.mark.parametrize(("var", "value", "message"), [
    (NODE_ENV, "web/1", r"^FLAKEKIT_NODE: 'web/1' is not a valid node id"),
    (ADVERTISE_ENV, "10.0.0.5:8080", r"^FLAKEKIT_ADVERTISE: .*scheme must be http;"),
    (ADVERTISE_ENV, "http://10.0.0.5", r"^FLAKEKIT_ADVERTISE: .*has no port"),
])
def test_bad_env_value_is_named(host, monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        _build(host, _cluster())


def test_empty_env_counts_as_unset(host, monkeypatch):
    monkeypatch.setenv(NODE_ENV, "")
    kit = _build(host, _cluster(node="web-1"))
    assert kit.cluster.node == "web-1"
    kit.close()


def test_advertise_is_required(host):
    with pytest.raises(ConfigError,
                       match=r"^cluster\.advertise: is required: .*FLAKEKIT_ADVERTISE"):
        _build(host, {"name": "ids"})


def test_operator_tools_need_no_identity(host):
    """``flakekit cluster status`` runs anywhere: no node id or advertise needed."""
    kit = _build(host, {"name": "ids"}, as_member=False)
    assert kit.cluster is None and kit.membership is not None
    with pytest.raises(ConfigError, match=r"^cluster\.advertise: is required"):
        kit.cluster_settings()
    kit.close()


def test_bad_host_name_as_node(host, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "bad host#name")
    with pytest.raises(ConfigError, match=r"^cluster\.node: the host name 'bad host#name' is "
                       r"not a valid node id .*set cluster\.node or \$FLAKEKIT_NODE"):
        _build(host, _cluster())


# -- every bad value of [cluster] -------------------------------------------------------------
BAD = [
    ({"advertise": ADVERTISE}, r"^cluster\.name: is required"),
    (_cluster(name=""), r"^cluster\.name: expected cluster name"),
    (_cluster(name="my cluster"), r"^cluster\.name: 'my cluster' is not a valid cluster name"),
    (_cluster(name="a" * 65), r"^cluster\.name: 'a+' is not a valid cluster name: up to 64"),
    (_cluster(name=7), r"^cluster\.name: expected cluster name such as 'ids', got 7"),
    (_cluster(advertize="x"), r"^cluster\.advertize: unknown key; .*did you mean 'advertise'\?"),
    (_cluster(wieght=2), r"^cluster\.wieght: unknown key; .*did you mean 'weight'\?"),
    (_cluster(node="web#1"), r"^cluster\.node: 'web#1' is not a valid node id"),
    (_cluster(node="a/b"), r"^cluster\.node: 'a/b' is not a valid node id"),
    (_cluster(node="-web"), r"^cluster\.node: '-web' is not a valid node id"),
    (_cluster(node=""), r"^cluster\.node: expected node id such as 'web-1'"),
    (_cluster(node=3), r"^cluster\.node: expected node id"),
    (_cluster(advertise="https://10.0.0.5:8443"),
     r"^cluster\.advertise: 'https://10\.0\.0\.5:8443': https is not supported .*http://"),
    (_cluster(advertise="ftp://10.0.0.5:21"), r"^cluster\.advertise: .*scheme must be http;"),
    (_cluster(advertise="10.0.0.5:8080"), r"^cluster\.advertise: .*scheme must be http;"),
    (_cluster(advertise="http://10.0.0.5"), r"^cluster\.advertise: .*has no port"),
    (_cluster(advertise="http://10.0.0.5:0"), r"^cluster\.advertise: .*has no port"),
    (_cluster(advertise="http://10.0.0.5:99999"), r"^cluster\.advertise: .*is not a URL"),
    (_cluster(advertise="http://:8080"), r"^cluster\.advertise: .*has no host"),
    (_cluster(advertise="http://u:pw@h:8080"), r"^cluster\.advertise: .*carries credentials"),
    (_cluster(advertise="http://h:8080/ids"), r"^cluster\.advertise: .*has a path"),
    (_cluster(advertise="http://h:8080?x=1"), r"^cluster\.advertise: .*has a path, query"),
    (_cluster(advertise=8080), r"^cluster\.advertise: expected a URL such as"),
    (_cluster(weight=0), r"^cluster\.weight: expected an integer from 1 to 64 .*got 0"),
    (_cluster(weight=65), r"^cluster\.weight: expected an integer from 1 to 64 .*got 65"),
    (_cluster(weight=True), r"^cluster\.weight: expected an integer from 1 to 64 .*got True"),
    (_cluster(weight="2"), r"^cluster\.weight: expected an integer .*got '2'"),
    (_cluster(weight=1.5), r"^cluster\.weight: expected an integer .*got 1\.5"),
    (_cluster(lease="500ms"), r"^cluster\.lease: must be at least 1s .*got 500ms"),
    (_cluster(lease="lots"), r"^cluster\.lease: expected a duration"),
    (_cluster(lease=-1), r"^cluster\.lease: a duration cannot be negative"),
    (_cluster(handoff_wait="2min"), r"^cluster\.handoff_wait: must be at most 60s .*got 120s"),
    (_cluster(handoff_wait="soon"), r"^cluster\.handoff_wait: expected a duration"),
    (_cluster(membership=3), r"^cluster\.membership: expected a name or a table with a type"),
]


@pytest.mark.parametrize(("cluster", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_cluster_value(cluster, message):
    """Refused when the file is parsed (so by ``flakekit config check`` too)."""
    with pytest.raises(ConfigError, match=message) as info:
        _config(cluster)
    assert "\n" not in str(info.value)


BAD_AT_BUILD = [
    (_cluster(membership={"type": "sqll"}),
     r"^cluster\.membership\.type: unknown membership 'sqll'; known: .*sql.*did you mean 'sql'\?"),
    (_cluster(membership="zookeper"), r"^cluster\.membership: unknown membership 'zookeper'"),
    (_cluster(membership={"backnd": "default"}),
     r"^cluster\.membership\.backnd: unknown key; .*did you mean 'backend'\?"),
    (_cluster(membership={"backend": "main"}),
     r"^cluster\.membership\.backend: unknown backend 'main'; known: default"),
    (_cluster(membership={"backend": 1}), r"^cluster\.membership\.backend: expected a string"),
    (_cluster(membership={"create_schema": "yes"}),
     r"^cluster\.membership\.create_schema: expected true or false"),
]


@pytest.mark.parametrize(("cluster", "message"), BAD_AT_BUILD, ids=[m for _, m in BAD_AT_BUILD])
def test_bad_membership_at_build(host, cluster, message):
    with pytest.raises(ConfigError, match=message):
        _build(host, cluster)


def test_cluster_not_a_table():
    with pytest.raises(ConfigError, match=r"^cluster: expected a table, got str"):
        _config("ids")


def test_misspelt_section():
    with pytest.raises(ConfigError, match=r"^clustr: unknown key; .*did you mean 'cluster'\?"):
        parse_config({"clustr": {"name": "ids"}})


def test_env_interpolation_in_cluster(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.9.8.7")
    spec = _config(_cluster(advertise="http://${POD_IP}:8080")).cluster
    assert spec.advertise == "http://10.9.8.7:8080"


# -- order ------------------------------------------------------------------------------------
def test_strict_without_cluster_names_order_and_the_fix(host):
    with pytest.raises(ConfigError) as info:
        _build(host, None)
    assert str(info.value) == (
        'generators.orders.order: "strict" needs a [cluster] section (name, advertise, '
        'membership) so that one node owns the key; add [cluster], or set order = "node"')


@pytest.mark.parametrize("value", ["strictly", "", 1, True])
def test_bad_order(host, value):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.order: ") as info:
        _build(host, _cluster(), {"orders": {"strategy": "segment", "order": value}})
    assert "'node', 'strict'" in str(info.value) or "expected a string" in str(info.value)


def test_misspelt_order_key(host):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.ordr: unknown key; .*did you "
                       r"mean 'order'\?"):
        _build(host, _cluster(), {"orders": {"strategy": "segment", "ordr": "strict"}})


def test_strict_with_all_keys_is_refused(host):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.store\.keys: order = \"strict\" "
                       r"serves one key per generator"):
        _build(host, _cluster(), {"orders": {"strategy": "segment", "order": "strict",
                                             "store": {"type": "sql", "keys": "all"}}})


def test_order_on_snowflake_is_unknown(host):
    with pytest.raises(ConfigError, match=r"^generators\.ids\.order: unknown key"):
        _build(host, _cluster(), {"ids": {"allocator": {"type": "static", "worker_id": 1},
                                          "order": "strict"}})


class PlainStorePlugin:
    """A segment store that does not fence keys (no claim_key...)."""

    @hookimpl
    def flakekit_register_segment_stores(self, register):
        class Plain:
            def fetch(self, key, step=None):
                raise AssertionError("not fetched at build time")

            def give_back(self, key, expected_max_id, new_max_id):
                return False

        register("plain", lambda settings, ctx: Plain())


def test_strict_needs_a_fencing_store():
    host = PluginHost().load(entrypoints=False, extra=[PlainStorePlugin()])
    with pytest.raises(ContractError, match=r"generators\.orders\.store: .*'plain'.*is not a "
                       r"KeyFence: it lacks claim_key\(\)"):
        _build(host, _cluster(), {"orders": {"strategy": "segment", "order": "strict",
                                             "store": "plain"}})
    # the same store serves order = "node"
    kit = _build(host, _cluster(), {"orders": {"strategy": "segment", "store": "plain"}})
    assert isinstance(kit.get("orders"), SegmentGenerator)
    kit.close()


def test_strict_generator_refuses_outside_a_cluster_node(host):
    """A strict key is never served by a process that is not its owner's node."""
    kit = _build(host, _cluster(node="web-1"))
    gen = kit["orders"]
    assert isinstance(gen, StrictSegment)
    with pytest.raises(ClusterError, match=r"^generators\.orders: order = \"strict\": key "
                       r"'orders' is served only by its owner"):
        gen.next_id()
    with pytest.raises(ClusterError):
        gen.next_ids(3)
    kit.close()


def test_kit_describes_the_strict_generator(host):
    kit = _build(host, _cluster())
    info = kit.describe("orders")
    assert (info.strategy, info.key, info.store) == ("segment", "orders", "sql")
    kit.close()


def test_cluster_settings_without_a_section(host):
    kit = _build(host, None, {"orders": {"strategy": "segment"}})
    with pytest.raises(ConfigError, match=r"^cluster: the config has no \[cluster\] section"):
        kit.cluster_settings()
    kit.close()


def test_unknown_generator_name_still_suggests(host):
    kit = _build(host, _cluster())
    with pytest.raises(UnknownNameError):
        kit.get("order")
    kit.close()


def test_plugins_lists_the_membership(capsys):
    code, out, _ = run_cli(capsys, "plugins", "--json")
    assert code == 0
    [builtin] = [p for p in json.loads(out) if p["name"] == "flakekit.builtin.cluster"]
    assert builtin["registers"] == ["membership:sql"]
    assert builtin["hooks"] == ["flakekit_register_memberships"]


def test_membership_kind_in_the_host(host):
    reg = host.memberships.get("sql")
    assert (reg.kind, reg.plugin) == ("membership", "flakekit.builtin.cluster")
    with pytest.raises(UnknownNameError,
                       match=r"unknown membership 'etcd'; it comes with the plugin flakekit-etcd: "
                             r"pip install .*; known: sql"):
        host.memberships.get("etcd", "cluster.membership")


# -- flakekit config check ---------------------------------------------------------------------
CONFIG = """\
[backends.default]
url = "sqlite:///ids.db"

[cluster]
name = "ids"
weight = 2
lease = "6s"

[generators.orders]
strategy = "segment"
order = "strict"

[generators.audit]
strategy = "segment"
"""


def test_config_check_prints_the_cluster(tmp_path, capsys, monkeypatch):
    path = tmp_path / "flakekit.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv(NODE_ENV, "web-1")
    monkeypatch.setenv(ADVERTISE_ENV, "http://10.0.0.5:8080")
    code, out, err = run_cli(capsys, "config", "check", str(path))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].endswith(": ok (2 generators: orders, audit; 0 layouts)")
    assert lines[1] == (
        "cluster 'ids': node 'web-1' ($FLAKEKIT_NODE), advertise http://10.0.0.5:8080 "
        "($FLAKEKIT_ADVERTISE), weight 2, membership sql (backend default), lease 6s, "
        "handoff_wait 2s; strict keys: orders")
    assert not (tmp_path / "ids.db").exists()  # no connection was opened


def test_config_check_refuses_a_bad_cluster(tmp_path, capsys):
    path = tmp_path / "flakekit.toml"
    path.write_text(CONFIG.replace('weight = 2', 'weight = 2\nadvertise = "http://h"'))
    code, out, err = run_cli(capsys, "config", "check", str(path))
    assert code == 2 and out == ""
    assert err == ("error: cluster.advertise: 'http://h' has no port (peers must not guess "
                   "it); expected http://HOST:PORT such as 'http://10.0.0.5:8080'\n")


def test_config_check_refuses_an_https_advertise(tmp_path, capsys):
    """Nodes forward over plain HTTP: an https advertise is refused before any start
    (it used to pass and then fail every forwarded request)."""
    path = tmp_path / "flakekit.toml"
    path.write_text(CONFIG.replace('weight = 2', 'weight = 2\nadvertise = "https://h:8443"'))
    code, out, err = run_cli(capsys, "config", "check", str(path))
    assert code == 2 and out == ""
    assert err.startswith("error: cluster.advertise: 'https://h:8443': https is not supported")
    assert err.count("\n") == 1


def test_config_check_without_advertise(tmp_path, capsys):
    path = tmp_path / "flakekit.toml"
    path.write_text(CONFIG)
    code, out, err = run_cli(capsys, "config", "check", str(path))  # a shared config (issue 22)
    assert code == 0 and "a shared config: no advertise here" in out, err
