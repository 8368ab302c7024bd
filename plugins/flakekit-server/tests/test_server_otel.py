"""OpenTelemetry (flakekit_server/otel.py), with the SDK's in-memory exporters: a span per
segment fetch, lease renewal and hand-off; the /metrics numbers as instruments with the
same values; and nothing imported at all when opentelemetry is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from flakekit_server import otel
from flakekit_server.app import IdService, ServerOptions
from flakekit_server.metrics import render
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from server_testing import sqlite_config

import flakekit
from flakekit.plugin import get_host


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.use(tracer_provider=provider)
    yield exporter
    otel.use()


def named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == otel.SPAN_PREFIX + name]


@pytest.fixture
def kit(tmp_path):
    # the default heartbeat (seconds): a background renewal racing the tests' own
    # renew_once would replace the lease under it and make that call return False
    kit = flakekit.load(sqlite_config(tmp_path, {"invoice": 100}))
    yield kit
    kit.close()


def test_spans_for_segment_fetches_and_lease_renewals(spans, kit):
    kit.start()
    (fetch,) = named(spans, "segment.fetch")   # the first buffer, at start
    assert fetch.attributes["flakekit.generator"] == "invoices"
    assert fetch.attributes["flakekit.key"] == "invoice"
    assert fetch.attributes["flakekit.max_id"] == 101
    assert fetch.status.status_code is StatusCode.UNSET and fetch.end_time >= fetch.start_time
    gen = kit.get("invoices")
    for _ in range(95):   # past the prefetch point: the next buffer is fetched
        gen.next_id()
    gen.next_ids(20)
    assert len(named(spans, "segment.fetch")) >= 2
    assert kit.get("orders").keeper.renew_once()
    renewal = named(spans, "lease.renew")[-1]
    assert renewal.attributes["flakekit.generator"] == "orders"
    assert "worker 0" in renewal.attributes["flakekit.subject"]


def test_a_failed_renewal_is_an_error_span(spans, kit, tmp_path):
    import sqlite3

    kit.start()
    with sqlite3.connect(tmp_path / "ids.db") as conn:   # the row taken: the lease is lost
        conn.execute("UPDATE system_nodes SET version = version + 1, holder = 'thief'")
    assert not kit.get("orders").keeper.renew_once()
    failed = named(spans, "lease.renew")[-1]
    assert failed.status.status_code is StatusCode.ERROR
    assert "no longer ours" in failed.status.description


def test_a_span_per_cluster_handoff(spans):
    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.settings import ClusterSettings
    from flakekit.generators.segment import SegmentSettings
    from flakekit.testing import ManualClock
    from flakekit.testing.memory_cluster import MemoryClusterStore

    clock = ManualClock()
    store = MemoryClusterStore(clock)
    store.add_key("order", step=100)
    node = ClusterNode(ClusterSettings("c", "a", "http://a:8080", lease=10, debounce=0.5),
                       store.membership("a"), clock, get_host().events(), threads=False)
    node.add_strict("order", store.fence("a"), SegmentSettings())
    node.start()
    try:
        for _ in range(4):
            clock.advance(0.6)
            node.upkeep()
        assert node.next_id("order")[0] > 0
    finally:
        node.close()
    (handoff,) = named(spans, "cluster.handoff")
    assert handoff.attributes["flakekit.key"] == "order"
    assert handoff.attributes["flakekit.node"] == "a"
    assert handoff.attributes["flakekit.claim_epoch"] >= 1


def test_metrics_are_the_prometheus_numbers(kit):
    kit.start()
    service = IdService(kit, ServerOptions())
    try:
        for _ in range(3):
            service.handle(b"GET", b"/api/v1/next/orders?count=5", None)
        reader = InMemoryMetricReader()
        otel.use(meter_provider=MeterProvider(metric_readers=[reader]))
        try:
            names = otel.export_metrics(service.snapshot)
            data = reader.get_metrics_data()
        finally:
            otel.use()
        prometheus = otel._Samples._parse(render([service.snapshot()]))
    finally:
        service.close()
    got = {m.name: {tuple(sorted(p.attributes.items())): p.value for p in m.data.data_points}
           for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert ("flakekit_ids_issued" in names
            and "flakekit_http_request_duration_seconds_count" in names)
    issued = got["flakekit_ids_issued"][(("generator", "orders"), ("process", "0"))]
    assert issued == 15
    # the same series as /metrics, with the same values where they do not move by themselves
    for family in ("flakekit_ids_issued_total", "flakekit_worker_id", "flakekit_generator_ready",
                   "flakekit_segment_fetches_total", "flakekit_lease_epoch"):
        ours = got[family.removesuffix("_total")]
        theirs = {tuple(sorted(labels.items())): value for labels, value in prometheus[family]}
        assert ours == theirs, family


def test_nothing_is_imported_without_opentelemetry(tmp_path):
    """opentelemetry made unimportable (as if not installed): a kit with the server plugin
    fetches, renews and draws, and neither opentelemetry nor flakekit_server.otel is ever
    imported."""
    config = sqlite_config(tmp_path, {"invoice": 100})
    script = textwrap.dedent(f"""
        import json, sys

        sys.modules["opentelemetry"] = None   # as if not installed: find_spec says None
        import flakekit, flakekit_server
        kit = flakekit.load({str(config)!r}).start()
        kit.get("invoices").next_ids(150)
        ok = kit.get("orders").keeper.renew_once()
        kit.get("orders").next_ids(10)
        kit.close()
        loaded = sorted(m for m, mod in sys.modules.items() if mod is not None
                        and m.startswith(("opentelemetry", "flakekit_server.otel")))
        print(json.dumps({{"renewed": ok, "loaded": loaded,
                          "plugin": "flakekit_server" in sys.modules}}))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result == {"renewed": True, "loaded": [], "plugin": True}
    assert "hook flakekit_operation failed" not in run.stderr
