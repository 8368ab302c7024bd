"""Issue 9 item 8 (CLI part): a failing command prints one line on stderr, always.

Log warnings (fetch retries), ALERTs and the like stay off stderr unless ``-v``. Real
processes (the console script), real databases: a closed port, and a proxy that is cut.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flakekit.testing import proxied, unreachable_url
from flakekit.testing.cli import write_sql_toml

FLAKEKIT = Path(sys.executable).with_name("flakekit")


def _flakekit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLAKEKIT_DEBUG", "FLAKEKIT_CONFIG")}
    return subprocess.run([str(FLAKEKIT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("server", ["mariadb", "postgresql"])
@pytest.mark.parametrize("generator", ["invoice", "orders"])
def test_closed_port_is_one_line(tmp_path, server, generator):
    """`flakekit next GEN` against a database nobody listens on: exit 1, exactly one line
    on stderr; with -v the log lines (retries, the ALERT) are shown too."""
    cfg = write_sql_toml(tmp_path, unreachable_url(server))
    done = _flakekit("next", generator, "-c", str(cfg), cwd=tmp_path)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    loud = _flakekit("-v", "next", generator, "-c", str(cfg), cwd=tmp_path)
    assert loud.returncode == 1
    assert len(loud.stderr.splitlines()) > 1 and loud.stderr.splitlines()[-1] == lines[0]


@pytest.mark.postgresql
def test_cut_proxy_is_one_line(tmp_path, pg_url, tcp_proxy):
    """A key that exists on a database whose connection is then cut: one line, exit 1."""
    from sqlalchemy.engine import make_url

    proxy = tcp_proxy(make_url(pg_url).port or 5432)
    cfg = write_sql_toml(tmp_path, proxied(pg_url, proxy))
    created = _flakekit("segments", "create", "invoice", "--step", "10", "-c", str(cfg),
                        cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    ok = _flakekit("next", "invoice", "-c", str(cfg), cwd=tmp_path)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    proxy.cut()
    done = _flakekit("next", "invoice", "-c", str(cfg), cwd=tmp_path)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
