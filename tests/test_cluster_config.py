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
from flakekit.testing.cli import run_cli, run_error_line, write_toml
from flakekit.testing.configs import ADVERTISE, cluster_table, strict_config
from flakekit.testing.databases import free_port
from flakekit.testing.pytest_plugin import cleaned_up

pytestmark = pytest.mark.usefixtures("no_node_identity")


@pytest.fixture
def build(host):
    """``build(cluster=None, generators=None, **kw)``: a kit of ``strict_config(cluster,
    generators)``, closed after the test."""
    def build(cluster=None, generators=None, **kw):
        return build_kit(strict_config(cluster, generators), host, **kw)

    with cleaned_up(build, lambda kit: kit.close()) as made:
        yield made


# -- defaults ---------------------------------------------------------------------------------
def test_defaults(build, host):
    kit = build({"name": "ids", "advertise": ADVERTISE})
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


def test_values_are_read(build):
    kit = build(cluster_table(node="web-1", weight=3, lease="30s", handoff_wait="500ms",
                                membership={"backend": "default"}))
    spec = kit.config.cluster
    assert (kit.cluster.node, spec.weight, spec.lease_ns, spec.handoff_wait_ns) == (
        "web-1", 3, 30 * 10**9, 500 * 10**6)
    assert spec.membership.type == "sql"  # type defaults to sql


def test_cluster_settings_of_the_kit(build):
    """What the server builds its ClusterNode from: seconds, as ClusterSettings takes them."""
    pytest.importorskip("flakekit.cluster.settings")
    kit = build(cluster_table(node="web-1", weight=2, lease="6s", handoff_wait="1s"))
    s = kit.cluster_settings()
    assert (s.name, s.node, s.advertise, s.weight, s.lease, s.handoff_wait) == (
        "ids", "web-1", ADVERTISE, 2, 6.0, 1.0)
    # the server's --node / --advertise win over everything
    s = kit.cluster_settings(node="web-9", advertise="http://b.example:8443/")
    assert (s.node, s.advertise) == ("web-9", "http://b.example:8443")


def test_segment_order_defaults_to_node(build):
    kit = build(generators={"orders": {"strategy": "segment"}})
    assert isinstance(kit.get("orders"), SegmentGenerator)
    assert kit.specs["orders"].settings.order == "node"
    assert kit.config.cluster is None and kit.membership is None and kit.cluster is None
    assert kit.strict_generators() == []


def test_no_connection_at_build_time(host):
    """Building a cluster config opens no connection: the backend may be down."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    kit = build_kit(strict_config(cluster_table(), url=url), host)
    assert kit.membership is not None and kit.strict_generators()
    kit.close()


# -- the environment --------------------------------------------------------------------------
def test_env_gives_node_and_advertise(build, monkeypatch):
    monkeypatch.setenv(NODE_ENV, "pod-7")
    monkeypatch.setenv(ADVERTISE_ENV, "http://10.1.2.3:9000")
    kit = build({"name": "ids"})
    assert (kit.cluster.node, kit.cluster.node_from) == ("pod-7", "$FLAKEKIT_NODE")
    assert (kit.cluster.advertise, kit.cluster.advertise_from) == (
        "http://10.1.2.3:9000", "$FLAKEKIT_ADVERTISE")


def test_env_overrides_the_file(build, monkeypatch):
    """One config file for every node: each node's identity comes from where it runs."""
    monkeypatch.setenv(NODE_ENV, "pod-7")
    monkeypatch.setenv(ADVERTISE_ENV, "http://10.1.2.3:9000")
    kit = build(cluster_table(node="web-1"))
    assert (kit.cluster.node, kit.cluster.advertise) == ("pod-7", "http://10.1.2.3:9000")


def test_explicit_values_override_the_env(monkeypatch):
    monkeypatch.setenv(NODE_ENV, "pod-7")
    spec = strict_config(cluster_table()).cluster
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
def test_bad_env_value_is_named(build, monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        build(cluster_table())


def test_empty_env_counts_as_unset(build, monkeypatch):
    monkeypatch.setenv(NODE_ENV, "")
    kit = build(cluster_table(node="web-1"))
    assert kit.cluster.node == "web-1"


def test_advertise_is_required(build):
    with pytest.raises(ConfigError,
                       match=r"^cluster\.advertise: is required: .*FLAKEKIT_ADVERTISE"):
        build({"name": "ids"})


def test_operator_tools_need_no_identity(build):
    """``flakekit cluster status`` runs anywhere: no node id or advertise needed."""
    kit = build({"name": "ids"}, as_member=False)
    assert kit.cluster is None and kit.membership is not None
    with pytest.raises(ConfigError, match=r"^cluster\.advertise: is required"):
        kit.cluster_settings()


def test_bad_host_name_as_node(build, host, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "bad host#name")
    with pytest.raises(ConfigError, match=r"^cluster\.node: the host name 'bad host#name' is "
                       r"not a valid node id .*set cluster\.node or \$FLAKEKIT_NODE"):
        build(cluster_table())


# -- every bad value of [cluster] -------------------------------------------------------------
BAD = [
    ({"advertise": ADVERTISE}, r"^cluster\.name: is required"),
    (cluster_table(name=""), r"^cluster\.name: expected cluster name"),
    (cluster_table(name="my cluster"), r"^cluster\.name: 'my cluster' is not a valid cluster name"),
    (cluster_table(name="a" * 65), r"^cluster\.name: 'a+' is not a valid cluster name: up to 64"),
    (cluster_table(name=7), r"^cluster\.name: expected cluster name such as 'ids', got 7"),
    (cluster_table(advertize="x"),
     r"^cluster\.advertize: unknown key; .*did you mean 'advertise'\?"),
    (cluster_table(wieght=2), r"^cluster\.wieght: unknown key; .*did you mean 'weight'\?"),
    (cluster_table(node="web#1"), r"^cluster\.node: 'web#1' is not a valid node id"),
    (cluster_table(node="a/b"), r"^cluster\.node: 'a/b' is not a valid node id"),
    (cluster_table(node="-web"), r"^cluster\.node: '-web' is not a valid node id"),
    (cluster_table(node=""), r"^cluster\.node: expected node id such as 'web-1'"),
    (cluster_table(node=3), r"^cluster\.node: expected node id"),
    (cluster_table(advertise="https://10.0.0.5:8443"),
     r"^cluster\.advertise: 'https://10\.0\.0\.5:8443': https is not supported .*http://"),
    (cluster_table(advertise="ftp://10.0.0.5:21"), r"^cluster\.advertise: .*scheme must be http;"),
    (cluster_table(advertise="10.0.0.5:8080"), r"^cluster\.advertise: .*scheme must be http;"),
    (cluster_table(advertise="http://10.0.0.5"), r"^cluster\.advertise: .*has no port"),
    (cluster_table(advertise="http://10.0.0.5:0"), r"^cluster\.advertise: .*has no port"),
    (cluster_table(advertise="http://10.0.0.5:99999"), r"^cluster\.advertise: .*is not a URL"),
    (cluster_table(advertise="http://:8080"), r"^cluster\.advertise: .*has no host"),
    (cluster_table(advertise="http://u:pw@h:8080"), r"^cluster\.advertise: .*carries credentials"),
    (cluster_table(advertise="http://h:8080/ids"), r"^cluster\.advertise: .*has a path"),
    (cluster_table(advertise="http://h:8080?x=1"), r"^cluster\.advertise: .*has a path, query"),
    (cluster_table(advertise=8080), r"^cluster\.advertise: expected a URL such as"),
    (cluster_table(weight=0), r"^cluster\.weight: expected an integer from 1 to 64 .*got 0"),
    (cluster_table(weight=65), r"^cluster\.weight: expected an integer from 1 to 64 .*got 65"),
    (cluster_table(weight=True), r"^cluster\.weight: expected an integer from 1 to 64 .*got True"),
    (cluster_table(weight="2"), r"^cluster\.weight: expected an integer .*got '2'"),
    (cluster_table(weight=1.5), r"^cluster\.weight: expected an integer .*got 1\.5"),
    (cluster_table(lease="500ms"), r"^cluster\.lease: must be at least 1s .*got 500ms"),
    (cluster_table(lease="lots"), r"^cluster\.lease: expected a duration"),
    (cluster_table(lease=-1), r"^cluster\.lease: a duration cannot be negative"),
    (cluster_table(handoff_wait="2min"), r"^cluster\.handoff_wait: must be at most 60s .*got 120s"),
    (cluster_table(handoff_wait="soon"), r"^cluster\.handoff_wait: expected a duration"),
    (cluster_table(membership=3), r"^cluster\.membership: expected a name or a table with a type"),
]


@pytest.mark.parametrize(("cluster", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_cluster_value(cluster, message):
    """Refused when the file is parsed (so by ``flakekit config check`` too)."""
    with pytest.raises(ConfigError, match=message) as info:
        strict_config(cluster)
    assert "\n" not in str(info.value)


BAD_AT_BUILD = [
    (cluster_table(membership={"type": "sqll"}),
     r"^cluster\.membership\.type: unknown membership 'sqll'; known: .*sql.*did you mean 'sql'\?"),
    (cluster_table(membership="zookeper"), r"^cluster\.membership: unknown membership 'zookeper'"),
    (cluster_table(membership={"backnd": "default"}),
     r"^cluster\.membership\.backnd: unknown key; .*did you mean 'backend'\?"),
    (cluster_table(membership={"backend": "main"}),
     r"^cluster\.membership\.backend: unknown backend 'main'; known: default"),
    (cluster_table(membership={"backend": 1}), r"^cluster\.membership\.backend: expected a string"),
    (cluster_table(membership={"create_schema": "yes"}),
     r"^cluster\.membership\.create_schema: expected true or false"),
]


@pytest.mark.parametrize(("cluster", "message"), BAD_AT_BUILD, ids=[m for _, m in BAD_AT_BUILD])
def test_bad_membership_at_build(build, cluster, message):
    with pytest.raises(ConfigError, match=message):
        build(cluster)


def test_cluster_not_a_table():
    with pytest.raises(ConfigError, match=r"^cluster: expected a table, got str"):
        strict_config("ids")


def test_misspelt_section():
    with pytest.raises(ConfigError, match=r"^clustr: unknown key; .*did you mean 'cluster'\?"):
        parse_config({"clustr": {"name": "ids"}})


def test_env_interpolation_in_cluster(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.9.8.7")
    spec = strict_config(cluster_table(advertise="http://${POD_IP}:8080")).cluster
    assert spec.advertise == "http://10.9.8.7:8080"


# -- order ------------------------------------------------------------------------------------
def test_strict_without_cluster_names_order_and_the_fix(build):
    with pytest.raises(ConfigError) as info:
        build(None)
    assert str(info.value) == (
        'generators.orders.order: "strict" needs a [cluster] section (name, advertise, '
        'membership) so that one node owns the key; add [cluster], or set order = "node"')


@pytest.mark.parametrize("value", ["strictly", "", 1, True])
def test_bad_order(build, value):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.order: ") as info:
        build(cluster_table(), {"orders": {"strategy": "segment", "order": value}})
    assert "'node', 'strict'" in str(info.value) or "expected a string" in str(info.value)


def test_misspelt_order_key(build):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.ordr: unknown key; .*did you "
                       r"mean 'order'\?"):
        build(cluster_table(), {"orders": {"strategy": "segment", "ordr": "strict"}})


def test_strict_with_all_keys_is_refused(build):
    with pytest.raises(ConfigError, match=r"^generators\.orders\.store\.keys: order = \"strict\" "
                       r"serves one key per generator"):
        build(cluster_table(), {"orders": {"strategy": "segment", "order": "strict",
                                             "store": {"type": "sql", "keys": "all"}}})


def test_order_on_snowflake_is_unknown(build):
    with pytest.raises(ConfigError, match=r"^generators\.ids\.order: unknown key"):
        build(cluster_table(), {"ids": {"allocator": {"type": "static", "worker_id": 1},
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
        build_kit(strict_config(cluster_table(), {"orders": {
            "strategy": "segment", "order": "strict", "store": "plain"}}), host)
    # the same store serves order = "node"
    kit = build_kit(strict_config(cluster_table(), {"orders": {"strategy": "segment",
                                                               "store": "plain"}}), host)
    assert isinstance(kit.get("orders"), SegmentGenerator)
    kit.close()


def test_strict_generator_refuses_outside_a_cluster_node(build):
    """A strict key is never served by a process that is not its owner's node."""
    kit = build(cluster_table(node="web-1"))
    gen = kit["orders"]
    assert isinstance(gen, StrictSegment)
    with pytest.raises(ClusterError, match=r"^generators\.orders: order = \"strict\": key "
                       r"'orders' is served only by its owner"):
        gen.next_id()
    with pytest.raises(ClusterError):
        gen.next_ids(3)


def test_kit_describes_the_strict_generator(build):
    kit = build(cluster_table())
    info = kit.describe("orders")
    assert (info.strategy, info.key, info.store) == ("segment", "orders", "sql")


def test_cluster_settings_without_a_section(build):
    kit = build(None, {"orders": {"strategy": "segment"}})
    with pytest.raises(ConfigError, match=r"^cluster: the config has no \[cluster\] section"):
        kit.cluster_settings()


def test_unknown_generator_name_still_suggests(build):
    kit = build(cluster_table())
    with pytest.raises(UnknownNameError):
        kit.get("order")


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
    path = write_toml(tmp_path, CONFIG)
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
    path = write_toml(tmp_path, CONFIG.replace('weight = 2', 'weight = 2\nadvertise = "http://h"'))
    code, out, err = run_cli(capsys, "config", "check", str(path))
    assert code == 2 and out == ""
    assert err == ("error: cluster.advertise: 'http://h' has no port (peers must not guess "
                   "it); expected http://HOST:PORT such as 'http://10.0.0.5:8080'\n")


def test_config_check_refuses_an_https_advertise(tmp_path, capsys):
    """Nodes forward over plain HTTP: an https advertise is refused before any start
    (it used to pass and then fail every forwarded request)."""
    path = write_toml(tmp_path, CONFIG.replace('weight = 2',
                                               'weight = 2\nadvertise = "https://h:8443"'))
    err = run_error_line(capsys, "config", "check", str(path))
    assert err.startswith("error: cluster.advertise: 'https://h:8443': https is not supported")


def test_config_check_without_advertise(tmp_path, capsys):
    path = write_toml(tmp_path, CONFIG)
    code, out, err = run_cli(capsys, "config", "check", str(path))  # a shared config (issue 22)
    assert code == 0 and "a shared config: no advertise here" in out, err
