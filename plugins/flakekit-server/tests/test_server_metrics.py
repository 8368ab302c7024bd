"""/metrics: Prometheus text format with every number the issue lists."""

from __future__ import annotations

import re
import sqlite3
import time

import pytest
from server_testing import ok, sqlite_config

SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(\{([a-z_]+="(\\.|[^"\\])*",?)*\})? '
                    r'(-?[0-9.e+-]+|NaN|[+-]Inf)$')


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse the exposition strictly: every line is a comment or a well-formed sample."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("# HELP "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name = match.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no # TYPE"
        labels = dict(re.findall(r'([a-z_]+)="((?:\\.|[^"\\])*)"', match.group(2) or ""))
        out.setdefault(name, []).append((labels, float(match.group(5).replace("Inf", "inf"))))
    return out


def value(metrics, name: str, **labels: str) -> float:
    found = [v for lab,
             v in metrics.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, metrics.get(name))
    return found[0]


@pytest.fixture
def server(tmp_path, start_server):
    config = sqlite_config(tmp_path, {"invoice": 100}, heartbeat="200ms")
    srv = start_server(config)
    srv.db = tmp_path / "ids.db"
    return srv


class TestMetrics:
    def test_content(self, server):
        """IDs issued, lease remaining and epoch, segment buffers, fetch and request latency."""
        for _ in range(10):
            assert server.get("/api/snowflake/get/orders")[0] == 200
        assert server.get("/api/v1/next/orders?count=90")[0] == 200
        for _ in range(150):   # past the first segment of 100: a second fetch
            assert server.get("/api/segment/get/invoice")[0] == 200
        assert server.get("/api/v1/next/nope")[0] == 404
        time.sleep(0.5)        # a couple of heartbeats
        status, headers, body = server.get("/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        m = parse(body.decode())
        assert value(m, "flakekit_ids_issued_total", generator="orders", process="0") == 100
        assert value(m, "flakekit_ids_issued_total", generator="invoices", process="0") == 150
        assert value(m, "flakekit_server_ready", process="0") == 1
        assert value(m, "flakekit_worker_id", generator="orders") == 0
        assert value(m, "flakekit_lease_epoch", generator="orders", worker="0") == 1
        assert 0 < value(m, "flakekit_lease_remaining_seconds", generator="orders") <= 2
        assert value(m, "flakekit_lease_renewals_total", generator="orders") >= 1
        assert value(m, "flakekit_lease_renew_failures_total", generator="orders") == 0
        assert value(m, "flakekit_lease_losses_total", generator="orders") == 0
        assert value(m, "flakekit_segment_step", key="invoice") >= 100
        assert value(m, "flakekit_segment_buffer_ready", key="invoice", slot="current") == 1
        fill = value(m, "flakekit_segment_buffer_fill_ratio", key="invoice", slot="current")
        assert 0 < fill <= 1
        assert value(m, "flakekit_segment_fetches_total", key="invoice") >= 2
        assert value(m, "flakekit_segment_fetch_duration_seconds_count", key="invoice") >= 2
        assert value(m, "flakekit_segment_fetch_duration_seconds_sum", key="invoice") > 0
        assert value(m, "flakekit_segment_fetch_duration_max_seconds", key="invoice") > 0
        assert value(m, "flakekit_http_requests_total", route="leaf_snowflake", code="200") == 10
        assert value(m, "flakekit_http_requests_total", route="leaf_segment", code="200") == 150
        assert value(m, "flakekit_http_requests_total", route="next", code="404") == 1
        inf = value(m, "flakekit_http_request_duration_seconds_bucket", route="leaf_segment",
                    le="+Inf")
        assert inf == 150 == value(m, "flakekit_http_request_duration_seconds_count",
                                   route="leaf_segment")
        buckets = [v for lab, v in m["flakekit_http_request_duration_seconds_bucket"]
                   if lab["route"] == "leaf_segment"]
        assert buckets == sorted(buckets)   # cumulative
        assert value(m, "flakekit_http_connections", process="0") >= 1

    def test_lease_loss_counted(self, server):
        """A lost lease shows up as a loss, a not-ready generator and negative readiness."""
        with sqlite3.connect(server.db) as conn:
            conn.execute("UPDATE system_nodes SET version = version + 1, holder = 'thief'")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = parse(ok(server, "/metrics").decode())
            if value(m, "flakekit_lease_losses_total", generator="orders") == 1:
                break
            time.sleep(0.1)
        assert value(m, "flakekit_lease_losses_total", generator="orders") == 1
        assert value(m, "flakekit_generator_ready", generator="orders") == 0
        assert value(m, "flakekit_server_ready", process="0") == 0
        assert value(m, "flakekit_generator_ready", generator="invoices") == 1

    def test_label_escaping(self):
        from flakekit_server.metrics import _labels

        assert _labels({"k": 'a"b\\c\nd'}) == '{k="a\\"b\\\\c\\nd"}'
