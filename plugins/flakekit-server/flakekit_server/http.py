"""The HTTP/1.1 transport: an asyncio protocol on httptools (uvloop when available).

Measured against uvicorn (see the README), a bare protocol is about twice as fast for
one-ID requests: there is no ASGI layer between the parser and the generator. The exact
URL of every open Leaf endpoint maps straight to the generator's ``next_id``; anything
else goes through :meth:`IdService.handle`.

Limits (all per process): ``max_connections`` (over it, the connection waiting longest
for a request makes room; if none does, 503 and close), URL length (414), header bytes
(431, enforced on partial input too: the parser is fed at most ``SLICE`` bytes at a time),
request body (413; the API takes none), a header deadline that starts at accept (slow or
silent clients) and an idle keep-alive timeout. What one client can cost is bounded: once
its unread answers fill the transport's write buffer, the server stops answering and
reading it (pipelined requests already parsed wait in a queue of at most one slice's
worth), and a client that reads nothing for ``idle_timeout`` is disconnected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import httptools

from flakekit_server.answers import JSON, Pending, error_body, from_exception
from flakekit_server.app import IdService
from flakekit_server.cluster import Hints
from flakekit_server.forward import OWNER_EPOCH
from flakekit_server.metrics import FIRST_BUCKET_NS, bucket

__all__ = ["HttpProtocol", "STATUS_LINES"]

log = logging.getLogger("flakekit.server")

REASONS = {
    200: "OK", 302: "Found", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
    414: "URI Too Long", 421: "Misdirected Request", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout",
}
STATUS_LINES = {code: f"HTTP/1.1 {code} {text}\r\n".encode() for code, text in REASONS.items()}


def status_line(code: int) -> bytes:
    """The status line; a code an owner relayed that this table lacks keeps its number."""
    line = STATUS_LINES.get(code)
    return line if line is not None else b"HTTP/1.1 %d Status %d\r\n" % (code, code)
_perf = time.perf_counter_ns
_monotonic = time.monotonic
_OK_TEXT = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
_CLOSE = b"Connection: close\r\n"
#: bodies longer than this are written after their head, not copied into one buffer
_COPY_MAX = 65536
#: the parser is fed at most this many bytes at a time, so a partial request line or header
#: is checked against its limit every SLICE bytes and a pipelined burst parses in steps
SLICE = 4096
#: what a connection waits for: a complete request (408 after header_timeout) or the next
#: request of a keep-alive connection (closed after idle_timeout)
HEAD, IDLE = 0, 1


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    __slots__ = ("_auth", "_body", "_fwd", "_head_seen", "_header_bytes", "_hints", "_in_head",
                 "_inbuf", "_queue", "_reading", "_t0", "_task", "_url", "busy", "close_when_done",
                 "closing", "deadline", "got_bytes", "parser", "paused", "service", "server",
                 "transport", "waiting", "write_deadline")

    def __init__(self, service: IdService, server: Any) -> None:
        self.service = service
        self.server = server           # the ServerState: options, connection set
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self._url = b""
        self._auth: bytes | None = None
        self._hints: Hints | None = None
        self._header_bytes = 0
        self._body = 0
        self._t0 = 0
        self._in_head = False          # between the first byte of a request and its end
        self._head_seen = 0            # bytes fed since then (an upper bound)
        self._inbuf = bytearray()      # received, not yet parsed (reading is paused meanwhile)
        self._queue: deque[tuple[Any, ...]] = deque()  # parsed, not yet answered
        self._reading = True
        self.waiting = HEAD
        self.deadline = _monotonic() + server.options.header_timeout
        self.write_deadline = 0.0
        self.got_bytes = False
        self.closing = False
        self.paused = False
        #: answering a request off the event loop (a Pending): the next one waits for it
        self.busy = False
        self.close_when_done = False
        self._task: asyncio.Task[Any] | None = None
        #: a forward_one request: keep-alive, t0, its URL's histogram of forwarded 200s
        self._fwd: tuple[bool, int, list[int]] = (True, 0, [])

    # -- connection ----------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        state = self.server
        stats = self.service.stats
        if len(state.connections) >= state.options.max_connections and not state.make_room():
            stats.rejected_connections += 1
            body = error_body(503, "too_many_connections",
                              f"the server has {state.options.max_connections} connections open "
                              "(--max-connections); retry later")
            self._send(503, JSON, body, b"Retry-After: 1\r\n", keep_alive=False)
            return
        # the header deadline runs from accept: a silent connection does not hold its slot
        self.deadline = _monotonic() + state.options.header_timeout
        state.connections.add(self)
        stats.connections = len(state.connections)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.connections.discard(self)
        self.service.stats.connections = len(self.server.connections)
        self.closing = True
        self._queue.clear()
        self._inbuf.clear()

    def pause_writing(self) -> None:
        self.paused = True
        self.write_deadline = _monotonic() + self.server.options.idle_timeout
        self._stop_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()

    def _stop_reading(self) -> None:
        if self._reading and not self.closing:
            self._reading = False
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.got_bytes = True
        if len(data) <= SLICE and not (self._inbuf or self._queue or self.paused or self.busy):
            self._feed(data)    # the common case: one small request
            if self._queue:
                self._stop_reading()
            return
        self._inbuf += data
        self._pump()

    def _pump(self) -> None:
        """Answer queued requests and parse buffered input while the client reads."""
        while not self.closing and not self.paused and not self.busy:
            if self._queue:
                self._run(*self._queue.popleft())
            elif self._inbuf:
                chunk = bytes(self._inbuf[:SLICE])
                del self._inbuf[:SLICE]
                self._feed(chunk)
            else:
                break
        if self.closing:
            return
        if self.paused or self._queue or self._inbuf or self.busy:
            self._stop_reading()
        elif not self._reading:
            self._reading = True
            self.transport.resume_reading()

    def _feed(self, chunk: bytes) -> None:
        try:
            self.parser.feed_data(chunk)
        except _Reject as exc:
            self._fail(exc.status, exc.code, exc.message)
            return
        except httptools.HttpParserUpgrade:
            # the request was answered (the upgrade ignored; or it is queued, and closes the
            # connection once answered); what follows would be another protocol: never parsed.
            # CONNECT is never answered by the parser's callbacks: refused here.
            self._inbuf.clear()
            if not self.closing and not self._queue:
                self._fail(400, "bad_request", "protocol upgrades (and CONNECT) are not supported")
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__ or exc.__cause__
            if isinstance(cause, _Reject):  # raised by a callback below, wrapped by httptools
                self._fail(cause.status, cause.code, cause.message)
            else:
                self._fail(400, "bad_request", f"malformed HTTP request: {exc}")
            return
        if self._in_head:
            # httptools buffers a header until its line ends: bound what it may hold
            self._head_seen += len(chunk)
            opts = self.server.options
            if self._head_seen > opts.max_url + opts.max_header_bytes + SLICE + 256:
                self._fail(431, "headers_too_large",
                           f"the headers are larger than {opts.max_header_bytes} bytes")

    def _fail(self, status: int, code: str, message: str) -> None:
        if self.closing:
            return
        self.service.stats.observe("rejected", status, 0)
        self._queue.clear()
        self._inbuf.clear()
        self._send(status, JSON, error_body(status, code, message), b"", keep_alive=False)

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._auth = None
        self._hints = None
        self._header_bytes = 0
        self._body = 0
        self._t0 = _perf()
        self._in_head = True
        self._head_seen = 0
        if self.waiting == IDLE:
            self.waiting = HEAD
            self.deadline = _monotonic() + self.server.options.header_timeout

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.server.options.max_url:
            raise _Reject(414, "uri_too_long",
                          f"the URL is longer than {self.server.options.max_url} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.server.options.max_header_bytes:
            raise _Reject(431, "headers_too_large", "the headers are larger than "
                          f"{self.server.options.max_header_bytes} bytes")
        if len(name) == 13 and name.lower() == b"authorization":
            self._auth = value
        elif len(name) in (21, 23) and name[:11].lower() == b"x-flakekit-":
            low = name.lower()
            if low == b"x-flakekit-view-epoch":
                self._hints = self._hints or Hints()
                self._hints.view_epoch = value.strip()
            elif low == b"x-flakekit-forwarded-by":
                self._hints = self._hints or Hints()
                self._hints.forwarded_by = value.strip()

    def on_body(self, body: bytes) -> None:
        self._body += len(body)
        if self._body > self.server.options.max_body:
            raise _Reject(413, "body_too_large", "this API takes no request body"
                          if not self.server.options.max_body else
                          f"the request body is larger than {self.server.options.max_body} bytes")

    def on_message_complete(self) -> None:
        parser = self.parser
        # (no on_headers_complete callback, one call less per request: the API takes no body,
        # so a request's head ends with the request, or the body is refused at once)
        self._in_head = False
        # an Upgrade is ignored (RFC 9110 allows it): answered, then the connection closes
        keep_alive = (parser.should_keep_alive() and not parser.should_upgrade()
                      and not self.service.stopping)
        self.waiting = IDLE
        self.deadline = _monotonic() + self.server.options.idle_timeout
        if self.paused or self._queue or self.busy:
            # answered once the client reads what it was sent
            self._queue.append((parser.get_method(), self._url, self._auth, keep_alive,
                                self._t0, self._hints))
        else:
            self._run(parser.get_method(), self._url, self._auth, keep_alive, self._t0,
                      self._hints)

    def _run(self, method: bytes, url: bytes, auth: bytes | None, keep_alive: bool, t0: int,
             hints: Hints | None = None) -> None:
        if self.closing:
            return
        service = self.service
        fast = service.fast.get(url)
        if fast is not None and method == b"GET" and hints is None:
            # the hot path: an open generator's Leaf URL (IdService.fast); what it costs
            # per request is docs/server.md's "Speed"
            try:
                value = fast[1]()
            except BaseException as exc:  # noqa: BLE001
                err = from_exception(exc)
                self._send(err.status, JSON, error_body(err.status, err.code, err.message),
                           err.headers, keep_alive)
                service.stats.observe(fast[2], err.status, _perf() - t0)
                return
            if value is None:   # a segment key whose buffers are empty: never wait here
                self._defer(service.draw_later(fast[0], fast[2]), method, keep_alive, t0)
                return
            header = b""
            hist = fast[3]
        else:
            strict = service.strict_fast.get(url) if service.strict_fast else None
            if strict is None or method != b"GET" or (
                    hints is not None and hints.view_epoch is not None):
                if (hints is not None and hints.forwarded_by is not None
                        and hints.view_epoch is None and method == b"GET"):
                    # a coalescing node's batch for a key this node owns (coalesce.py)
                    answer = service.forwarded_batch(url)
                    if answer is not None:
                        self._answer(method, answer, keep_alive, t0)
                        return
                self._handle(method, url, auth, keep_alive, t0, hints)
                return
            # cluster mode: a strict key this node owns, its IDs in memory (every check of
            # ClusterNode.next_id made after the draw); else handle() forwards, refuses or
            # waits for the hand-off in a thread
            got = strict[1](strict[0])
            if got is None:
                # another node owns the key: forwarded with its other single-ID requests
                # (ClusterHttp.forward_one); a refill, a moving key, a 421: handle()
                forward = service.forward_one
                if hints is None and forward is not None:
                    self.busy = True
                    self._fwd = (keep_alive, t0, strict[3])
                    if forward(strict[0], url, auth, self._forwarded):
                        return
                    self.busy = False
                self._handle(method, url, auth, keep_alive, t0, hints)
                return
            value = got[0]
            header = b"%s: %d\r\n" % (OWNER_EPOCH, got[1])
            hist = strict[2]
        # 200 with the ID, counted in the URL's histogram (no other per-request work)
        body = b"%d" % value
        self.transport.write(b"%s%d\r\n%s%s\r\n%s" % (
            _OK_TEXT, len(body), header, b"" if keep_alive else _CLOSE, body))
        if not keep_alive:
            self._close_after_write()
        elapsed = _perf() - t0
        hist[0 if elapsed < FIRST_BUCKET_NS else bucket(elapsed)] += 1
        hist[-2] += elapsed
        hist[-1] += 1

    def _handle(self, method: bytes, url: bytes, auth: bytes | None, keep_alive: bool,
                t0: int, hints: Hints | None) -> None:
        """Anything but the hot path: :meth:`IdService.handle`, answered now or once its
        :class:`Pending` is done."""
        answer = self.service.handle(method, url, auth, hints)
        if isinstance(answer, Pending):
            self._defer(answer, method, keep_alive, t0)
            return
        self._answer(method, answer, keep_alive, t0)

    def _answer(self, method: bytes, answer: tuple[Any, ...], keep_alive: bool,
                t0: int) -> None:
        """Send ``answer`` (a HEAD: its head only) and count it under its route."""
        status, ctype, body, headers, route = answer
        if method == b"HEAD":
            self._send_head(status, ctype, len(body), headers, keep_alive)
        else:
            self._send(status, ctype, body, headers, keep_alive)
        self.service.stats.observe(route, status, _perf() - t0)

    def _forwarded(self, answer: tuple[Any, ...]) -> None:
        """The answer to a request :meth:`ClusterHttp.forward_one` took (a GET); a 200
        counted in the URL's histogram of forwarded answers, as the hot path counts."""
        if not self.busy:   # answered already (a callback must not answer twice)
            return
        self.busy = False
        keep_alive, t0, hist = self._fwd
        status, ctype, body, headers, route = answer
        self._send(status, ctype, body, headers, keep_alive and not self.close_when_done)
        elapsed = _perf() - t0
        if status == 200:
            hist[0 if elapsed < FIRST_BUCKET_NS else bucket(elapsed)] += 1
            hist[-2] += elapsed
            hist[-1] += 1
        else:
            self.service.stats.observe(route, status, elapsed)
        if not self.closing:
            self._pump()

    def _defer(self, pending: Pending, method: bytes, keep_alive: bool, t0: int) -> None:
        """Answer once ``pending`` is done; the connection reads and answers nothing else
        meanwhile (pipelined answers stay in order)."""
        self.busy = True
        # reading goes on (no pause/resume: two epoll calls per answer): what comes
        # meanwhile is buffered, and reading stops then (data_received -> _pump)
        inline = [True]   # a reply made inside start(): the caller goes on parsing

        def reply(answer: tuple[Any, ...]) -> None:
            if not self.busy:   # answered already (a callback must not answer twice)
                return
            self._task = None
            self.busy = False
            self._answer(method, answer, keep_alive and not self.close_when_done, t0)
            if not self.closing and not inline[0]:
                self._pump()

        if pending.start is not None:   # a forward: its callback answers, no task
            pending.start(reply)
            inline[0] = False
            return
        inline[0] = False
        task = asyncio.get_running_loop().create_task(pending.result())
        self._task = task

        def done(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                self._task = None
                self.busy = False
                self._close_after_write()
                return
            reply(task.result())

        task.add_done_callback(done)

    # -- writing ---------------------------------------------------------------------------------
    def _send(self, status: int, ctype: bytes, body: bytes, headers: bytes,
              keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head = b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status_line(status), ctype, len(body), headers, b"" if keep_alive else _CLOSE)
        if len(body) > _COPY_MAX:   # a large batch: not copied once more behind the head
            self.transport.write(head)
            self.transport.write(body)
        else:
            self.transport.write(head + body)
        if not keep_alive:
            self._close_after_write()

    def _send_head(self, status: int, ctype: bytes, length: int, headers: bytes,
                   keep_alive: bool) -> None:
        """A HEAD answer: the GET answer's headers, no body."""
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status_line(status), ctype, length, headers, b"" if keep_alive else _CLOSE))
        if not keep_alive:
            self._close_after_write()

    def _close_after_write(self) -> None:
        self.closing = True
        self._queue.clear()
        self._inbuf.clear()
        self.transport.close()   # flushes what was written first

    def evictable(self) -> bool:
        """Waiting for a request and holding none: may make room for a new connection."""
        if self.closing or self.paused or self.busy or self._queue or self._inbuf:
            return False
        return self.waiting == IDLE and not self._in_head or not self.got_bytes


class ServerState:
    """What every connection of one listening server shares."""

    def __init__(self, options: Any) -> None:
        self.options = options
        self.connections: set[HttpProtocol] = set()
        self.evicted = 0

    def make_room(self) -> bool:
        """At the connection limit: close the connection closest to its deadline among those
        waiting for a request (idle keep-alive, or silent since accept), so one client holding
        every slot cannot lock others out. False if every connection is busy."""
        best: HttpProtocol | None = None
        for conn in self.connections:
            if conn.evictable() and (best is None or conn.deadline < best.deadline):
                best = conn
        if best is None:
            return False
        self.evicted += 1
        best._close_after_write()
        self.connections.discard(best)
        return True

    def sweep(self) -> None:
        """Close connections past the header deadline, the idle timeout, or (a client that
        reads none of its answers) the write deadline."""
        now = _monotonic()
        opts = self.options
        for conn in list(self.connections):
            if conn.closing:
                continue
            if conn.paused:
                if now > conn.write_deadline:
                    log.info("closing a connection whose client read nothing for %g s",
                             opts.idle_timeout)
                    conn.closing = True
                    conn.transport.abort()
                continue
            if now <= conn.deadline or conn._queue or conn.busy:
                continue
            if conn.waiting == HEAD and conn.got_bytes:
                conn._send(408, JSON, error_body(408, "request_timeout",
                           f"the request was not complete within {opts.header_timeout:g} s"),
                           b"", keep_alive=False)
            else:
                conn._close_after_write()   # silent since accept, or idle keep-alive

    def close_idle(self) -> None:
        """At shutdown: close every connection but those answering off the loop, which
        close once answered (:meth:`finish`)."""
        for conn in list(self.connections):
            if conn.busy:
                conn.close_when_done = True
            elif not conn.closing:
                conn._close_after_write()

    async def finish(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the answers still being made off the loop."""
        deadline = _monotonic() + timeout
        while any(c.busy for c in self.connections) and _monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn._task is not None:
                conn._task.cancel()


async def sweeper(state: ServerState, interval: float = 1.0) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            state.sweep()
        except Exception:  # never let the sweeper die
            log.exception("connection sweep failed")
