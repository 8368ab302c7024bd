"""Coalescing forwarded single-ID requests: one upstream request per batch (group commit).

A node that does not own a strict key forwards its requests to the owner
(:mod:`flakekit_server.forward`). Forwarding every request on its own costs a second
HTTP exchange per ID. Instead, the common single-ID requests of one key (the Leaf URL
``/api/segment/get/KEY`` and ``/api/v1/next/NAME`` with ``count=1`` in format
``numbers`` or ``text``) are **coalesced** per (owner, generator, ``Authorization``):

* while no upstream request of the group is in flight, a request is sent at once, as a
  batch of one;
* while one is in flight, further requests wait in arrival order; when the answer comes,
  the next upstream request asks for exactly as many IDs as there are waiting requests
  (``GET /api/v1/next/NAME?count=N``, at most ``MAX_BATCH``) and the N IDs of its
  answer go to those N requests in arrival order, each answered as the owner answers
  that request alone (Leaf's plain body or the JSON API's, ``X-Flakekit-Owner-Epoch``
  and the other headers of the owner's answer, ``X-Flakekit-Relayed-From``).

Why the IDs of a strict key still increase strictly as clients see them (docs/cluster.md,
I2: an ID answered to a request that started after another one ended is larger):

1. A batch serves only requests that had **arrived before its upstream request was
   sent** (the queue is taken whole when the request is written; a request arriving
   later waits for a later batch). Every request of a batch is therefore in progress
   from before the owner drew the batch's IDs until after they came back: the owner's
   draw is a moment inside each of their intervals, so any hand-out among them is a
   linearizable order; arrival order is the natural one.
2. A later batch is sent only after the earlier one's answer arrived, so the owner drew
   its IDs later, and they are larger (the owner serves the key in order).
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

import json
import re
from collections.abc import Callable
from urllib.parse import unquote

from flakekit_server.forward import Forwarder, ForwardError, Relayed

__all__ = ["MAX_BATCH", "Coalescer", "Shape", "single_shape"]

#: at most this many requests share one upstream request
MAX_BATCH = 512
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


class _Waiter:
    __slots__ = ("answered", "render")

    def __init__(self, render: Callable[[bytes], tuple[bytes, bytes]],
                 answered: Callable[[Relayed | None, ForwardError | None], None]) -> None:
        self.render = render
        self.answered = answered


class _Group:
    __slots__ = ("busy", "limit", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.limit = MAX_BATCH
        self.waiting: list[_Waiter] = []


class Coalescer:
    """Batches of single-ID forwards, per (owner, generator, ``Authorization``); see the
    module docstring. On the event loop only, like the :class:`Forwarder` it sends by."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self._groups: dict[tuple[str, bytes, bytes | None], _Group] = {}
        #: upstream requests sent, requests they served (with IDs or a relayed refusal)
        self.batches = 0
        self.requests = 0
        #: called with (group, batch size) as a batch is sent (tests watch batches form)
        self.on_send: Callable[[tuple[str, bytes, bytes | None], int], None] | None = None

    def submit(self, advertise: str, generator: bytes, authorization: bytes | None,
               render: Callable[[bytes], tuple[bytes, bytes]],
               answered: Callable[[Relayed | None, ForwardError | None], None]) -> None:
        """Queue a single-ID request; ``answered(relayed, None)`` gets its answer as the
        owner would have given it alone, ``answered(None, error)`` a forward error."""
        group_key = (advertise, generator, authorization)
        group = self._groups.get(group_key)
        if group is None:
            group = self._groups[group_key] = _Group()
        group.waiting.append(_Waiter(render, answered))
        if not group.busy:
            self._send(group_key, group)

    def _send(self, group_key: tuple[str, bytes, bytes | None], group: _Group) -> None:
        """Send the next batch: the requests waiting now (nothing that arrives after)."""
        if not group.waiting:
            group.busy = False
            if len(self._groups) > 1024:   # many tokens or owners over time: forget idle ones
                self._groups.pop(group_key, None)
            return
        n = min(len(group.waiting), group.limit)
        batch, group.waiting = group.waiting[:n], group.waiting[n:]
        group.busy = True
        self.batches += 1
        if self.on_send is not None:
            self.on_send(group_key, n)
        advertise, generator, authorization = group_key
        url = b"%s%s?count=%d" % (_NEXT, generator, n)

        def done(answer: Relayed | None, exc: ForwardError | None) -> None:
            self._answered(group_key, group, batch, answer, exc)

        self.forwarder.send(advertise, b"GET", url, authorization, done)

    def _answered(self, group_key: tuple[str, bytes, bytes | None], group: _Group,
                  batch: list[_Waiter], answer: Relayed | None,
                  exc: ForwardError | None) -> None:
        n = len(batch)
        if answer is not None and answer[0] == 400 and n > 1:
            # the owner's --max-count is below the batch: nothing was spent; the same
            # requests again (ahead of anything that arrived since), in smaller batches
            group.limit = max(1, n // 2)
            group.waiting[:0] = batch
            self._send(group_key, group)
            return
        values: list[bytes] | None = None
        if answer is not None and answer[0] == 200:
            values = _ids(answer[2], n)
            if values is None:
                answer, exc = None, ForwardError(
                    f"the owner's answer to a batch of {n} is not {n} IDs")
        # the next batch goes out first (the owner works on it while these are answered):
        # it holds only requests that arrived before this moment
        self._send(group_key, group)
        self.requests += n
        if values is None:
            for waiter in batch:
                waiter.answered(answer, exc)
            return
        assert answer is not None
        headers = answer[3]
        for waiter, value in zip(batch, values, strict=False):   # in arrival order
            ctype, body = waiter.render(value)
            waiter.answered((200, ctype, body, headers), None)


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
