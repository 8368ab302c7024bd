"""Large batches are made off the event loop (issue 15 item 4): a 100k batch must not hold
up the single-ID requests queued behind it on the loop."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from flakekit_server.app import IdService, Pending, ServerOptions
from server_testing import exchange, ok, sqlite_config

import flakekit
from flakekit.values.batch import IdBatch


class ThreadSpy:
    """The real generator, noting which thread each batch is drawn in."""

    def __init__(self, gen):
        self.gen = gen
        self.threads: list[str] = []

    def _drawn(self, method, n):
        """``self.gen.<method>(n)``, noting the thread it is called in."""
        self.threads.append(threading.current_thread().name)
        return getattr(self.gen, method)(n)

    def next_ids(self, n):
        return self._drawn("next_ids", n)

    def __getattr__(self, name):
        return getattr(self.gen, name)


class MemorySpy(ThreadSpy):
    """The same for a segment key, whose batches come from memory (never waiting)."""

    def try_next_ids(self, n):
        return self._drawn("try_next_ids", n)


def spy_on(service, name):
    """Put a spy in place of generator ``name`` (where the service's routes find it)."""
    if name in service.memory:
        spy = service.generators[name] = service.memory[name] = MemorySpy(service.generators[name])
    else:
        spy = service.generators[name] = ThreadSpy(service.generators[name])
    return spy


@pytest.fixture
def service(tmp_path):
    kit = flakekit.load(sqlite_config(tmp_path, {"invoice": 1000})).start()
    svc = IdService(kit, ServerOptions(max_count=100_000))
    yield svc
    svc.close()
    kit.close()


@pytest.mark.parametrize("name", ["orders", "invoices"])
def test_large_batch_runs_in_a_worker_thread(service, name):
    """count >= offload_count: the answer is a Pending whose batch is drawn in a worker
    thread, not the caller's (the event loop's); smaller batches stay inline."""
    spy = spy_on(service, name)
    small = service.handle(b"GET", f"/api/v1/next/{name}?count=10".encode(), None)
    assert isinstance(small, tuple) and small[0] == 200
    assert spy.threads == [threading.current_thread().name]
    count = service.options.offload_count
    answer = service.handle(b"GET", f"/api/v1/next/{name}?count={count}".encode(), None)
    assert isinstance(answer, Pending)
    status, _, body, _, route = asyncio.run(answer.result())
    assert (status, route) == (200, "next")
    ids = json.loads(body)["ids"]
    assert len(ids) == count == len(set(ids)) and ids == sorted(ids)
    assert spy.threads[-1].startswith("flakekit-server-batch")
    assert service.offloaded == 1 and service.issued[name] == 10 + count


def test_offloaded_batch_keeps_pipelined_order(tmp_path, start_server):
    """On one connection, a large batch then single IDs: answered in request order (the
    connection waits for the batch), and the counter shows the batch went off the loop."""
    server = start_server(sqlite_config(tmp_path, {"invoice": 1000}))
    big = b"GET /api/v1/next/invoices?count=20000&format=ranges HTTP/1.1\r\nHost: x\r\n\r\n"
    one = b"GET /api/segment/get/invoice HTTP/1.1\r\nHost: x\r\n\r\n"
    data = exchange(server, big + one + one + b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                              b"Connection: close\r\n\r\n")
    assert data.count(b"HTTP/1.1 200 OK") == 4
    parts = data.split(b"HTTP/1.1 200 OK")[1:]
    batch = json.loads(parts[0].split(b"\r\n\r\n", 1)[1])
    singles = [int(p.split(b"\r\n\r\n", 1)[1]) for p in parts[1:3]]
    end = batch["ranges"][-1]["stop"]
    assert batch["count"] == 20000 and singles[0] >= end and singles == sorted(singles)
    status, body = server.json("/api/v1/status")
    assert status == 200, body
    assert body["processes"][0]["offloaded_batches"] == 1
    metrics = ok(server, "/metrics").decode()
    assert 'flakekit_http_offloaded_batches_total{process="0"} 1' in metrics


def test_view_epoch_header_must_be_a_number(tmp_path, start_server):
    """X-Flakekit-View-Epoch is checked on every server (400 naming it), cluster or not."""
    server = start_server(sqlite_config(tmp_path, {"invoice": 1000}))
    status, _, body = server.get("/api/segment/get/invoice", {"X-Flakekit-View-Epoch": "x1"})
    assert status == 400 and b"X-Flakekit-View-Epoch" in body
    status, headers, body = server.get("/api/segment/get/invoice", {"X-Flakekit-View-Epoch": "7"})
    assert status == 200 and body.isdigit() and "x-flakekit-owner-epoch" not in headers
    status, data = server.json("/api/v1/cluster")
    assert status == 404 and data["error"] == "no_cluster" and "[cluster]" in data["message"]


@pytest.mark.parametrize("fmt", ["numbers", "strings", "text", "base62", "ranges"])
def test_a_batch_encoded_in_slices_is_the_same_answer(service, fmt):
    """The loop encodes a large batch ENCODE_SLICE IDs at a time; the bytes are the ones
    the one-piece encoder makes, across ranges that do not line up with the slices."""
    from flakekit_server import encoding

    batch = IdBatch([range(10, 10 + 3 * encoding.ENCODE_SLICE + 7), range(90_000, 90_005),
                     range(100_000, 100_000 + encoding.ENCODE_SLICE)])
    whole = service.bodies.format("orders", len(batch), fmt, batch, batch.ranges)
    sliced = asyncio.run(service.bodies.format_in_slices("orders", len(batch), fmt, batch))
    assert sliced == whole
    if fmt == "numbers":
        assert json.loads(whole[2])["ids"] == list(batch)


def test_the_loop_answers_other_work_between_slices(service):
    """While a 100k batch is encoded, other callbacks of the loop run between its slices
    (single IDs are answered there): at least one turn per slice."""
    from flakekit_server import encoding

    batch = IdBatch([range(7 << 40, (7 << 40) + 100_000)])
    turns = 0

    async def main() -> bytes:
        nonlocal turns
        done = False

        async def other() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        answer = await service.bodies.format_in_slices("orders", len(batch), "numbers", batch)
        done = True
        await task
        return answer[2]

    body = asyncio.run(main())
    assert turns >= 100_000 // encoding.DECIMAL_SLICE   # decimal IDs: written in bulk slices
    assert len(json.loads(body)["ids"]) == 100_000


def test_two_large_batches_of_one_generator_are_drawn_one_after_the_other(service):
    """Two large batches of one generator at once: one is drawn whole, then the other
    (the generator's lock is shared with single IDs, not with a second batch), so each
    batch is one contiguous stretch of the generator's IDs."""
    count = 3 * service.options.offload_count

    async def both() -> list[Any]:
        answers = [service.handle(b"GET", f"/api/v1/next/orders?count={count}".encode(), None)
                   for _ in range(2)]
        assert all(isinstance(a, Pending) for a in answers)
        return await asyncio.gather(*(a.result() for a in answers))

    a, b = (json.loads(r[2])["ids"] for r in asyncio.run(both()))
    assert len(a) == len(b) == count
    assert max(a) < min(b) or max(b) < min(a)


def test_a_segment_key_with_empty_buffers_is_drawn_off_the_loop(service):
    """The Leaf URL of a segment key draws with try_next_id on the loop (never waits for
    the database); when its buffers are empty the transport answers draw_later(), which
    draws in a worker thread."""
    name, draw, route, _ = service.fast[b"/api/segment/get/invoice"]
    gen = service.generators[name]
    assert draw == gen.try_next_id and route == "leaf_segment"
    seen: list[str] = []

    class Spy:
        def next_id(self):
            seen.append(threading.current_thread().name)
            return gen.next_id()

    pending = service.draw_later(name, route, Spy())
    status, _, body, _, got_route = asyncio.run(pending.result())
    assert (status, got_route) == (200, "leaf_segment") and int(body) >= 1
    assert seen and seen[0].startswith("flakekit-server-draw")
    assert service.issued_count(name) >= 1
