"""Coalescing forwarded single-ID requests: one upstream request per batch (group commit).

A node that does not own a strict key forwards its requests to the owner
(:mod:`flakekit_server.forward`). Forwarding every request on its own costs a second
HTTP exchange per ID. Instead, the common single-ID requests of one key (the Leaf URL
``/api/segment/get/KEY`` and ``/api/v1/next/NAME`` with ``count=1`` in format
``numbers`` or ``text``) are **coalesced** per (owner, generator, ``Authorization``):

* a request is sent at the end of the event loop's round (with the requests read in the
  same round: a batch of those), while fewer than ``IN_FLIGHT`` (2) upstream requests of
  the group are in flight; otherwise the requests wait in arrival order, and when an
  answer comes the next upstream request (again at the end of that round) asks for
  exactly as many IDs as there are waiting requests
  (``GET /api/v1/next/NAME?count=N``, at most ``MAX_BATCH``) and the N IDs of its
  answer go to those N requests in arrival order, each answered as the owner answers
  that request alone (Leaf's plain body or the JSON API's, ``X-Flakekit-Owner-Epoch``
  and the other headers of the owner's answer, ``X-Flakekit-Relayed-From``).

Why the IDs of a strict key still increase strictly as clients see them (docs/cluster.md,
I2: an ID answered to a request that started after another one ended is larger):

1. A batch serves only requests that had **arrived before its upstream request was
   sent** (the queue is taken whole when the request is written; a request arriving
   later waits for a later batch), and each of them is answered only after the owner's
   answer came back. The owner's draw of the batch's IDs is therefore a moment inside
   the interval of every request of the batch.
2. The owner serves the key strictly (I2 on the owner, across its hand-offs): if request
   A (batch X) ended before request B (batch Y) started, X's answer had arrived before
   Y was sent, so the owner drew Y's IDs after it had answered X's: they are larger.
   Two batches in flight at once hold only requests that overlap in time (the second
   was sent before the first was answered, and each request of the first ends after
   that answer), so whichever the owner draws first, no ordering is owed between them.
   The same holds for batches to different owners during a hand-off.
3. The batch is sized exactly: the owner is asked for as many IDs as requests wait. An ID
   left over (an owner answering more than asked) is dropped, never kept for a later
   request (it would be older than what the owner has answered since); an answer with
   fewer IDs than asked is an error for the whole batch.
4. Any failure (the owner's 503 ``key_moving``, a 421, a 401, the owner unreachable or
   timing out) goes to every request of the batch; nothing of it is served. A 400 (an
   owner started with a ``--max-count`` below the batch) spends nothing: the batch is
   split in halves and its requests sent again, still before any later arrival.

The one-hop rule and the caller's ``Authorization`` are the forwarder's: the upstream
request carries ``X-Flakekit-Forwarded-By``, and requests with different
``Authorization`` headers never share a batch. Every other request (a batch, another
format, unknown query parameters, a key of a ``keys = "all"`` table with no generator of
its own) is forwarded unchanged, one upstream request each.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from flakekit_server.forward import Forwarder, ForwardError, Relayed

__all__ = ["IN_FLIGHT", "MAX_BATCH", "Coalescer", "Group", "Shape", "Waiter", "single_shape"]

#: at most this many requests share one upstream request
MAX_BATCH = 512
#: upstream requests of one group in flight at a time: a request that arrives while one
#: is answered goes in the next one at once, rather than after it (see the module docstring)
IN_FLIGHT = 2
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
_LEAF = b"/api/segment/get/"
_NEXT = b"/api/v1/next/"
_FORMATS = {b"format=numbers": "numbers", b"format=text": "text"}

#: a coalescable request: the generator the batch asks (as sent upstream), and how one ID
#: (its decimal bytes) is answered: ``render(value) -> (content type, body)``
Shape = tuple[bytes, Callable[[bytes], tuple[bytes, bytes]]]


def _leaf_body(value: bytes) -> tuple[bytes, bytes]:
    return TEXT, value


def _text_body(value: bytes) -> tuple[bytes, bytes]:
    return TEXT, value + b"\n"


def _numbers(name: str) -> Callable[[bytes], tuple[bytes, bytes]]:
    head = b'{"generator":' + json.dumps(name).encode() + b',"count":1,"ids":['

    def body(value: bytes) -> tuple[bytes, bytes]:
        return JSON, head + value + b"]}"

    return body


def single_shape(route: str, url: bytes, generators: dict[str, str]) -> Shape | None:
    """The shape of a single-ID request that can be coalesced, or None (forward it as it
    is). ``generators``: Leaf key -> the strict generator that serves it."""
    path, _, query = url.partition(b"?")
    if route == "leaf_segment" and path.startswith(_LEAF):
        # Leaf's URL takes any query parameter (ignored) and a "/" at the end
        key = unquote(path[len(_LEAF):].decode("latin-1"))
        name = generators.get(key[:-1] if key.endswith("/") else key)
        if name is None or not _NAME_RE.fullmatch(name):
            return None
        return name.encode(), _leaf_body
    if route != "next" or not path.startswith(_NEXT):
        return None
    name = path[len(_NEXT):].decode("latin-1")
    if not _NAME_RE.fullmatch(name):
        return None
    fmt = "numbers"
    seen: set[bytes] = set()
    for part in query.split(b"&") if query else ():
        param = part.partition(b"=")[0]
        if param in seen:
            return None
        seen.add(param)
        if part == b"count=1":
            continue
        fmt_name = _FORMATS.get(part)
        if fmt_name is None:
            return None
        fmt = fmt_name
    return name.encode(), _text_body if fmt == "text" else _numbers(name)


#: one waiting request: ``render`` (its ID -> content type and body), ``reply`` (the
#: transport's: ``(status, ctype, body, headers, route)``), its ``route``, ``failed``
#: (``failed(reply, answer, error)``: a refusal or forward error, relayed as for an
#: unbatched forward) and ``suffix`` (the header lines added to the owner's: which node
#: it came from)
Waiter = tuple[Callable[[bytes], tuple[bytes, bytes]], Callable[[Any], None], str,
               Callable[[Callable[[Any], None], Relayed | None, ForwardError | None], None],
               bytes]
Group = tuple[str, bytes, bytes | None]   # owner's advertise URL, generator, Authorization


class _Queue:
    __slots__ = ("in_flight", "limit", "scheduled", "waiting")

    def __init__(self) -> None:
        self.in_flight = 0         # upstream requests sent and not answered yet
        self.scheduled = False     # a send is due at the end of the loop's round
        self.limit = MAX_BATCH
        self.waiting: list[Waiter] = []


class Coalescer:
    """Batches of single-ID forwards, per (owner, generator, ``Authorization``); see the
    module docstring. On the event loop only, like the :class:`Forwarder` it sends by.
    ``max_in_flight``: upstream requests of one group at a time (1: a batch is sent only
    once the one before it is answered)."""

    def __init__(self, forwarder: Forwarder, max_in_flight: int = IN_FLIGHT) -> None:
        self.forwarder = forwarder
        self.max_in_flight = max_in_flight
        self._queues: dict[Group, _Queue] = {}
        #: upstream requests sent; requests they answered, and those answered with an ID
        self.batches = 0
        self.requests = 0
        self.served = 0

    def submit(self, group: Group, waiter: Waiter) -> None:
        """Queue one single-ID request of ``group``; it is answered through ``waiter``."""
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = _Queue()
        queue.waiting.append(waiter)
        if not queue.scheduled and queue.in_flight < self.max_in_flight:
            self._schedule(group, queue)

    def _schedule(self, group: Group, queue: _Queue) -> None:
        """Send at the end of this round of the loop: with what it read meanwhile."""
        queue.scheduled = True
        asyncio.get_running_loop().call_soon(self._send, group, queue)

    def _send(self, group: Group, queue: _Queue) -> None:
        """Send the next batch: the requests waiting now (nothing that arrives after)."""
        queue.scheduled = False
        if not queue.waiting or queue.in_flight >= self.max_in_flight:
            return   # an answer sends what waits
        n = min(len(queue.waiting), queue.limit)
        if n == len(queue.waiting):
            batch, queue.waiting = queue.waiting, []
        else:
            batch, queue.waiting = queue.waiting[:n], queue.waiting[n:]
        queue.in_flight += 1
        self.batches += 1

        def done(answer: Relayed | None, exc: ForwardError | None) -> None:
            self._answered(group, queue, batch, answer, exc)

        self.forwarder.send(group[0], b"GET", b"%s%s?count=%d" % (_NEXT, group[1], n),
                            group[2], done)

    def _answered(self, group: Group, queue: _Queue, batch: list[Waiter],
                  answer: Relayed | None, exc: ForwardError | None) -> None:
        n = len(batch)
        queue.in_flight -= 1
        if answer is not None and answer[0] == 400 and n > 1:
            # the owner's --max-count is below the batch: nothing was spent; the same
            # requests again (ahead of anything that arrived since), in smaller batches
            queue.limit = max(1, n // 2)
            queue.waiting[:0] = batch
            self._send(group, queue)
            if queue.waiting and not queue.scheduled and queue.in_flight < self.max_in_flight:
                self._schedule(group, queue)
            return
        values: list[bytes] | None = None
        if answer is not None and answer[0] == 200:
            values = _ids(answer[2], n)
            if values is None:
                answer, exc = None, ForwardError(
                    f"the owner's answer to a batch of {n} is not {n} IDs")
        # the next batch: the requests waiting when it is sent, once the loop has read what
        # arrived with this answer (nothing that arrives after: a later batch)
        if queue.waiting:
            if not queue.scheduled:
                self._schedule(group, queue)
        elif not queue.in_flight and len(self._queues) > 1024:
            self._queues.pop(group, None)   # many tokens or owners over time: forget idle ones
        self.requests += n
        if values is None:
            for waiter in batch:
                waiter[3](waiter[1], answer, exc)
            return
        assert answer is not None
        self.served += n
        owner_headers = answer[3]
        suffix = batch[0][4]
        headers = owner_headers + suffix
        for (render, reply, route, _, own_suffix), value in zip(batch, values, strict=False):
            if own_suffix is not suffix:
                suffix, headers = own_suffix, owner_headers + own_suffix
            ctype, body = render(value)      # in arrival order: the smallest first
            reply((200, ctype, body, headers, route))


def _ids(body: bytes, n: int) -> list[bytes] | None:
    """The first ``n`` decimal IDs of ``{"generator":...,"count":N,"ids":[...]}`` (more
    are dropped, never kept), or None when there are fewer or the body is not that."""
    at = body.rfind(b'"ids":[')
    if at < 0 or not body.endswith(b"]}"):
        return None
    values = body[at + 7:-2].split(b",")
    if len(values) < n:
        return None
    values = values[:n]
    for value in values:
        if not value.isdigit():
            return None
    return values
