"""The HTTP/1.1 transport: an asyncio protocol on httptools (uvloop when available).

Measured against uvicorn (see the README), a bare protocol is about twice as fast for
one-ID requests: there is no ASGI layer between the parser and the generator. The exact
URL of every open Leaf endpoint maps straight to the generator's ``next_id``; anything
else goes through :meth:`IdService.handle`.

Limits (all per process): ``max_connections`` (over it: 503 and close), URL length
(414), header bytes (431), request body (413; the API takes none), a deadline for a
request's headers (slow clients) and an idle keep-alive timeout. Writes that the client
does not read pause reading from it, so a slow reader cannot grow the server's memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httptools

from flakekit_server.app import JSON, IdService, error_body, from_exception

__all__ = ["HttpProtocol", "STATUS_LINES"]

log = logging.getLogger("flakekit.server")

REASONS = {
    200: "OK", 302: "Found", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
    414: "URI Too Long", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    503: "Service Unavailable",
}
STATUS_LINES = {code: f"HTTP/1.1 {code} {text}\r\n".encode() for code, text in REASONS.items()}
_perf = time.perf_counter_ns
_monotonic = time.monotonic
_OK_TEXT = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
_CLOSE = b"Connection: close\r\n"


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    __slots__ = ("_auth", "_body", "_header_bytes", "_header_name", "_t0", "_url",
                 "busy_since", "closing", "last_active", "parser", "paused", "service",
                 "server", "transport")

    def __init__(self, service: IdService, server: Any) -> None:
        self.service = service
        self.server = server           # the ServerState: options, connection set
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self._url = b""
        self._auth: bytes | None = None
        self._header_bytes = 0
        self._body = 0
        self._t0 = 0
        self.busy_since = 0.0          # monotonic time a request started; 0: idle
        self.last_active = _monotonic()
        self.closing = False
        self.paused = False

    # -- connection ----------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        state = self.server
        stats = self.service.stats
        if len(state.connections) >= state.options.max_connections:
            stats.rejected_connections += 1
            body = error_body(503, "too_many_connections",
                              f"the server has {state.options.max_connections} connections open "
                              "(--max-connections); retry later")
            self._send(503, JSON, body, b"Retry-After: 1\r\n", keep_alive=False)
            return
        state.connections.add(self)
        stats.connections = len(state.connections)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.connections.discard(self)
        self.service.stats.connections = len(self.server.connections)
        self.closing = True

    def pause_writing(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if not self.closing:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_active = _monotonic()
        try:
            self.parser.feed_data(data)
        except _Reject as exc:
            self._fail(exc.status, exc.code, exc.message)
        except httptools.HttpParserUpgrade:
            self._fail(400, "bad_request", "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            cause = exc.__context__ or exc.__cause__
            if isinstance(cause, _Reject):  # raised by a callback below, wrapped by httptools
                self._fail(cause.status, cause.code, cause.message)
            else:
                self._fail(400, "bad_request", f"malformed HTTP request: {exc}")

    def _fail(self, status: int, code: str, message: str) -> None:
        self.service.stats.observe("rejected", status, 0)
        self._send(status, JSON, error_body(status, code, message), b"", keep_alive=False)

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._auth = None
        self._header_bytes = 0
        self._body = 0
        self._t0 = _perf()
        self.busy_since = _monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.server.options.max_url:
            raise _Reject(414, "uri_too_long", f"the URL is longer than {self.server.options.max_url} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.server.options.max_header_bytes:
            raise _Reject(431, "headers_too_large",
                          f"the headers are larger than {self.server.options.max_header_bytes} bytes")
        if len(name) == 13 and name.lower() == b"authorization":
            self._auth = value

    def on_body(self, body: bytes) -> None:
        self._body += len(body)
        if self._body > self.server.options.max_body:
            raise _Reject(413, "body_too_large", "this API takes no request body"
                          if not self.server.options.max_body else
                          f"the request body is larger than {self.server.options.max_body} bytes")

    def on_message_complete(self) -> None:
        parser = self.parser
        keep_alive = parser.should_keep_alive() and not self.service.stopping
        service = self.service
        fast = service.fast.get(self._url)
        if fast is not None and parser.get_method() == b"GET":
            try:
                body = b"%d" % fast[1]()
            except BaseException as exc:  # noqa: BLE001
                err = from_exception(exc)
                self._send(err.status, JSON, error_body(err.status, err.code, err.message),
                           err.headers, keep_alive)
                route, status = "leaf_" + service.strategy[fast[0]], err.status
            else:
                self.transport.write(b"%s%d\r\n%s\r\n%s" % (
                    _OK_TEXT, len(body), b"" if keep_alive else _CLOSE, body))
                if not keep_alive:
                    self._close_after_write()
                route, status = "leaf_" + service.strategy[fast[0]], 200
        else:
            status, ctype, body, headers, route = service.handle(parser.get_method(), self._url, self._auth)
            self._send(status, ctype, body, headers, keep_alive)
        service.stats.observe(route, status, _perf() - self._t0)
        self.busy_since = 0.0
        self.last_active = _monotonic()

    # -- writing ---------------------------------------------------------------------------------
    def _send(self, status: int, ctype: bytes, body: bytes, headers: bytes, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
            STATUS_LINES[status], ctype, len(body), headers, b"" if keep_alive else _CLOSE, body))
        if not keep_alive:
            self._close_after_write()

    def _close_after_write(self) -> None:
        self.closing = True
        self.transport.close()   # flushes what was written first


class ServerState:
    """What every connection of one listening server shares."""

    def __init__(self, options: Any) -> None:
        self.options = options
        self.connections: set[HttpProtocol] = set()

    def sweep(self) -> None:
        """Close connections past the header deadline or the idle timeout."""
        now = _monotonic()
        opts = self.options
        for conn in list(self.connections):
            if conn.closing or conn.paused:
                continue
            if conn.busy_since and now - conn.busy_since > opts.header_timeout:
                conn._send(408, JSON, error_body(408, "request_timeout",
                           f"the request was not complete within {opts.header_timeout:g} s"),
                           b"", keep_alive=False)
            elif not conn.busy_since and now - conn.last_active > opts.idle_timeout:
                conn._close_after_write()

    def close_idle(self) -> None:
        """At shutdown: close every connection (no request is ever in flight between events)."""
        for conn in list(self.connections):
            if not conn.closing:
                conn._close_after_write()


async def sweeper(state: ServerState, interval: float = 1.0) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            state.sweep()
        except Exception:  # noqa: BLE001 - never let the sweeper die
            log.exception("connection sweep failed")
