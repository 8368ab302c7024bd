"""Every endpoint of `flakekit serve` against a real server process on loopback."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from server_testing import (
    Server,
    create_keys,
    exchange,
    fresh_pg,
    ok,
    ok_json,
    run_cli,
    sqlite_config,
    write_config,
)

TOKEN = "s3cret-token-0123456789abcdef"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """One server for the read-mostly tests: snowflake 'orders', segments 'invoices'
    (key invoice) and 'secret' (key secret, needs a token)."""
    tmp = tmp_path_factory.mktemp("api")
    config = sqlite_config(tmp, {"invoice": 100, "secret": 10}, name="flakekit.toml",
                           segments={"invoices": "invoice", "secret": "secret"})
    tokens = tmp / "tokens"
    tokens.write_text(f"# generator token\nsecret {TOKEN}\n")
    server = Server(config, "--max-count", "5000", "--token-file", str(tokens), tmp=tmp)
    yield server
    server.stop()


def is_json_error(body: bytes, status: int, code: str) -> dict:
    data = json.loads(body)
    assert data["status"] == status and data["error"] == code, data
    assert data["message"] and "Traceback" not in data["message"]
    return data


class TestLeafCompatibility:
    def test_snowflake_plain_text(self, api):
        """/api/snowflake/get/{key} answers the ID as plain text, as Leaf does."""
        status, headers, body = api.get("/api/snowflake/get/orders")
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        assert body.isdigit() and int(body) > 0

    def test_segment_plain_text_increasing(self, api):
        """/api/segment/get/{key} answers increasing IDs of the key (biz_tag) as plain text."""
        ids = [int(ok(api, "/api/segment/get/invoice")) for _ in range(250)]
        assert ids == sorted(ids) and len(set(ids)) == 250
        assert ids[0] >= 1

    def test_segment_by_generator_name(self, api):
        """The generator's name works as a Leaf key too."""
        status, _, body = api.get("/api/segment/get/invoices")
        assert status == 200 and body.isdigit()

    def test_leaf_client_unchanged(self, api):
        """A Leaf-style client (plain urllib GET, parse the body as a long) works."""
        with urllib.request.urlopen(f"http://127.0.0.1:{api.port}/api/snowflake/get/orders",
                                    timeout=5) as resp:
            value = int(resp.read().decode())
        assert 0 < value < 2**63

    def test_leaf_decode(self, api):
        """/decodeSnowflakeId answers Leaf's JSON (timestamp, workerId, sequenceId)."""
        value = int(ok(api, "/api/snowflake/get/orders"))
        status, data = api.json(f"/decodeSnowflakeId?snowflakeId={value}")
        assert status == 200
        assert set(data) == {"timestamp", "workerId", "sequenceId"}
        assert int(data["workerId"]) == (value >> 12) & 1023

    def test_unknown_snowflake_key_404(self, api):
        status, _, body = api.get("/api/snowflake/get/nope")
        assert status == 404, body
        data = is_json_error(body, 404, "unknown_key")
        assert "orders" in data["message"] and "--snowflake-default" in data["message"]

    def test_unknown_segment_key_404(self, api):
        status, _, body = api.get("/api/segment/get/invoicee")
        assert status == 404
        assert "did you mean 'invoice'" in is_json_error(body, 404, "unknown_key")["message"]

    @pytest.mark.parametrize("path", ["/api/segment/get/a%20b", "/api/segment/get/%C3%A9",
                                      "/api/snowflake/get/" + "x" * 129, "/api/segment/get/",
                                      "/api/segment/get/a/b", "/api/segment/get/.hidden"])
    def test_invalid_key_400(self, api, path):
        """A key that is not valid gets 400 before it reaches a generator."""
        status, _, body = api.get(path)
        assert status == 400
        is_json_error(body, 400, "bad_request")


class TestJsonApi:
    def test_single(self, api):
        status, data = api.json("/api/v1/next/orders")
        assert status == 200 and data["generator"] == "orders" and data["count"] == 1
        assert len(data["ids"]) == 1

    @pytest.mark.parametrize("name", ["orders", "invoices"])
    def test_batch(self, api, name):
        """count=N gives N distinct IDs, increasing, for every strategy."""
        status, data = api.json(f"/api/v1/next/{name}?count=5000")
        assert status == 200 and data["count"] == 5000
        ids = data["ids"]
        assert len(set(ids)) == 5000 and ids == sorted(ids)

    def test_formats(self, api):
        """strings (safe for JavaScript), ranges (compact) and text (one per line)."""
        data = ok_json(api, "/api/v1/next/orders?count=3&format=strings")
        assert all(isinstance(i, str) and i.isdigit() for i in data["ids"])
        data = ok_json(api, "/api/v1/next/invoices?count=300&format=ranges")
        ids = [i for r in data["ranges"] for i in range(r["start"], r["stop"], r["step"])]
        assert len(set(ids)) == 300
        status, headers, body = api.get("/api/v1/next/orders?count=4&format=text")
        assert status == 200, body
        assert headers["content-type"].startswith("text/plain")
        assert len(body.split()) == 4

    def test_no_id_twice_across_endpoints(self, api):
        got = [int(ok(api, "/api/segment/get/invoice")) for _ in range(5)]
        got += ok_json(api, "/api/v1/next/invoices?count=500")["ids"]
        got += [int(ok(api, "/api/segment/get/invoice")) for _ in range(5)]
        assert len(set(got)) == len(got)

    @pytest.mark.parametrize("query",
                             ["count=0", "count=5001", "count=abc", "count=-1", "count=1.5",
                                       "count=", "count=%EF%BC%91", "count=1&count=2", "cnt=3",
                                       "format=xml"])
    def test_bad_count_400(self, api, query):
        status, _, body = api.get(f"/api/v1/next/orders?{query}")
        assert status == 400, body
        is_json_error(body, 400, "bad_request")

    def test_unknown_generator_404(self, api):
        status, _, body = api.get("/api/v1/next/ordrs")
        assert status == 404, body
        assert "did you mean 'orders'" in is_json_error(body, 404, "unknown_generator")["message"]

    def test_generators(self, api):
        status, data = api.json("/api/v1/generators")
        assert status == 200, data
        names = {g["name"]: g for g in data["generators"]}
        assert set(names) == {"orders", "invoices", "secret"}
        assert names["invoices"]["leaf_url"] == "/api/segment/get/invoice"
        assert names["secret"]["token_required"] and not names["orders"]["token_required"]
        assert data["max_count"] == 5000

    def test_decode(self, api):
        value = ok_json(api, "/api/v1/next/orders")["ids"][0]
        status, data = api.json(f"/api/v1/decode/{value}?generator=orders")
        assert status == 200 and data["id"] == value and data["layout"] == "snowflake"
        assert {"time", "worker", "sequence", "timestamp"} <= set(data)
        assert abs(time.time() - _iso(data["timestamp"])) < 60
        status, data = api.json(f"/api/v1/decode/{value}?layout=sonyflake")
        assert status == 200 and data["layout"] == "sonyflake"

    @pytest.mark.parametrize(("path", "status", "code"), [
        ("/api/v1/decode/abc", 400, "invalid_id"),
        ("/api/v1/decode/-5", 400, "invalid_id"),
        ("/api/v1/decode/99999999999999999999", 400, "invalid_id"),
        ("/api/v1/decode/5?layout=nope", 404, "unknown_layout"),
        ("/api/v1/decode/5?generator=invoices", 404, "unknown_generator"),
        ("/decodeSnowflakeId", 400, "bad_request"),
    ])
    def test_decode_errors(self, api, path, status, code):
        got, _, body = api.get(path)
        assert got == status
        is_json_error(body, status, code)


def _iso(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class TestErrors:
    def test_not_found(self, api):
        status, _, body = api.get("/nope")
        assert status == 404, body
        is_json_error(body, 404, "not_found")

    def test_method_not_allowed(self, api):
        status, headers, body = api.get("/api/v1/next/orders", method="POST")
        assert status == 405 and headers["allow"] == "GET"
        is_json_error(body, 405, "method_not_allowed")

    def test_body_refused(self, api):
        status, _, body = api.get("/api/v1/next/orders", method="GET", body=b"x" * 10)
        assert status == 413, body
        is_json_error(body, 413, "body_too_large")

    def test_url_too_long(self, api):
        status, _, body = api.get("/api/v1/next/orders?" + "a" * 5000)
        assert status == 414, body
        is_json_error(body, 414, "uri_too_long")

    def test_headers_too_large(self, api):
        status, _, body = api.get("/health", headers={f"X-H{i}": "v" * 1000 for i in range(20)})
        assert status == 431, body
        is_json_error(body, 431, "headers_too_large")

    def test_garbage_is_400_json(self, api):
        """Bytes that are not HTTP get a 400 with a JSON body, and the connection closes."""
        data = exchange(api, b"\x16\x03\x01garbage\r\n\r\n", timeout=5)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400")
        is_json_error(body, 400, "bad_request")

    def test_pipelined_requests_answered_in_order(self, api):
        req = b"GET /api/segment/get/invoice HTTP/1.1\r\nHost: x\r\n\r\n"
        data = exchange(api, req * 3 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: "
                                       b"close\r\n\r\n", timeout=5)
        assert data.count(b"HTTP/1.1 200 OK") == 4
        bodies = [part.split(b"HTTP/1.1")[0] for part in data.split(b"\r\n\r\n")[1:4]]
        ids = [int(b) for b in bodies]
        assert ids == sorted(ids) and len(set(ids)) == 3

    def test_health(self, api):
        status, data = api.json("/health")
        assert status == 200 and data["status"] == "ok"


class TestAuth:
    def test_missing_token_401(self, api):
        for path in ("/api/segment/get/secret", "/api/v1/next/secret?count=2"):
            status, headers, body = api.get(path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer")
            is_json_error(body, 401, "unauthorized")

    def test_wrong_token_401(self, api):
        status, _, body = api.get("/api/segment/get/secret",
                                  {"Authorization": "Bearer wrong-token-0000000000"})
        assert status == 401
        is_json_error(body, 401, "unauthorized")
        status, _, body = api.get("/api/segment/get/secret", {"Authorization": f"Basic {TOKEN}"})
        assert status == 401

    def test_right_token(self, api):
        status, _, body = api.get("/api/segment/get/secret", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and body.isdigit()
        status, data = api.json("/api/v1/next/secret?count=3", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and len(data["ids"]) == 3

    def test_open_generator_needs_none(self, api):
        assert api.get("/api/segment/get/invoice")[0] == 200

    @pytest.mark.parametrize(("text", "message"), [
        ("nope abcdefghijklmnopqrstuvwxyz", "unknown generator 'nope'"),
        ("orders short", "too short"),
        ("orders", "expected 'GENERATOR TOKEN'"),
    ])
    def test_bad_token_file_exit_2(self, tmp_path, text, message):
        config = sqlite_config(tmp_path, segments={})
        tokens = tmp_path / "tokens"
        tokens.write_text(text + "\n")
        result = run_cli("serve", "--config", str(config), "--port", "0", "--token-file",
                         str(tokens))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert "tokens:1" in result.stderr


class TestSafeDefaults:
    def test_binds_loopback_by_default(self, api):
        assert api.host == "127.0.0.1"
        status = ok_json(api, "/api/v1/status")
        assert status["server"]["host"] == "127.0.0.1"

    def test_static_allocator_refuses_many_processes(self, tmp_path):
        config = tmp_path / "c.toml"
        config.write_text('[generators.fixed]\nallocator = { type = "static", worker_id = 3 }\n')
        result = run_cli("serve", "--config", str(config), "--port", "0", "--workers", "2")
        assert result.returncode == 2
        assert "generators.fixed.allocator" in result.stderr and "duplicate IDs" in result.stderr

    def test_snowflake_default_serves_any_key(self, tmp_path, start_server):
        """With --snowflake-default, any key works, as Leaf ignores it."""
        config = sqlite_config(tmp_path, segments={})
        server = start_server(config, "--snowflake-default", "orders")
        status, _, body = server.get("/api/snowflake/get/anything")
        assert status == 200 and body.isdigit()

    def test_graceful_shutdown_releases_lease_and_gives_back(self, tmp_path, start_server):
        """SIGTERM: leases released (holder cleared), the segment tail given back."""
        db = tmp_path / "ids.db"
        config = sqlite_config(tmp_path, {"invoice": 1000})
        server = start_server(config)
        assert ok(server, "/api/segment/get/invoice") == b"1"
        assert server.get("/api/snowflake/get/orders")[0] == 200
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT holder FROM system_nodes").fetchone()[0] is not None
            assert conn.execute("SELECT max_id FROM leaf_alloc").fetchone()[0] > 2
        assert server.stop() == 0
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT holder FROM system_nodes").fetchone()[0] is None
            assert conn.execute("SELECT max_id FROM leaf_alloc").fetchone()[0] == 2
        assert "Traceback" not in server.log()


class TestReadiness:
    def test_ready_flips_when_lease_lost(self, tmp_path, start_server):
        """Another holder takes the worker row: the heartbeat fails, /ready goes 503, IDs stop."""
        db = tmp_path / "ids.db"
        config = sqlite_config(tmp_path, {"invoice": 100}, heartbeat="200ms")
        server = start_server(config)
        status, data = server.json("/ready")
        assert status == 200 and data["ready"] is True
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE system_nodes SET version = version + 1, holder = 'thief'")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, data = server.json("/ready")
            if status == 503:
                break
            time.sleep(0.1)
        assert status == 503 and data["ready"] is False
        assert any("orders" in p and "lease lost" in p for p in data["problems"]), data
        status, headers, body = server.get("/api/snowflake/get/orders")
        assert status == 503 and headers["retry-after"] == "1"
        is_json_error(body, 503, "lease_invalid")
        # the segment generator still serves: only the generator that lost its lease stops
        assert server.get("/api/segment/get/invoice")[0] == 200

    def test_not_ready_without_segment_buffer(self, tmp_path, start_server):
        """A segment key whose buffers are empty and cannot refill makes /ready 503."""
        db = tmp_path / "ids.db"
        config = sqlite_config(tmp_path, {"tiny": 2}, segments={"tiny": "tiny"})
        config.write_text(config.read_text().replace('key = "tiny"',
                                                     'key = "tiny"\ndynamic_step = '
                                                     'false\nwait_budget = "100ms"'))
        server = start_server(config)
        assert server.json("/ready")[0] == 200
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE leaf_alloc")
        statuses = [server.get("/api/segment/get/tiny")[0] for _ in range(8)]
        assert 503 in statuses or 404 in statuses
        status, data = server.json("/ready")
        assert status == 503 and any("tiny" in p for p in data["problems"]), data


class TestMultiProcess:
    def test_two_processes_two_leases(self, tmp_path, start_server):
        """--workers 2: each process leases its own worker id; IDs over many connections are
        unique."""
        config = sqlite_config(tmp_path, {"invoice": 1000})
        server = start_server(config, "--workers", "2")
        assert "2 processes" in server.banner
        deadline = time.monotonic() + 10
        while True:
            status = ok_json(server, "/api/v1/status")
            if len(status["processes"]) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        workers = {g["worker_id"] for p in status["processes"] for g in p["generators"]
                   if g["name"] == "orders"}
        assert len(status["processes"]) == 2 and len(workers) == 2, status
        ids = []
        for _ in range(200):  # new connections: spread over both processes
            ids.append(int(ok(server, "/api/snowflake/get/orders")))
            ids.append(int(ok(server, "/api/segment/get/invoice")))
        assert len(set(ids)) == len(ids)
        seen_workers = {(i >> 12) & 1023 for i in ids[::2]}
        assert seen_workers == workers
        assert server.json("/ready")[0] == 200
        assert server.stop() == 0


    def test_sigterm_during_startup_stops_promptly(self, tmp_path, start_server):
        """SIGTERM while the workers are still starting (here: waiting up to 20 s for an
        unreachable ZooKeeper) stops the supervisor and every worker at once, instead of
        waiting for start-up to finish or fail."""
        import os
        import signal

        pytest.importorskip("flakekit_zookeeper")
        config = tmp_path / "slow.toml"
        config.write_text('[generators.orders]\nstrategy = "snowflake"\nallocator = { type = '
                          '"zookeeper", hosts = "127.0.0.1:1", connect_timeout = "20s" }\n')
        server = start_server(config, "--workers", "2", wait=False)
        pid = server.proc.pid
        deadline = time.monotonic() + 10
        children: list[int] = []
        while len(children) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children")
                            .read_text().split()]
            except OSError:
                break
        assert len(children) == 2, children
        time.sleep(0.5)  # the workers are inside kit.start()
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(8)
        except Exception:  # noqa: BLE001
            pass
        took = time.monotonic() - t0
        assert server.proc.returncode is not None and took < 8, f"still running after {took:.1f} s"
        for child in children:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    os.kill(child, 0)
                except ProcessLookupError:
                    break
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state == "Z":
                    break
                time.sleep(0.05)
            else:
                os.kill(child, signal.SIGKILL)
                raise AssertionError(f"worker {child} outlived the supervisor")


@pytest.mark.postgresql
class TestPostgres:
    def test_serves_from_postgresql(self, tmp_path, start_server):
        """`flakekit serve --config FILE` serves IDs from PostgreSQL-backed generators."""
        for url in fresh_pg():
            run = run_cli("db", "init", "--config", str(write_config(tmp_path / "c.toml", url)))
            assert run.returncode == 0, run.stderr
            create_keys(url, {"invoice": 500})
            server = start_server(tmp_path / "c.toml", "--workers", "2")
            ids = [int(ok(server, "/api/snowflake/get/orders")) for _ in range(50)]
            ids += [int(ok(server, "/api/segment/get/invoice")) for _ in range(50)]
            ids += ok_json(server, "/api/v1/next/invoices?count=2000")["ids"]
            ids += ok_json(server, "/api/v1/next/orders?count=2000")["ids"]
            assert len(set(ids)) == len(ids) == 4100
            assert server.json("/ready")[0] == 200
            assert server.stop() == 0
            _check_released_pg(url)


def _check_released_pg(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            holders = conn.execute(text("SELECT holder FROM system_nodes")).scalars().all()
    finally:
        engine.dispose()
    assert holders and all(h is None for h in holders)


def test_cli_help_lists_serve():
    result = run_cli("--help")
    assert "serve" in result.stdout
    assert Path(__file__).name == "test_server_api.py"
