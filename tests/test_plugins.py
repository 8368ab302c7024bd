"""Plugins: the example distribution through the console script, and PluginHost rules."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import types
from pathlib import Path

import click
import pluggy
import pytest
from click.testing import CliRunner

from flakekit import hookimpl
from flakekit.builtin.layouts import SNOWFLAKE
from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.errors import (
    ClockMovedBackwardsError,
    DuplicateRegistrationError,
    LeaseLostError,
    PluginLoadError,
)
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.pluginhost import host as host_module
from flakekit.pluginhost.host import BUILTIN_PLUGINS, PluginHost
from flakekit.testing import ManualClock
from flakekit.values.layout import BitLayout

DIST = "flakekit-example-plugin"
ROOT = Path(__file__).resolve().parent.parent


def _flakekit(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the throw-away venv's ``flakekit`` (it has the example plugin installed)."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("FLAKEKIT_DISABLE_PLUGINS", "FLAKEKIT_LOAD_PLUGINS",
                            "FLAKEKIT_TRACE_PLUGINS", "FLAKEKIT_CONFIG")}
    environ.update(env)
    return subprocess.run([str(bin_dir / "flakekit"), *args], capture_output=True, text=True,
                          timeout=60, env=environ)


@pytest.mark.slow
class TestExamplePlugin:
    def test_console_script_sees_layout_and_clock(self, example_plugin_venv):
        """Installed into a throw-away venv, `flakekit plugins` and `layout list` show
        js-safe and offset."""
        plugins = _flakekit(example_plugin_venv, "plugins")
        assert plugins.returncode == 0, plugins.stderr
        assert f"example  ({DIST} 0.1.0)" in plugins.stdout
        assert "layout:js-safe" in plugins.stdout and "clock:offset" in plugins.stdout
        listing = _flakekit(example_plugin_venv, "layout", "list")
        assert listing.returncode == 0, listing.stderr
        assert any(line.split()[:2] == ["js-safe",
                                        "41/4/8"] for line in listing.stdout.splitlines())
        show = _flakekit(example_plugin_venv, "layout", "show", "js-safe", "--json")
        assert show.returncode == 0, show.stderr
        assert '"total_bits": 53' in show.stdout and '"worker_field": "worker"' in show.stdout

    def test_env_switches_hide_the_installed_plugin(self, example_plugin_venv):
        """FLAKEKIT_DISABLE_PLUGINS=example and an allow-list without it both drop js-safe."""
        disabled = _flakekit(example_plugin_venv, "layout", "list",
                             FLAKEKIT_DISABLE_PLUGINS="example")
        allowed_other = _flakekit(example_plugin_venv, "layout", "list",
                                  FLAKEKIT_LOAD_PLUGINS="something-else")
        allowed = _flakekit(example_plugin_venv, "layout", "list", FLAKEKIT_LOAD_PLUGINS="example")
        for result in (disabled, allowed_other, allowed):
            assert result.returncode == 0, result.stderr
            assert "snowflake" in result.stdout
        assert "js-safe" not in disabled.stdout and "js-safe" not in allowed_other.stdout
        assert "js-safe" in allowed.stdout

    def test_offset_clock_from_a_config(self, example_plugin_venv, tmp_path):
        """A config using the plugin's layout and clock builds and issues 53-bit IDs."""
        config = tmp_path / "flakekit.toml"
        config.write_text(
            '[generators.web]\nlayout = "js-safe"\n'
            'clock = { type = "offset", offset_ms = -250 }\n'
            'allocator = { type = "static", worker_id = 3 }\n', encoding="utf-8",
        )
        result = _flakekit(example_plugin_venv, "next", "web", "-n", "3", "-c", str(config))
        assert result.returncode == 0, result.stderr
        ids = [int(line) for line in result.stdout.split()]
        assert len(set(ids)) == 3 and all(0 < i < 2**53 for i in ids)
        config.write_text(config.read_text().replace("-250", "'soon'"), encoding="utf-8")
        bad = _flakekit(example_plugin_venv, "config", "check", str(config))
        assert bad.returncode == 2
        assert "generators.web.clock.offset_ms" in bad.stderr


# -- in-process plugins ------------------------------------------------------------------------
class LayoutPlugin:
    """Registers one layout under a configurable name."""

    def __init__(self, name: str = "tiny") -> None:
        self.layout = BitLayout(name=name, fields=[["time", 41], ["worker", 10], ["sequence", 12]])

    @hookimpl
    def flakekit_register_layouts(self, register):
        register(self.layout.name, self.layout, description="test layout")


class Recorder:
    """Records every event hook call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    @hookimpl
    def flakekit_lease_acquired(self, generator, lease):
        self.calls.append(("acquired", {"generator": generator, "worker": lease.worker_id}))

    @hookimpl
    def flakekit_lease_renewed(self, generator, lease):
        self.calls.append(("renewed", {"generator": generator, "worker": lease.worker_id}))

    @hookimpl
    def flakekit_lease_lost(self, generator, lease, reason):
        self.calls.append(("lost", {"generator": generator, "reason": reason}))

    @hookimpl
    def flakekit_clock_moved_backwards(self, generator, clock, behind_ns, waited):
        self.calls.append(("backwards", {"clock": clock, "behind_ns": behind_ns, "waited": waited}))

    @hookimpl
    def flakekit_alert(self, kind, message, details):
        self.calls.append(("alert", {"kind": kind, "message": message, **details}))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class LosingAllocator(StaticAllocator):
    """A static allocator whose renewals report that someone else owns the id."""

    def renew(self, lease, issued_until_ns):
        raise LeaseLostError(f"worker {lease.worker_id} now belongs to another-host:1")


@pytest.fixture
def host():
    """A loaded host with built-ins only (no entry points)."""
    return PluginHost().load(entrypoints=False)


class _Typo:
    @hookimpl
    def flakekit_lease_aquired(self, generator, lease):
        """Misspelt: acquired."""


class _WrongArg:
    @hookimpl
    def flakekit_register_layouts(self, registry):
        """``registry`` is not an argument of the spec."""


class TestRegistration:
    def test_extra_plugin_registers_a_layout(self, host):
        """A plugin registered after loading contributes by name and can be removed again."""
        host.register(LayoutPlugin("tiny"), name="undo-tiny")
        assert host.layout("tiny").name == "tiny"
        assert host.layouts.get("tiny").plugin == "undo-tiny"
        host.unregister("undo-tiny")
        assert "tiny" not in host.layouts

    def test_registers_writes_a_registration_hook_as_a_line(self, host):
        """`flakekit_register_X = registers(...)` in a module registers like the hook def."""
        from flakekit.plugin import registers

        tiny = BitLayout(name="tiny-line", fields=[["time", 41], ["worker", 10],
                                                   ["sequence", 12]])
        plugin = types.ModuleType("tiny_line_plugin")
        plugin.flakekit_register_layouts = registers("tiny-line", tiny, description="one line")
        host.register(plugin, name="undo-tiny-line")
        assert host.layout("tiny-line") is tiny
        assert host.layouts.get("tiny-line").description == "one line"
        host.unregister("undo-tiny-line")

    def test_duplicate_name_names_both_plugins(self, host):
        """Registering a built-in layout name again fails naming both plugins."""
        with pytest.raises(DuplicateRegistrationError) as info:
            host.register(LayoutPlugin("snowflake"), name="undo-dup")
        message = str(info.value)
        assert "flakekit.builtin.layouts" in message and "undo-dup" in message
        assert info.value.first == "flakekit.builtin.layouts" and info.value.second == "undo-dup"

    def test_duplicate_between_extra_and_builtin_at_load(self):
        """An extra plugin loaded before the built-ins collides with them at load()."""
        with pytest.raises(DuplicateRegistrationError, match="flakekit.builtin.layouts"):
            PluginHost().load(entrypoints=False, extra=[LayoutPlugin("sonyflake")])

    def test_entry_point_taking_a_builtin_name_is_broken_not_fatal(self, monkeypatch):
        """docs/plugins.md and hooks.md: an entry-point plugin registering a built-in's name
        is recorded as broken (naming itself to disable); the host loads, the built-in
        keeps the name, building a config refuses."""
        class FakeEntryPoint:
            name, dist, version, value = "dup", "flakekit-dup", "0.1", "flakekit_dup"

            def load(self):
                return LayoutPlugin("snowflake")

        monkeypatch.setattr(host_module, "flakekit_entry_points", lambda group: [FakeEntryPoint()])
        monkeypatch.delenv("FLAKEKIT_LOAD_PLUGINS", raising=False)
        monkeypatch.delenv("FLAKEKIT_DISABLE_PLUGINS", raising=False)
        host = PluginHost().load()
        assert [b.name for b in host.broken] == ["dup"]
        assert host.layouts.get("snowflake").plugin == "flakekit.builtin.layouts"
        assert host.layout("snowflake") == SNOWFLAKE
        with pytest.raises(PluginLoadError) as info:
            host.check_broken()
        assert str(info.value) == (
            "plugin 'dup' (entry point flakekit:dup, distribution flakekit-dup 0.1) is broken: "
            "registering failed: layout 'snowflake' is registered by both plugin 'dup' and "
            "plugin 'flakekit.builtin.layouts'; uninstall or disable one "
            "(FLAKEKIT_DISABLE_PLUGINS=dup); fix it, or skip it with FLAKEKIT_DISABLE_PLUGINS=dup")

    def test_docs_state_the_duplicate_message_and_the_builtins(self):
        """docs/plugins.md quotes the duplicate message the code writes (disable the plugin
        that is not a built-in) and lists every built-in plugin in load order."""
        doc = " ".join((ROOT / "docs" / "plugins.md").read_text(encoding="utf-8").split())
        message = str(DuplicateRegistrationError("layout", "snowflake", "example",
                                                 "flakekit.builtin.layouts"))
        assert f"`{message}`" in doc
        listed = doc.split("4. the built-ins: ", 1)[1].split(";", 1)[0]
        names = [f"`{listed.split('`')[1]}`"] + [f"`flakekit.builtin{n}`"
                                                 for n in re.findall(r"`(\.[a-z_]+)`", listed)]
        assert names == [f"`{m}`" for m in BUILTIN_PLUGINS]

    def test_misspelt_hook_fails_check_pending(self):
        """A hook name that matches no spec is a PluginValidationError, not silence."""
        class Typo:
            @hookimpl
            def flakekit_register_layout(self, register):
                """Misspelt: the spec is flakekit_register_layouts."""

        with pytest.raises(pluggy.PluginValidationError, match="flakekit_register_layout"):
            PluginHost().load(entrypoints=False, extra=[Typo()])

    @pytest.mark.parametrize(("plugin", "name", "match"), [
        pytest.param(_Typo, "undo-typo", "unknown hook", id="misspelt_hook_after_load"),
        pytest.param(_WrongArg, "undo-wrong-arg", "registry", id="unknown_argument"),
    ])
    def test_bad_hookimpl_refused_by_register(self, host, plugin, name, match):
        """host.register() runs check_pending too: a misspelt hook after load, and an
        implementation asking for an argument the spec does not have, are rejected."""
        with pytest.raises(pluggy.PluginValidationError, match=match):
            host.register(plugin(), name=name)

    def test_bad_registration_name_names_the_plugin(self, host):
        """A name config files could not use is refused with the plugin's name."""
        with pytest.raises(ValueError, match="undo-upper.*'Tiny'"):
            host.register(_module_plugin("undo_upper_mod", "Tiny"), name="undo-upper")


def _module_plugin(module_name: str, layout_name: str) -> types.ModuleType:
    """A plugin as a module object (what an entry point loads)."""
    module = types.ModuleType(module_name)

    @hookimpl
    def flakekit_register_layouts(register):
        register(layout_name, lambda: BitLayout(
            name=layout_name, fields=[["time", 41], ["worker", 10], ["sequence", 12]]))

    module.flakekit_register_layouts = flakekit_register_layouts
    return module


class TestEnvironmentSwitches:
    def test_disable_builtin_removes_its_allocator(self, monkeypatch):
        """FLAKEKIT_DISABLE_PLUGINS=flakekit.builtin.static removes the static allocator."""
        monkeypatch.setenv("FLAKEKIT_DISABLE_PLUGINS", "flakekit.builtin.static")
        host = PluginHost().load(entrypoints=False)
        assert "static" not in host.allocators
        assert "snowflake" in host.layouts
        assert "flakekit.builtin.static" not in [p.name for p in host.plugins()]

    def test_disable_list_is_comma_separated(self, monkeypatch):
        """Several names, with spaces, each blocked; a module plugin by its name too."""
        monkeypatch.setenv("FLAKEKIT_DISABLE_PLUGINS", " flakekit.builtin.clocks , undo_mod")
        host = PluginHost().load(entrypoints=False, extra=[_module_plugin("undo_mod", "tiny")])
        assert host.clocks.names() == []
        assert "tiny" not in host.layouts

    def test_trace_writes_hook_calls_to_stderr(self, monkeypatch, capfd):
        """FLAKEKIT_TRACE_PLUGINS=1 prints registration and event hook calls."""
        monkeypatch.setenv("FLAKEKIT_TRACE_PLUGINS", "1")
        host = PluginHost().load(entrypoints=False)
        host.events().alert("test-alert", "looked at", {"n": 1})
        err = capfd.readouterr().err
        assert "flakekit_register_layouts" in err
        assert "flakekit_alert" in err and "test-alert" in err

    def test_no_trace_by_default(self, monkeypatch, capfd):
        """Without the switch nothing is printed."""
        monkeypatch.delenv("FLAKEKIT_TRACE_PLUGINS", raising=False)
        PluginHost().load(entrypoints=False).events().alert("quiet", "x", {})
        assert "flakekit_alert" not in capfd.readouterr().err


class TestEventHooks:
    @pytest.fixture
    def recorder(self, host) -> Recorder:
        """A :class:`Recorder` plugin on ``host``."""
        recorder = Recorder()
        host.register(recorder, name="undo-recorder")
        return recorder

    def _started(self, host, allocator=None, clock=None):
        """Generator ``orders`` (static worker 5 unless ``allocator``) reporting to
        ``host``'s plugins, started; and its clock."""
        clock = clock or ManualClock()
        allocator = allocator or StaticAllocator(StaticSettings(worker_id=5))
        gen = SnowflakeGenerator(SNOWFLAKE, clock, allocator, name="orders", events=host.events())
        return gen.start(), clock

    def test_lease_acquired_and_renewed(self, host, recorder):
        """Starting a generator and renewing its lease reach a plugin."""
        gen, _ = self._started(host)
        assert recorder.calls == [("acquired", {"generator": "orders", "worker": 5})]
        assert gen.keeper.renew_once() is True
        assert recorder.calls[-1] == ("renewed", {"generator": "orders", "worker": 5})
        gen.close()

    def test_lease_lost(self, host, recorder):
        """A renewal that finds the id taken fires flakekit_lease_lost; IDs stop."""
        gen, _ = self._started(host, allocator=LosingAllocator(StaticSettings(worker_id=5)))
        gen.next_id()
        assert gen.keeper.renew_once() is False
        assert recorder.names() == ["acquired", "lost"]
        assert "another-host:1" in recorder.calls[-1][1]["reason"]
        with pytest.raises(LeaseLostError):
            gen.next_id()

    def test_clock_moved_backwards_waited_then_refused(self, host, recorder):
        """A small step back is waited out (waited=True); a big one raises (waited=False)."""
        gen, clock = self._started(host)
        before = gen.next_id()
        clock.step(ns=-2_000_000)                      # 2 ms back: within max_backward 5 ms
        after = gen.next_id()
        assert after > before
        assert recorder.calls[-1] == ("backwards", {"clock": "manual", "behind_ns": 2_000_000,
                                                    "waited": True})
        clock.step(-1.0)                               # 1 s back: refuse
        with pytest.raises(ClockMovedBackwardsError, match="moved backwards by 100"):
            gen.next_id()
        name, details = recorder.calls[-1]
        assert name == "backwards" and details["waited"] is False
        assert details["behind_ns"] >= 1_000_000_000
        gen.close()

    def test_alert(self, host, recorder):
        """Events.alert() reaches flakekit_alert with its details."""
        host.events().alert("worker-reclaim", "reclaimed worker 3 after 1h", {"worker_id": 3})
        assert recorder.calls == [("alert", {"kind": "worker-reclaim",
                                             "message": "reclaimed worker 3 after 1h",
                                             "worker_id": 3})]

    def test_broken_event_plugin_does_not_stop_ids(self, host, caplog):
        """An exception in an event hook is logged; the generator carries on."""
        class Broken:
            @hookimpl
            def flakekit_lease_acquired(self, generator, lease):
                raise RuntimeError("plugin bug")

        host.register(Broken(), name="undo-broken")
        gen, _ = self._started(host)
        assert gen.next_id() > 0
        assert "flakekit_lease_acquired failed" in caplog.text
        gen.close()


class TestCommandsHook:
    def test_plugin_command_in_help(self, host):
        """flakekit_register_commands adds a command to a copy of the CLI group."""
        from flakekit.cli import cli

        class Hello:
            @hookimpl
            def flakekit_register_commands(self, cli):
                @cli.command()
                @click.argument("who", default="world")
                def hello(who):
                    """Say hello (from a plugin)."""
                    click.echo(f"hello {who}")

        host.register(Hello(), name="undo-hello")
        group = copy.copy(cli)
        group.commands = dict(cli.commands)
        host.add_commands(group)
        runner = CliRunner()
        help_result = runner.invoke(group, ["--help"])
        assert help_result.exit_code == 0
        assert "hello" in help_result.output and "Say hello (from a plugin)." in help_result.output
        run_result = runner.invoke(group, ["hello", "plugins"])
        assert run_result.exit_code == 0 and run_result.output == "hello plugins\n"
        assert "hello" not in cli.commands


class TestInstallHints:
    """A name a bundled plugin provides says what to install when that plugin is missing."""

    def test_the_table_matches_the_bundled_plugins(self):
        """Every name and command the bundled plugins register is in BUNDLED (and nothing
        else is), so a new one cannot go without its hint."""
        import flakekit_etcd
        import flakekit_server
        import flakekit_zookeeper

        from flakekit.pluginhost.bundled import BUNDLED

        dists = {"flakekit-etcd": flakekit_etcd, "flakekit-server": flakekit_server,
                 "flakekit-zookeeper": flakekit_zookeeper}
        host = PluginHost()
        for dist, module in dists.items():
            host.pm.register(module, name=dist)
        host.load(entrypoints=False)
        found = {(r.kind, r.name): r.plugin for registry in host.registries.values()
                 for r in registry if r.plugin in dists}
        found.update({("command", c): dist for dist, names in host.commands_by_plugin().items()
                      if dist in dists for c in names})
        assert found == BUNDLED

    def test_unknown_allocator_names_the_package(self, monkeypatch):
        """From a checkout: `pip install ./plugins/...`; installed: the distribution name."""
        from flakekit.errors import UnknownNameError
        from flakekit.pluginhost import bundled
        from flakekit.pluginhost.registry import Registry

        monkeypatch.chdir(Path(__file__).resolve().parent.parent)
        with pytest.raises(UnknownNameError) as info:
            Registry("allocator").get("zookeeper", "generators.a.allocator.type")
        assert str(info.value) == (
            "generators.a.allocator.type: unknown allocator 'zookeeper'; it comes with the "
            "plugin flakekit-zookeeper: pip install ./plugins/flakekit-zookeeper; known: (none)")
        monkeypatch.setattr(bundled, "_checkout", lambda: None)
        with pytest.raises(UnknownNameError, match=r"membership 'etcd'; it comes with the plugin "
                           r"flakekit-etcd: pip install flakekit-etcd; known"):
            Registry("membership").get("etcd", "cluster.membership.type")
        with pytest.raises(UnknownNameError, match=r"unknown allocator 'zookeper'; known: sql$"):
            registry = Registry("allocator")
            registry.register("p", "sql", lambda *a: None)
            registry.get("zookeper")

    def test_missing_serve_command_says_what_to_install(self):
        """`flakekit serve` without the server plugin: the usage error names the package."""
        from flakekit.cli.main import _Cli

        group = _Cli()
        with pytest.raises(click.UsageError, match=r"No such command 'serve'; it comes with "
                           r"the plugin flakekit-server: pip install "):
            group.resolve_command(click.Context(group), ["serve"])
        with pytest.raises(click.UsageError, match=r"^No such command 'nope'"):
            group.resolve_command(click.Context(group), ["nope"])

    def test_plugins_lists_commands(self, capsys):
        """`flakekit plugins` shows the commands each plugin adds (JSON too)."""
        import json

        from flakekit.testing.cli import run_cli

        code, out, _ = run_cli(capsys, "plugins", "--json")
        rows = {p["name"]: p for p in json.loads(out)}
        assert code == 0 and rows["flakekit.builtin.segments"]["commands"] == ["segments"]
        code, out, _ = run_cli(capsys, "plugins")
        assert "    commands: segments" in out
