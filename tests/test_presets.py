"""The foreign ID families: each built-in layout decodes a vector from that system's own
documentation or code, and `flakekit decode` reads many IDs, JSON lines and --all."""

from __future__ import annotations

import datetime as dt
import json

import pytest

import flakekit
from flakekit.builtin.layouts import (
    DISCORD,
    INSTAGRAM,
    MASTODON,
    SNOWFLAKE,
    SONYFLAKE_V2,
    TWITTER,
)
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok

UTC = dt.UTC


def ms(when: dt.datetime) -> int:
    return (when - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(milliseconds=1)


class TestVectors:
    def test_discord_docs_example(self):
        """discord.com/developers/docs/reference#snowflakes breaks 175928847299117063 down
        as timestamp 41944705796 (+ epoch 1420070400000 = 1462015105796 ms), internal
        worker 1, internal process 0, increment 7."""
        parts = DISCORD.decompose(175928847299117063)
        assert parts == {"time": 41944705796, "worker": 1, "process": 0, "sequence": 7}
        assert ms(DISCORD.timestamp(175928847299117063)) == 1462015105796
        stamp = DISCORD.timestamp(175928847299117063)
        assert stamp.isoformat() == "2016-04-30T11:18:25.796000+00:00"
        assert DISCORD.compose(time=41944705796, worker=1, process=0,
                               sequence=7) == 175928847299117063

    def test_twitter_example_tweet(self):
        """Wikipedia's "Snowflake ID" article: a tweet by @Wikipedia in June 2022 has ID
        1541815603606036480, machine bits 01 0111 1010 (datacenter 11, worker 26),
        sequence 0."""
        parts = TWITTER.decompose(1541815603606036480)
        assert parts == {"time": 1656432460105 - 1288834974657, "datacenter": 11, "worker": 26,
                         "sequence": 0}
        assert TWITTER.timestamp(1541815603606036480) == dt.datetime(2022, 6, 28, 16, 7, 40, 105000,
                                                                     tzinfo=UTC)

    def test_twitter_idworker_formula(self):
        """twitter-archive/snowflake IdWorker.scala: (t - twepoch) << 22 | datacenter << 17
        | worker << 12 | sequence; IdWorkerSpec masks 0x1F000 (worker), 0x3E0000 (dc)."""
        t = 1300000000000 - 1288834974657
        value = TWITTER.compose(time=t, datacenter=31, worker=4, sequence=4095)
        assert value == t << 22 | 31 << 17 | 4 << 12 | 4095
        assert (value & 0x000000000001F000) >> 12 == 4
        assert (value & 0x00000000003E0000) >> 17 == 31
        assert (value & 0xFFFFFFFFFFC00000) >> 22 == t
        assert TWITTER.epoch_ms == 1288834974657 and TWITTER.total_bits == 63

    def test_sonyflake_v2_defaults(self):
        """sony/sonyflake v2 New(Settings{}): 39 time bits of 10 ms since 2025-01-01 UTC,
        8 sequence, 16 machine; toID = elapsed << 24 | sequence << 16 | machine."""
        assert SONYFLAKE_V2.fields == (("time", 39), ("sequence", 8), ("machine", 16))
        assert SONYFLAKE_V2.unit_ns == 10_000_000
        assert SONYFLAKE_V2.time_of_tick(0) == dt.datetime(2025, 1, 1, tzinfo=UTC)
        when = dt.datetime(2025, 6, 1, tzinfo=UTC)
        elapsed = 151 * 86_400 * 100  # 10 ms ticks from 2025-01-01 to 2025-06-01
        value = SONYFLAKE_V2.compose(time=when, sequence=5, machine=0x0102)
        assert value == elapsed << 24 | 5 << 16 | 0x0102
        assert SONYFLAKE_V2.timestamp(value) == when

    def test_sonyflake_v2_matches_the_python_port(self):
        """The sonyflake package (a port of sony/sonyflake) with v2's start time composes
        the same integers."""
        sonyflake = pytest.importorskip("sonyflake")
        sony = sonyflake.Sonyflake(start_time=dt.datetime(2025, 1, 1, tzinfo=UTC), machine_id=7)
        when = dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
        for seq in (0, 1, 255):
            assert SONYFLAKE_V2.compose(time=when, sequence=seq, machine=7) == sony.compose(when,
                                                                                            seq, 7)

    def test_instagram_blog_example(self):
        """Instagram Engineering, "Sharding & IDs at Instagram": 1387263000 ms since the
        epoch << (64-41), shard 31341 % 2000 = 1341 << (64-41-13), sequence 5001 % 1024;
        the PL/pgSQL uses our_epoch 1314220021721."""
        value = 1387263000 << (64 - 41) | (31341 % 2000) << (64 - 41 - 13) | (5001 % 1024)
        assert INSTAGRAM.decompose(value) == {"time": 1387263000, "shard": 1341, "sequence": 905}
        assert ms(INSTAGRAM.timestamp(value)) == 1314220021721 + 1387263000
        assert INSTAGRAM.worker_field == "shard" and INSTAGRAM.total_bits == 64

    def test_mastodon_docs_status(self):
        """docs.joinmastodon.org, Status entity example: id "103270115826048975",
        created_at 2019-12-08T03:48:33.901Z; the id is (ms since 1970) << 16 | tail
        (lib/mastodon/snowflake.rb), stamped when the transaction began."""
        when = MASTODON.timestamp("103270115826048975")
        created = dt.datetime(2019, 12, 8, 3, 48, 33, 901000, tzinfo=UTC)
        assert ms(when) == 1575776913849
        assert dt.timedelta(0) <= created - when < dt.timedelta(seconds=1)
        assert MASTODON.decompose(103270115826048975)["sequence"] == 103270115826048975 & 0xFFFF

    def test_mastodon_id_at(self):
        """Mastodon::Snowflake.id_at(t, with_random: false) = (t.to_i * 1000) << 16."""
        t = dt.datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC)
        assert MASTODON.compose(time=t) == (ms(t)) << 16

    def test_registered_by_name(self):
        """Every family is a built-in layout, reachable by name."""
        for name in ("twitter", "discord", "sonyflake-v2", "instagram", "mastodon"):
            assert flakekit.layout(name).name == name


class TestWarnings:
    def test_64_bit_layouts_warn_about_bigint(self):
        """A 64-bit layout warns when its IDs overflow a signed BIGINT; 63 bits do not."""
        warnings = DISCORD.warnings()
        assert any("overflow signed BIGINT" in w and "2084-09-06" in w for w in warnings)
        assert DISCORD.top_bit_at() == dt.datetime(2084, 9, 6, 15, 47, 35, 552000, tzinfo=UTC)
        assert not any("BIGINT" in w for w in TWITTER.warnings())
        assert not any("BIGINT" in w for w in SNOWFLAKE.warnings())

    def test_layout_show_prints_the_bigint_warning(self, capsys):
        """`flakekit layout show` prints it."""
        out = run_ok(capsys, "layout", "show", "discord")
        assert "warning: 64-bit layout: IDs made from 2084-09-06 on overflow signed BIGINT" in out


class TestPlausible:
    NOW = dt.datetime(2026, 12, 1, tzinfo=UTC)

    def test_time_between_epoch_and_tomorrow(self):
        """A reading is plausible if its time lies between the epoch and now + 1 day."""
        discord_id = 175928847299117063
        assert DISCORD.plausible(discord_id, self.NOW)
        future = DISCORD.compose(time=dt.datetime(2027, 1, 1, tzinfo=UTC))
        assert not DISCORD.plausible(future, self.NOW)
        assert DISCORD.plausible(DISCORD.compose(time=self.NOW + dt.timedelta(hours=23)), self.NOW)
        assert not TWITTER.plausible(1 << 63, self.NOW)  # does not fit 63 bits

    def test_a_v1_sonyflake_reads_implausibly_under_v2(self):
        """A Sonyflake v1 ID of 2026 read with v2's 2025 epoch lands in 2037: not plausible."""
        from flakekit.builtin.layouts import SONYFLAKE

        value = SONYFLAKE.compose(time=dt.datetime(2026, 11, 1, tzinfo=UTC), machine=1)
        assert SONYFLAKE.plausible(value, self.NOW)
        assert not SONYFLAKE_V2.plausible(value, self.NOW)


class TestDecodeCommand:
    def test_decode_by_name(self, capsys):
        """A new user decodes a Discord, a Twitter and a Sonyflake v2 ID by layout name."""
        out = run_ok(capsys, "decode", "175928847299117063", "-l", "discord")
        assert "timestamp  2016-04-30T11:18:25.796Z" in out and "process    0" in out
        code, out, _ = run(capsys, "decode", "1541815603606036480", "-l", "twitter", "--json")
        assert json.loads(out)["datacenter"] == 11
        sony = SONYFLAKE_V2.compose(time=dt.datetime(2025, 6, 1, tzinfo=UTC), sequence=1, machine=9)
        code, out, _ = run(capsys, "decode", str(sony), "-l", "sonyflake-v2", "--json")
        assert json.loads(out)["timestamp"] == "2025-06-01T00:00:00.000Z"

    def test_many_ids_and_stdin_as_json_lines(self, capsys, monkeypatch):
        """Arguments and `-` (stdin, one per line) mix; --json is one object per line."""
        code, out, err = run(capsys, "decode", "175928847299117063", "-", "-l", "discord", "--json",
                             stdin="\n1541815603606036480\n  175928847299117064 \n",
                             monkeypatch=monkeypatch)
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["id"] for r in rows] == [175928847299117063, 1541815603606036480,
                                           175928847299117064]
        assert rows[2]["sequence"] == 8

    def test_a_bad_id_among_many(self, capsys):
        """A bad ID gets its own error line; the others still decode; exit 2."""
        code, out, err = run(capsys, "decode", "175928847299117063", "nope", "12", "--json")
        assert code == 2
        assert len(out.splitlines()) == 2
        assert "id 'nope' is not an integer" in err and "1 of 3 IDs could not be decoded" in err

    def test_no_ids(self, capsys):
        code, _, err = run(capsys, "decode")
        assert code == 2 and "give one or more IDs" in err

    def test_all_ranks_the_discord_vector(self, capsys):
        """--all reads the ID under every layout; the Discord vector is plausible as a
        Discord ID (its published time) and not as a Sonyflake v2 one (that would be in
        2028); several times fit, so the verdict says ambiguous."""
        out = run_ok(capsys, "decode", "175928847299117063", "--all", "--json")
        result = json.loads(out)
        assert result["id_str"] == "175928847299117063" and result["verdict"] == "ambiguous"
        readings = {r["layout"]: r for r in result["readings"]}
        assert set(readings) >= {"twitter", "discord", "sonyflake-v2", "instagram", "mastodon",
                                 "snowflake"}
        assert readings["discord"]["plausible"] and readings["discord"]["parts"]["worker"] == 1
        assert readings["discord"]["timestamp"] == "2016-04-30T11:18:25.796Z"
        assert not readings["sonyflake-v2"]["plausible"] and not readings["mastodon"]["plausible"]
        code, out, _ = run(capsys, "decode", "175928847299117063", "--all")
        assert out.startswith("175928847299117063: ambiguous: 4 different times fit")
        line = next(x for x in out.splitlines()[2:] if "discord " in x)
        assert line.lstrip().startswith("* discord") and "worker=1 process=0 sequence=7" in line
        line = next(x for x in out.splitlines() if "sonyflake-v2" in x)
        assert line.lstrip().startswith("sonyflake-v2") and "its time is in the future" in line

    def test_all_says_when_an_id_does_not_fit(self, capsys):
        """A 64-bit ID does not fit the 63-bit layouts: said, not an error."""
        code, out, _ = run(capsys, "decode", str(1 << 63 | 5), "--all", "--json")
        readings = {r["layout"]: r for r in json.loads(out)["readings"]}
        assert readings["twitter"]["fits"] is False and readings["discord"]["fits"]
        assert "does not fit: needs 64 bits, the layout has 63" in readings["twitter"]["evidence"]


#: the five foreign vectors (TestVectors) and the time each system published for them
FIVE = {
    "twitter": (1541815603606036480, "2022-06-28T16:07:40.105Z"),
    "discord": (175928847299117063, "2016-04-30T11:18:25.796Z"),
    "sonyflake-v2": (SONYFLAKE_V2.compose(time=dt.datetime(2025, 6, 1, tzinfo=UTC), sequence=5,
                                          machine=0x0102), "2025-06-01T00:00:00.000Z"),
    "instagram": (1387263000 << 23 | 1341 << 10 | 905, "2011-09-09T22:28:04.721Z"),
    "mastodon": (103270115826048975, "2019-12-08T03:48:33.849Z"),
}


class TestEvidence:
    """Readings ranked by evidence (flakekit.values.readings), with the clock injected."""

    NOW = dt.datetime(2026, 12, 1, tzinfo=UTC)

    @pytest.mark.parametrize("system", sorted(FIVE))
    def test_each_vector_reads_as_its_system(self, system):
        """Under every built-in layout, each vector's own layout is a plausible reading at
        the time its system published; readings are plausible first, strongest first."""
        from flakekit.values.readings import rank

        value, when = FIVE[system]
        verdict = rank(value, [flakekit.layout(n) for n in LAYOUT_NAMES], self.NOW)
        mine = next(r for r in verdict.readings if r.layout == system)
        assert mine.plausible and mine.as_dict()["timestamp"] == when
        flags = [r.plausible for r in verdict.readings]
        assert flags == sorted(flags, reverse=True)
        strengths = [r.strength for r in verdict.readings if r.plausible]
        assert strengths == sorted(strengths, reverse=True)
        assert verdict.kind in ("one", "ambiguous") and when in verdict.summary

    def test_narrow_eras_rank_first(self):
        """Mastodon (2017 to now out of 8,900 years) and Sonyflake v2 (2025 to now out of
        174 years) vectors rank their own layout first."""
        from flakekit.values.readings import rank

        layouts = [flakekit.layout(n) for n in LAYOUT_NAMES]
        for system in ("mastodon", "sonyflake-v2"):
            assert rank(FIVE[system][0], layouts, self.NOW).readings[0].layout == system

    def test_a_tweet_is_ambiguous_with_discord(self):
        """A 2022 tweet is bit for bit a Discord ID of 2026 (same shifts, epochs 4 years
        apart): the verdict says ambiguous and names both times; the three layouts
        with Twitter's epoch count as one time."""
        from flakekit.values.readings import rank

        verdict = rank(FIVE["twitter"][0], [flakekit.layout(n) for n in LAYOUT_NAMES], self.NOW)
        assert verdict.kind == "ambiguous"
        group = next(g for g in verdict.summary.split("; ") if "2022-06-28T16:07:40.105Z" in g)
        assert sorted(group.split(" (")[0].split(": ")[-1].split(" = ")) == ["region-split",
                                                                             "snowflake", "twitter"]
        assert "discord (2026-08-25T14:24:45.448Z)" in verdict.summary

    def test_mastodon_before_2017_is_no_mastodon_id(self):
        """Mastodon counts from 1970 but made snowflakes only from 2017: a 1980 reading
        is implausible, with the reason."""
        from flakekit.values.readings import read

        reading = read(MASTODON, MASTODON.compose(time=dt.datetime(1980, 1, 1, tzinfo=UTC)),
                       self.NOW)
        assert not reading.plausible and "before 2017-01-01" in reading.evidence

    def test_max_as_mastodon_has_no_clamped_time(self):
        """2^64-1 as a Mastodon ID lies in the year 10889: no datetime, never 9999-12-31."""
        from flakekit.errors import InvalidIdError
        from flakekit.values.readings import read

        reading = read(MASTODON, 2**64 - 1, self.NOW)
        assert reading.fits and not reading.plausible and reading.timestamp is None
        with pytest.raises(InvalidIdError, match="about the year 10889"):
            MASTODON.timestamp(2**64 - 1)
        assert MASTODON.capacity(self.NOW).overflows_at is None
        assert MASTODON.describe()["overflows_at"] is None


LAYOUT_NAMES = ("snowflake", "sonyflake", "region-split", "twitter", "discord", "sonyflake-v2",
                "instagram", "mastodon")


class TestDecodeVerdicts:
    def test_max_as_mastodon_exits_1(self, capsys):
        """`decode 2^64-1 -l mastodon`: one line, exit 1, no clamped date."""
        code, out, err = run(capsys, "decode", str(2**64 - 1), "-l", "mastodon")
        assert code == 1 and out == "" and len(err.splitlines()) == 1
        assert ("is no mastodon ID: its time lies after 9999-12-31" in err
                and "9999-12-31T" not in err)
        assert "--all" in err

    def test_nothing_fits_exits_1(self, capsys):
        """--all where no layout reads a plausible time: one line, exit 1; --json still
        prints the readings for scripts."""
        code, out, err = run(capsys, "decode", str(2**64 - 1), "--all")
        assert code == 1 and out == "" and len(err.splitlines()) == 1
        assert "fits no known layout" in err
        code, out, err = run(capsys, "decode", str(2**64 - 1), "--all", "--json")
        assert code == 1 and json.loads(out)["verdict"] == "none"

    def test_bare_decode_of_a_foreign_id_says_so(self, capsys):
        """A tweet read as Sonyflake v2 lands in 2054: the reading is printed with a
        warning that suggests --all, and `plausible: false` in JSON."""
        code, out, err = run(capsys, "decode", "1541815603606036480", "-l", "sonyflake-v2",
                             "--json")
        assert code == 0 and json.loads(out)["plausible"] is False
        assert "does not look like a sonyflake-v2 ID: its time is in the future" in err
        assert "try `flakekit decode 1541815603606036480 --all`" in err

    def test_one_off_layouts(self, capsys):
        """--epoch/--bits and an inline table read the Discord vector at its published time."""
        code, out, err = run(capsys, "decode", "175928847299117063", "--epoch",
                             "2015-01-01T00:00:00Z", "--bits",
                             "time=42,worker=5,process=5,sequence=12",
                             "--json")
        assert code == 0, err
        data = json.loads(out)
        assert data["timestamp"] == "2016-04-30T11:18:25.796Z" and data["process"] == 0
        assert data["id_str"] == "175928847299117063"
        inline = ('{fields = [["time", 42], ["worker", 5], ["process", 5], ["sequence", 12]], '
                  'total_bits = 64, epoch = 1420070400000}')
        out = run_ok(capsys, "decode", "175928847299117063", "-l", inline, "--json")
        assert json.loads(out)["worker"] == 1
        out = run_ok(capsys, "decode", "1541815603606036480", "--unit", "10ms", "--json")
        assert json.loads(out)["layout"] == "one-off"

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--bits", "42/5/5"), "--bits: the bits add up to 52; use 53, 63 or 64"),
            (("--bits", "x/y"), "--bits: 'x/y': expected bits most significant first"),
            (("--unit", "3 parsecs"), "--unit"),
            (("--epoch", "yesterday"), "--epoch"),
            (("-l", "{fields = 3}"), "--layout: fields: expected a list of [name, bits] pairs"),
            (("-l", "{nope"), "--layout: not a TOML inline table"),
        ],
    )
    def test_bad_one_off_options(self, capsys, args, message):
        """A bad one-off option exits 2 naming the option."""
        code, _, err = run(capsys, "decode", "175928847299117063", *args)
        assert code == 2 and message in err and "Traceback" not in err
