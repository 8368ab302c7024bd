"""The ``system`` clock with its DEFAULT settings: steps back up to 5 ms are waited out,
larger ones raise (issue 9, item 6: the default used to be read as 5,000,000 ms)."""

from __future__ import annotations

import re
import time

import pytest

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.errors import ClockMovedBackwardsError
from flakekit.values.clock import SystemClock, SystemSettings

MS = 1_000_000


class SteppableTime:
    """The host's wall clock plus an offset the test steps, the way NTP steps it."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


@pytest.fixture
def system_gen(host, monkeypatch):
    """A generator built from config with `clock = "system"` and no clock settings."""
    wall = SteppableTime()
    monkeypatch.setattr(SystemClock, "time_ns", staticmethod(wall))
    config = parse_config({"generators": {"g": {
        "clock": "system", "allocator": {"type": "static", "worker_id": 3},
    }}})
    with build_kit(config, host) as kit:
        yield kit["g"], wall


def test_default_max_backward_is_5ms():
    assert SystemSettings().max_backward == 5 * MS
    assert SystemClock.from_settings().max_backward_ns == 5 * MS
    assert SystemSettings(max_backward=5).max_backward == 5 * MS  # a number is ms


def test_two_second_step_back_raises_instead_of_blocking(system_gen):
    """Before the fix the default allowed 5000 s: next_id() slept 2 s, then issued."""
    gen, wall = system_gen
    gen.next_id()
    wall.offset_ns -= 2_000 * MS
    with pytest.raises(ClockMovedBackwardsError, match=r"\(5\.000 ms\)") as raised:
        gen.next_id()
    # the step seen is 2 s less the real time since the first ID (a loaded lane: not 1990+)
    seen = re.search(r"by ([\d.]+) ms", str(raised.value))
    assert seen and 5 < float(seen[1]) < 2_010, str(raised.value)
    with pytest.raises(ClockMovedBackwardsError):
        gen.next_ids(3)
    wall.offset_ns = 0
    assert gen.next_id()


def test_three_millisecond_step_back_is_waited_out(system_gen):
    gen, wall = system_gen
    before = gen.next_id()
    wall.offset_ns -= 3 * MS
    after = gen.next_id()
    assert after > before
    assert min(gen.next_ids(3)) > after
