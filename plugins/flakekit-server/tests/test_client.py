"""flakekit.client.Client against real `flakekit serve` processes on loopback: single IDs,
batches, the local buffer, errors, bad URLs, and a node killed mid-run."""

from __future__ import annotations

import signal
import time

import pytest
from server_testing import base, two_invoice_nodes

from flakekit.client import Client
from flakekit.errors import (
    ClientConfigError,
    ClientConnectionError,
    ClientError,
    ClientRefusedError,
)
from flakekit.testing import free_port, in_threads

pytestmark = pytest.mark.services



def test_single_ids_of_a_segment_increase(invoice_node):
    with Client(base(invoice_node)) as client:
        ids = [client.next_id("invoices") for _ in range(150)]
    assert ids == sorted(ids) and len(set(ids)) == 150


def test_snowflake_ids(invoice_node):
    with Client([base(invoice_node)]) as client:
        ids = [client.next_id("orders") for _ in range(20)]
    assert len(set(ids)) == 20 and all(0 < i < 2**63 for i in ids)
    assert ids == sorted(ids)


def test_batch(invoice_node):
    with Client(base(invoice_node)) as client:
        first = client.next_id("invoices")
        batch = client.next_ids("invoices", 250)
        orders = client.next_ids("orders", 1000)
    assert len(batch) == 250 and batch == sorted(batch) and batch[0] > first
    assert len(set(orders)) == 1000


def test_segment_key_through_the_leaf_url(invoice_node):
    """A key that is no generator name (the biz_tag) is served by Leaf's URL."""
    with Client(base(invoice_node)) as client:
        one = client.next_id("invoice")
        three = client.next_ids("invoice", 3)
        assert "invoice" in client.routing.leaf_keys
    assert three == sorted(three) and three[0] > one


def test_keep_alive_one_connection(invoice_node):
    """Sequential calls reuse one kept-alive connection per node."""
    with Client(base(invoice_node)) as client:
        client.next_id("orders")
        pool = client._pools[base(invoice_node)]
        conn = pool.idle[0]
        for _ in range(30):
            client.next_id("orders")
        assert pool.idle == [conn]


def test_buffered_ids_come_from_memory(invoice_node):
    """buffer=N: one request fetches N, later calls hand them out; refills start early."""
    with Client(base(invoice_node), buffer=40) as client:
        ids = [client.next_id("invoices")]
        buf = client._buffers["invoices"]
        assert len(buf.ids) == 39            # the rest of the first batch waits in memory
        ids += [client.next_id("invoices") for _ in range(300)]
        assert len(set(ids)) == 301
        deadline = time.monotonic() + 10     # below 20% a background refill tops it up
        while buf.filling and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(buf.ids) >= 8


def test_buffer_threads_share_no_id(invoice_node):
    with Client(base(invoice_node), buffer=25) as client:
        mine = in_threads(lambda _: [client.next_id("invoices") for _ in range(200)], 4,
                          timeout=30)
    got = [i for ids in mine for i in ids]
    assert len(got) == 800 and len(set(got)) == 800


def test_unknown_generator_refused(invoice_node):
    with Client(base(invoice_node), retry_budget=1) as client, \
            pytest.raises(ClientRefusedError) as info:
        client.next_id("nope")
    assert info.value.status == 404 and info.value.code == "unknown_key"
    assert "nope" in str(info.value) and "\n" not in str(info.value)


def test_count_over_the_server_limit_refused(invoice_node):
    with Client(base(invoice_node)) as client, pytest.raises(ClientRefusedError) as info:
        client.next_ids("orders", 100_001)
    assert info.value.status == 400 and "count" in str(info.value)


@pytest.mark.parametrize(("n", "words"), [(0, "n: must be an integer >= 1"),
                                          (-3, "got -3"), (2.5, "got 2.5"), (True, "got True")])
def test_bad_count(invoice_node, n, words):
    with Client(base(invoice_node)) as client, pytest.raises(ClientConfigError, match=words):
        client.next_ids("orders", n)


@pytest.mark.parametrize("key", ["", None, 7])
def test_bad_key(invoice_node, key):
    with Client(base(invoice_node)) as client, pytest.raises(ClientConfigError, match="^key: "):
        client.next_id(key)


@pytest.mark.parametrize(("url", "words"), [
    ("ftp://127.0.0.1:8080", "scheme must be http or https, got 'ftp'"),
    ("localhost:8080", "scheme must be http or https"),
    ("127.0.0.1:8080", "scheme must be http or https"),
    ("http://:8080", "names no host"),
    ("http://127.0.0.1:99999", "port"),
    ("http://127.0.0.1:80x", "not a valid URL"),
    ("http://127.0.0.1:0", "the port must be 1 to 65535, got 0"),
    ("http://127.0.0.1:8080/api/v1", "no path"),
    ("http://u:p@127.0.0.1:8080", "credentials"),
    ("", "non-empty string"),
    (8080, "non-empty string"),
])
def test_bad_urls(url, words):
    with pytest.raises(ClientConfigError) as info:
        Client(["http://127.0.0.1:1", url])
    message = str(info.value)
    assert message.startswith("urls[1]: ") and words in message and "\n" not in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, ClientError)


@pytest.mark.parametrize(("kw", "words"), [
    ({"timeout": 0}, "timeout: must be a number of seconds > 0"),
    ({"retry_budget": -1}, "retry_budget: must be"),
    ({"buffer": -1}, "buffer: must be an integer >= 0"),
    ({"buffer": 1.5}, "buffer"),
])
def test_bad_options(kw, words):
    with pytest.raises(ClientConfigError, match=words):
        Client("http://127.0.0.1:8080", **kw)


def test_no_urls():
    with pytest.raises(ClientConfigError, match="give at least one node URL"):
        Client([])


def test_connection_refused():
    """Nothing listens: a one-line error after the retry budget, no traceback chain to read."""
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with Client(url, retry_budget=0.5) as client, pytest.raises(ClientConnectionError) as info:
        client.next_id("orders")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "connection refused" in message and url in message and "\n" not in message
    assert isinstance(info.value, ConnectionError)


def test_closed_client_refuses(invoice_node):
    client = Client(base(invoice_node))
    client.close()
    with pytest.raises(ClientError, match="closed"):
        client.next_id("orders")


def test_server_killed_mid_run(tmp_path):
    """Two nodes on one database: when one is killed, calls go on at the other; when both
    are gone, a ClientConnectionError within the budget."""
    with two_invoice_nodes(tmp_path) as (one, two), \
            Client([base(one), base(two)], retry_budget=2, timeout=2) as client:
        got = [client.next_id("invoices") for _ in range(40)]
        got += client.next_ids("orders", 10)
        one.stop(signal.SIGKILL)
        got += [client.next_id("invoices") for _ in range(40)]
        got += client.next_ids("orders", 10)
        assert len(set(got)) == len(got) == 100
        two.stop(signal.SIGKILL)
        with pytest.raises(ClientConnectionError, match="cannot reach the node"):
            client.next_id("invoices")
