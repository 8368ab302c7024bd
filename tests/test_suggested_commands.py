"""Issue 9 item 7: every suggested command works when pasted, and `config check` refuses
what building refuses.

`flakekit db init` creates every table the config needs (``leaf_alloc`` included); the
unknown-key hint names the key and the config, and running it fixes the error; `config
check` fails (exit 2, one line naming the field) for a layout whose epoch is in the future
and for durations no database can hold, without connecting to any database.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from flakekit.testing import unreachable_url
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok, run_refused, write_segment_toml, write_sql_toml, write_toml


def _on_layout(tmp_path: Path, name: str, fields: str, epoch: str) -> Path:
    """A config whose one generator, g (static worker 1), uses layout ``name``, defined by
    ``fields`` (TOML) and ``epoch``."""
    return write_toml(tmp_path, f"""
        [layouts.{name}]
        fields = {fields}
        epoch = "{epoch}"

        [generators.g]
        layout = "{name}"
        allocator = {{ type = "static", worker_id = 1 }}
    """)


def _on_sql(tmp_path: Path, url: str, settings: str) -> Path:
    """A config whose one generator, g, takes its worker id from the ``sql`` allocator
    on backend ``default`` at ``url``, with ``settings`` (inline-table TOML) added."""
    return write_toml(tmp_path, f"""
        [backends.default]
        url = "{url}"

        [generators.g]
        allocator = {{ type = "sql", {settings} }}
    """)


def _initialised_segment(capsys, tmp_path: Path, name: str, setting: str) -> Path:
    """A config whose one generator is segment ``name`` (one more TOML line: ``setting``) on
    ./ids.db, after `flakekit db init` on it succeeded."""
    cfg = write_segment_toml(tmp_path, "sqlite:///ids.db", name, setting)
    run_ok(capsys, "db", "init", "-c", str(cfg))
    return cfg


def _tables(url: str) -> set[str]:
    """The table names in the database at ``url``."""
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


class TestConfigCheckRefusesWhatBuildingRefuses:
    def test_layout_epoch_in_the_future(self, capsys, tmp_path):
        """A generator on a layout that starts in 2999: config check exits 2 with one
        line naming the generator's layout field, as `next` does."""
        cfg = _on_layout(tmp_path, "later", '[["time", 41], ["worker", 10], ["sequence", 12]]',
                         "2999-01-01T00:00:00Z")
        for args in (("config", "check", str(cfg)), ("next", "-c", str(cfg))):
            code, out, err = run(capsys, *args)
            assert code == 2, (args, out, err)
            assert err.count("\n") == 1
            assert err.startswith("error: generators.g.layout: layout 'later' starts at 2999-01-01")
            assert "in the future" in err

    def test_time_field_full(self, capsys, tmp_path):
        """A layout whose time bits ran out long ago is refused by config check too."""
        cfg = _on_layout(tmp_path, "short", '[["time", 20], ["worker", 31], ["sequence", 12]]',
                         "2000-01-01T00:00:00Z")
        err = run_refused(capsys, "config", "check", str(cfg))
        assert err.startswith("error: generators.g.layout: layout 'short': the time field is "
                              "full since 2000-01-01")

    @pytest.mark.parametrize(("key", "value"), [
        ("reclaim_after", '["100000000000d"]'),
        ("reclaim_after", '["36501d", "1d"]'),
        ("max_start_wait", '"1000000000h"'),
        ("max_start_wait", "1e30"),
    ])
    def test_durations_no_database_can_hold(self, capsys, tmp_path, key, value):
        """Durations past 100 years fail config check with one line naming the field
        (they used to pass and then crash at start-up with an OverflowError)."""
        cfg = _on_sql(tmp_path, "sqlite:///ids.db", f"{key} = {value}")
        err = run_refused(capsys, "config", "check", str(cfg))
        assert err.count("\n") == 1
        assert err.startswith(f"error: generators.g.allocator.{key}: a duration must be at most "
                              "36500d")
        assert "OverflowError" not in run_refused(capsys, "next", "-c", str(cfg))

    def test_longest_duration_works_on_every_backend(self, capsys, tmp_path, db_url):
        """The longest accepted reclaim age leases, renews and issues on every database."""
        cfg = _on_sql(tmp_path, db_url, 'reclaim_after = ["36500d"], create_schema = true')
        run_ok(capsys, "config", "check", str(cfg))
        out = run_ok(capsys, "next", "-n", "3", "-c", str(cfg))
        assert len(set(out.split())) == 3

    def test_check_contacts_no_database(self, capsys, tmp_path):
        """Backends nobody listens on: config check still builds everything and says ok."""
        cfg = write_toml(tmp_path, f"""
            [backends.pg]
            url = "{unreachable_url('postgresql')}"
            [backends.my]
            url = "{unreachable_url('mariadb')}"

            [generators.a]
            allocator = {{ type = "sql", backend = "pg" }}
            [generators.b]
            strategy = "segment"
            store = {{ type = "sql", backend = "my" }}
        """)
        out = run_ok(capsys, "config", "check", str(cfg))
        assert "ok (2 generators: a, b" in out


class TestPastedCommands:
    def test_db_init_creates_leaf_alloc_and_the_key_hint_works(self, capsys, tmp_path, db_url):
        """db init creates system_nodes AND leaf_alloc; `next` on a missing key suggests
        `flakekit segments create KEY --step 1000 -c CONFIG`, which, pasted, fixes it."""
        cfg = write_sql_toml(tmp_path, db_url)
        out = run_ok(capsys, "db", "init", "-c", str(cfg))
        assert {"system_nodes", "leaf_alloc", "flakekit_schema"} <= _tables(db_url)
        assert "leaf_alloc" in out
        code, _, err = run(capsys, "next", "invoice", "-c", str(cfg))
        assert code == 2, err
        hint = f"`flakekit segments create invoice --step 1000 -c {cfg}`"
        assert hint in err, err
        pasted = shlex.split(hint.strip("`"))
        run_ok(capsys, *pasted[1:])
        out = run_ok(capsys, "next", "invoice", "-n", "2", "-c", str(cfg))
        assert out.split() == ["1", "2"]
        run_ok(capsys, "next", "orders", "-c", str(cfg))

    def test_db_init_on_a_segment_only_config_with_its_own_table(self, capsys, tmp_path):
        """A store with its own table name gets that table, and no unrelated one."""
        _initialised_segment(capsys, tmp_path, "invoice",
                             'store = { type = "sql", backend = "default", table = "my_alloc" }')
        tables = _tables(f"sqlite:///{tmp_path / 'ids.db'}")
        assert "my_alloc" in tables and "leaf_alloc" not in tables

    def test_key_hint_quotes_what_the_shell_would_split(self, tmp_path):
        """A key or config path with spaces is quoted so the pasted command still works."""
        from flakekit.errors import UnknownKeyError

        err = UnknownKeyError("my key").for_config(str(tmp_path / "a b" / "flakekit.toml"))
        command = str(err).split("`")[1]
        assert shlex.split(command)[3] == "my key"
        assert shlex.split(command)[-1] == str(tmp_path / "a b" / "flakekit.toml")

    def test_key_hint_names_the_config_when_found_after_start(self, capsys, tmp_path):
        """With preload = false the missing key surfaces at next_id(): same hint."""
        cfg = _initialised_segment(capsys, tmp_path, "lazy", "preload = false")
        code, _, err = run(capsys, "next", "lazy", "-c", str(cfg))
        assert code == 2
        assert f"`flakekit segments create lazy --step 1000 -c {cfg}`" in err, err
