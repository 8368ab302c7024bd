"""Strategies are a plugin kind: the built-ins register through the hook, a plugin adds
one, and a table's keys are its strategy's checked settings."""

from __future__ import annotations

import itertools

import attrs
import pytest

from flakekit import hookimpl
from flakekit.assembly.config import parse_config
from flakekit.assembly.context import BuildContext
from flakekit.assembly.kit import build_kit, typed_generators
from flakekit.assembly.settings import PluginRef, build_settings
from flakekit.builtin.strategies import SegmentStrategySettings, build_segment
from flakekit.errors import ConfigError, UnknownNameError
from flakekit.sql.backends import BackendPool, BackendSettings
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.testing import ManualClock
from flakekit.values.events import NO_EVENTS


@attrs.frozen
class CountSettings:
    start: int = 1


@attrs.define
class Counter:
    """The smallest generator: start, next_id, next_ids, close."""

    start_at: int
    _count: itertools.count = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._count = itertools.count(self.start_at)

    def start(self) -> Counter:
        return self

    def next_id(self) -> int:
        return next(self._count)

    def next_ids(self, n: int) -> list[int]:
        return [next(self._count) for _ in range(n)]

    def close(self) -> None:
        pass


class CounterPlugin:
    @hookimpl
    def flakekit_register_strategies(self, register):
        register("count", lambda settings, ctx: Counter(settings.start),
                 settings=CountSettings, description="a counter")


class NotAGeneratorPlugin:
    @hookimpl
    def flakekit_register_strategies(self, register):
        register("half", lambda settings, ctx: object(), description="returns nothing usable")


def _build_refusal(host, plugin: object, name: str, generators: dict) -> str:
    """The ConfigError message of building ``generators`` with ``plugin`` registered."""
    host.register(plugin, name=name)
    with pytest.raises(ConfigError) as info:
        build_kit(parse_config({"generators": generators}), host)
    return str(info.value)


class TestRegistration:
    def test_builtins_register_through_the_hook(self, host):
        """snowflake and segment are registrations of flakekit.builtin.strategies."""
        assert host.strategies.names() == ["segment", "snowflake"]
        assert {r.plugin for r in host.strategies} == {"flakekit.builtin.strategies"}

    def test_hook_flakekit_register_strategies(self, host):
        """A plugin's strategy is used from config, its settings checked by name."""
        host.register(CounterPlugin(), name="undo-counter")
        config = parse_config({"generators": {"c": {"strategy": "count", "start": 40}}})
        with build_kit(config, host) as kit:
            assert kit["c"].next_id() == 40
            assert kit["c"].next_ids(2) == [41, 42]
        bad = parse_config({"generators": {"c": {"strategy": "count", "strat": 1}}})
        with pytest.raises(ConfigError, match=r"^generators\.c\.strat: .*did you mean 'start'"):
            build_kit(bad, host)
        host.unregister("undo-counter")
        with pytest.raises(UnknownNameError, match=r"^generators\.c\.strategy: unknown strategy"):
            build_kit(config, host)

    def test_format_needs_a_string_form(self, host):
        """`format` on a strategy whose generators have no next_str() is refused by field."""
        message = _build_refusal(host, CounterPlugin(), "undo-counter",
                                 {"c": {"strategy": "count", "format": "base62"}})
        assert message.startswith("generators.c.format: strategy 'count'")

    def test_wrong_object_is_refused_naming_the_plugin(self, host):
        """A strategy factory returning a non-generator fails at build naming its plugin."""
        message = _build_refusal(host, NotAGeneratorPlugin(), "undo-half",
                                 {"h": {"strategy": "half"}})
        assert message.startswith("generators.h: strategy 'half' from plugin 'undo-half'")
        assert "lacks close(), next_id(), next_ids(), start()" in message


class TestTypedSpecs:
    def test_references_are_parsed_once(self, host):
        """Clock, allocator and store references become PluginRefs with their paths."""
        config = parse_config({
            "backends": {"main": {"url": "sqlite://"}},
            "generators": {
                "a": {"allocator": {"type": "static", "worker_id": 1}},
                "s": {"strategy": "segment", "store": {"backend": "main"}},
            },
        })
        typed = typed_generators(config, host)
        assert typed["a"].settings.allocator == PluginRef(
            "allocator", "static", {"worker_id": 1}, "generators.a.allocator",
            "generators.a.allocator.type")
        assert typed["a"].settings.clock.type == "monotonic"
        assert typed["s"].settings.store == PluginRef(
            "segment store", "sql", {"backend": "main"}, "generators.s.store",
            "generators.s.store")
        assert {r.kind for r in typed["a"].refs} == {"clock", "allocator"}


# -- the segment strategy from a table (moved from test_segment.py) ------------------------------
def _ctx(host, url: str) -> BuildContext:
    pool = BackendPool({"main": BackendSettings(url)})
    return BuildContext("inv", "generators.inv", None, ManualClock(), NO_EVENTS, pool, host)


def _build_segment(table, ctx):
    return build_segment(build_settings(SegmentStrategySettings, table, ctx.path), ctx)


class TestBuildSegment:
    def test_builds_from_table(self, host, sqlite_url):
        """A config table builds a generator on the named backend."""
        ctx = _ctx(host, sqlite_url)
        SqlSegmentStore(ctx.backends.engine("main")).create("invoice", 10)
        gen = _build_segment(
            {"store": {"type": "sql", "backend": "main"}, "key": "invoice",
             "wait_budget": "50ms", "max_step": 1000}, ctx,
        )
        with gen:
            assert gen.next_id() == 1
        assert gen.settings.wait_budget == 50_000_000
        ctx.backends.dispose()

    @pytest.mark.parametrize(
        ("table", "path", "message"),
        [
            ({"kee": "x"}, "generators.inv.kee", "did you mean 'key'"),
            ({"prefetch_at": 1.5}, "generators.inv.prefetch_at", "below 1"),
            ({"max_step": 0}, "generators.inv.max_step", "at least 1"),
            ({"wait_budget": "soon"}, "generators.inv.wait_budget", "duration"),
            ({"store": {"type": "sqll"}}, "generators.inv.store.type", "did you mean 'sql'"),
            ({"store": {"type": "sql", "backend": "nope"}}, "generators.inv.store.backend",
             "unknown backend"),
            ({"store": {"type": "sql", "bakend": "main"}}, "generators.inv.store.bakend",
             "did you mean 'backend'"),
            ({"store": 3}, "generators.inv.store", "expected a name or a table"),
            ({"grow_below": "1h", "shrink_after": "30min"}, "generators.inv", "shrink_after"),
        ],
        ids=["unknown-key", "prefetch", "max-step", "budget", "store-type", "backend",
             "store-key", "store-shape", "durations"],
    )
    def test_config_errors_name_the_field(self, host, sqlite_url, table, path, message):
        """Every wrong value names its dotted path and the fix."""
        with pytest.raises(ConfigError, match=message) as info:
            _build_segment(table, _ctx(host, sqlite_url))
        assert str(info.value).startswith(path)


# -- a third-party distribution's strategy, installed in a throw-away venv ------------------------
@pytest.mark.slow
def test_example_plugin_strategy_from_config(example_plugin_venv, tmp_path):
    """The example distribution's `counter` strategy is listed and used by `flakekit next`;
    its settings are checked with the field's path."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items()
           if k not in ("FLAKEKIT_DISABLE_PLUGINS", "FLAKEKIT_LOAD_PLUGINS", "FLAKEKIT_CONFIG")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(example_plugin_venv / "flakekit"), *args], env=env,
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    listing = run("plugins")
    assert listing.returncode == 0, listing.stderr
    assert "strategy:counter" in listing.stdout
    config = tmp_path / "flakekit.toml"
    config.write_text('[generators.tickets]\nstrategy = "counter"\nstart = 1000\n',
                      encoding="utf-8")
    result = run("next", "tickets", "-n", "3", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1000", "1001", "1002"]
    config.write_text('[generators.tickets]\nstrategy = "counter"\nstrat = 1\n', encoding="utf-8")
    bad = run("config", "check", str(config))
    assert bad.returncode == 2
    assert "generators.tickets.strat: unknown key" in bad.stderr and "'start'" in bad.stderr
