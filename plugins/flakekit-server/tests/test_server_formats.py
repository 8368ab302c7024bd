"""String forms over HTTP: `format=strings` gives the generator's configured form,
`format=hex|base62|base32|decimal` that encoding (with the generator's prefix), and
/api/v1/decode reads the strings back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from server_testing import Server, ok_json

from flakekit.values.formats import IdFormat


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formats")
    config = tmp / "flakekit.toml"
    config.write_text(
        f'[backends.main]\nurl = "sqlite:///{tmp / "ids.db"}"\n\n'
        '[generators.orders]\nallocator = { type = "sql", backend = "main" }\n'
        'format = { encoding = "base62", prefix = "ord_" }\n\n'
        '[generators.plain]\nallocator = { type = "sql", backend = "main", service = "plain" }\n'
    )
    server = Server(config, tmp=tmp)
    yield server
    server.stop()


def test_strings_use_the_generators_format(api):
    """format=strings: the configured form, sortable like the IDs; decimal by default."""
    status, data = api.json("/api/v1/next/orders?count=50&format=strings")
    assert status == 200
    ids = data["ids"]
    assert all(s.startswith("ord_") and len(s) == 15 for s in ids) and ids == sorted(ids)
    data = ok_json(api, "/api/v1/next/plain?count=2&format=strings")
    assert all(s.isdigit() for s in data["ids"])


def test_an_encoding_keeps_the_prefix(api):
    status, data = api.json("/api/v1/next/orders?count=3&format=hex")
    assert status == 200 and all(s.startswith("ord_") and len(s) == 20 for s in data["ids"])
    values = [IdFormat("hex", "ord_").decode(s) for s in data["ids"]]
    assert values == sorted(values) and len(set(values)) == 3


def test_decode_reads_the_string_back(api):
    data = ok_json(api, "/api/v1/next/orders?format=strings")
    text = data["ids"][0]
    status, info = api.json(f"/api/v1/decode/{text}?generator=orders")
    assert status == 200 and info["id"] == IdFormat("base62", "ord_").decode(text)


def test_bad_format_is_a_400(api):
    status, data = api.json("/api/v1/next/orders?format=base63")
    assert status == 400 and "an encoding (decimal, hex, base62, base32)" in data["message"]


@given(start=st.one_of(st.integers(0, 3000), st.integers(0, 2**63 - 10_000)),
       lengths=st.lists(st.integers(0, 4500), min_size=1, max_size=3),
       gap=st.integers(1, 5000), sep=st.sampled_from([b",", b'","', b"\n"]))
def test_decimal_join_writes_what_str_writes(start, lengths, gap, sep):
    """Batches are written in bulk (a block of 1,000 consecutive IDs in one join): the
    same bytes as str() of every ID, at any start (below 1,000 too) and block edge."""
    from flakekit_server.app import decimal_join

    from flakekit.values.batch import IdBatch

    ranges = []
    for n in lengths:
        ranges.append(range(start, start + n))
        start += n + gap
    want = sep.decode().join(str(i) for r in ranges for i in r).encode()
    assert decimal_join(IdBatch(ranges), sep) == want
    assert decimal_join(ranges[0], sep) == sep.decode().join(map(str, ranges[0])).encode()
    assert decimal_join(range(start, start + 3 * gap, 3), sep) == sep.join(
        b"%d" % i for i in range(start, start + 3 * gap, 3))
