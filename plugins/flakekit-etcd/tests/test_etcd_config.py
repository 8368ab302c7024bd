"""Settings errors name their field; the CLI reports unreachable endpoints, a server that
is not etcd v3 (3.4+), and auth failures in one line; ``flakekit workers`` shows the
lease."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest
from etcdhelpers import SCRIPT, allocator, etcdctl
from flakekit_etcd import EtcdSettings
from flakekit_etcd.errors import EtcdAuthError, EtcdVersionError

from flakekit.errors import BackendError
from flakekit.leases.lease import LeaseRequest
from flakekit.testing import free_port
from flakekit.testing.cli import run_cli
from flakekit.testing.configs import assert_field_error
from flakekit.testing.services import read_env


@pytest.mark.parametrize(("table", "field"), [
    ({"ttl": "1s"}, "ttl"),
    ({"ttl": "2500ms"}, "ttl"),
    ({"ttl": "4s", "safety_window": "2s"}, "safety_window"),
    ({"service": "a/b"}, "service"),
    ({"endpoints": "127.0.0.1:notaport"}, "endpoints"),
    ({"username": "root"}, "password"),
    ({"root": "flakekit/"}, "root"),
    ({"root": "/a//b"}, "root"),
], ids=["ttl-floor", "ttl-whole", "safety", "service", "endpoints", "auth-pair", "root-relative",
        "root-double-slash"])
def test_settings_checks_raise_field_error(table, field):
    assert_field_error(EtcdSettings, table, field)


def _config(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "flakekit.toml"
    path.write_text(textwrap.dedent(f"""
        [generators.orders]
        strategy = "snowflake"
        allocator = {table}
    """))
    return path


def test_unknown_setting_suggests_the_right_one(tmp_path, capsys):
    """A typo in the allocator table: exit 2, one line naming the field, did-you-mean."""
    cfg = _config(tmp_path, '{ type = "etcd", endpoint = "127.0.0.1:2379" }')
    code, _, err = run_cli(capsys, "workers", "--config", str(cfg))
    assert code == 2, err
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "generators.orders.allocator" in line and "endpoints" in line, line


def test_bad_setting_is_one_line_at_the_field(tmp_path, capsys):
    cfg = _config(tmp_path, '{ type = "etcd", ttl = "1s" }')
    code, _, err = run_cli(capsys, "workers", "--config", str(cfg))
    assert code == 2 and "\n" not in err.strip()
    assert "generators.orders.allocator.ttl" in err and "at least 2s" in err, err


def test_unreachable_endpoints_are_one_line(tmp_path, capsys):
    port = free_port()
    cfg = _config(tmp_path, f'{{ type = "etcd", endpoints = "127.0.0.1:{port}", '
                            'connect_timeout = "1s" }')
    code, _, err = run_cli(capsys, "workers", "--config", str(cfg))
    assert code == 1 and "\n" not in err.strip() and "Traceback" not in err
    assert f"127.0.0.1:{port}" in err and "cannot connect" in err, err
    assert "scripts/etcd.sh start" in err


@pytest.fixture
def not_etcd():
    """An HTTP server on loopback that is not an etcd 3.4+: ``/version`` answers an etcd
    3.2 cluster version (no /v3 gateway), anything else 404."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            body = b'{"etcdserver":"3.2.32","etcdcluster":"3.2.0"}'
            self.send_response(200 if self.path == "/version" else 404)
            self.end_headers()
            self.wfile.write(body if self.path == "/version" else b"404 page not found")

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_wrong_api_version_is_one_line(tmp_path, capsys, not_etcd):
    cfg = _config(tmp_path, f'{{ type = "etcd", endpoints = "{not_etcd}" }}')
    code, _, err = run_cli(capsys, "workers", "--config", str(cfg))
    assert code == 1 and "\n" not in err.strip()
    assert "etcd 3.2.32" in err and "3.4 or newer" in err, err
    with pytest.raises(EtcdVersionError):
        allocator("x", endpoints=not_etcd).acquire(LeaseRequest("t", 3, "", 0))


def test_workers_lists_holder_epoch_and_ttl_left(tmp_path, capsys, etcd_endpoints, ns):
    cfg = _config(tmp_path, f'{{ type = "etcd", endpoints = "{etcd_endpoints}", '
                            f'service = "{ns}", ttl = "5s" }}')
    holder = allocator(ns, endpoints=etcd_endpoints, ttl="5s")
    lease = holder.acquire(LeaseRequest("t", 1023, "10.9.8.7", 8080))
    code, out, err = run_cli(capsys, "workers", "--config", str(cfg), "--json")
    holder.close()
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["allocator"] == "etcd" and row["state"] == "held"
    assert row["epoch"] == lease.epoch and row["holder"].startswith("10.9.8.7:8080/")
    assert 0 < row["ttl_left"] <= 5 and row["lease"].startswith("0x")


@pytest.fixture
def etcd_with_auth(etcd_endpoints, tmp_path):
    """A member of its own with auth enabled (root / pw)."""
    svc = tmp_path / "svc"
    env = {**os.environ, "FLAKEKIT_SVC_DIR": str(svc)}
    subprocess.run(["bash", str(SCRIPT), "start"], check=True, timeout=120, env=env)
    endpoints = read_env(svc)["ETCD_ENDPOINTS"]
    try:
        etcdctl(endpoints, "user", "add", "root", "--new-user-password=pw",
                "--interactive=false")
        etcdctl(endpoints, "auth", "enable")
        yield endpoints
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], check=False, timeout=60, env=env)


def test_auth_failures_are_one_line_and_the_right_password_works(tmp_path, capsys,
                                                                   etcd_with_auth):
    base = f'type = "etcd", endpoints = "{etcd_with_auth}"'
    for extra, want in (("", "set username and password"),
                        (', username = "root", password = "nope"', "check username")):
        cfg = _config(tmp_path, f"{{ {base}{extra} }}")
        code, _, err = run_cli(capsys, "workers", "--config", str(cfg))
        assert code == 1 and "\n" not in err.strip(), err
        assert "authentication failed" in err and want in err, err
    with pytest.raises(BackendError, match="authentication failed"):
        allocator("x", endpoints=etcd_with_auth).acquire(LeaseRequest("t", 3, "", 0))
    ok = allocator("x", endpoints=etcd_with_auth, username="root", password="pw")
    lease = ok.acquire(LeaseRequest("t", 3, "", 0))
    assert lease.worker_id == 0
    ok.renew(lease, 0)
    ok.close()
    assert issubclass(EtcdAuthError, BackendError)
