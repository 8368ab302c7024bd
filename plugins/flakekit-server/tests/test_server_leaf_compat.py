"""A Leaf client works unchanged (issue 10 item 5): Leaf's endpoints behave as Leaf's
Spring mappings do, while the JSON API stays strict. Real server process, SQLite."""

from __future__ import annotations

import json
import time

import pytest
from server_testing import (
    Server,
    create_keys,
    ok,
    ok_json,
    run_cli,
    sqlite_config,
    sqlite_server,
)

LEAF_GENERATORS = (
    '[generators.orders]\nstrategy = "snowflake"\n'
    'allocator = { type = "sql", backend = "main" }\n\n'
    '[generators.invoices]\nstrategy = "segment"\nkey = "invoice"\n'
    'store = { type = "sql", backend = "main", keys = "all" }\n'
)


@pytest.fixture(scope="module")
def leaf(tmp_path_factory):
    """Snowflake 'orders'; segment 'invoices' (key invoice) on a store with keys = "all"."""
    with sqlite_server(tmp_path_factory.mktemp("leaf"), LEAF_GENERATORS,
                       keys={"invoice": 100, "leaf-segment-test": 2000}) as server:
        yield server


@pytest.mark.parametrize("path", [
    "/api/segment/get/invoice?_=1701234567890",          # jQuery's cache-buster
    "/api/segment/get/invoice?t=1&t=2&x",                # repeated, valueless
    "/api/segment/get/invoice/",                         # Spring's trailing-slash match
    "/api/snowflake/get/orders?nocache=abc",
    "/api/snowflake/get/orders/",
])
def test_leaf_ignores_query_and_trailing_slash(leaf, path):
    status, headers, body = leaf.get(path)
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain") and body.isdigit()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_leaf_takes_any_method(leaf, method):
    """Leaf's @RequestMapping has no method: POST works as GET does."""
    for path in ("/api/segment/get/invoice", "/api/snowflake/get/orders"):
        status, _, body = leaf.get(path, method=method)
        assert status == 200 and body.isdigit(), (method, path, body)


def test_head_has_no_body_and_never_draws(leaf):
    """HEAD on Leaf's pages: the headers, no body; on its ID URLs a 405 (a HEAD must not
    spend an ID, RFC 9110), whatever else the Spring-style mapping takes."""
    status, headers, body = leaf.get("/db", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, headers, body = leaf.get("/api/segment/get/invoice", method="HEAD")
    assert status == 405 and body == b"" and headers["allow"] == "GET, POST"


def test_json_api_stays_strict(leaf):
    status, _, body = leaf.get("/api/v1/next/orders?_=1")
    assert status == 400 and json.loads(body)["error"] == "bad_request"
    status, _, body = leaf.get("/api/v1/next/orders", method="POST")
    assert status == 405
    status, _, body = leaf.get("/api/v1/next/orders/")
    assert status == 400


def test_decode_error_is_200_with_error_msg(leaf):
    """Leaf answers an unparseable snowflakeId with 200 and {"errorMsg": ...}."""
    for raw in ("abc", "99999999999999999999", "-5"):
        status, data = leaf.json(f"/decodeSnowflakeId?snowflakeId={raw}&_=1")
        assert status == 200 and set(data) == {"errorMsg"}, (raw, data)
    value = int(ok(leaf, "/api/snowflake/get/orders"))
    status, data = leaf.json(f"/decodeSnowflakeId/?snowflakeId={value}", )
    assert status == 200 and set(data) == {"timestamp", "workerId", "sequenceId"}


def test_key_added_while_running_is_served(leaf):
    """keys = "all": a biz_tag inserted into leaf_alloc while the server runs is served
    within about a second of the first miss (Leaf: within a minute)."""
    status, _, body = leaf.get("/api/segment/get/coupon")
    assert status == 404 and json.loads(body)["error"] == "unknown_key"
    assert "segments create coupon" in json.loads(body)["message"]
    create_keys(leaf.url, {"coupon": 50})
    # a miss has the table re-read in the background (the event loop never waits for it)
    deadline = time.monotonic() + 10
    while (got := leaf.get("/api/segment/get/coupon"))[0] != 200:
        assert got[0] == 404 and time.monotonic() < deadline, got
        time.sleep(0.2)
    ids = [int(got[2])] + [int(ok(leaf, "/api/segment/get/coupon")) for _ in range(119)]
    assert ids == sorted(ids) and len(set(ids)) == 120 and ids[0] >= 1
    status, _, body = leaf.get("/api/segment/get/leaf-segment-test")
    assert status == 200 and body.isdigit()
    # the monitor data shows the table's keys under the generator serving them
    data = ok_json(leaf, "/api/v1/status")
    keys = {k["key"] for p in data["processes"] for g in p["generators"]
            if g["name"] == "invoices" for k in g["keys"]}
    assert {"invoice", "coupon", "leaf-segment-test"} <= keys
    assert leaf.json("/ready")[0] == 200


def test_db_page_lists_rows(leaf):
    """Leaf's /db page: the leaf_alloc rows (tag, max, step, update)."""
    status, headers, body = leaf.get("/db?_=2")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "invoice" in page and "leaf-segment-test" in page and "<table>" in page


def test_without_keys_all_new_keys_are_404(tmp_path):
    """The default ("one") serves only the configured keys: a new row is not served."""
    config = sqlite_config(tmp_path, {"invoice": 100}, name="flakekit.toml")
    with Server(config, tmp=tmp_path) as server:
        create_keys(f"sqlite:///{tmp_path / 'ids.db'}", {"coupon": 50})
        status, _, body = server.get("/api/segment/get/coupon")
        assert status == 404, body


def test_bad_keys_value_is_one_line(tmp_path):
    config = sqlite_config(tmp_path, name="flakekit.toml", segments={})
    config.write_text(config.read_text() + '[generators.x]\nstrategy = "segment"\n'
                      'store = { type = "sql", backend = "main", keys = "every" }\n')
    result = run_cli("config", "check", str(config))
    assert result.returncode == 2
    assert "generators.x.store.keys" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_keys_all_two_servers_on_postgresql_never_repeat(tmp_path):
    """Two servers serving every key of one PostgreSQL table: a key created while both run
    is served by both, and no ID comes twice (the row lock hands out disjoint segments)."""
    from concurrent.futures import ThreadPoolExecutor

    from server_testing import fresh_pg

    gen = fresh_pg()
    url = next(gen)
    try:
        create_keys(url, {"invoice": 100})
        config = tmp_path / "flakekit.toml"
        config.write_text(
            f'[backends.main]\nurl = "{url}"\n\n'
            '[generators.invoices]\nstrategy = "segment"\nkey = "invoice"\n'
            'store = { type = "sql", backend = "main", keys = "all" }\n'
        )
        servers = [Server(config, tmp=tmp_path) for _ in range(2)]
        try:
            create_keys(url, {"refund": 20})
            for server in servers:  # each learns the new key from the table
                deadline = time.monotonic() + 10
                while server.get("/api/segment/get/refund")[0] != 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)

            def draw(server: Server) -> list[int]:
                return [int(ok(server, "/api/segment/get/refund")) for _ in range(150)]

            with ThreadPoolExecutor(2) as pool:
                got = [i for ids in pool.map(draw, servers) for i in ids]
            assert len(got) == len(set(got)) == 300
        finally:
            for server in servers:
                assert server.stop() == 0
    finally:
        gen.close()
