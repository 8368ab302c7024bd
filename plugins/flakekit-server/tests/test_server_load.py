"""Load: 1M IDs from concurrent clients over loopback, two server processes, no duplicate."""

from __future__ import annotations

import json
import threading
import time

import pytest
from server_testing import sqlite_config

THREADS = 8
BATCHES = 13        # per thread and generator
BATCH = 5000
SINGLES = 250       # per thread and generator


@pytest.mark.slow
def test_million_ids_no_duplicate(tmp_path, start_server):
    config = sqlite_config(tmp_path, {"invoice": 10_000})
    server = start_server(config, "--workers", "2", "--max-count", str(BATCH))
    got: dict[str, list[list[int]]] = {"orders": [], "invoices": []}
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        mine: dict[str, list[int]] = {"orders": [], "invoices": []}
        conn = server.conn(timeout=30)

        def get(path: str) -> bytes | None:
            """The body of a 200 answer; anything else is noted in ``errors``."""
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                errors.append(f"{path}: {resp.status} {body[:200]!r}")
                return None
            return body

        try:
            for i in range(BATCHES):
                for name in ("orders", "invoices"):
                    if (body := get(f"/api/v1/next/{name}?count={BATCH}")) is None:
                        return
                    mine[name].extend(json.loads(body)["ids"])
                    if i == 0:
                        conn.close()  # a new connection: may land on the other process
            for _ in range(SINGLES):
                for name, path in (("orders", "/api/snowflake/get/orders"),
                                   ("invoices", "/api/segment/get/invoice")):
                    if (body := get(path)) is None:
                        return
                    mine[name].append(int(body))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            conn.close()
        with lock:
            for name, ids in mine.items():
                got[name].append(ids)

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    elapsed = time.monotonic() - started
    assert not errors, errors[:5]
    total = 0
    for name, lists in got.items():
        ids = [i for part in lists for i in part]
        total += len(ids)
        assert len(ids) == THREADS * (BATCHES * BATCH + SINGLES)
        assert len(set(ids)) == len(ids), f"{name}: {len(ids) - len(set(ids))} duplicates"
        for part in lists:   # each client sees its own IDs of a key in increasing order...
            if name == "orders":
                continue     # (snowflake: two processes, k-sorted only)
            batches = part[: BATCHES * BATCH]
            assert all(batches[k] < batches[k + 1] for k in range(BATCH - 1))
    assert total >= 1_000_000
    assert elapsed < 60, f"{total} IDs took {elapsed:.1f} s"
    assert server.json("/ready")[0] == 200
    assert server.stop() == 0
