"""Built-in layouts: flakekit's own (snowflake, sonyflake, region-split) and the foreign ID
families users bring (twitter, discord, sonyflake-v2, instagram, mastodon), so
``flakekit decode ID --layout discord`` reads their IDs. Each foreign layout's test vector
(tests/test_presets.py) comes from that system's own documentation or code.
"""

from __future__ import annotations

from flakekit.pluginhost.markers import hookimpl
from flakekit.pluginhost.registry import LayoutFactory, Register
from flakekit.values.layout import BitLayout, fields_from_bits


def _builtin(name: str, bits: str, unit: str, epoch: int | str, description: str,
             since_ms: str | None = None) -> BitLayout:
    """A built-in layout: ``bits`` as :func:`fields_from_bits` reads it, their sum the
    total bits."""
    fields = fields_from_bits(bits)
    return BitLayout(name=name, fields=fields, unit_ns=unit, epoch_ms=epoch,
                     total_bits=sum(b for _, b in fields), description=description,
                     since_ms=since_ms)


SNOWFLAKE = _builtin(
    "snowflake", "time=41,worker=10,sequence=12", "1ms", 1288834974657,
    "Twitter Snowflake: 41 time (1 ms) / 10 worker / 12 sequence")
SONYFLAKE = _builtin(
    "sonyflake", "time=39,sequence=8,machine=16", "10ms", "2014-09-01T00:00:00Z",
    "Sony Sonyflake: 39 time (10 ms) / 8 sequence / 16 machine")
REGION_SPLIT = _builtin(
    "region-split", "time=41,region=3,worker=7,sequence=12", "1ms", 1288834974657,
    "Snowflake with 3 region bits: 41 time / 3 region / 7 worker / 12 sequence")

# twitter-archive/snowflake IdWorker.scala: twepoch 1288834974657, datacenterIdBits 5,
# workerIdBits 5, sequenceBits 12; id = time << 22 | datacenter << 17 | worker << 12 | seq.
TWITTER = _builtin(
    "twitter", "time=41,datacenter=5,worker=5,sequence=12", "1ms", 1288834974657,
    "Twitter/X IDs: 41 time (1 ms) / 5 datacenter / 5 worker / 12 sequence")
# discord.com/developers/docs/reference#snowflakes: 42 bits of ms since the Discord epoch
# 1420070400000 (2015-01-01), 5 internal worker, 5 internal process, 12 increment; 64 bits.
DISCORD = _builtin(
    "discord", "time=42,worker=5,process=5,sequence=12", "1ms", 1420070400000,
    "Discord snowflakes: 42 time (1 ms since 2015) / 5 worker / 5 process / 12 increment")
# sony/sonyflake v2 (v2/sonyflake.go): defaults 39 time bits of 10 ms, 8 sequence, 16
# machine, and StartTime 2025-01-01 00:00:00 UTC (v1: 2014-09-01).
SONYFLAKE_V2 = _builtin(
    "sonyflake-v2", "time=39,sequence=8,machine=16", "10ms", "2025-01-01T00:00:00Z",
    "Sonyflake v2 defaults: 39 time (10 ms since 2025) / 8 sequence / 16 machine")
# Instagram Engineering, "Sharding & IDs at Instagram" (2012): PL/pgSQL next_id() with
# our_epoch 1314220021721; (now - epoch) << 23 | shard_id << 10 | seq % 1024.
INSTAGRAM = _builtin(
    "instagram", "time=41,shard=13,sequence=10", "1ms", 1314220021721,
    "Instagram IDs: 41 time (1 ms) / 13 shard / 10 sequence")
# mastodon/mastodon lib/mastodon/snowflake.rb: 6 bytes (48 bits) of ms since the Unix
# epoch, then 2 bytes (16 bits) of hashed sequence data. Snowflake IDs came with Mastodon
# 2.0 (October 2017; older statuses kept serial numbers): a reading before 2017 is no
# Mastodon snowflake, though the epoch is 1970.
MASTODON = _builtin(
    "mastodon", "time=48,sequence=16", "1ms", 0,
    "Mastodon IDs: 48 time (1 ms since 1970) / 16 sequence (hashed)",
    since_ms="2017-01-01T00:00:00Z")

#: flakekit's own layouts, then the foreign families, in listing order
LAYOUTS = (SNOWFLAKE, SONYFLAKE, REGION_SPLIT, TWITTER, DISCORD, SONYFLAKE_V2, INSTAGRAM,
           MASTODON)


@hookimpl
def flakekit_register_layouts(register: Register[LayoutFactory]) -> None:
    for layout in LAYOUTS:
        register(layout.name, layout, description=layout.description)
