"""The monitor page's pictures in real headless Chromium (Debian's chromium package): the
buffers as fill bars (grey, not red, while the next buffer is not loaded), the IDs/s
sparkline from the server's per-second samples, the lease bar, the processes, the
segment table; no horizontal scroll at phone width; keys inserted as text only."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import sqlite3
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from server_testing import dump_dom, needs_chromium, sqlite_config, start_loaded

from flakekit.testing.waiting import wait_until

pytestmark = needs_chromium

EVIL = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


def status(server) -> dict:
    code, body = server.json("/api/v1/status")
    assert code == 200
    return body


def generator(snap: dict, name: str) -> dict:
    return next(g for g in snap["processes"][0]["generators"] if g["name"] == name)


@contextlib.contextmanager
def same_origin_proxy(port: int, probe: bytes) -> Iterator[int]:
    """Serves ``probe`` at /probe and forwards every other GET to the server on ``port``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            if self.path == "/probe":
                code, ctype, body = 200, "text/html", probe
            else:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{self.path}",
                                                timeout=10) as r:
                        code, ctype, body = r.status, r.headers["Content-Type"], r.read()
                except urllib.error.HTTPError as err:
                    code, ctype, body = err.code, err.headers["Content-Type"], err.read()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy.server_address[1]
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(10)


@pytest.fixture
def loaded(tmp_path, start_server):
    """A server on SQLite with keys invoice and payment, 7 segment IDs and 42 snowflake IDs
    drawn, after the per-second tick sampled them."""
    server = start_loaded(tmp_path, start_server)
    wait_until(lambda: sum(generator(status(server), "orders")["rate_per_s"]) == 42, 30,
               what="the tick to sample the 42 IDs", interval=0.2)
    return server


class TestRateSamples:
    def test_status_has_per_second_counts_of_each_generator(self, loaded):
        """The IDs drawn show up in the ring of per-second counts, once, in one second."""
        snap = status(loaded)
        orders = generator(snap, "orders")["rate_per_s"]
        assert sum(orders) == 42 and max(orders) == 42
        assert all(n >= 0 for n in orders) and len(orders) <= 300
        assert sum(generator(snap, "invoices")["rate_per_s"]) == 7
        assert sum(generator(snap, "payments")["rate_per_s"]) == 0


class TestMonitorPictures:
    def test_bars_sparkline_lease_processes_and_table_render(self, tmp_path, loaded):
        dom = dump_dom(tmp_path, f"http://127.0.0.1:{loaded.port}/")
        # per key: two buffers; invoice's current one is 7 of 1000 used, next not loaded
        assert len(re.findall(r'class="card segment-card"', dom)) == 2, dom[:4000]
        invoice = dom.split('<span class="key">invoice</span>', 1)[1].split("segment-card", 1)[0]
        fills = re.findall(r'class="bar buffer ready-buffer" data-fill="([0-9.]+)"', invoice)
        assert fills[0] == "0.993", invoice
        assert "993 of 1,000 left" in invoice
        if len(fills) == 1:   # the next buffer is not loaded yet: grey, never red
            pending = re.search(r'<div class="bar pending buffer pending-buffer">(.*?)</div>',
                                invoice, re.S)
            assert pending and "not loaded yet" in pending.group(1)
            assert "no" not in re.findall(r'class="([^"]*)"', pending.group(0))[0].split()
        # per generator: the sparkline is drawn from the samples, the lease is a bar
        spark = dom.split('<span class="name">orders</span>', 1)[1].split("</svg>", 1)[0]
        assert '<svg class="spark"' in spark
        assert re.search(r'<path class="line" d="M[0-9.]+ [0-9.]+', spark), spark
        assert "<title>max 42 IDs/s over" in spark
        lease = re.search(r'class="fill lease" style="width: ([0-9.]+)%', dom)
        assert lease and float(lease.group(1)) > 0
        assert "s left" in dom
        # the processes and their restarts
        assert re.search(r"<b>process 0</b>.*?0 restarts", dom, re.S)
        # the segment table, as /db shows it
        rows = re.findall(r'<tr class="db-row">(.*?)</tr>', dom, re.S)
        assert sorted(re.sub(r"<[^>]+>", "|", r).split("|")[1] for r in rows) == [
            "invoice", "payment"]
        assert '<a href="/db">' in dom

    def test_narrow_screen_has_no_horizontal_scroll(self, tmp_path, loaded):
        """At 390 px wide (a phone), nothing is wider than the screen. A probe page in the
        same origin (a small proxy in front of the server) measures the page in an iframe."""
        probe = (
            b"<!doctype html><body style='margin:0'>"
            b"<iframe id=f src='/' width=390 height=844 style='border:0'></iframe>"
            b"<pre id=out>waiting</pre><script>"
            b"setTimeout(function(){var o=document.getElementById('out');try{"
            b"var d=document.getElementById('f').contentDocument;"
            b"var e=d.documentElement;o.textContent="
            b"JSON.stringify({scroll:e.scrollWidth,client:e.clientWidth,"
            b"cards:d.querySelectorAll('.card').length,"
            b"sparks:d.querySelectorAll('svg.spark path.line').length});"
            b"}catch(x){o.textContent=JSON.stringify({error:String(x)});}},2500);"
            b"</script>")
        with same_origin_proxy(loaded.port, probe) as port:
            dom = dump_dom(tmp_path, f"http://127.0.0.1:{port}/probe", "--hide-scrollbars",
                           "--window-size=800,900")
        out = json.loads(re.search(r'<pre id="out">(.*?)</pre>', dom, re.S).group(1))
        assert "error" not in out, out
        assert out["client"] == 390, out
        assert out["scroll"] <= out["client"], out
        assert out["cards"] == 3 and out["sparks"] == 1, out

    def test_keys_are_text_not_markup(self, tmp_path, start_server):
        """A key in the table that is HTML shows as text; its script never runs."""
        config = sqlite_config(tmp_path, {"invoice": 100}, segments={"invoices": "invoice"})
        with sqlite3.connect(tmp_path / "ids.db") as conn:
            conn.execute("INSERT INTO leaf_alloc (biz_tag, max_id, step, description) "
                         "SELECT ?, max_id, step, description FROM leaf_alloc", (EVIL,))
        server = start_server(config)
        dom = dump_dom(tmp_path, f"http://127.0.0.1:{server.port}/")
        assert "<title>flakekit server</title>" in dom and "pwned" not in dom.split("<body", 1)[0]
        assert "&lt;script&gt;document.title=" in dom, dom[-3000:]
        assert "<script>document.title" not in dom

