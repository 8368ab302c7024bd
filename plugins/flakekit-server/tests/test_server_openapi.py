"""The OpenAPI document: it names exactly the routes the server has, and schemathesis
finds the running server's answers as the document describes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flakekit_server.app import IdService, ServerOptions
from flakekit_server.openapi import served_paths
from server_testing import sqlite_config

import flakekit

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))


@pytest.fixture
def config(tmp_path):
    return sqlite_config(tmp_path, {"invoice": 100})


def test_document_names_every_route(config, start_server):
    server = start_server(config)
    status, doc = server.json("/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    kit = flakekit.load(config)
    try:
        service = IdService(kit, ServerOptions())
        try:
            routes = served_paths(service)
        finally:
            service.close()
    finally:
        kit.close()
    assert set(doc["paths"]) == routes
    for path, item in doc["paths"].items():
        if path in service.routes:   # the operations pages answer HEAD as well
            assert {"get", "head"} <= set(item), path


#: what the server answers schema-violating requests with: schemathesis' default list
#: plus 414 and 431 (a key or header generated longer than --max-url / the header limit
#: is refused by the transport before any endpoint sees it)
NEGATIVE_STATUSES = ["400", "401", "403", "404", "405", "406", "409", "414", "415", "422",
                     "428", "429", "431", "5xx"]


def test_schemathesis(config, start_server, tmp_path):
    """Examples, coverage and fuzzing phases, a fixed number of examples per operation
    from a fixed seed (deterministic: not bounded by time, which made the amount of data
    depend on the machine's speed). Excluded checks: Leaf's endpoints answer every
    method as Leaf does (unsupported_method), and decode's generator/layout exclusion
    cannot be said in OpenAPI (positive_data_acceptance)."""
    server = start_server(config)
    url = f"http://{server.host}:{server.port}/openapi.json"
    settings = tmp_path / "schemathesis.toml"
    settings.write_text("[checks.negative_data_rejection]\nexpected-statuses = ["
                        + ", ".join(f'"{s}"' for s in NEGATIVE_STATUSES) + "]\n")
    run = subprocess.run(
        [SCHEMATHESIS, "--config-file", str(settings), "run", url, "--checks", "all",
         "--exclude-checks", "unsupported_method,positive_data_acceptance",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "25",
         "--generation-deterministic", "--seed", "1", "--no-color"],
        capture_output=True, text=True, timeout=600)
    lines = run.stdout.strip().splitlines()
    print(lines[-1] if lines else run.stderr)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "failure" not in lines[-1] and "error" not in lines[-1], lines[-1]


@pytest.mark.parametrize("path", [
    "/api/segment/get/invoice%2F",    # an encoded "/" is part of the key: no key has one
    "/api/segment/get/invoices%2F/",
    "/api/snowflake/get/orders%2F",
    "/api/segment/get/invoice%0A",    # "$" alone matches before a final newline
    "/api/v1/next/orders%0A",
    "/api/v1/decode/1?generator=orders%0A",
])
def test_schema_violating_keys_are_400(config, start_server, path):
    """Keys the document's pattern refuses are refused by the server too (schemathesis
    found "invoices%2F" served as "invoices" in a fuzzing run: ST201)."""
    server = start_server(config)
    status, _, body = server.get(path)
    assert status == 400, (path, body)


def test_literal_trailing_slash_still_served(config, start_server):
    """Leaf's endpoints keep taking a literal "/" at the end, as Spring does."""
    server = start_server(config)
    status, _, body = server.get("/api/segment/get/invoice/")
    assert status == 200 and body.isdigit()
