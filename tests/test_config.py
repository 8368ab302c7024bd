"""Config files: sections, ${ENV}, errors that name the dotted path, building a Kit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flakekit.assembly.config import load_config, parse_config
from flakekit.assembly.kit import build_kit
from flakekit.errors import ConfigError
from flakekit.testing.cli import write_toml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

GOOD = """
[backends.main]
url = "postgresql+psycopg://app:${FK_TEST_PW}@127.0.0.1/ids"

[layouts.orders-layout]
fields = [["time", 41], ["region", 2], ["worker", 8], ["sequence", 12]]
unit = "1ms"
epoch = "2024-01-01T00:00:00Z"

[generators.orders]
strategy = "snowflake"
layout = "orders-layout"
clock = "monotonic"
nodes = { region = 1 }
allocator = { type = "static", worker_id = 7 }

[generators.wall]
layout = "sonyflake"
clock = { type = "system", max_backward = "20ms" }
allocator = { type = "static", env = "FK_TEST_WORKER" }
"""


class TestParse:
    def test_good_config_builds_and_issues(self, tmp_path, host, monkeypatch):
        """A config with a custom layout, region node field and two generators works."""
        monkeypatch.setenv("FK_TEST_PW", "s3cret")
        monkeypatch.setenv("FK_TEST_WORKER", "300")
        config = load_config(write_toml(tmp_path, GOOD))
        assert config.backends["main"].url.endswith(":s3cret@127.0.0.1/ids")
        assert "s3cret" not in repr(config.backends["main"])
        with build_kit(config, host) as kit:
            orders = kit["orders"]
            parts = config.layouts["orders-layout"].decompose(orders.next_id())
            assert parts["region"] == 1 and parts["worker"] == 7
            assert kit["wall"].worker_id == 300
            assert kit["wall"].clock.max_backward_ns == 20_000_000

    def test_quickstart_runs_on_the_example_config(self, tmp_path):
        """examples/quickstart.py runs on examples/flakekit.toml: its custom layout puts
        region 1 and the leased worker id into the orders IDs."""
        done = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        orders = [line for line in done.stdout.splitlines() if line.startswith("orders id:")]
        assert len(orders) == 1 and "'region': 1, 'worker': 0," in orders[0], done.stdout

    def test_env_default(self):
        """${NAME:-default} falls back when the variable is unset."""
        config = parse_config({"backends": {"x": {"url": "sqlite:///${FK_NOPE_DB:-fk}.db"}}})
        assert config.backends["x"].url == "sqlite:///fk.db"

    def test_missing_env_names_path(self):
        """An unset ${VAR} names the field and how to give a default."""
        with pytest.raises(ConfigError,
                           match=r"backends.x.url: environment variable FK_NOPE is not set"):
            parse_config({"backends": {"x": {"url": "postgresql://u:${FK_NOPE}@h/db"}}})

    def test_missing_file(self, tmp_path):
        """A missing file is one clear line."""
        with pytest.raises(ConfigError, match="does not exist"):
            load_config(tmp_path / "nope.toml")

    def test_not_utf8_names_the_file(self, tmp_path, capsys):
        """A Latin-1 config names the file, the byte and its line; the CLI exits 2, one line."""
        from flakekit.testing.cli import run_cli

        path = tmp_path / "latin1.toml"
        path.write_bytes(b'[generators.a]\ndescription = "caf\xe9"\n')
        with pytest.raises(ConfigError,
                           match=r"latin1.toml' is not UTF-8 text: byte 0xe9 on line 2"):
            load_config(path)
        for args in (("config", "check", str(path)), ("next", "-c", str(path))):
            code, out, err = run_cli(capsys, *args)
            assert code == 2 and len(err.splitlines()) == 1 and "latin1.toml" in err, err

    def test_segment_key_follows_the_servers_rule(self, tmp_path, capsys):
        """A generator's segment key the server could not serve is refused at load."""
        from flakekit.testing.cli import run_refused

        path = write_toml(tmp_path, '[backends.main]\nurl = "sqlite:///x.db"\n[generators.a]\n'
                          'strategy = "segment"\nstore = { type = "sql", backend = "main" }\n'
                          'key = "bad key"\n')
        err = run_refused(capsys, "config", "check", str(path))
        assert err.startswith("error: generators.a.key: 'bad key' is not a valid segment key")

    def test_bad_toml(self, tmp_path):
        """Broken TOML says where."""
        with pytest.raises(ConfigError, match="not valid TOML"):
            load_config(write_toml(tmp_path, "[generators\n"))


BAD_CASES = [
    ({"generatorz": {}}, r"^generatorz: unknown key.*did you mean 'generators'"),
    ({"generators": {"g": {"strategy": "snowflak"}}},
     r"generators.g.strategy: unknown strategy 'snowflak'.*did you mean 'snowflake'"),
    ({"generators": {"g": {"layout": "snowflak", "allocator": "static"}}},
     r"generators.g.layout: unknown layout 'snowflak'; known: .*did you mean 'snowflake'"),
    ({"generators": {"g": {"clock": "sytem", "allocator": "static"}}},
     r"generators.g.clock: unknown clock 'sytem'.*did you mean 'system'"),
    ({"generators": {"g": {"allocator": {"type": "statik"}}}},
     r"generators.g.allocator.type: unknown allocator 'statik'.*did you mean 'static'"),
    ({"generators": {"g": {"allocator": {"type": "static", "worker": 3}}}},
     r"generators.g.allocator.worker: unknown key.*did you mean 'worker_id'"),
    ({"generators": {"g": {"allocator": {"type": "static", "worker_id": "three"}}}},
     r"generators.g.allocator.worker_id: expected an integer"),
    ({"generators": {"g": {"layuot": "snowflake", "allocator": "static"}}},
     r"generators.g.layuot: unknown key.*did you mean 'layout'"),
    ({"generators": {"g": {}}}, r"generators.g.allocator: is required"),
    ({"generators": {"g": {"clock": {"type": "system", "max_backward": "soon"},
                           "allocator": "static"}}}, r"generators.g.clock.max_backward: "),
    ({"generators": {"g": {"allocator": "static", "nodes": {"region": 1}}}},
     r"generators.g.nodes.region: layout 'snowflake' has no such field"),
    ({"generators": {"g": {"layout": "region-split", "allocator": "static",
                           "nodes": {"region": 9}}}},
     r"generators.g.nodes.region: 9 does not fit in 3 bits"),
    ({"generators": {"g": {"allocator": {"type": "static", "worker_id": 5000}}}},
     r"generators.g.allocator.worker_id: worker id 5000 is outside the worker range 0..1023 of "
     r"layout 'snowflake'"),
    ({"generators": {"g": {"allocator": "static", "on_lease_lost": "panic"}}},
     r"generators.g.on_lease_lost: expected one of .stop., .exit., .restart."),
    ({"layouts": {"l": {"fields": [["time", 41], ["worker", 10], ["sequence", 11]]}}},
     r"layouts.l.fields: the fields add up to 62 bits"),
    ({"layouts": {"snowflake": {"fields": [["time", 41], ["worker", 10], ["sequence", 12]]}}},
     r"layouts.snowflake: a layout named 'snowflake' is already registered"),
    ({"backends": {"b": {"url": "not a url"}}}, r"backends.b.url: 'not a url' is not a URL"),
    ({"backends": {"b": {}}}, r"backends.b.url: is required"),
    ({"default": "nope", "generators": {"g": {"allocator": "static"}}},
     r"default: unknown generator 'nope'"),
    ({"generators": {"g": {"allocator": {"type": "sql", "heartbeat": "2h"}}}},
     r"generators.g.allocator.heartbeat: heartbeat \(2h\) must be shorter"),
    ({"generators": {"g": {"allocator": {"type": "sql", "safety_window": 0}}}},
     r"generators.g.allocator.safety_window: safety_window must be at least 10ms"),
    ({"generators": {"g": {"strategy": "segment", "key": "k", "stor": {}}}},
     r"generators.g.stor: unknown key;.* store.*did you mean 'store'"),
    # TOML has inf and nan: a duration must be a finite number
    ({"generators": {"g": {"clock": {"type": "system", "max_backward": float("inf")},
                           "allocator": "static"}}}, r"generators.g.clock.max_backward: .*finite"),
    ({"generators": {"g": {"allocator": "static", "max_start_wait": float("inf")}}},
     r"generators.g.max_start_wait: .*finite"),
    ({"layouts": {"l": {"fields": [["time", 41], ["worker", 10], ["sequence", 12]],
                        "unit": float("inf")}}}, r"layouts.l.unit: .*finite"),
]


@pytest.mark.parametrize(("data", "message"), BAD_CASES,
                         ids=[m.split(":")[0].strip("^r") for _, m in BAD_CASES])
def test_errors_name_the_dotted_path(data, message, host):
    """Every wrong config raises ConfigError naming the field, with a suggestion."""
    with pytest.raises(ConfigError, match=message):
        build_kit(parse_config(data), host)


def test_password_never_printed(host):
    """A backend URL with a password is redacted in error messages."""
    data = {"backends": {"b": {"url": "nosuchdb+x://u:hunter2@h/db"}},
            "generators": {"g": {"allocator": {"type": "sql", "backend": "b"}}}}
    try:
        kit = build_kit(parse_config(data), host)
        kit.pool.engine("b", "generators.g.allocator.backend")
    except Exception as exc:  # noqa: BLE001 - whatever it is, no password in it
        assert "hunter2" not in str(exc)


def test_identity_from_environment(monkeypatch, host):
    """FLAKEKIT_HOST/PORT/INSTANCE reach the allocator's lease request; junk is refused."""
    monkeypatch.setenv("FLAKEKIT_HOST", "10.1.2.3")
    monkeypatch.setenv("FLAKEKIT_PORT", "8080")
    monkeypatch.setenv("FLAKEKIT_INSTANCE", "2")
    config = parse_config({"generators": {"g": {"allocator": {"type": "static", "worker_id": 1}}}})
    request = build_kit(config, host).get("g").keeper.request
    assert (request.host, request.port, request.instance) == ("10.1.2.3", 8080, 2)
    monkeypatch.setenv("FLAKEKIT_INSTANCE", "two")
    with pytest.raises(ConfigError, match="FLAKEKIT_INSTANCE: 'two' is not a whole number"):
        build_kit(config, host)


def test_first_use_from_many_threads_takes_one_lease(tmp_path, host):
    """kit["name"] from 16 threads at once starts the generator once: one worker id."""
    from flakekit.testing import in_threads

    config = parse_config({
        "backends": {"db": {"url": f"sqlite:///{tmp_path / 'ids.db'}"}},
        "generators": {"g": {"allocator": {"type": "sql", "backend": "db"}}},
    })
    kit = build_kit(config, host)
    try:
        seen = in_threads(lambda _: kit["g"].worker_id, 16)
        records = kit.get("g").keeper.allocator.records()
        assert set(seen) == {0} and [r.state for r in records] == ["held"]
    finally:
        kit.close()


def test_duplicate_name_blames_the_third_party_plugin():
    """A plugin that registers a built-in's name is the one to disable."""
    from flakekit import hookimpl
    from flakekit.errors import DuplicateRegistrationError
    from flakekit.pluginhost.host import PluginHost

    class Clash:
        @hookimpl
        def flakekit_register_layouts(self, register):
            from flakekit.builtin.layouts import SNOWFLAKE

            register("snowflake", SNOWFLAKE)

    with pytest.raises(DuplicateRegistrationError, match="FLAKEKIT_DISABLE_PLUGINS=clash"):
        PluginHost().load(entrypoints=False).register(Clash(), name="clash")
    # loaded before the built-ins (as entry points are), it is still the one named
    with pytest.raises(DuplicateRegistrationError) as info:
        PluginHost().load(entrypoints=False, extra=[Clash()])
    assert "FLAKEKIT_DISABLE_PLUGINS=flakekit.builtin" not in str(info.value)
