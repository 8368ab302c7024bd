"""BitLayout: structure, compose/decompose, capacity, errors that name the field."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flakekit.builtin.layouts import REGION_SPLIT, SNOWFLAKE, SONYFLAKE
from flakekit.errors import InvalidIdError, LayoutError, PartValueError
from flakekit.values.layout import BitLayout


class TestBuiltins:
    def test_snowflake_matches_twitter(self):
        """41/10/12 with Twitter's epoch; worker shifted by 12, time by 22."""
        assert SNOWFLAKE.fields == (("time", 41), ("worker", 10), ("sequence", 12))
        assert SNOWFLAKE.epoch_ms == 1288834974657
        assert SNOWFLAKE.shift("time") == 22 and SNOWFLAKE.shift("worker") == 12
        assert SNOWFLAKE.compose(time=1, worker=1, sequence=1) == (1 << 22) | (1 << 12) | 1

    def test_sonyflake_is_bit_identical_to_sony(self):
        """Sony puts the sequence above the machine id: time<<24 | seq<<16 | machine."""
        assert SONYFLAKE.unit_ns == 10_000_000
        assert SONYFLAKE.epoch_ms == 1409529600000
        assert SONYFLAKE.compose(time=5, sequence=3, machine=0xBEEF) == 5 << 24 | 3 << 16 | 0xBEEF
        assert SONYFLAKE.worker_field == "machine"

    def test_region_split(self):
        """41/3/7/12: 8 regions of 128 workers."""
        assert REGION_SPLIT.capacity().max_workers == 1024
        assert REGION_SPLIT.max_value("region") == 7
        assert REGION_SPLIT.max_value("worker") == 127

    def test_capacity(self):
        """Snowflake: 4.096M IDs/s per worker, overflows in 2079."""
        cap = SNOWFLAKE.capacity(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        assert cap.ids_per_second_per_worker == 4_096_000
        assert cap.max_workers == 1024
        assert cap.overflows_at.year == 2080 and cap.overflows_at.month == 7
        assert 54 < cap.years_left < 55

    def test_timestamp(self):
        """The time field decodes to the UTC start of its tick."""
        when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)
        value = SNOWFLAKE.compose(time=when, worker=3, sequence=4)
        assert SNOWFLAKE.timestamp(value) == when
        assert SNOWFLAKE.decompose(value) == {"time": SNOWFLAKE.tick(when), "worker": 3,
                                              "sequence": 4}


class TestValidation:
    @pytest.mark.parametrize(
        ("fields", "total", "field"),
        [
            ([["worker", 10], ["time", 41], ["sequence", 12]], 63, "fields[0]"),
            ([["time", 41], ["worker", 22]], 63, "fields"),
            ([["time", 41], ["worker", 10], ["sequence", 11]], 63, "fields"),
            ([["time", 41], ["time", 10], ["sequence", 12]], 63, "fields[1]"),
            ([["time", 41], ["Worker", 10], ["sequence", 12]], 63, "fields[1]"),
            ([["time", 41], ["worker", 0], ["sequence", 22]], 63, "fields[1]"),
            ([["time", 41], ["worker", 10], ["sequence", 12]], 62, "total_bits"),
            ("nope", 63, "fields"),
            ([["time", 10], ["sequence", 53]], 63, "fields[0]"),
        ],
        ids=["time-not-first", "no-sequence", "wrong-total", "duplicate", "bad-name",
             "zero-bits", "bad-total-bits", "not-a-list", "time-too-small"],
    )
    def test_invalid_layouts_name_the_field(self, fields, total, field):
        """Each broken layout raises LayoutError naming the field at fault."""
        with pytest.raises(LayoutError) as info:
            BitLayout("x", fields, total_bits=total)
        assert info.value.field == field

    @pytest.mark.parametrize(
        ("key", "value"),
        [("unit", "fast"), ("unit", "1ns"), ("epoch", "yesterday"),
         ("epoch", "2024-01-01T00:00:00"), ("epoch", -5)],
    )
    def test_bad_unit_and_epoch(self, key, value):
        """A unit or epoch that cannot be read names its field and the format."""
        data = {"fields": [["time", 41], ["worker", 10], ["sequence", 12]], key: value}
        with pytest.raises(LayoutError) as info:
            BitLayout.from_mapping("x", data)
        assert info.value.field == key

    def test_unknown_key_suggests(self):
        """A misspelt layout key suggests the right one."""
        with pytest.raises(LayoutError, match="did you mean 'epoch'"):
            BitLayout.from_mapping("x",
                                   {"fields": [["time", 41], ["worker", 10], ["sequence", 12]],
                                    "epoc": 0})

    def test_part_out_of_range(self):
        """A part that does not fit names the field and the allowed range."""
        with pytest.raises(PartValueError,
                           match=r"worker: 1024 does not fit in 10 bits; allowed 0..1023"):
            SNOWFLAKE.compose(time=1, worker=1024)
        with pytest.raises(PartValueError, match="no such field"):
            SNOWFLAKE.compose(time=1, wroker=1)
        with pytest.raises(PartValueError, match="time: is required"):
            SNOWFLAKE.compose(worker=1)

    @pytest.mark.parametrize("bad", ["abc", -1, 1 << 63, "1.5", 1.0, None])
    def test_bad_ids(self, bad):
        """Decoding something that is not an ID of the layout raises InvalidIdError."""
        with pytest.raises(InvalidIdError):
            SNOWFLAKE.decompose(bad)

    def test_hex_and_string_ids(self):
        """IDs may be given as decimal or hex strings."""
        value = SNOWFLAKE.compose(time=99, worker=5, sequence=6)
        assert (SNOWFLAKE.decompose(hex(value)) == SNOWFLAKE.decompose(str(value))
                == SNOWFLAKE.decompose(value))

    def test_warnings(self):
        """53-bit layouts are JavaScript-safe; a short time field warns of overflow."""
        js = BitLayout("js", [["time", 41], ["worker", 4], ["sequence", 8]], total_bits=53,
                       epoch_ms="2024-01-01T00:00:00Z")
        assert not any("JavaScript" in w for w in js.warnings())
        short = BitLayout("short", [["time", 30], ["worker", 21], ["sequence", 12]])
        assert any("years left" in w or "overflowed" in w for w in short.warnings())
        assert any("JavaScript" in w for w in SNOWFLAKE.warnings())


@st.composite
def layouts_and_parts(draw):
    total = draw(st.sampled_from([53, 63, 64]))
    time_bits = draw(st.integers(20, min(45, total - 2)))
    seq_bits = draw(st.integers(1, min(22, total - time_bits - 1)))
    rest = total - time_bits - seq_bits
    n_nodes = draw(st.integers(1, min(3, rest)))
    cuts = sorted(draw(st.lists(st.integers(1, rest - 1), min_size=n_nodes - 1,
                                max_size=n_nodes - 1, unique=True))) if n_nodes > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, rest])]
    nodes = [(f"n{i}", size) for i, size in enumerate(sizes)]
    position = draw(st.integers(0, len(nodes)))
    fields = [("time", time_bits), *nodes[:position], ("sequence", seq_bits), *nodes[position:]]
    layout = BitLayout("random", fields, total_bits=total, worker_field="n0",
                       unit_ns=draw(st.sampled_from(["1ms", "10ms", "1s"])))
    parts = {name: draw(st.integers(0, (1 << bits) - 1)) for name, bits in fields}
    return layout, parts


class TestRoundTrip:
    @settings(max_examples=300, deadline=None)
    @given(layouts_and_parts())
    def test_compose_decompose_round_trip(self, case):
        """decompose(compose(parts)) == parts for random layouts and values."""
        layout, parts = case
        value = layout.compose(**parts)
        assert 0 <= value <= layout.max_id
        assert layout.decompose(value) == parts
