"""HTTP and Prometheus conventions: HEAD on /health and /ready, process_* and build_info
metrics, counters present (at 0) from start, the warning for an exposed, open server."""

from __future__ import annotations

import platform
import time

import flakekit_server
import pytest
from flakekit_server.cli import exposure_warning
from server_testing import ok, ok_json, sqlite_config
from test_server_metrics import parse, value

import flakekit


@pytest.fixture
def server(tmp_path, start_server):
    return start_server(sqlite_config(tmp_path, {"invoice": 100}))


class TestHead:
    @pytest.mark.parametrize("path", ["/health", "/ready", "/healthz", "/readyz"])
    def test_head_is_get_without_body(self, server, path):
        status, headers, body = server.get(path)
        h_status, h_headers, h_body = server.get(path, method="HEAD")
        assert h_status == status == 200 and h_body == b""
        assert h_headers["content-type"] == headers["content-type"]
        assert int(h_headers["content-length"]) > 0

    def test_head_never_spends_ids(self, server):
        """HEAD on the JSON API's next would take IDs: refused, and GET is the only method."""
        status, headers, _ = server.get("/api/v1/next/orders", method="HEAD")
        assert status == 405 and headers["allow"] == "GET"
        status, headers, _ = server.get("/health", method="POST")
        assert status == 405 and headers["allow"] == "GET, HEAD"

    @pytest.mark.parametrize("path", ["/api/segment/get/invoice", "/api/segment/get/invoice/",
                                      "/api/snowflake/get/orders"])
    def test_head_on_a_leaf_id_url_is_405_and_draws_nothing(self, server, path):
        """Leaf's ID URLs take any method, but a HEAD would spend an ID (RFC 9110: HEAD has
        no effect a GET would not): 405, and the next GET gets the very next ID."""
        first = int(server.get(path)[2])
        status, headers, body = server.get(path, method="HEAD")
        assert status == 405 and headers["allow"] == "GET, POST" and body == b""
        after = int(server.get(path)[2])
        if "segment" in path:
            assert after == first + 1   # consecutive: the HEAD drew nothing
        issued = {g["name"]: g["issued"] for g in
                  ok_json(server, "/api/v1/status")["processes"][0]["generators"]}
        assert issued["invoices" if "segment" in path else "orders"] == 2


class TestMetrics:
    def test_process_and_build_info(self, server):
        m = parse(ok(server, "/metrics").decode())
        assert m["flakekit_build_info"] == [({"version": flakekit.__version__,
                                              "server_version": flakekit_server.__version__,
                                              "python": platform.python_version()}, 1.0)]
        assert value(m, "process_cpu_seconds_total", process="0") > 0
        assert value(m, "process_resident_memory_bytes", process="0") > 1 << 20
        assert (value(m, "process_virtual_memory_bytes", process="0")
                >= value(m, "process_resident_memory_bytes", process="0"))
        assert 0 < value(m, "process_open_fds", process="0") < value(m, "process_max_fds",
                                                                     process="0")
        started = value(m, "process_start_time_seconds", process="0")
        assert abs(started - server_started(server)) < 120   # /proc's start, not 1970

    def test_fetch_latency_histogram(self, server):
        """Every fetch lands in one bucket: the +Inf bucket equals the count, buckets grow."""
        for _ in range(150):   # past the first segment of 100: a second fetch
            assert server.get("/api/segment/get/invoice")[0] == 200
        m = parse(ok(server, "/metrics").decode())
        name = "flakekit_segment_fetch_duration_seconds"
        buckets = [(float(lab["le"]), v) for lab,
                   v in m[name + "_bucket"] if lab["key"] == "invoice"]
        counts = [v for _, v in sorted(buckets)]
        assert len(counts) == len(flakekit.plugin.LATENCY_BUCKETS_S) + 1
        assert counts == sorted(counts) and counts[-1] == value(m, name + "_count",
                                                                key="invoice") >= 2
        assert value(m, name + "_sum", key="invoice") > 0

    def test_counters_from_start(self, server):
        """A fresh server has every counter at 0: rate() works from the first event on."""
        m = parse(ok(server, "/metrics").decode())
        for waited in ("true", "false"):
            assert value(m, "flakekit_clock_rollbacks_total", generator="orders",
                         waited=waited) == 0
        for kind in flakekit_server.metrics.ALERT_KINDS:
            assert value(m, "flakekit_alerts_total", kind=kind) == 0
        assert value(m, "flakekit_lease_losses_total", generator="orders") == 0
        assert value(m, "flakekit_segment_fetch_failures_total", key="invoice") == 0


def server_started(server) -> float:
    return value(parse(ok(server, "/metrics").decode()), "flakekit_server_start_time_seconds",
                 process="0")


class TestExposureWarning:
    @pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2", "[::1]"])
    def test_loopback_is_quiet(self, host):
        assert exposure_warning(host, None) is None

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "ids.example.com"])
    def test_exposed(self, host):
        line = exposure_warning(host, None)
        assert line is not None and "\n" not in line and "--token-file" in line
        assert exposure_warning(host, "/etc/tokens") is None

    def test_printed_by_serve(self, tmp_path, start_server):
        config = sqlite_config(tmp_path, segments={})
        exposed = start_server(config, "--host", "0.0.0.0")
        time.sleep(0.2)
        lines = [line for line in exposed.log().splitlines() if "--token-file" in line]
        assert lines == [exposure_warning("0.0.0.0", None)]
        tokens = tmp_path / "tokens"
        tokens.write_text("* a-long-enough-secret-token\n")
        closed = start_server(config, "--host", "0.0.0.0", "--token-file", str(tokens))
        quiet = start_server(config)
        time.sleep(0.2)
        assert "--token-file" not in closed.log() and "--token-file" not in quiet.log()


def test_acquire_latency_histogram_from_a_real_lease(tmp_path, start_server):
    """A leased snowflake generator's acquire shows in
    ``flakekit_lease_acquire_duration_seconds`` (buckets, sum, count) from start."""
    cfg = tmp_path / "flakekit.toml"
    cfg.write_text(
        f'[backends.default]\nurl = "sqlite:///{tmp_path / "ids.db"}"\n'
        '[generators.orders]\nstrategy = "snowflake"\n'
        'allocator = { type = "sql", backend = "default", service = "orders" }\n'
    )
    status, _, body = start_server(cfg).get("/metrics")
    assert status == 200
    text = body.decode()
    lines = [ln for ln in text.splitlines()
             if ln.startswith("flakekit_lease_acquire_duration_seconds")]
    assert any('le="+Inf"' in ln and ln.endswith(" 1") for ln in lines), lines
    count = [ln for ln in lines if ln.startswith("flakekit_lease_acquire_duration_seconds_count")]
    assert count and count[0].endswith(" 1"), lines
    total = [ln for ln in lines if ln.startswith("flakekit_lease_acquire_duration_seconds_sum")]
    assert total and float(total[0].rsplit(" ", 1)[1]) > 0, lines
