"""The clients in cluster mode against real `flakekit serve` nodes (one SQLite database as
the membership store): strict keys routed to the owner, 421 followed, an older owner
epoch refused, the owner killed mid-run."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from server_testing import Server, base, create_keys, write_config

from flakekit.aio_client import AsyncClient
from flakekit.client import Client
from flakekit.errors import StaleOwnerEpochError
from flakekit.testing import free_port

pytestmark = pytest.mark.services

KEY = "invoices"     # an order = "strict" segment generator ...
ROUTE = "invoice"    # ... of this key: its owner is the key's (the view's owners name it)
LEASE = "3s"


def start_cluster(tmp_path, nodes: int = 2) -> list[Server]:
    url = f"sqlite:///{tmp_path / 'ids.db'}"
    create_keys(url, {"invoice": 100})
    extra = (f'[generators.{KEY}]\nstrategy = "segment"\n'
             'store = { type = "sql", backend = "main" }\nkey = "invoice"\norder = "strict"\n\n'
             f'[cluster]\nname = "clients"\nmembership = {{ type = "sql", backend = "main" }}\n'
             f'lease = "{LEASE}"\nhandoff_wait = "1s"\n')
    config = write_config(tmp_path / "flakekit.toml", url, segments={}, extra=extra)
    servers = []
    for i in range(nodes):
        port = free_port()
        servers.append(Server(config, "--port", str(port), "--node", f"n{i}",
                              "--advertise", f"http://127.0.0.1:{port}", tmp=tmp_path))
    wait_for_view(servers, nodes)
    return servers


def view_of(server: Server) -> dict:
    status, _, body = server.get("/api/v1/cluster")
    assert status == 200, body
    return json.loads(body)


def wait_for_view(servers: list[Server], members: int, timeout: float = 30) -> dict:
    """Until every node serves the same view epoch with ``members`` members."""
    deadline = time.monotonic() + timeout
    while True:
        views = [view_of(s) for s in servers]
        epochs = {v["epoch"] for v in views}
        if len(epochs) == 1 and all(len(v["members"]) == members for v in views):
            return views[0]
        assert time.monotonic() < deadline, views
        time.sleep(0.1)


def owner_and_other(servers: list[Server]) -> tuple[Server, Server]:
    with Client(base(servers[0])) as client:
        client.next_id(KEY)
        owner = client.routing.owner_base(KEY)
    first = next(s for s in servers if base(s) == owner)
    return first, next(s for s in servers if s is not first)


def stop_all(servers: list[Server]) -> None:
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two nodes n0, n1 of one cluster, for the tests that leave the nodes as they are."""
    servers = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield servers
    stop_all(servers)


def test_view_is_read_and_strict_keys_go_to_the_owner(cluster):
    servers = cluster
    owner, other = owner_and_other(servers)
    with Client(base(other)) as client:     # only the non-owner is given
        ids = [client.next_id(KEY) for _ in range(30)]
        view = client.view()
        assert view is not None and view.hash == "hrw-xxh64-v1"
        assert {m.node for m in view.members} == {"n0", "n1"}
        assert client.routing.is_strict(KEY)
        assert client.routing.owner_base(KEY) == base(owner)
        assert client.routing.epochs[ROUTE] >= 1
        # the owner was asked directly: a kept-alive connection to it is idle now
        assert client._pools[base(owner)].idle
    assert ids == sorted(ids) and len(set(ids)) == 30


def test_strict_keys_are_never_buffered(cluster):
    servers = cluster
    with Client([base(s) for s in servers], buffer=50) as a, \
            Client([base(s) for s in servers], buffer=50) as b:
        ids = [c.next_id(KEY) for _ in range(20) for c in (a, b)]
        assert KEY not in a._buffers and KEY not in b._buffers
        a.next_id("orders")                  # not strict: buffered as without a cluster
        assert len(a._buffers["orders"].ids) == 49
    assert ids == sorted(ids) and len(set(ids)) == 40   # per-key real-time order


def test_a_421_is_followed_to_the_owner(cluster):
    servers = cluster
    owner, other = owner_and_other(servers)
    with Client([base(s) for s in servers]) as client:
        client.next_id(KEY)
        epoch = client.routing.view.epoch
        client.routing.hints[KEY] = (epoch, base(other))   # a wrong idea of the owner
        value = client.next_id(KEY)
        assert client.routing.hints[KEY][1] == base(owner)  # from the 421's advertise
        assert client.next_id(KEY) > value


def test_an_older_owner_epoch_is_refused(cluster):
    servers = cluster
    with Client(base(servers[0])) as client:
        client.next_id(KEY)
        seen = client.routing.epochs[ROUTE]
        client.routing.epochs[ROUTE] = seen + 1000        # as if a newer owner answered
        with pytest.raises(StaleOwnerEpochError) as info:
            client.next_id(KEY)
        assert info.value.epoch == seen and info.value.seen == seen + 1000
        assert "\n" not in str(info.value)


def test_async_client_routes_and_refuses_older_epochs(cluster):
    servers = cluster

    async def main():
        async with AsyncClient([base(s) for s in servers]) as client:
            ids = [await client.next_id(KEY) for _ in range(20)]
            ids += await client.next_ids(KEY, 30)
            assert client.routing.is_strict(KEY)
            client.routing.epochs[ROUTE] += 1000
            with pytest.raises(StaleOwnerEpochError):
                await client.next_id(KEY)
            return ids

    ids = asyncio.run(main())
    assert ids == sorted(ids) and len(set(ids)) == 50


@pytest.mark.slow
def test_owner_killed_the_key_moves_and_the_client_follows(tmp_path):
    """The owner is SIGKILLed: the client waits (503 + Retry-After, refused connections)
    within its budget until the other node owns the key, at a higher epoch, with IDs above
    every earlier one."""
    servers = start_cluster(tmp_path)
    try:
        owner, other = owner_and_other(servers)
        with Client([base(s) for s in servers], retry_budget=30) as client:
            before = [client.next_id(KEY) for _ in range(10)]
            epoch = client.routing.epochs[ROUTE]
            owner.stop(signal.SIGKILL)
            after = client.next_id(KEY)
            assert after > max(before)
            assert client.routing.epochs[ROUTE] > epoch
            assert client.routing.owner_base(KEY) == base(other)
    finally:
        stop_all(servers)
