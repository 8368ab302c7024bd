"""Commands that need no database start without importing one (issue 15, item 2).

Structural, never timed: each command runs in a fresh interpreter, which then lists
``sys.modules``. ``--help``, ``decode`` and ``layout ...`` must not import SQLAlchemy or a
driver, ZooKeeper's or etcd's client, the HTTP server's implementation, the generators,
the config parser or the contracts (each an import chain of tens of milliseconds), nor
importlib.metadata (the entry points are read by :mod:`flakekit.pluginhost.entrypoints`).
``benchmarks/bench_startup.py`` measures what this buys.

Issue 24 narrowed it: no :mod:`difflib`; a built-in command imports no plugin's CLI
module, and the plugin host imports only the built-ins whose registrations a command asks
for (``decode`` and ``layout``: the layouts, no allocator, store, strategy or membership
settings classes, and no :mod:`logging`: the CLI routes it when something imports it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from flakekit.pluginhost.entrypoints import EntryPoint, read_entry_points

#: modules (and their submodules) a fast command must not import
FORBIDDEN = (
    "sqlalchemy", "psycopg", "pymysql", "MySQLdb", "kazoo", "etcd3", "grpc",
    "flakekit_server.app", "flakekit_server.http", "flakekit_server.runner",
    "flakekit_server.metrics", "flakekit.values.stats", "flakekit.values.formats",
    "flakekit_zookeeper.lease", "flakekit_zookeeper.leaf", "flakekit_zookeeper.client",
    "etcd3gw", "flakekit_etcd.store", "flakekit_etcd.lease",
    "redis", "flakekit_redis.guard", "flakekit_redis.kvstore", "flakekit_redis.segments",
    "flakekit.sql.backends", "flakekit.sql.leaf", "flakekit.sql.workers", "flakekit.sql.schema",
    "flakekit.generators.segment", "flakekit.generators.snowflake",
    "flakekit.generators.segment_service", "flakekit.leases.keeper", "flakekit.leases.kv",
    "flakekit.pluginhost.contracts", "flakekit.assembly.config", "flakekit.assembly.kit",
    "flakekit.assembly.context", "flakekit.cluster.node", "tomllib", "importlib.metadata",
    "difflib",
)

#: not for a built-in command that needs only layouts (decode, layout ...)
NOT_FOR_LAYOUTS = (
    "flakekit.builtin.clocks", "flakekit.builtin.static", "flakekit.builtin.sql",
    "flakekit.builtin.http_lease", "flakekit.builtin.segments", "flakekit.builtin.strategies",
    "flakekit.builtin.cluster", "flakekit.generators.segment_settings", "flakekit.leases.lease",
    "flakekit.values.clock", "flakekit.sql.settings", "flakekit_server.cli", "flakekit_redis.cli",
    "logging",  # --help may import it: the server plugin's command module does
)

FAST_COMMANDS = [
    ["--help"],
    ["decode", "1234567890123456789"],
    ["decode", "--layout", "sonyflake", "1234567890123456789"],
    ["layout", "list"],
    ["layout", "show", "snowflake"],
    ["layout", "compose", "snowflake", "time=5", "worker=3", "sequence=1"],
    ["layout", "decompose", "snowflake", "1234567890123456789"],
]

#: run one command in this fresh interpreter, then report its exit status and modules
CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from flakekit.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(sys.argv[1:])
        except SystemExit as exc:
            code = exc.code
    print(json.dumps({"code": code, "stdout": out.getvalue(), "modules": sorted(sys.modules)}))
""")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("FLAKEKIT_CONFIG", "FLAKEKIT_LOAD_PLUGINS", "FLAKEKIT_DISABLE_PLUGINS")}


def run_child(args: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True,
                          text=True, timeout=120, env=_env(), cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _offending(modules: list[str], forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden)]


@pytest.mark.parametrize("args", FAST_COMMANDS, ids=[" ".join(a) for a in FAST_COMMANDS])
def test_fast_command_imports_no_database_server_or_metadata(args, tmp_path):
    """Each fast command succeeds and none of FORBIDDEN is in ``sys.modules`` after it."""
    result = run_child(args, tmp_path)
    assert result["code"] == 0, result["stdout"]
    assert _offending(result["modules"]) == []


@pytest.mark.parametrize("args", [a for a in FAST_COMMANDS if a[0] != "--help"],
                         ids=[" ".join(a) for a in FAST_COMMANDS if a[0] != "--help"])
def test_layout_commands_import_only_the_layouts(args, tmp_path):
    """``decode`` and ``layout ...`` load the layouts' built-in and no other, and no
    plugin's commands: no settings class of an allocator, store or strategy is built."""
    result = run_child(args, tmp_path)
    assert result["code"] == 0, result["stdout"]
    assert "flakekit.builtin.layouts" in result["modules"]
    assert _offending(result["modules"], NOT_FOR_LAYOUTS) == []


def test_builtin_hooks_table_matches_the_builtins():
    """:data:`BUILTIN_HOOKS` (what the host imports a built-in for) names exactly the
    hooks each built-in implements, and every built-in."""
    import importlib

    from flakekit.pluginhost.host import BUILTIN_HOOKS, BUILTIN_PLUGINS

    assert sorted(BUILTIN_HOOKS) == sorted(BUILTIN_PLUGINS)
    for module, hooks in BUILTIN_HOOKS.items():
        mod = importlib.import_module(module)
        found = {name for name in dir(mod) if name.startswith("flakekit_")
                 and hasattr(getattr(mod, name), "flakekit_impl")}
        assert found == set(hooks), module


def test_lazy_builtins_register_the_same_as_eager(tmp_path):
    """Whatever is asked first, the full host has every built-in's registrations."""
    from flakekit.pluginhost.host import PluginHost

    lazy = PluginHost().load(entrypoints=False)
    assert "snowflake" in lazy.layouts and "static" not in lazy._registries["allocator"]
    eager = PluginHost().load(entrypoints=False)
    eager.pm  # noqa: B018  (every built-in)
    for kind, registry in eager._registries.items():
        assert registry.names() == lazy.registries[kind].names(), kind


LOG_CHILD = textwrap.dedent("""
    import sys, warnings
    from flakekit.cli.main import _LogRouting
    assert "logging" not in sys.modules
    routing = _LogRouting()
    warnings.warn("hidden warning before logging")  # imports logging, routed
    import logging
    logging.getLogger("flakekit.x").warning("hidden record")
    routing.restore()
    logging.getLogger("flakekit.x").warning("shown record")
    routing = _LogRouting()
    routing.verbose(1)
    logging.getLogger("flakekit.x").info("shown with -v")
    routing.restore()
""")


def test_log_routing_set_up_when_logging_is_imported_late():
    """The CLI does not import logging, yet a record or a warning during a command stays
    off stderr (routed as soon as something imports logging), and -v still shows them."""
    proc = subprocess.run([sys.executable, "-c", LOG_CHILD], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "hidden" not in proc.stderr
    assert "shown record" in proc.stderr and "shown with -v" in proc.stderr


def test_help_still_lists_plugin_and_builtin_commands(tmp_path):
    """Lazy loading keeps every command in --help: the built-ins, the ones built-in
    plugins register (db, segments) and an installed plugin's (serve)."""
    result = run_child(["--help"], tmp_path)
    listed = {line.split()[0] for line in result["stdout"].split("Commands:")[1].splitlines()
              if line.startswith("  ") and line.strip()}
    expected = {"decode", "next", "layout", "plugins", "workers", "db", "segments"}
    if any(ep.name == "server" for ep in read_entry_points("flakekit")):
        expected.add("serve")
    assert expected <= listed


def test_a_slow_command_still_gets_what_it_needs(tmp_path):
    """The lazy imports are not lost: ``config check`` parses and builds a config."""
    config = tmp_path / "flakekit.toml"
    config.write_text('[generators.g]\nallocator = { type = "static", worker_id = 1 }\n',
                      encoding="utf-8")
    result = run_child(["config", "check", str(config)], tmp_path)
    assert result["code"] == 0, result["stdout"]
    assert "flakekit.assembly.config" in result["modules"]


class TestEntryPoints:
    """The fast reader finds what importlib.metadata finds, in the same order."""

    @pytest.mark.parametrize("group", ["flakekit", "pytest11", "console_scripts"])
    def test_same_as_importlib_metadata(self, group):
        mine = [(e.name, e.value, e.dist, e.version) for e in read_entry_points(group)]
        ref = [(e.name, e.value, e.dist.name if e.dist else None,
                e.dist.version if e.dist else None)
               for e in metadata.entry_points(group=group)]
        assert mine == ref

    def test_first_distribution_of_a_name_wins_and_metadata_names_it(self, tmp_path):
        """Two copies of one distribution on the path: the first one's entry points, with
        the Name and Version of its METADATA (not of the directory name)."""
        for where, version in (("a", "1.0"), ("b", "2.0")):
            info = tmp_path / where / f"flakekit_demo-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: flakekit-demo\nVersion: {version}\n\nbody\n",
                encoding="utf-8")
            (info / "entry_points.txt").write_text(
                f"# comment\n[console_scripts]\nx = y\n\n[flakekit]\ndemo = demo_{where}:plugin\n",
                encoding="utf-8")
        found = read_entry_points("flakekit", [str(tmp_path / "a"), str(tmp_path / "b")])
        assert [(e.name, e.value, e.dist, e.version) for e in found] == [
            ("demo", "demo_a:plugin", "flakekit-demo", "1.0")]

    def test_a_zip_on_the_path_falls_back_to_importlib_metadata(self, tmp_path):
        """A zip archive may hold distributions the directory scan cannot see."""
        archive = tmp_path / "dists.zip"
        archive.write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip file
        found = read_entry_points("flakekit", [str(archive)])
        assert found == []  # importlib.metadata's answer for this path (it has none)

    def test_load_walks_to_the_attribute(self):
        ep = EntryPoint("x", "flakekit.pluginhost.entrypoints:EntryPoint.load", "g", None, None)
        assert ep.load() is EntryPoint.load
        assert EntryPoint("x", "json", "g", None, None).load() is json


def test_the_console_script_pauses_the_collector_only_while_it_starts():
    """The console script (``main()`` without arguments) starts with the cyclic collector
    off; a process it forks has it on at once, the command itself once it outlives the
    pause. An in-process caller (``main(argv)``) keeps its collector as it is."""
    script = textwrap.dedent("""
        import gc, os, time
        from flakekit.cli import main as cli_main
        from flakekit.cli.main import COLLECTOR_PAUSE_S, _pause_collector

        try:
            cli_main(["--version"])
        except SystemExit:
            pass
        assert gc.isenabled()
        _pause_collector()
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        deadline = time.monotonic() + COLLECTOR_PAUSE_S + 60
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gc.isenabled()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
