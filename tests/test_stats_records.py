"""Stats are typed records (issue 11 item 2): read by attribute, JSON from ``as_dict()``.

The server, the monitor and ``--json`` print ``as_dict()``; its keys and their order are
the JSON shape users' dashboards parse, so they are pinned here. Real generators: a SQL
worker lease and a SQL segment store, both on SQLite.
"""

from __future__ import annotations

import json

import attrs
import pytest
from sqlalchemy import create_engine

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.pluginhost.contracts import HasStats, StatsRecord
from flakekit.pluginhost.host import get_host
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.values.stats import BufferStats, LeaseStats, SegmentStats, SnowflakeStats

SNOWFLAKE_KEYS = ["name", "strategy", "layout", "clock", "ids_drawn", "worker_id", "epoch",
                  "lease_remaining_s", "renewals", "renew_failures", "lost", "acquires",
                  "acquire_ns_total", "acquire_buckets"]
SEGMENT_KEYS = ["strategy", "name", "key", "started", "closed", "step", "min_step", "max_id",
                "buffers", "fetching", "fetches", "fetch_failures", "fetch_ms_last",
                "fetch_ms_max", "fetch_ms_mean", "waits", "unavailable", "gave_back",
                "last_error", "fetch_buckets"]
BUFFER_KEYS = ["slot", "ready", "start", "position", "end", "step", "idle"]


@pytest.fixture
def kit(tmp_path):
    url = f"sqlite:///{tmp_path / 'ids.db'}"
    engine = create_engine(url)
    SqlSegmentStore(engine).create("invoice", 10)
    engine.dispose()
    config = parse_config({
        "backends": {"main": {"url": url}},
        "generators": {
            "orders": {"strategy": "snowflake", "allocator": {"type": "sql", "backend": "main"}},
            "invoices": {"strategy": "segment", "store": {"type": "sql", "backend": "main"},
                         "key": "invoice"},
        },
    }, str(tmp_path / "flakekit.toml"))
    with build_kit(config, get_host(), identity=("127.0.0.1", 4000)) as kit:
        yield kit


def test_snowflake_stats_is_a_frozen_record(kit):
    gen = kit["orders"]
    gen.next_ids(3)
    stats = gen.stats()
    assert isinstance(stats, SnowflakeStats) and isinstance(stats, StatsRecord)
    assert isinstance(gen, HasStats)
    assert stats.strategy == "snowflake" and stats.ids_drawn == 3
    assert stats.worker_id is not None and stats.epoch is not None and stats.lost is None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.ids_drawn = 0  # type: ignore[misc]
    data = stats.as_dict()
    assert list(data) == SNOWFLAKE_KEYS
    assert data["name"] == "orders" and data["worker_id"] == stats.worker_id
    json.dumps(data)


def test_snowflake_stats_carry_the_keepers_lease_stats(kit):
    gen = kit["orders"]
    gen.next_id()
    lease = gen.keeper.stats()
    assert isinstance(lease, LeaseStats)
    stats = gen.stats()
    assert {k: v for k, v in stats.as_dict().items() if k in attrs.asdict(lease)} == {
        **attrs.asdict(lease), "lease_remaining_s": stats.lease_remaining_s}


def test_segment_stats_is_a_frozen_record_with_buffer_records(kit):
    gen = kit["invoices"]
    assert gen.next_id() == 1
    stats = gen.stats()
    assert isinstance(stats, SegmentStats) and isinstance(stats, StatsRecord)
    assert stats.key == "invoice" and stats.fetches >= 1 and stats.started
    assert all(isinstance(b, BufferStats) for b in stats.buffers)
    assert [b.slot for b in stats.buffers] == ["current", "next"]
    assert stats.buffers[0].position == 2 and stats.buffers[0].ready
    data = stats.as_dict()
    assert list(data) == SEGMENT_KEYS
    assert isinstance(data["buffers"], list)  # JSON arrays, as before
    assert [list(b) for b in data["buffers"]] == [BUFFER_KEYS, BUFFER_KEYS]
    json.dumps(data)


def test_segments_report_prints_a_running_generators_buffers_as_json(kit):
    """``segments_report(..., running=...)`` (``flakekit segments --json``, the server)."""
    from flakekit.builtin.segments import StoreTarget, segments_report

    gen = kit["invoices"]
    gen.next_id()
    store = SqlSegmentStore(create_engine(kit.config.backends["main"].url))
    report = segments_report(store, StoreTarget("main", "leaf_alloc", {"invoice": "invoices"}),
                             {"invoice": gen})
    [row] = report["keys"]
    assert row["buffers"] == [b.as_dict() for b in gen.stats().buffers]
    assert [list(b) for b in row["buffers"]] == [BUFFER_KEYS, BUFFER_KEYS]
    json.dumps(report)
    store.engine.dispose()


def test_kit_stats_are_records_by_name(kit):
    kit["orders"].next_id()
    kit["invoices"].next_id()
    stats = kit.stats()
    assert isinstance(stats["orders"], SnowflakeStats)
    assert isinstance(stats["invoices"], SegmentStats)
