"""Our sonyflake layout is bit-identical to the sonyflake package (sony/sonyflake port)."""

from __future__ import annotations

import datetime as dt

import pytest

from flakekit.builtin.layouts import SONYFLAKE
from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.testing import ManualClock

sonyflake = pytest.importorskip("sonyflake")
EPOCH = dt.datetime(2014, 9, 1, tzinfo=dt.UTC)


@pytest.fixture
def sony():
    return sonyflake.Sonyflake(start_time=EPOCH, machine_id=0xBEEF)


def test_compose_matches(sony):
    """The same time, sequence and machine compose to the same integer."""
    when = dt.datetime(2025, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC)
    for seq in (0, 1, 77, 255):
        assert SONYFLAKE.compose(time=when, sequence=seq, machine=0xBEEF) == sony.compose(when, seq,
                                                                                          0xBEEF)


def test_their_decomposition_of_our_ids(sony):
    """IDs from our generator decode with their decompose() to our parts."""
    gen = SnowflakeGenerator(SONYFLAKE, ManualClock(),
                             StaticAllocator(StaticSettings(worker_id=0xBEEF))).start()
    for value in [*(gen.next_id() for _ in range(300)), *gen.next_ids(300)]:
        theirs = sony.decompose(value)
        ours = SONYFLAKE.decompose(value)
        assert (theirs.time, theirs.sequence, theirs.machine_id) == (ours["time"], ours["sequence"],
                                                                     ours["machine"])
        assert sony.to_time(value) == SONYFLAKE.timestamp(value)
