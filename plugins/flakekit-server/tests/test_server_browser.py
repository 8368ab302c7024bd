"""The monitor page in real headless Chromium (Debian's chromium package).

The test loads ``/`` and checks what a person would see after the page's script ran:
generator names, worker ids, both buffers of each segment key. A screenshot goes to
``test-artifacts/`` (git-ignored) for a human to look at.
"""

from __future__ import annotations

import re
from pathlib import Path

from server_testing import (
    chromium,
    dump_dom,
    needs_chromium,
    sqlite_config,
    start_loaded,
    table_rows,
)

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"

pytestmark = needs_chromium


class TestMonitorPage:
    def test_page_shows_generators_leases_and_buffers(self, tmp_path, start_server):
        server = start_loaded(tmp_path, start_server)
        page = f"http://127.0.0.1:{server.port}/"

        dom = dump_dom(tmp_path, page)
        assert 'class="badge ok">ready<' in dom, dom[:3000]
        leases = table_rows(dom, "leases")
        assert len(leases) == 1
        name, process, layout, worker, epoch, left, *_rest, issued, state = leases[0]
        assert (name, process, layout, worker, epoch, issued, state) == (
            "orders", "0", "snowflake", "0", "1", "42", "ok")
        assert float(left) > 0
        segs = {row[0]: row for row in table_rows(dom, "segments")}
        assert set(segs) == {"invoice", "payment"}
        inv = segs["invoice"]
        # key, generator, process, step, issued, current pos/end/step/ready, next pos/end/step/ready
        assert inv[1:5] == ["invoices", "0", "1000", "7"]
        assert inv[5:9] == ["8", "1001", "1000", "yes"]
        assert inv[12] in ("yes", "no")
        assert segs["payment"][5:9] == ["1", "51", "50", "yes"]
        # HTTP per endpoint: the requests above, with a rate and p50/p99 latency
        http = {row[0]: row for row in table_rows(dom, "http")}
        route, rate, count, errors, p50, p99, mean = http["leaf_segment"]
        assert (count, errors) == ("7", "0") and float(rate) > 0
        for shown in (p50, p99, mean):
            assert re.fullmatch(r"(> )?[\d.]+ (\u00b5s|ms|s)", shown), http["leaf_segment"]
        assert http["next"][2] == "1"
        assert re.search(r"\bup [\d.]+ (ms|s|min)", dom), "no uptime in the summary"
        assert 'class="bar lease-bar"' in dom and 'class="bar gone-bar lease-bar"' not in dom

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "monitor-page.png"
        shot.unlink(missing_ok=True)
        result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,700", page)
        assert result.returncode == 0, result.stderr[-2000:]
        assert shot.stat().st_size > 10_000

    def test_page_shows_not_ready(self, tmp_path, start_server):
        """When a lease is lost the page says so, in red, with the reason."""
        import sqlite3
        import time

        db = tmp_path / "ids.db"
        config = sqlite_config(tmp_path, heartbeat="200ms", segments={})
        server = start_server(config)
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE system_nodes SET version = version + 1, holder = 'thief'")
        deadline = time.monotonic() + 10
        while server.get("/ready")[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        result = chromium(tmp_path, "--dump-dom", f"http://127.0.0.1:{server.port}/")
        dom = result.stdout
        assert 'class="badge bad">not ready<' in dom
        assert "<title>NOT READY" in dom
        assert "lease lost" in dom
        # the lease bar is red and says LOST (not the old deadline counting down), with
        # what to do; the process's chip says not ready
        card = dom.split('class="card generator-card bad"', 1)[1].split('class="card', 1)[0]
        assert 'class="fill gone"' in card and ">LOST \u00b7 worker 0" in card
        assert " s left" not in card and " min " not in card.split("What to do")[0]
        assert "What to do: This generator issues no IDs" in card
        assert "flakekit workers list" in card
        assert table_rows(dom, "leases")[0][5] == "lost"
        chip = dom.split('class="proc running not-ready"', 1)[1].split("</div>", 1)[0]
        assert ">process 0<" in chip and "not ready" in chip
