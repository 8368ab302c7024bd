"""Forwarding a strict key's request to its owner: one hop, on the event loop.

A node that does not own a strict key passes the request on to the owner's advertise URL
with ``X-Flakekit-Forwarded-By: <this node>`` and relays the owner's answer unchanged
(status, content type, body and headers such as ``X-Flakekit-Owner-Epoch``). The owner
never forwards a request that carries the header again (it answers 503), so a request
makes at most one hop whatever the two nodes' views say.

The client is a minimal HTTP/1.1 client over asyncio streams: peers are flakekit servers,
which always answer with ``Content-Length``. Connections are kept alive per peer (a
small idle pool), so a forward costs one round trip on loopback or the LAN.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

__all__ = ["FORWARDED_BY", "OWNER_EPOCH", "VIEW_EPOCH", "ForwardError", "Forwarder", "Relayed"]

FORWARDED_BY = b"X-Flakekit-Forwarded-By"
VIEW_EPOCH = b"X-Flakekit-View-Epoch"
OWNER_EPOCH = b"X-Flakekit-Owner-Epoch"
#: headers of the owner's answer the relay does not copy (this hop's own framing)
_HOP = frozenset({b"content-length", b"content-type", b"connection", b"keep-alive",
                  b"transfer-encoding"})
#: idle keep-alive connections kept per peer
IDLE_PER_PEER = 8

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
        self.idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()


class Forwarder:
    """Sends one request to a peer and returns its answer (:data:`Relayed`)."""

    def __init__(self, node: str, timeout: float = 5.0) -> None:
        self.node = node.encode()
        self.timeout = timeout
        self._peers: dict[str, _Peer] = {}

    def _peer(self, advertise: str) -> _Peer:
        peer = self._peers.get(advertise)
        if peer is None:
            peer = self._peers[advertise] = _Peer(advertise)
        return peer

    async def forward(self, advertise: str, method: bytes, url: bytes,
                      authorization: bytes | None) -> Relayed:
        """``method url`` at the peer ``advertise``; raises :class:`ForwardError`."""
        try:
            return await asyncio.wait_for(self._forward(advertise, method, url, authorization),
                                          self.timeout)
        except TimeoutError:
            raise ForwardError(f"the owner at {advertise} did not answer within "
                               f"{self.timeout:g} s") from None

    async def _forward(self, advertise: str, method: bytes, url: bytes,
                       authorization: bytes | None) -> Relayed:
        peer = self._peer(advertise)
        # HEAD is sent as GET (the answer's length is relayed, its body dropped by the
        # transport): the owner's HEAD answer would have no body to frame by
        verb = b"GET" if method == b"HEAD" else method
        head = b"%s %s%s HTTP/1.1\r\nHost: %s:%d\r\n%s: %s\r\n" % (
            verb, peer.prefix, url, peer.host.encode(), peer.port, FORWARDED_BY, self.node)
        if authorization is not None:
            head += b"Authorization: " + authorization + b"\r\n"
        if verb not in (b"GET", b"HEAD"):
            head += b"Content-Length: 0\r\n"
        request = head + b"\r\n"
        while peer.idle:   # a kept-alive connection; the peer may have closed it meanwhile
            reader, writer = peer.idle.popleft()
            if writer.is_closing() or reader.at_eof():
                writer.close()
                continue
            try:
                return await self._exchange(peer, reader, writer, request)
            except _Stale:
                continue   # closed before answering a byte: nothing was served, try anew
        try:
            reader, writer = await asyncio.open_connection(peer.host, peer.port)
        except OSError as exc:
            raise ForwardError(f"cannot reach the owner at {advertise}: "
                               f"{exc.strerror or exc}") from None
        try:
            return await self._exchange(peer, reader, writer, request)
        except _Stale:
            raise ForwardError(f"the owner at {advertise} closed the connection "
                               "without answering") from None

    async def _exchange(self, peer: _Peer, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, request: bytes) -> Relayed:
        reuse = False
        try:
            writer.write(request)
            await writer.drain()
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale from None
                raise ForwardError("the owner's answer ended early") from None
            except asyncio.LimitOverrunError:
                raise ForwardError("the owner's answer headers are too large") from None
            status, ctype, length, headers, keep = _parse_head(raw)
            body = await reader.readexactly(length) if length else b""
            reuse = keep
            return status, ctype, body, headers
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            if isinstance(exc, ConnectionResetError | BrokenPipeError):
                raise _Stale from None
            raise ForwardError(f"the owner's connection failed: {exc}") from None
        finally:
            if reuse and len(peer.idle) < IDLE_PER_PEER:
                peer.idle.append((reader, writer))
            else:
                writer.close()

    def close(self) -> None:
        for peer in self._peers.values():
            while peer.idle:
                peer.idle.popleft()[1].close()


class _Stale(Exception):
    """A kept-alive connection closed before any byte of the answer."""


def _parse_head(raw: bytes) -> tuple[int, bytes, int, bytes, bool]:
    lines = raw[:-4].split(b"\r\n")
    try:
        version, code, _ = (lines[0] + b" ").split(b" ", 2)
        status = int(code)
    except ValueError:
        raise ForwardError(
            f"the owner answered a malformed status line {lines[0][:60]!r}") from None
    ctype = b"application/octet-stream"
    length = 0
    keep = version == b"HTTP/1.1"
    out = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        low = name.strip().lower()
        value = value.strip()
        if low == b"content-length":
            length = int(value)
        elif low == b"content-type":
            ctype = value
        elif low == b"connection":
            keep = value.lower() != b"close"
        if low not in _HOP:
            out.append(name.strip() + b": " + value + b"\r\n")
    return status, ctype, length, b"".join(out), keep
