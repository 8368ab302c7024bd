"""A database that accepts TCP but never answers fails within connect_timeout, and the
error says which database (issue 9, item 8, database part).

The proxy's stall mode is that server: connections are accepted, nothing comes back.
``statement_timeout`` is set to ten minutes, so the socket read timeout derived from it
(before the fix, the one the MariaDB handshake waited on) is far longer than any bound
here; the 2 s connect_timeout must be what ends the wait.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flakekit.errors import BackendError
from flakekit.leases.lease import LeaseRequest
from flakekit.sql.backends import BackendPool, BackendSettings
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing.threads import Call
from flakekit.values.clock import MonotonicClock

pytestmark = pytest.mark.slow

NS = 1_000_000_000
SERVERS = [
    pytest.param("postgresql+psycopg://postgres:hunter2@127.0.0.1:{port}/test", 5432,
                 marks=pytest.mark.postgresql, id="postgresql"),
    pytest.param("mysql+pymysql://root:hunter2@127.0.0.1:{port}/test", 3306,
                 marks=pytest.mark.mariadb, id="mariadb"),
]


@pytest.mark.parametrize(("url", "port"), SERVERS)
def test_acquire_against_a_silent_server(url, port, tcp_proxy):
    """Acquire fails with one line naming the database (password hidden), well before
    the ten-minute read timeout."""
    proxy = tcp_proxy(port)
    proxy.stall()
    url = url.format(port=proxy.port)
    pool = BackendPool({"b": BackendSettings(url, connect_timeout=2 * NS,
                                             statement_timeout=600 * NS)})
    try:
        alloc = SqlWorkerAllocator(engine=pool.engine("b"), service="s",
                                   clock=MonotonicClock(), host="10.0.0.1", port=1)
        with pytest.raises(BackendError) as info:
            Call(lambda: alloc.acquire(LeaseRequest("s", 1023, "", 0))).join(120)
    finally:
        pool.dispose()
    message = str(info.value)
    assert f"127.0.0.1:{proxy.port}" in message and "***" in message
    assert "hunter2" not in message and "\n" not in message


@pytest.mark.parametrize(("url", "port"), SERVERS)
def test_db_init_against_a_silent_server(url, port, tcp_proxy, tmp_path):
    """`flakekit db init` gives up after the connect timeout (once, not once per step),
    exits 1 and names the database on its last line."""
    proxy = tcp_proxy(port)
    proxy.stall()
    cfg = tmp_path / "flakekit.toml"
    cfg.write_text(f'[backends.default]\nurl = "{url.format(port=proxy.port)}"\n'
                   'connect_timeout = "2s"\nstatement_timeout = "10m"\n')
    done = subprocess.run([sys.executable, "-m", "flakekit.cli", "db", "init", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=150, env=dict(os.environ))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{proxy.port}" in last and "hunter2" not in done.stderr
