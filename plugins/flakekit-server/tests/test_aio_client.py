"""flakekit.aio_client.AsyncClient against real `flakekit serve` processes on loopback."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from server_testing import Server, base, two_invoice_nodes

from flakekit.aio_client import AsyncClient
from flakekit.errors import (
    ClientConfigError,
    ClientConnectionError,
    ClientError,
    ClientRefusedError,
)
from flakekit.testing import free_port

pytestmark = pytest.mark.services



def run(coro):
    return asyncio.run(coro)


def test_single_and_batch(invoice_node):
    async def main():
        async with AsyncClient(base(invoice_node)) as client:
            singles = [await client.next_id("invoices") for _ in range(50)]
            batch = await client.next_ids("invoices", 200)
            orders = await client.next_ids("orders", 500)
            leaf = await client.next_ids("invoice", 3)    # the biz_tag: Leaf's URL
            return singles, batch, orders, leaf

    singles, batch, orders, leaf = run(main())
    assert singles == sorted(singles) and len(set(singles)) == 50
    assert batch == sorted(batch) and batch[0] > singles[-1] and len(batch) == 200
    assert len(set(orders)) == 500
    assert leaf == sorted(leaf) and leaf[0] > batch[-1]


def test_keep_alive_one_connection(invoice_node):
    async def main():
        async with AsyncClient(base(invoice_node)) as client:
            for _ in range(20):
                await client.next_id("orders")
            return [len(v) for v in client._idle.values()]

    assert run(main()) == [1]


def test_concurrent_calls_share_one_view_read(invoice_node):
    """500 concurrent buffered calls: the view is read once (not once per waiting call),
    one batch request at a time: at most two connections, unique IDs."""
    async def main():
        async with AsyncClient(base(invoice_node), buffer=50) as client:
            ids = await asyncio.gather(*(client.next_id("orders") for _ in range(500)))
            return ids, sum(len(v) for v in client._idle.values())

    ids, conns = run(main())
    assert len(set(ids)) == 500 and conns <= 2


def test_buffer(invoice_node):
    async def main():
        async with AsyncClient(base(invoice_node), buffer=30) as client:
            first = await client.next_id("invoices")
            held = len(client._buffers["invoices"])
            rest = await asyncio.gather(*(client.next_id("invoices") for _ in range(300)))
            for _ in range(100):            # the background refill lands meanwhile
                if "invoices" not in client._fills:
                    break
                await asyncio.sleep(0.01)
            return first, held, rest, len(client._buffers["invoices"])

    first, held, rest, left = run(main())
    assert held == 29
    assert len({first, *rest}) == 301
    assert left >= 6


def test_errors(invoice_node):
    async def main():
        async with AsyncClient(base(invoice_node), retry_budget=1) as client:
            with pytest.raises(ClientRefusedError) as info:
                await client.next_id("nope")
            assert info.value.status == 404 and "\n" not in str(info.value)
            with pytest.raises(ClientConfigError, match="^n: "):
                await client.next_ids("orders", 0)
            with pytest.raises(ClientConfigError, match="^key: "):
                await client.next_id("")

    run(main())


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "http://:80", "http://127.0.0.1:70000",
                                 "http://127.0.0.1:8080/x"])
def test_bad_urls(url):
    with pytest.raises(ClientConfigError, match="^urls: "):
        AsyncClient(url)


def test_connection_refused():
    url = f"http://127.0.0.1:{free_port()}"

    async def main():
        async with AsyncClient(url, retry_budget=0.5) as client:
            await client.next_id("orders")

    start = time.monotonic()
    with pytest.raises(ClientConnectionError) as info:
        run(main())
    assert time.monotonic() - start < 5
    assert "connection refused" in str(info.value) and "\n" not in str(info.value)


def test_closed_client_refuses(invoice_node):
    async def main():
        client = AsyncClient(base(invoice_node))
        await client.aclose()
        await client.next_id("orders")

    with pytest.raises(ClientError, match="closed"):
        run(main())


def test_server_killed_mid_run(tmp_path):
    async def main(one: Server, two: Server) -> None:
        async with AsyncClient([base(one), base(two)], retry_budget=2, timeout=2) as client:
            got = [await client.next_id("invoices") for _ in range(40)]
            one.stop(signal.SIGKILL)
            got += await asyncio.gather(*(client.next_id("invoices") for _ in range(40)))
            got += await client.next_ids("orders", 10)
            assert len(set(got)) == len(got) == 90
            two.stop(signal.SIGKILL)
            with pytest.raises(ClientConnectionError, match="cannot reach the node"):
                await client.next_id("invoices")

    with two_invoice_nodes(tmp_path) as (one, two):
        run(main(one, two))
