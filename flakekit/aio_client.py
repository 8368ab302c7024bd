"""The asyncio client for ``flakekit serve``: :class:`AsyncClient`, the same routing as
:class:`flakekit.client.Client` (its :class:`~flakekit.client.Routing`), over asyncio
streams with keep-alive connections per node (standard library only).

Use it from one event loop; ``buffer=N`` refills a key's buffer in a task while the
buffered IDs are handed out.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque

from flakekit.client import (
    Answer,
    ClusterView,
    Done,
    NodeUrl,
    RoutingClient,
    ViewRead,
    check_count,
    check_key,
)
from flakekit.errors import FlakekitError

__all__ = ["AsyncClient"]

#: an answer's head (status line and headers) larger than this is refused
MAX_HEAD = 65_536


class _BadAnswer(ConnectionError):
    """The bytes on the connection are not an HTTP/1.1 answer we can read."""


class _Conn:
    """One keep-alive HTTP/1.1 connection over asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, node: NodeUrl) -> _Conn:
        context = ssl.create_default_context() if node.scheme == "https" else None
        reader, writer = await asyncio.open_connection(node.host, node.port, ssl=context)
        return cls(reader, writer)

    async def request(self, host: str, path: str, headers: dict[str, str]
                      ) -> tuple[int, dict[str, str], bytes, bool]:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self.writer.drain()
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("the server closed the connection") from exc
        except asyncio.LimitOverrunError as exc:
            raise _BadAnswer("the answer's headers are too large") from exc
        if len(head) > MAX_HEAD:
            raise _BadAnswer("the answer's headers are too large")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _BadAnswer(f"not an HTTP answer: {status_line[:60]!r}")
        answer: dict[str, str] = {}
        for field in fields:
            if field:
                name, _, value = field.partition(":")
                answer[name.strip().lower()] = value.strip()
        if "chunked" in answer.get("transfer-encoding", "").lower():
            raise _BadAnswer("chunked answers are not supported (a proxy between?)")
        close = answer.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0"
        length = answer.get("content-length")
        try:
            if length is not None:
                body = await self.reader.readexactly(int(length))
            elif close:
                body = await self.reader.read()
            else:
                raise _BadAnswer("the answer has no Content-Length")
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("the server closed the connection mid-answer") from exc
        except ValueError as exc:
            raise _BadAnswer(f"bad Content-Length {length!r}") from exc
        return int(parts[1]), answer, body, close

    def close(self) -> None:
        self.writer.close()


class AsyncClient(RoutingClient):
    """IDs from ``flakekit serve`` nodes, for asyncio (one event loop).

    Arguments as :class:`flakekit.client.Client`. Use ``async with AsyncClient(...)`` or
    call :meth:`aclose`.
    """

    def _init_io(self) -> None:
        self._idle: dict[str, list[_Conn]] = {}
        self._buffers: dict[str, deque[int]] = {}
        self._fills: dict[str, asyncio.Task[list[int]]] = {}
        self._refreshing: asyncio.Task[None] | None = None

    # -- the API -----------------------------------------------------------------------------
    async def next_id(self, key: str) -> int:
        """One ID of ``key`` (a generator name, or a segment key the server serves)."""
        check_key(key)
        if self.routing.buffer and not await self._strict(key):
            return await self._buffered(key)
        return (await self._fetch(key, 1))[0]

    async def next_ids(self, key: str, n: int) -> list[int]:
        """``n`` IDs of ``key`` in one request (a Leaf-only key: one request per ID)."""
        check_key(key)
        return await self._fetch(key, check_count(n))

    async def view(self) -> ClusterView | None:
        """The cluster view as last read (read now if never); None: not a cluster."""
        if self.routing.view_read_at is None:
            await self._refresh_view(None)
        return self.routing.view

    async def aclose(self) -> None:
        """Close every connection; buffered IDs are dropped (gaps, never reuse)."""
        self._closed = True
        fills, self._fills = list(self._fills.values()), {}
        for task in fills:
            task.cancel()
        for task in fills:
            try:
                await task
            except (asyncio.CancelledError, FlakekitError, OSError):
                pass
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
        self._buffers.clear()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- buffer ------------------------------------------------------------------------------
    async def _strict(self, key: str) -> bool:
        if self.routing.view_due(time.monotonic()):
            await self._refresh_view(None)
        return self._learned_strict(key)

    def _fill(self, key: str) -> asyncio.Task[list[int]]:
        task = self._fills.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fill_now(key))
            self._fills[key] = task
        return task

    async def _fill_now(self, key: str) -> list[int]:
        try:
            ids = await self._fetch(key, self.routing.buffer)
        finally:
            self._fills.pop(key, None)
        if not self._closed and not self.routing.is_strict(key):
            self._buffers.setdefault(key, deque()).extend(ids)
        return ids

    async def _buffered(self, key: str) -> int:
        low = max(1, self.routing.buffer // 5)
        while True:
            buf = self._buffers.get(key)
            if buf:
                value = buf.popleft()
                if len(buf) < low and not self._closed:
                    task = self._fill(key)
                    task.add_done_callback(_quiet)   # a failed refill: the next empty call says
                return value
            await asyncio.shield(self._fill(key))   # many waiters, one request

    # -- requests ----------------------------------------------------------------------------
    async def _fetch(self, key: str, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += await self._call(key, n - len(out))
        return out

    async def _call(self, key: str, n: int) -> list[int]:
        attempts = self._attempts(key, n)
        if self.routing.view_due(time.monotonic()):
            await self._refresh_view(None)
        while True:
            plan = attempts.next()
            step = attempts.settle(plan, await self._exchange(plan.base, plan.path,
                                                               plan.headers), time.monotonic())
            if isinstance(step, Done):
                return step.ids
            if step.delay:
                await asyncio.sleep(step.delay)
            if step.refresh is not None:
                await self._refresh_view(step.refresh or None)

    async def _refresh_view(self, prefer: str | None) -> None:
        """Read the view; callers arriving meanwhile share the one read."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(
                self._read_view(prefer))
        await asyncio.shield(task)

    async def _read_view(self, prefer: str | None) -> None:
        read = ViewRead(self.routing, prefer)
        for request in read:
            read.answer(await self._exchange(*request))

    async def _exchange(self, base: str, path: str, headers: dict[str, str]) -> Answer:
        """``_send``, with a connection error as the answer instead of raised."""
        try:
            return await self._send(base, path, headers)
        except (OSError, TimeoutError) as exc:
            return exc

    async def _send(self, base: str, path: str, headers: dict[str, str]
                    ) -> tuple[int, dict[str, str], bytes]:
        node = self.routing.nodes[base]
        host = base.split("://", 1)[1]
        idle = self._idle.setdefault(base, [])
        timeout = self.routing.timeout
        for again in (False, True):
            reused = bool(idle) and not again
            async with asyncio.timeout(timeout):
                conn = idle.pop() if reused else await _Conn.open(node)
            try:
                async with asyncio.timeout(timeout):
                    status, answer, body, close = await conn.request(host, path, headers)
            except (OSError, TimeoutError) as exc:
                conn.close()
                if reused and not isinstance(exc, (TimeoutError, _BadAnswer)):
                    continue   # a kept-alive connection the server closed: once more, new
                raise
            if close or self._closed:
                conn.close()
            else:
                idle.append(conn)
            return status, answer, body
        raise AssertionError("unreachable")  # pragma: no cover - the fresh try raises


def _quiet(task: asyncio.Task[list[int]]) -> None:
    if not task.cancelled():
        task.exception()   # retrieved: no "exception was never retrieved" warning
