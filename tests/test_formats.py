"""String forms: round trips, sortable fixed widths, prefixes, one-line errors, config,
next_str(), and the CLI's -f/--prefix on `next` and `decode`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flakekit
from flakekit.builtin.layouts import SNOWFLAKE
from flakekit.errors import ConfigError, InvalidIdError
from flakekit.testing.cli import run_cli as run
from flakekit.testing.cli import run_ok
from flakekit.values.formats import DECIMAL, ENCODINGS, IdFormat, detect, parse_id

IDS = st.integers(0, 2**64 - 1)
PREFIXES = st.sampled_from(["", "ord_", "user_", "x1_", "a_b_"])
FORMATS = st.builds(IdFormat, st.sampled_from(ENCODINGS), PREFIXES, st.sampled_from([None, True]))


class TestProperties:
    @settings(max_examples=400, deadline=None)
    @given(FORMATS, IDS)
    def test_round_trip(self, fmt, value):
        """decode(encode(i)) == i for every encoding, prefix and padding."""
        text = fmt.encode(value)
        assert text.startswith(fmt.prefix)
        assert fmt.decode(text) == value
        assert parse_id(text, fmt) == value

    @settings(max_examples=400, deadline=None)
    @given(FORMATS.filter(lambda f: f.sortable), IDS, IDS)
    def test_fixed_width_sorts_like_the_numbers(self, fmt, a, b):
        """Fixed-width strings compare (bytewise) as the IDs do, and have one length."""
        sa, sb = fmt.encode(a), fmt.encode(b)
        assert len(sa) == len(sb) == len(fmt.prefix) + fmt.width
        assert (sa < sb) == (a < b) and (sa == sb) == (a == b)

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from(["hex", "base62", "base32"]), PREFIXES, IDS)
    def test_detect_finds_fixed_width_forms(self, encoding, prefix, value):
        """Without a format, a fixed-width string is recognised by its prefix and width."""
        text = IdFormat(encoding, prefix).encode(value)
        body = text[len(prefix):]
        if body.isdigit():  # an all-digit body reads as decimal (documented)
            return
        assert detect(text) == IdFormat(encoding, prefix)
        assert parse_id(text) == value


class TestEncodings:
    def test_known_values(self):
        """Widths hold any 64-bit ID: hex 16, base62 11, Crockford base32 13."""
        top = 2**64 - 1
        assert IdFormat("hex").encode(255) == "00000000000000ff"
        assert IdFormat("hex").encode(top) == "f" * 16
        assert IdFormat("base62").encode(61) == "0000000000z"
        assert IdFormat("base62").encode(top) == "LygHa16AHYF"
        assert IdFormat("base32").encode(top) == "FZZZZZZZZZZZZ"
        assert IdFormat("base32").encode(32) == "0000000000010"
        assert DECIMAL.encode(42) == "42" and IdFormat("decimal",
                                                       pad=True).encode(42) == "0" * 18 + "42"
        assert IdFormat("base62", prefix="ord_").encode(0) == "ord_00000000000"

    def test_crockford_reads_case_and_lookalikes(self):
        """Crockford base32 decodes lower case, I/L as 1 and O as 0."""
        fmt = IdFormat("crockford")
        assert fmt.encoding == "base32"
        assert fmt.decode("000000000001O") == fmt.decode("000000000001o") == 32
        assert fmt.decode("000000000000l") == fmt.decode("000000000000I") == 1

    @pytest.mark.parametrize(
        ("fmt", "text", "message"),
        [
            (IdFormat("base62", "ord_"), "usr_0000000000z",
             "expected the prefix 'ord_', got 'usr_'"),
            (IdFormat("base62", "ord_"), "ord_", "no digits after the prefix"),
            (IdFormat("base62"), "00000-00000z", "'-' at position 6 is not a base62 digit"),
            (IdFormat("base32"), "000000000000U", "'U' at position 13 is not a base32 digit"),
            (IdFormat("hex"), "1" * 17, "17 digits, at most 16 for a 64-bit id"),
            (IdFormat("base62"), "0" * 10,
             "10 characters, expected exactly 11 (exactly 11 base62 characters: 0-9, A-Z, a-z)"),
            (IdFormat("base32", "ord_"), "ord_" + "1" * 12,
             "expected exactly 13 ('ord_' then exactly 13 base32"),
            (IdFormat("hex"), "ff", "2 characters, expected exactly 16"),
            (IdFormat("base62"), "zzzzzzzzzzz", "does not fit in 64 bits"),
        ],
    )
    def test_bad_strings_say_what_is_wrong(self, fmt, text, message):
        """A bad string raises InvalidIdError with one line naming the fault."""
        with pytest.raises(InvalidIdError) as info:
            fmt.decode(text)
        assert message in str(info.value) and "\n" not in str(info.value)

    def test_bad_formats_name_the_field(self):
        """An unknown encoding suggests the nearest; a bad prefix says the rule."""
        with pytest.raises(ConfigError,
                           match=r"format.encoding: unknown encoding 'base63'.*did you mean "
                                 r"'base62'"):
            IdFormat("base63")
        with pytest.raises(ConfigError, match=r"format.prefix: 'ord-' is not a valid prefix"):
            IdFormat("hex", prefix="ord-")
        with pytest.raises(ConfigError, match=r"generators.o.format.prefix"):
            IdFormat.from_config({"encoding": "hex", "prefix": "9_"}, "generators.o.format")
        with pytest.raises(ConfigError,
                           match=r"generators.o.format.prefx: unknown key.*did you mean 'prefix'"):
            IdFormat.from_config({"prefx": "o_"}, "generators.o.format")
        with pytest.raises(InvalidIdError, match="0..2\\*\\*64-1"):
            IdFormat("hex").encode(-1)

    def test_layout_decompose_accepts_string_forms(self):
        """layout.decompose reads a prefixed string (detected, or with the format given)."""
        value = SNOWFLAKE.compose(time=123456789, worker=7, sequence=9)
        fmt = IdFormat("base62", prefix="ord_")
        text = fmt.encode(value)
        assert SNOWFLAKE.decompose(text) == SNOWFLAKE.decompose(value)
        assert SNOWFLAKE.decompose(text, fmt) == SNOWFLAKE.decompose(value)
        assert SNOWFLAKE.timestamp(IdFormat("base32").encode(value)) == SNOWFLAKE.timestamp(value)
        with pytest.raises(InvalidIdError, match="expected the prefix 'ord_'"):
            SNOWFLAKE.decompose("inv_" + text[4:], fmt)


CONFIG = """
[generators.orders]
layout = "snowflake"
allocator = {{type = "static", worker_id = 3}}
format = {fmt}
"""


@pytest.fixture
def orders_config(tmp_path):
    path = tmp_path / "flakekit.toml"
    path.write_text(CONFIG.format(fmt='{encoding = "base62", prefix = "ord_"}'))
    return path


def test_generator_next_str(orders_config):
    """A generator's `format` gives next_str()/next_strs() in that form, in ID order."""
    with flakekit.load(orders_config) as kit:
        gen = kit["orders"]
        assert gen.id_format == IdFormat("base62", "ord_")
        one = gen.next_str()
        many = gen.next_strs(500)
    assert one.startswith("ord_") and len(one) == 15
    values = [gen.id_format.decode(s) for s in [one, *many]]
    assert values == sorted(values) and len(set(values)) == 501
    assert [one, *many] == sorted([one, *many])
    assert SNOWFLAKE.decompose(one)["worker"] == 3


def test_format_string_shorthand_and_bad_config(tmp_path):
    """`format = "hex"` is a shorthand; a bad one fails at load naming the field."""
    path = tmp_path / "f.toml"
    path.write_text(CONFIG.format(fmt='"hex"'))
    assert flakekit.load(path).get("orders").id_format == IdFormat("hex")
    path.write_text(CONFIG.format(fmt='"base64"'))
    with pytest.raises(ConfigError,
                       match="generators.orders.format.encoding: unknown encoding 'base64'"):
        flakekit.load(path)


class TestCli:
    def test_next_and_decode_round_trip(self, capsys, orders_config):
        """`next` prints the generator's form; `decode` reads it back with the config."""
        out = run_ok(capsys, "next", "-n", "3", "-c", str(orders_config))
        strings = out.split()
        assert len(strings) == 3 and all(s.startswith("ord_") and len(s) == 15 for s in strings)
        code, out, _ = run(capsys, "decode", *strings, "-c", str(orders_config), "--json")
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["input"] for r in rows] == strings and all(r["worker"] == 3 for r in rows)

    def test_next_with_format_options(self, capsys, orders_config):
        """-f and --prefix override the configured format."""
        out = run_ok(capsys, "next", "-f", "hex", "--prefix", "o_", "-c", str(orders_config))
        assert out.startswith("o_") and len(out.strip()) == 18
        value = int(out.strip()[2:], 16)
        code, out, _ = run(capsys, "decode", out.strip(), "-f", "hex", "--json")
        assert json.loads(out)["id"] == value
        out = run_ok(capsys, "next", "-f", "decimal", "-c", str(orders_config))
        assert out.strip().isdigit()

    def test_decode_detects_the_form(self, capsys):
        """Without -f, decode recognises prefix and encoding by width."""
        value = SNOWFLAKE.compose(time=99999999, worker=5, sequence=1)
        for fmt in (IdFormat("base62", "ord_"), IdFormat("base32"), IdFormat("hex", "x_")):
            out = run_ok(capsys, "decode", fmt.encode(value), "--json")
            assert json.loads(out)["id"] == value

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("decode", "ord_0000000000!", "-f", "base62"),
             "'!' at position 11 is not a base62 digit"),
            (("decode", "ord_24crCcq7Nr", "-f", "base62"), "10 characters, expected exactly 11"),
            (("decode", "123", "-f", "base63"), "--format: unknown encoding 'base63'"),
            (("next", "--prefix", "ord", "-c", "{config}"),
             "--prefix: 'ord' is not a valid prefix"),
            (("decode", "ord_abc"), "id 'ord_abc' is not an integer or an id string"),
        ],
    )
    def test_bad_input_is_one_line(self, capsys, orders_config, args, message):
        """Bad strings and options: exit 2, one line naming what is wrong."""
        args = tuple(a.replace("{config}", str(orders_config)) for a in args)
        code, out, err = run(capsys, *args)
        assert code == 2, (out, err)
        assert message in err and "Traceback" not in err


def test_segment_generator_next_str(tmp_path, sqlite_url):
    """A segment generator takes `format` too: its dense IDs as prefixed strings."""
    from sqlalchemy import create_engine

    from flakekit.sql.leaf import SqlSegmentStore

    engine = create_engine(sqlite_url)
    SqlSegmentStore(engine).create("invoice", 10)
    engine.dispose()
    cfg = tmp_path / "segments.toml"
    cfg.write_text(
        f'[backends.main]\nurl = "{sqlite_url}"\n\n[generators.invoices]\nstrategy = "segment"\n'
        'store = { type = "sql", backend = "main" }\nkey = "invoice"\n'
        'format = { encoding = "base32", prefix = "inv_" }\n'
    )
    with flakekit.load(cfg) as kit:
        assert kit["invoices"].next_str() == "inv_0000000000001"
        assert kit["invoices"].next_strs(2) == ["inv_0000000000002", "inv_0000000000003"]
        assert kit["invoices"].next_id() == 4


class TestHexPrefixAmbiguity:
    def test_base32_starting_with_0x_is_not_hex(self):
        """A Crockford base32 ID whose text starts with 0X decodes as base32 (found by
        hypothesis: it used to be read as a broken 0x-hex number)."""
        fmt = IdFormat("base32")
        value = fmt.decode("0X0000000000G")
        assert fmt.encode(value) == "0X0000000000G"
        assert parse_id("0X0000000000G") == value

    def test_base62_starting_with_0x_is_not_hex(self):
        """An 11-character base62 body starting with 0x is base62, never a silent hex read."""
        fmt = IdFormat("base62")
        text = "0x123456789"
        assert parse_id(text) == fmt.decode(text) != int(text, 16)

    def test_plain_hex_still_works(self):
        """0x-hex that is no fixed-width form still reads as hex."""
        assert parse_id("0x1d4b0f2a3c000001") == 0x1D4B0F2A3C000001
        assert parse_id("0xff") == 255
