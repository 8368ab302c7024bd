"""Built-in layouts: snowflake, sonyflake, region-split."""

from __future__ import annotations

from flakekit import hookimpl
from flakekit.layout import BitLayout
from flakekit.registry import Register

SNOWFLAKE = BitLayout(
    name="snowflake",
    fields=[["time", 41], ["worker", 10], ["sequence", 12]],
    unit_ns="1ms", epoch_ms=1288834974657,
    description="Twitter Snowflake: 41 time (1 ms) / 10 worker / 12 sequence",
)
SONYFLAKE = BitLayout(
    name="sonyflake",
    fields=[["time", 39], ["sequence", 8], ["machine", 16]],
    unit_ns="10ms", epoch_ms="2014-09-01T00:00:00Z",
    description="Sony Sonyflake: 39 time (10 ms) / 8 sequence / 16 machine",
)
REGION_SPLIT = BitLayout(
    name="region-split",
    fields=[["time", 41], ["region", 3], ["worker", 7], ["sequence", 12]],
    unit_ns="1ms", epoch_ms=1288834974657,
    description="Snowflake with 3 region bits: 41 time / 3 region / 7 worker / 12 sequence",
)


@hookimpl
def flakekit_register_layouts(register: Register) -> None:
    for layout in (SNOWFLAKE, SONYFLAKE, REGION_SPLIT):
        register(layout.name, layout, description=layout.description)
