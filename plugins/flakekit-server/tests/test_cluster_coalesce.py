"""Coalesced forwards (flakekit_server/coalesce.py): single-ID requests for a strict key
that reach a non-owner share upstream requests to the owner, and the IDs still increase
strictly as clients see them.

The first tests run the coalescer and the forwarder against an owner made here (a small
HTTP server on loopback that holds each batch until the test lets it answer), so a test
decides what arrives while a batch is in flight. The last ones run two real nodes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from cluster_testing import Recorder, check_ids, metric
from flakekit_server.coalesce import Coalescer, single_shape
from flakekit_server.forward import Forwarder, ForwardError

from flakekit.testing.databases import free_port

LEAF = "/api/segment/get/order"


class Owner:
    """An owner on loopback: ``GET /api/v1/next/orders?count=N`` -> N IDs from a counter,
    each answer held until :meth:`release` (or answered at once with ``hold=False``);
    ``status``/``body`` override the next answers; ``extra`` IDs beyond the count."""

    def __init__(self, hold: bool = True) -> None:
        self.hold = hold
        self.counts: list[int] = []          # the count of every batch, as received
        self.next_value = 1
        self.status = 200
        self.refusal = b""
        self.extra = 0
        self.max_count = 0                   # > 0: a larger count is a 400
        self.release_newest = False
        self.headers: list[dict[str, str]] = []
        self._gates: list[asyncio.Event] = []
        self.received = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Owner:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def advertise(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def release(self) -> None:
        """Let the oldest held answer go (the newest with ``release_newest``)."""
        while not self._gates:
            await self._wait_received()
        self._gates.pop(-1 if self.release_newest else 0).set()

    async def _wait_received(self) -> None:
        self.received.clear()
        await asyncio.wait_for(self.received.wait(), 10)

    async def wait_batches(self, n: int) -> None:
        while len(self.counts) < n:
            await self._wait_received()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *lines = head.decode().split("\r\n")
                self.headers.append({k.lower(): v for k, _, v in
                                     (h.partition(": ") for h in lines if h)})
                count = int(re.search(r"count=(\d+)", line).group(1))  # type: ignore[union-attr]
                self.counts.append(count)
                gate = asyncio.Event()
                if self.hold:
                    self._gates.append(gate)
                self.received.set()
                if self.hold:
                    await gate.wait()
                writer.write(self._answer(count))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def _answer(self, count: int) -> bytes:
        if self.max_count and count > self.max_count:
            status, body = 400, b'{"error":"bad_request","status":400,"message":"count"}'
        elif self.status != 200:
            status, body = self.status, self.refusal
        else:
            n = count + self.extra
            ids = list(range(self.next_value, self.next_value + n))
            self.next_value += n
            status = 200
            body = (b'{"generator":"orders","count":%d,"ids":[' % n
                    + ",".join(map(str, ids)).encode() + b"]}")
        reason = {200: "OK", 400: "Bad Request", 503: "Service Unavailable"}[status]
        return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"X-Flakekit-Owner-Epoch: 7\r\n\r\n" % (status, reason.encode(), len(body))
                + body)


class Client:
    """Requests submitted to a coalescer, their answers in submission order."""

    def __init__(self, coalescer: Coalescer, advertise: str,
                 auth: bytes | None = b"Bearer t") -> None:
        self.coalescer = coalescer
        self.advertise = advertise
        self.auth = auth
        self.answers: list[Any] = []
        self.futures: list[asyncio.Future[Any]] = []

    def submit(self, url: bytes = LEAF.encode(),
               route: str = "leaf_segment") -> asyncio.Future[Any]:
        shape = single_shape(route, url, {"order": "orders", "orders": "orders"})
        assert shape is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answered(answer: Any, exc: ForwardError | None = None) -> None:
            assert not future.done(), "answered twice"
            future.set_result(exc if exc is not None else answer[:4])

        def failed(reply: Any, answer: Any, exc: ForwardError | None) -> None:
            assert reply is answered
            answered(answer, exc)

        self.coalescer.submit((self.advertise, shape[0], self.auth),
                              (shape[1], answered, route, failed, b"X-Via: n9\r\n"))
        self.futures.append(future)
        return future


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def with_owner(test: Callable[[Owner, Client], Awaitable[None]]) -> Callable[[], None]:
    """``test`` as a plain test function: it gets a started :class:`Owner` and a
    :class:`Client` of a fresh coalescer (over a forwarder as node n1) aimed at it."""
    def run_test() -> None:
        async def main() -> None:
            owner = await Owner().start()
            forwarder = Forwarder("n1", timeout=30)
            try:
                await test(owner, Client(Coalescer(forwarder), owner.advertise))
            finally:
                forwarder.close()

        run(main())

    run_test.__doc__ = test.__doc__
    return run_test


def test_the_shapes_that_coalesce():
    gens = {"order": "orders", "orders": "orders"}
    leaf = single_shape("leaf_segment", b"/api/segment/get/order", gens)
    assert leaf is not None and leaf[0] == b"orders" and leaf[1](b"42") == (
        b"text/plain; charset=utf-8", b"42")
    # Leaf's URL: a "/" at the end and any query parameter, as the owner takes them
    assert single_shape("leaf_segment", b"/api/segment/get/order/?x=1", gens) is not None
    numbers = single_shape("next", b"/api/v1/next/orders?count=1&format=numbers", gens)
    assert numbers is not None and numbers[1](b"42") == (
        b"application/json", b'{"generator":"orders","count":1,"ids":[42]}')
    text = single_shape("next", b"/api/v1/next/orders?format=text", gens)
    assert text is not None and text[1](b"42") == (b"text/plain; charset=utf-8", b"42\n")
    # forwarded as they are: batches, other formats, unknown or repeated parameters, a key
    # with no generator of its own (keys = "all")
    for route, url in [("next", b"/api/v1/next/orders?count=2"),
                       ("next", b"/api/v1/next/orders?format=ranges"),
                       ("next", b"/api/v1/next/orders?format=strings"),
                       ("next", b"/api/v1/next/orders?count=1&count=1"),
                       ("next", b"/api/v1/next/orders?x=1"),
                       ("next", b"/api/v1/next/or%20ders"),
                       ("leaf_segment", b"/api/segment/get/other"),
                       ("leaf_snowflake", b"/api/snowflake/get/order")]:
        assert single_shape(route, url, gens) is None, url


async def _rounds(n: int = 3) -> None:
    """Let the loop run a few rounds: a send due at the end of a round has been made."""
    for _ in range(n):
        await asyncio.sleep(0)


@with_owner
async def test_a_batch_serves_only_requests_that_arrived_before_it_was_sent(owner, client):
    coalescer = client.coalescer
    a = client.submit()
    await owner.wait_batches(1)              # A's batch is in flight, held
    b, c = client.submit(), client.submit()  # a second batch goes at once: B and C
    await owner.wait_batches(2)
    d = client.submit()                      # two in flight (IN_FLIGHT): D waits
    await _rounds()
    assert coalescer.batches == 2 and owner.counts == [1, 2]
    await owner.release()                    # A answered: D goes, alone
    await owner.wait_batches(3)
    await owner.release()
    await owner.release()
    answers = [await f for f in (a, b, c, d)]
    assert owner.counts == [1, 2, 1]
    assert [x[2] for x in answers] == [b"1", b"2", b"3", b"4"]   # the owner's draw order
    for status, ctype, _, headers in answers:
        assert status == 200 and ctype.startswith(b"text/plain")
        assert b"X-Flakekit-Owner-Epoch: 7\r\n" in headers
        assert headers.endswith(b"X-Via: n9\r\n")   # the node it was relayed from
    # the hop is marked and the caller's token passed on
    assert {h["x-flakekit-forwarded-by"] for h in owner.headers} == {"n1"}
    assert {h["authorization"] for h in owner.headers} == {"Bearer t"}
    assert (coalescer.batches, coalescer.requests, coalescer.served) == (3, 4, 4)


@with_owner
async def test_one_in_flight_sends_the_next_batch_once_the_last_is_answered(owner, client):
    client = Client(Coalescer(client.coalescer.forwarder, max_in_flight=1), owner.advertise)
    a = client.submit()
    await owner.wait_batches(1)              # A's batch is in flight, held
    b, c = client.submit(), client.submit()  # they wait
    await _rounds()
    assert client.coalescer.batches == 1
    await owner.release()                    # A answered; B and C go, as one batch
    await owner.wait_batches(2)
    d = client.submit()                      # arrives after B+C's batch was sent
    assert owner.counts == [1, 2]
    await owner.release()
    await owner.wait_batches(3)
    await owner.release()
    answers = [await f for f in (a, b, c, d)]
    assert owner.counts == [1, 2, 1]
    assert [x[2] for x in answers] == [b"1", b"2", b"3", b"4"]   # arrival order


@with_owner
async def test_batches_in_flight_together_may_be_drawn_in_either_order(owner, client):
    """Two batches in flight hold requests that overlap in time: whichever the owner
    answers first, every request gets the ID of its batch's draw, in arrival order
    within the batch, and no ID twice (the owner's order is the only order owed)."""
    a = client.submit()
    await owner.wait_batches(1)
    b, c = client.submit(), client.submit()
    await owner.wait_batches(2)
    owner.release_newest = True              # the second batch is drawn first
    await owner.release()
    await owner.release()
    answers = [(await f)[2] for f in (a, b, c)]
    assert answers == [b"3", b"1", b"2"]


@with_owner
async def test_an_error_goes_to_every_request_of_the_batch(owner, client):
    first = client.submit()
    await owner.wait_batches(1)
    waiting = [client.submit() for _ in range(3)]
    await owner.release()
    await owner.wait_batches(2)
    owner.status, owner.refusal = 503, b'{"error":"key_moving","status":503}'
    late = client.submit()                   # after the failing batch was sent
    await owner.release()
    await owner.wait_batches(3)
    owner.status = 200
    await owner.release()
    assert (await first)[2] == b"1"
    for f in waiting:
        status, _, body, _ = await f
        assert status == 503 and json.loads(body)["error"] == "key_moving"
    assert (await late)[2] == b"2"           # not one ID of the refused batch: none
    assert owner.counts == [1, 3, 1]


@with_owner
async def test_an_unreachable_owner_fails_every_waiting_request(owner, client):
    client = Client(client.coalescer, f"http://127.0.0.1:{free_port()}")  # nobody there
    futures = [client.submit() for _ in range(4)]
    answers = [await f for f in futures]
    assert all(isinstance(a, ForwardError) for a in answers), answers


@with_owner
async def test_leftover_ids_are_dropped_and_a_short_answer_is_an_error(owner, client):
    owner.extra = 5                          # an owner answering more than asked
    first = client.submit()
    await owner.wait_batches(1)
    second = [client.submit(), client.submit()]
    await owner.release()
    await owner.wait_batches(2)
    owner.extra = -1                         # ... and then fewer
    await owner.release()
    assert (await first)[2] == b"1"          # 2..6 dropped, never handed out
    for f in second:
        assert isinstance(await f, ForwardError)
    owner.extra = 0
    third = client.submit()
    await owner.wait_batches(3)
    await owner.release()
    assert (await third)[2] == b"8"          # 7 went to the short answer: dropped


@with_owner
async def test_a_batch_over_the_owners_max_count_is_sent_again_in_halves(owner, client):
    owner.max_count = 2
    client = Client(client.coalescer, owner.advertise, auth=None)
    first = client.submit()
    await owner.wait_batches(1)
    rest = [client.submit() for _ in range(5)]
    owner.hold = False                       # every further answer at once
    await owner.release()
    answers = [await f for f in (first, *rest)]
    assert [a[2] for a in answers] == [b"1", b"2", b"3", b"4", b"5", b"6"]
    assert owner.counts == [1, 5, 2, 2, 1]
    assert "authorization" not in owner.headers[0]


@with_owner
async def test_groups_never_mix_tokens(owner, client):
    one = Client(client.coalescer, owner.advertise, b"Bearer one")
    two = Client(client.coalescer, owner.advertise, b"Bearer two")
    a, b = one.submit(), two.submit()        # two groups: two batches in flight
    await owner.wait_batches(2)
    await owner.release()
    await owner.release()
    await a
    await b
    assert sorted(h["authorization"] for h in owner.headers) == ["Bearer one",
                                                                 "Bearer two"]


# -- two real nodes --------------------------------------------------------------------------
def _coalesced(node: Any) -> dict[str, int]:
    status, body = node.json("/api/v1/status")
    assert status == 200
    return body["processes"][0]["cluster"]["coalesced"]


def test_forwarded_and_direct_requests_are_linearizable(start_cluster):
    """Many concurrent forwarded requests (coalesced on the non-owner) and direct ones on
    the owner: no ID twice, and an ID answered to a request that started after another
    ended is larger (I2), whichever node each went through."""
    cluster = start_cluster(2)
    owner = cluster.owner_of()
    other = cluster.others(owner)[0]
    before = _coalesced(other)
    ok_before = metric(other, "flakekit_http_requests_total", route="leaf_segment", code="200")
    issued_before = metric(other, "flakekit_ids_issued_total", generator="orders")
    recorder = Recorder([other, owner, other], path=LEAF, clients=9)
    records = recorder.run(150)
    assert not recorder.errors
    served = [r for r in records if r.id is not None]
    assert len(served) == len(records) == 9 * 150
    check_ids(served)
    after = _coalesced(other)
    forwarded = sum(1 for r in records if r.node == other.name)
    assert after["requests"] - before["requests"] == forwarded
    assert 0 < after["batches"] - before["batches"] <= forwarded
    # the forwarding node counts the answers it relayed, not as IDs it issued
    ok_after = metric(other, "flakekit_http_requests_total", route="leaf_segment", code="200")
    assert ok_after - ok_before == forwarded
    assert metric(other, "flakekit_ids_issued_total", generator="orders") == issued_before


def test_a_coalesced_answer_is_the_owners_answer(start_cluster):
    """Through the non-owner, each single-ID shape comes back as the owner gives it:
    status, content type, body form, the owner's epoch and the node it came from."""
    cluster = start_cluster(2)
    owner = cluster.owner_of()
    other = cluster.others(owner)[0]
    for path in (LEAF, "/api/v1/next/orders", "/api/v1/next/orders?count=1&format=numbers",
                 "/api/v1/next/orders?format=text", "/api/segment/get/orders/"):
        direct = owner.get(path)
        relayed = other.get(path)
        assert (relayed[0], relayed[1]["content-type"]) == (direct[0], direct[1]["content-type"])
        assert relayed[1]["x-flakekit-owner-epoch"] == direct[1]["x-flakekit-owner-epoch"]
        assert relayed[1]["x-flakekit-relayed-from"] == owner.name
        shape = re.sub(rb"\d+", b"N", direct[2])
        assert re.sub(rb"\d+", b"N", relayed[2]) == shape, (path, relayed[2], direct[2])
        first = re.findall(rb"\d+", direct[2])[-1]
        assert int(re.findall(rb"\d+", relayed[2])[-1]) > int(first)


def test_an_unreachable_owner_is_a_503_on_the_leaf_url(start_cluster):
    """The transport's forward path (a Leaf URL, no cluster header) answers a dead owner
    as the long way round does: 503 ``owner_unreachable`` naming the owner, with
    ``Retry-After``, counted; nothing served."""
    cluster = start_cluster(2)
    owner = cluster.owner_of()
    other = cluster.others(owner)[0]
    assert other.get(LEAF)[0] == 200              # a pooled connection to the owner
    before = metric(other, "flakekit_cluster_refused_total", reason="owner_unreachable")
    cluster.kill9(cluster.index(owner))           # the view names it for a lease still
    status, headers, body = other.get(LEAF)
    assert status == 503, body
    refusal = json.loads(body)
    assert refusal["error"] == "owner_unreachable" and repr(owner.name) in refusal["message"]
    assert headers["retry-after"] == "1"
    after = metric(other, "flakekit_cluster_refused_total", reason="owner_unreachable")
    assert after == before + 1
