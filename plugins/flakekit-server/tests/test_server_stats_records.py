"""The server reads typed stats records (issue 11 item 2) by attribute; the JSON it
prints keeps its shape (the key order below is what ``/metrics`` and the monitor show)."""

from __future__ import annotations

import json

from flakekit_server.app import describe

import flakekit
from flakekit.plugin import (
    BufferStats,
    GeneratorInfo,
    SegmentStats,
    SnowflakeStats,
)

LAYOUT = flakekit.layout("snowflake")


def snowflake(**kw) -> SnowflakeStats:
    base = dict(name="orders", strategy="snowflake", layout="snowflake", clock="monotonic",
                ids_drawn=7, worker_id=3, epoch=2, lease_remaining_s=12.5, renewals=4,
                renew_failures=0, lost=None)
    return SnowflakeStats(**{**base, **kw})


def segment(key: str, ready: bool = True, **kw) -> SegmentStats:
    buf = BufferStats(slot="current", ready=ready, start=1, position=5, end=11, step=10,
                      idle=6)
    empty = BufferStats(slot="next", ready=False, start=None, position=None, end=None,
                        step=None, idle=0)
    base = dict(strategy="segment", name="inv", key=key, started=True, closed=False, step=10,
                min_step=10, max_id=11, buffers=(buf, empty), fetching=False, fetches=1,
                fetch_failures=0, fetch_ms_last=1.0, fetch_ms_max=1.0, fetch_ms_mean=1.0,
                waits=0, unavailable=0, gave_back=0, last_error=None)
    return SegmentStats(**{**base, **kw})


def test_time_ordered_fields_and_problems_come_from_the_record():
    what = GeneratorInfo("snowflake", layout=LAYOUT)
    info = describe("orders", what, snowflake())
    assert list(info) == ["name", "strategy", "kind", "layout", "clock", "ids_drawn",
                          "worker_id", "epoch", "lease_remaining_s", "renewals",
                          "renew_failures", "lost", "acquires", "acquire_ns_total",
                          "acquire_buckets", "ready", "problem"]
    assert info["worker_id"] == 3 and info["ready"] is True
    assert describe("o", what, snowflake(lost="taken over"))["problem"] == "lease lost: taken over"
    assert describe("o", what, snowflake(worker_id=None))["problem"] == "no worker lease"
    assert describe("o", what, snowflake(lease_remaining_s=-2.0))["problem"] == (
        "lease on worker 3 expired 2.0 s ago (renewals failing)")
    json.dumps(info)


def test_segment_keys_are_its_own_first_then_the_tables_others():
    what = GeneratorInfo("segment", key="a")
    info = describe("inv", what, segment("a"), [segment("b", ready=False), segment("a")])
    assert [k["key"] for k in info["keys"]] == ["a", "b"]
    assert info["keys"][0]["buffers"][0] == {"slot": "current", "ready": True, "start": 1,
                                             "position": 5, "end": 11, "step": 10, "idle": 6}
    assert info["problem"] == "no buffer ready for key 'b'"
    assert describe("inv", what, segment("a", closed=True))["problem"] == "closed"
    json.dumps(info)
