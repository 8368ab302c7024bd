"""The flakekit CLI: output, --json, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flakekit.builtin.layouts import SNOWFLAKE
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok, write_toml

CONFIG = """
[layouts.orders-layout]
fields = [["time", 41], ["region", 2], ["worker", 8], ["sequence", 12]]
epoch = "2024-01-01T00:00:00Z"

[generators.orders]
layout = "orders-layout"
nodes = { region = 2 }
allocator = { type = "static", worker_id = 200 }
"""


@pytest.fixture
def config_file(tmp_path) -> Path:
    return write_toml(tmp_path, CONFIG)


class TestLayoutCommands:
    def test_list(self, capsys):
        """layout list shows the built-ins."""
        out = run_ok(capsys, "layout", "list")
        for name in ("snowflake", "sonyflake", "region-split"):
            assert name in out

    def test_list_with_config(self, capsys, config_file):
        """layout list --config adds the file's layouts."""
        out = run_ok(capsys, "layout", "list", "--config", str(config_file))
        assert "orders-layout" in out

    def test_show(self, capsys):
        """layout show draws the bits and gives capacity and warnings."""
        out = run_ok(capsys, "layout", "show", "snowflake")
        assert "| sign | time (41) | worker (10) | sequence (12) |" in out
        assert "4,096,000 per worker" in out and "2080-07-10" in out
        assert "warning: IDs can exceed 2^53" in out

    def test_show_json(self, capsys):
        """--json is machine readable."""
        code, out, _ = run(capsys, "layout", "show", "sonyflake", "--json")
        data = json.loads(out)
        assert code == 0 and data["unit"] == "10ms" and data["fields"][1]["name"] == "sequence"

    def test_compose_decompose(self, capsys):
        """compose then decompose gives the parts back."""
        code, out, _ = run(capsys, "layout", "compose", "snowflake", "time=2024-01-01T00:00:00Z",
                           "worker=3", "sequence=9")
        assert code == 0
        value = int(out)
        code, out, _ = run(capsys, "layout", "decompose", "snowflake", str(value), "--json")
        data = json.loads(out)
        assert data["worker"] == 3 and data["sequence"] == 9
        assert data["timestamp"] == "2024-01-01T00:00:00.000Z"


class TestDecodeAndNext:
    def test_next_and_decode_with_config(self, capsys, config_file):
        """next prints IDs from the config's generator; decode uses its layout."""
        code, out, _ = run(capsys, "next", "-n", "5", "--config", str(config_file))
        ids = [int(x) for x in out.split()]
        assert code == 0 and len(ids) == 5 and ids == sorted(set(ids))
        code, out, _ = run(capsys, "decode", str(ids[0]), "--config", str(config_file), "--json")
        data = json.loads(out)
        assert data["layout"] == "orders-layout" and data["worker"] == 200 and data["region"] == 2

    def test_decode_default_layout(self, capsys):
        """decode without a layout assumes snowflake."""
        value = SNOWFLAKE.compose(time=12345, worker=7, sequence=1)
        out = run_ok(capsys, "decode", str(value))
        assert "worker     7" in out


BAD = [
    (("decode", "abc"), "id 'abc' is not an integer"),
    (("decode", "-5"), None),
    (("decode", str(1 << 63)), "outside layout 'snowflake'"),
    (("layout", "show", "snowflak"), "did you mean 'snowflake'"),
    (("layout", "compose", "snowflake", "time=1", "worker=5000"),
     "worker: 5000 does not fit in 10 bits"),
    (("layout", "compose", "snowflake", "time=1", "worker"), "expected FIELD=VALUE"),
    (("next", "nope", "--config", "{config}"), "unknown generator 'nope'"),
    (("next", "-n", "0", "--config", "{config}"), "0 is not in the range"),
    (("config", "check", "/nonexistent/flakekit.toml"), "does not exist"),
    (("bogus",), "No such command"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(capsys, config_file, args, message):
    """Wrong input: exit 2, one line on stderr (plus click's usage line), no traceback."""
    args = tuple(a.replace("{config}", str(config_file)) for a in args)
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    if message:
        assert message in err
    assert len([line for line in err.splitlines() if line.startswith("error")]) <= 1


def test_config_check(capsys, config_file, tmp_path):
    """config check says ok for a good file and names the field for a bad one."""
    out = run_ok(capsys, "config", "check", str(config_file))
    assert "ok (1 generators: orders" in out
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace('layout = "orders-layout"', 'layout = "orders-layuot"'))
    code, _, err = run(capsys, "config", "check", str(bad))
    assert code == 2
    assert "generators.orders.layout: unknown layout 'orders-layuot'" in err
    assert "did you mean 'orders-layout'" in err


def test_plugins(capsys):
    """plugins lists the built-ins and what they register."""
    code, out, _ = run(capsys, "plugins", "--json")
    data = json.loads(out)
    names = {p["name"] for p in data}
    assert code == 0 and "flakekit.builtin.layouts" in names
    registers = {r for p in data for r in p["registers"]}
    assert {"layout:snowflake", "clock:monotonic", "allocator:static"} <= registers


def test_console_script(config_file):
    """The installed `flakekit` script runs and fails cleanly."""
    script = Path(sys.executable).with_name("flakekit")
    ok = subprocess.run([str(script), "next", "-n", "3", "--config", str(config_file)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and len(ok.stdout.split()) == 3
    bad = subprocess.run([str(script), "decode", "xyz"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLAKEKIT_DEBUG": ""})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_decode_with_a_config_without_generators_uses_snowflake(capsys, tmp_path):
    """`decode` falls back to snowflake when the config has no generator to take a
    layout from, as its help says."""
    path = tmp_path / "empty.toml"
    path.write_text("")
    out = run_ok(capsys, "decode", "123", "-c", str(path))
    assert "sequence" in out


def test_decode_names_the_generators_layout_field(capsys, tmp_path):
    """A wrong layout taken from the default generator names that generator's field."""
    path = tmp_path / "bad.toml"
    path.write_text('[generators.a]\nlayout = {x = 1}\nallocator = {type = "static", worker_id = '
                    '1}\n')
    code, out, err = run(capsys, "decode", "123", "-c", str(path))
    assert code == 2
    assert err.startswith("error: generators.a.layout: expected a layout name")


def test_ctrl_c_exits_130():
    """An interrupted command exits 130, as shells expect."""
    from flakekit.cli import run

    def interrupted() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            import click

            raise click.Abort()  # noqa: B904 - click keeps the context, as here

    assert run(interrupted) == 130


#: docs/cluster.md's shared config: every node reads it, each gives --node/--advertise
SHARED_CLUSTER = """\
[backends.main]
url = "postgresql+psycopg://ids@db.internal:5432/ids"

[cluster]
name = "ids"
membership = { type = "sql", backend = "main" }
lease = "10s"

[generators.orders]
strategy = "segment"
order = "strict"
store = { type = "sql", backend = "main" }
key = "order"
"""


class TestSharedClusterConfig:
    @pytest.fixture
    def shared(self, tmp_path, no_node_identity):
        path = tmp_path / "ids.toml"
        path.write_text(SHARED_CLUSTER)
        return path

    def test_config_check_reads_a_shared_config(self, capsys, shared):
        """Without advertise anywhere the rest is checked, as `cluster status` reads it,
        and the output says each node gives its own (text and JSON); no database is
        contacted (db.internal does not resolve)."""
        out = run_ok(capsys, "config", "check", str(shared))
        assert "cluster 'ids': a shared config" in out and "strict keys: order" in out
        code, out, err = run(capsys, "config", "check", str(shared), "--json")
        data = json.loads(out)
        assert code == 0 and data["ok"] and data["cluster"]["shared"] is True
        assert data["cluster"]["strict_keys"] == ["order"] and data["generators"] == ["orders"]

    def test_config_check_as_one_node(self, capsys, shared):
        """--node/--advertise check the file as that node would start; a bad URL exits 2
        naming --advertise."""
        code, out, err = run(capsys, "config", "check", str(shared), "--node", "web-1",
                             "--advertise", "http://10.0.0.5:8080", "--json")
        assert code == 0, err
        cluster = json.loads(out)["cluster"]
        got = (cluster["node"], cluster["advertise"], cluster["shared"])
        assert got == ("web-1", "http://10.0.0.5:8080", False)
        code, _, err = run(capsys, "config", "check", str(shared), "--advertise", "10.0.0.5")
        assert code == 2 and err.startswith("error: --advertise:")

    def test_a_shared_config_still_fails_on_other_errors(self, capsys, tmp_path, monkeypatch):
        """Only the missing advertise is left to the nodes: another error still fails."""
        monkeypatch.delenv("FLAKEKIT_ADVERTISE", raising=False)
        path = tmp_path / "bad.toml"
        path.write_text(SHARED_CLUSTER.replace('lease = "10s"', 'lease = "forever"'))
        code, _, err = run(capsys, "config", "check", str(path))
        assert code == 2 and "cluster.lease" in err

    def test_serve_names_advertise(self, capsys, shared):
        """`serve` on a shared config without --advertise says to pass it."""
        code, out, err = run(capsys, "serve", "-c", str(shared))
        assert code == 2 and "cluster.advertise: is required" in err
        assert "pass --advertise or set $FLAKEKIT_ADVERTISE" in err


def test_serve_help_shows_environment_variables(capsys):
    """`serve --help` lists each option's variable and the others serve reads."""
    code, out, _ = run(capsys, "serve", "--help")
    flat = " ".join(out.split())
    assert code == 0
    for name in ("FLAKEKIT_SERVER_HOST", "FLAKEKIT_SERVER_PORT", "FLAKEKIT_SERVER_LOG_LEVEL",
                 "FLAKEKIT_NODE", "FLAKEKIT_ADVERTISE", "FLAKEKIT_CONFIG"):
        assert name in flat, name
    assert "[env var: FLAKEKIT_SERVER_PORT; default: 8080" in flat


class TestScriptFriendly:
    ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"

    def test_one_timestamp_format(self):
        """iso_utc: UTC, milliseconds, Z; naive datetimes (from databases) are UTC."""
        import datetime as dt

        from flakekit.values.timeunits import iso_utc

        plus2 = dt.timezone(dt.timedelta(hours=2))
        assert iso_utc(dt.datetime(2024, 1, 1, 2, 0, tzinfo=plus2)) == "2024-01-01T00:00:00.000Z"
        assert iso_utc(dt.datetime(2016, 4, 30, 11, 18, 25, 796123)) == "2016-04-30T11:18:25.796Z"
        assert iso_utc(None) is None

    def test_layout_compose_json(self, capsys):
        """`layout compose --json` prints the ID, id_str and its parts."""
        code, out, _ = run(capsys, "layout", "compose", "snowflake", "time=2024-01-01T00:00:00Z",
                           "worker=3", "sequence=1", "--json")
        data = json.loads(out)
        assert (code == 0 and data["id"] == 1741610183685058561
                and data["id_str"] == "1741610183685058561")
        assert data["timestamp"] == "2024-01-01T00:00:00.000Z" and data["worker"] == 3

    def test_workers_and_release_json(self, capsys, tmp_path, sqlite_url):
        """`workers --json` times are in the one format; `workers release --json` says
        what it did."""
        import re

        cfg = tmp_path / "w.toml"
        cfg.write_text(f'[backends.main]\nurl = "{sqlite_url}"\n\n[generators.orders]\n'
                       'layout = "snowflake"\nallocator = { type = "sql", backend = "main", '
                       'service = "orders" }\n')
        assert run(capsys, "db", "init", "-c", str(cfg))[0] == 0
        assert run(capsys, "next", "-c", str(cfg))[0] == 0
        out = run_ok(capsys, "workers", "-c", str(cfg), "--json")
        row = json.loads(out)[0]
        assert re.match(self.ISO, row["last_seen"]) and re.match(self.ISO, row["created_at"])
        out = run_ok(capsys, "workers", "release", "0", "-c", str(cfg), "--force", "--json")
        data = json.loads(out)
        assert (data["generator"], data["worker_id"], data["released"]) == ("orders", 0, True)

    def test_db_init_and_upgrade_json(self, capsys, tmp_path, sqlite_url):
        """`db init --json` / `db upgrade --json`: one object per backend and component,
        with what was created, and the same line the text form prints."""
        cfg = tmp_path / "d.toml"
        cfg.write_text(f'[backends.main]\nurl = "{sqlite_url}"\n\n[generators.orders]\n'
                       'layout = "snowflake"\nallocator = { type = "sql", backend = "main", '
                       'service = "orders" }\n')
        out = run_ok(capsys, "db", "init", "-c", str(cfg), "--json")
        [first] = json.loads(out)
        assert (first["backend"], first["component"], first["before"]) == ("main", "workers", None)
        assert first["created"] == ["system_nodes"] and first["changed"] is True
        out = run_ok(capsys, "db", "upgrade", "-c", str(cfg), "--json")
        [again] = json.loads(out)
        assert again["before"] == again["after"] == again["latest"] and again["changed"] is False
        assert again["created"] == [] and "up to date" in again["line"]
