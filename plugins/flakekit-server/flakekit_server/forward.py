"""Forwarding a strict key's request to its owner: one hop, on the event loop.

A node that does not own a strict key passes the request on to the owner's advertise URL
with ``X-Flakekit-Forwarded-By: <this node>`` and relays the owner's answer unchanged
(status, content type, body and headers such as ``X-Flakekit-Owner-Epoch``). The owner
never forwards a request that carries the header again (it answers 503), so a request
makes at most one hop whatever the two nodes' views say.

The client is a minimal HTTP/1.1 client: an asyncio protocol per connection with
httptools' response parser (the server's own parser), no stream objects and no extra task
per request. Peers are flakekit servers, which always answer with ``Content-Length``.
Connections are kept alive per peer (an idle pool as large as the concurrency has been,
up to ``IDLE_PER_PEER``), so a forward costs one write and one read on a warm connection.
Single-ID requests reach the owner in batches (:mod:`flakekit_server.coalesce`), one
upstream request per batch.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["FORWARDED_BY", "OWNER_EPOCH", "VIEW_EPOCH", "ForwardError", "Forwarder", "Relayed"]

FORWARDED_BY = b"X-Flakekit-Forwarded-By"
VIEW_EPOCH = b"X-Flakekit-View-Epoch"
OWNER_EPOCH = b"X-Flakekit-Owner-Epoch"
#: headers of the owner's answer the relay does not copy (this hop's own framing)
_HOP = frozenset({b"content-length", b"content-type", b"connection", b"keep-alive",
                  b"transfer-encoding"})
#: idle keep-alive connections kept per peer (one per request in flight: below the
#: concurrency, a connection would be opened and closed per request)
IDLE_PER_PEER = 256
#: the owner's answer: at most this many bytes of headers
MAX_HEAD = 65536
#: how often answers still awaited are checked against their deadline (s)
_SWEEP_S = 0.1

Relayed = tuple[int, bytes, bytes, bytes]   # status, content type, body, raw header lines


class ForwardError(Exception):
    """The owner could not be reached or answered garbage (the caller answers 503)."""


class _Peer:
    __slots__ = ("host", "idle", "port", "prefix")

    def __init__(self, advertise: str) -> None:
        parts = urlsplit(advertise)
        if parts.scheme != "http" or not parts.hostname:
            raise ForwardError(f"advertise URL {advertise!r} is not http://HOST:PORT")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/").encode()
        self.idle: deque[_Connection] = deque()


class _Connection(asyncio.Protocol):
    """One kept-alive connection to a peer: one request at a time, its answer parsed by
    httptools into :attr:`waiter`."""

    __slots__ = ("_body", "_ctype", "_head_bytes", "_headers", "closed", "deadline",
                 "got_bytes", "parser", "transport", "waiter")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        #: called once with the answer ``(status, ctype, body, headers, keep-alive)`` or an
        #: exception (_Stale: closed before a byte of it)
        self.waiter: Callable[[Any], None] | None = None
        self.deadline = 0.0
        self.closed = False
        self.got_bytes = False
        self._reset()

    def _reset(self) -> None:
        self._ctype = b"application/octet-stream"
        self._headers: list[bytes] = []
        self._body: list[bytes] = []
        self._head_bytes = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._fail(ForwardError("the owner's answer ended early") if self.got_bytes else _Stale())

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__ or exc.__cause__
            self._fail(cause if isinstance(cause, ForwardError)
                       else ForwardError(f"the owner's answer is malformed: {exc}"))
            self.close()

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD:
            raise ForwardError("the owner's answer headers are too large")
        low = name.lower()
        if low == b"content-type":
            self._ctype = value
        elif low not in _HOP:
            self._headers.append(name + b": " + value + b"\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        answer = (parser.get_status_code(), self._ctype, b"".join(self._body),
                  b"".join(self._headers), parser.should_keep_alive())
        self._reset()
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(answer)


class Forwarder:
    """Sends one request to a peer and hands its answer (:data:`Relayed`) to a callback
    (:meth:`send`, no task or coroutine per request) or returns it (:meth:`forward`)."""

    def __init__(self, node: str, timeout: float = 5.0) -> None:
        self.node = node.encode()
        self.timeout = timeout
        self._peers: dict[str, _Peer] = {}
        self._busy: set[_Connection] = set()   # waiting for an answer (timed by _expire)
        self._timer: asyncio.TimerHandle | None = None
        self.opened = 0   # connections opened (a test checks that they are reused)

    def _peer(self, advertise: str) -> _Peer:
        peer = self._peers.get(advertise)
        if peer is None:
            peer = self._peers[advertise] = _Peer(advertise)
        return peer

    async def forward(self, advertise: str, method: bytes, url: bytes,
                      authorization: bytes | None) -> Relayed:
        """``method url`` at the peer ``advertise``; raises :class:`ForwardError`."""
        future: asyncio.Future[Relayed] = asyncio.get_running_loop().create_future()

        def done(answer: Relayed | None, error: ForwardError | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(answer)   # type: ignore[arg-type]

        self.send(advertise, method, url, authorization, done)
        return await future

    def send(self, advertise: str, method: bytes, url: bytes, authorization: bytes | None,
             done: Callable[[Relayed | None, ForwardError | None], None]) -> None:
        """Send ``method url`` to the peer ``advertise``; ``done(answer, None)`` or
        ``done(None, error)`` is called once, within ``timeout`` s, on the event loop."""
        try:
            peer = self._peer(advertise)
        except ForwardError as exc:
            done(None, exc)
            return
        # HEAD is sent as GET (the answer's length is relayed, its body dropped by the
        # transport): the owner's HEAD answer would have no body to frame by
        verb = b"GET" if method == b"HEAD" else method
        head = b"%s %s%s HTTP/1.1\r\nHost: %s:%d\r\n%s: %s\r\n" % (
            verb, peer.prefix, url, peer.host.encode(), peer.port, FORWARDED_BY, self.node)
        if authorization is not None:
            head += b"Authorization: " + authorization + b"\r\n"
        if verb not in (b"GET", b"HEAD"):
            head += b"Content-Length: 0\r\n"
        self._send(peer, advertise, head + b"\r\n", done, time.monotonic() + self.timeout)

    def _send(self, peer: _Peer, advertise: str, request: bytes,
              done: Callable[[Relayed | None, ForwardError | None], None],
              deadline: float) -> None:
        while peer.idle:   # a kept-alive connection; the peer may have closed it meanwhile
            conn = peer.idle.pop()   # the most recently used: the least likely to be closed
            if not conn.closed:
                self._exchange(peer, advertise, conn, request, done, deadline, fresh=False)
                return
        asyncio.get_running_loop().create_task(
            self._connect(peer, advertise, request, done, deadline))

    async def _connect(self, peer: _Peer, advertise: str, request: bytes,
                       done: Callable[[Relayed | None, ForwardError | None], None],
                       deadline: float) -> None:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                _, conn = await asyncio.get_running_loop().create_connection(
                    _Connection, peer.host, peer.port)
        except TimeoutError:
            done(None, ForwardError(f"the owner at {advertise} did not answer within "
                                    f"{self.timeout:g} s"))
            return
        except OSError as exc:
            done(None, ForwardError(f"cannot reach the owner at {advertise}: "
                                    f"{exc.strerror or exc}"))
            return
        self.opened += 1
        self._exchange(peer, advertise, conn, request, done, deadline, fresh=True)

    def _exchange(self, peer: _Peer, advertise: str, conn: _Connection, request: bytes,
                  done: Callable[[Relayed | None, ForwardError | None], None],
                  deadline: float, *, fresh: bool) -> None:
        def answered(result: Any) -> None:
            self._busy.discard(conn)
            if isinstance(result, BaseException):
                conn.close()
                if isinstance(result, _Stale):
                    if not fresh:   # closed before answering a byte: nothing was served
                        self._send(peer, advertise, request, done, deadline)
                        return
                    result = ForwardError(f"the owner at {advertise} closed the connection "
                                          "without answering")
                done(None, result if isinstance(result, ForwardError)
                     else ForwardError(f"the owner's connection failed: {result}"))
                return
            status, ctype, body, headers, keep = result
            if keep and not conn.closed and len(peer.idle) < IDLE_PER_PEER:
                peer.idle.append(conn)
            else:
                conn.close()
            done((status, ctype, body, headers), None)

        conn.waiter = answered
        conn.got_bytes = False
        conn.deadline = deadline
        self._busy.add(conn)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_SWEEP_S, self._expire)
        conn.transport.write(request)

    def _expire(self) -> None:
        """Every ``_SWEEP_S`` while answers are awaited: fail those past their deadline
        (one timer per forwarder, not one per request)."""
        self._timer = None
        now = time.monotonic()
        for conn in [c for c in self._busy if c.deadline <= now]:
            conn._fail(ForwardError(f"the owner did not answer within {self.timeout:g} s"))
        if self._busy:
            self._timer = asyncio.get_running_loop().call_later(_SWEEP_S, self._expire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for peer in self._peers.values():
            while peer.idle:
                peer.idle.popleft().close()


class _Stale(Exception):
    """A kept-alive connection closed before any byte of the answer."""
