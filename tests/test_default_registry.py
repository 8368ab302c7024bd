"""Issue 9 item 1: no duplicate IDs on one host from the default setups.

The embedded default keeps its registry in one per-user state directory (not the working
directory), relative SQLite paths in a config are taken from the config file's directory,
and with no --config the lookup is $FLAKEKIT_CONFIG, ./flakekit.toml, the embedded default.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FLAKEKIT = Path(sys.executable).with_name("flakekit")

#: leases a worker on the embedded default, issues IDs, and keeps the lease until told
HOLDER = textwrap.dedent("""
    import logging, pathlib, sys, time
    import flakekit

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out, go, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
    with flakekit.load() as kit:
        gen = kit["default"]
        ids = list(gen.next_ids(n))
        out.write_text(f"{gen.worker_id}\\n" + "\\n".join(map(str, ids)) + "\\n")
        deadline = time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
""")


def _default_env(home: Path) -> dict[str, str]:
    """The environment of a user with no flakekit settings (own XDG state home)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLAKEKIT_STATE_DIR", "FLAKEKIT_CONFIG", "FLAKEKIT_DEBUG")}
    env["XDG_STATE_HOME"] = str(home / "state")
    env["HOME"] = str(home)
    return env


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        for proc in procs:
            if proc.poll() is not None and proc.returncode != 0:
                raise AssertionError(f"holder exited {proc.returncode}: {proc.communicate()}")
        assert time.monotonic() < deadline, "holders did not start in time"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_processes_from_two_directories_share_the_default_registry(tmp_path):
    """Drill (default settings): two live processes started in two different working
    directories lease different worker ids from one registry, and no ID repeats."""
    env = _default_env(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    go = tmp_path / "go"
    outs = [tmp_path / "a.out", tmp_path / "b.out"]
    n = 20_000
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(go), str(n)], cwd=cwd,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cwd, out in zip((a, b), outs, strict=True)
    ]
    try:
        _wait_for(outs, procs)  # both hold their lease now
    finally:
        go.write_text("")
        results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    workers, ids = [], []
    for out in outs:
        first, *rest = out.read_text().split()
        workers.append(int(first))
        ids += map(int, rest)
    assert workers[0] != workers[1]
    assert len(ids) == 2 * n and len(set(ids)) == len(ids)
    registry = tmp_path / "state" / "flakekit" / "flakekit.db"
    assert registry.exists()
    assert not (a / "flakekit.db").exists() and not (b / "flakekit.db").exists()
    # side by side on the embedded default is the normal case: no "clone?" warning
    for _, err in results:
        assert "clone" not in err and "WARNING" not in err, err


def test_cli_next_uses_the_state_dir_from_any_directory(tmp_path):
    """`flakekit next` from two directories writes one registry in the state directory."""
    env = _default_env(tmp_path)
    for name in ("x", "y"):
        cwd = tmp_path / name
        cwd.mkdir()
        done = subprocess.run([str(FLAKEKIT), "next", "-n", "3"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.split()) == 3 and done.stderr == ""
        assert not (cwd / "flakekit.db").exists()
    assert (tmp_path / "state" / "flakekit" / "flakekit.db").exists()


def test_second_side_by_side_kit_logs_no_clone_warning(tmp_path, caplog):
    """Two live holders with no port identity (port 0) on one host are expected: the
    second takes another id without a 'clone or a second instance?' warning."""
    import flakekit

    caplog.set_level(logging.INFO, logger="flakekit")
    with flakekit.load() as one, flakekit.load() as two:
        assert one["default"].worker_id != two["default"].worker_id
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "clone" in w], warnings


def test_state_dir_env_overrides_platformdirs(tmp_path, monkeypatch):
    """$FLAKEKIT_STATE_DIR wins; without it the user state dir of platformdirs."""
    import platformdirs

    from flakekit.assembly.config import load_config, state_dir

    monkeypatch.setenv("FLAKEKIT_STATE_DIR", str(tmp_path / "s"))
    assert state_dir() == tmp_path / "s"
    config = load_config(None)
    assert config.backends["default"].url == f"sqlite:///{tmp_path / 's' / 'flakekit.db'}"
    assert (tmp_path / "s").is_dir()
    monkeypatch.delenv("FLAKEKIT_STATE_DIR")
    assert state_dir() == Path(platformdirs.user_state_dir("flakekit", appauthor=False))


def test_unwritable_state_dir_is_one_line(tmp_path):
    """A state directory that cannot be created names the variable to set."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**os.environ, "FLAKEKIT_STATE_DIR": str(blocker / "sub")}
    done = subprocess.run([str(FLAKEKIT), "next"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "FLAKEKIT_STATE_DIR" in done.stderr, done.stderr


class TestRelativeSqlitePaths:
    def test_config_in_a_used_from_b_uses_the_file_under_a(self, tmp_path):
        """The quickstart's `sqlite:///ids.db` in A/flakekit.toml, run from B, is A/ids.db."""
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir()
        b.mkdir()
        (a / "flakekit.toml").write_text(textwrap.dedent("""
            [backends.main]
            url = "sqlite:///ids.db"

            [generators.orders]
            allocator = { type = "sql", backend = "main", service = "orders" }
        """))
        done = subprocess.run([str(FLAKEKIT), "next", "-n", "2", "-c", "../a/flakekit.toml"],
                              cwd=b, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (a / "ids.db").exists()
        assert not (b / "ids.db").exists()

    def test_anchor_rules(self, tmp_path):
        """Only relative file paths move; absolute, in-memory and non-SQLite URLs stay."""
        from flakekit.assembly.config import anchor_sqlite_url

        assert anchor_sqlite_url("sqlite:///ids.db", tmp_path) == f"sqlite:///{tmp_path}/ids.db"
        assert anchor_sqlite_url("sqlite+pysqlite:///d/ids.db?timeout=5", tmp_path) == (
            f"sqlite+pysqlite:///{tmp_path}/d/ids.db?timeout=5")
        for url in ("sqlite:////abs/ids.db", "sqlite://", "sqlite:///:memory:",
                    "postgresql+psycopg://u@h/db", "sqlite:///file:ids.db?uri=true"):
            assert anchor_sqlite_url(url, tmp_path) == url

    def test_parsed_config_keeps_the_working_directory(self):
        """A config built in code (no file) has no directory to anchor to."""
        from flakekit.assembly.config import parse_config

        config = parse_config({"backends": {"x": {"url": "sqlite:///ids.db"}}})
        assert config.backends["x"].url == "sqlite:///ids.db"


class TestConfigLookup:
    def test_order(self, tmp_path, monkeypatch):
        """--config, else $FLAKEKIT_CONFIG, else ./flakekit.toml, else the embedded default."""
        from flakekit.assembly.config import find_config

        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("FLAKEKIT_CONFIG", raising=False)
        assert find_config().path is None
        (tmp_path / "flakekit.toml").write_text("")
        assert find_config().path == "flakekit.toml"
        monkeypatch.setenv("FLAKEKIT_CONFIG", "/etc/ids.toml")
        assert find_config().path == "/etc/ids.toml"
        assert find_config("mine.toml").path == "mine.toml"

    def test_cli_uses_local_flakekit_toml_and_says_so_with_v(self, tmp_path):
        """No --config: ./flakekit.toml is used; -v names it; config check prints it."""
        (tmp_path / "flakekit.toml").write_text(textwrap.dedent("""
            [generators.local]
            allocator = { type = "static", worker_id = 5 }
        """))
        env = {k: v for k, v in os.environ.items() if k != "FLAKEKIT_CONFIG"}
        quiet = subprocess.run([str(FLAKEKIT), "next", "--json"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert quiet.returncode == 0 and '"generator": "local"' in quiet.stdout
        assert quiet.stderr == ""
        for args in (["-v", "next"], ["next", "-v"]):
            loud = subprocess.run([str(FLAKEKIT), *args], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert loud.returncode == 0, loud.stderr
            assert "config: flakekit.toml (found in the working directory)" in loud.stderr
        check = subprocess.run([str(FLAKEKIT), "config", "check"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == 0
        assert check.stdout.startswith("flakekit.toml (found in the working directory): ok")

    def test_env_config_and_embedded_default_are_named(self, tmp_path):
        """$FLAKEKIT_CONFIG is named as such; with nothing, config check names the embedded
        default and its registry file."""
        cfg = tmp_path / "env.toml"
        cfg.write_text('[generators.e]\nallocator = { type = "static", worker_id = 1 }\n')
        env = {**os.environ, "FLAKEKIT_CONFIG": str(cfg)}
        loud = subprocess.run([str(FLAKEKIT), "-v", "next"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert loud.returncode == 0 and f"config: {cfg} ($FLAKEKIT_CONFIG)" in loud.stderr
        env = {k: v for k, v in os.environ.items() if k != "FLAKEKIT_CONFIG"}
        env["FLAKEKIT_STATE_DIR"] = str(tmp_path / "st")
        check = subprocess.run([str(FLAKEKIT), "config", "check"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == 0
        assert check.stdout.startswith(
            f"the embedded default (registry {tmp_path / 'st' / 'flakekit.db'};")


def test_relative_state_dir_is_refused(monkeypatch):
    """A relative FLAKEKIT_STATE_DIR would again mean one registry per working directory."""
    from flakekit.assembly.config import load_config
    from flakekit.errors import ConfigError

    monkeypatch.setenv("FLAKEKIT_STATE_DIR", "state")
    with pytest.raises(ConfigError, match="FLAKEKIT_STATE_DIR: 'state' is not an absolute path"):
        load_config(None)
