"""Cluster mode's strict keys over HTTP: served only through the node's ``ClusterNode``
(never from the kit's generator directly, never on the transport's fast path for a key
this node does not hold). An owned key whose IDs are in memory is answered on the loop
(every check made after the draw); a moving key or a refill is waited for in a thread
(``ClusterHttp.serve``); a key another node owns is forwarded or refused
(``ClusterHttp.refuse``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from flakekit.plugin import NonBlockingKeys, NotOwnerError
from flakekit_server.answers import JSON, TEXT, Pending, Response, error_body
from flakekit_server.cluster import ClusterHttp, epoch_header
from flakekit_server.service_base import ServiceBase

__all__ = ["StrictRoutes"]

_NEXT = b"/api/v1/next/"
#: forwarded batch URLs whose generator and count are remembered (forwarded_batch)
BATCH_URLS_KEPT = 4096


class StrictRoutes(ServiceBase):
    """The strict keys of an :class:`~flakekit_server.app.IdService` in cluster mode."""

    def _cluster_node(self) -> tuple[ClusterHttp, Any]:
        """Cluster mode's HTTP side and its ``ClusterNode`` (only asked in cluster mode)."""
        assert self.cluster is not None
        return self.cluster, self.cluster.node

    def _strict_key(self, key: str, name: str | None, auth: bytes | None) -> str | None:
        """The cluster key a Leaf URL names, if strict (its generator's token checked)."""
        assert self.cluster is not None
        if name is not None:
            strict = self.strict.get(name)
            if strict is not None:
                self._check_auth(name, auth)
            return strict
        if not self.cluster.is_strict(key):   # a key of a strict table with keys = "all"
            return None
        for owner in self.strict:
            self._check_auth(owner, auth)
        return key

    def _error(self, route: str) -> Callable[[int, str, str, bytes], Response]:
        def error(status: int, code: str, message: str, headers: bytes) -> Response:
            return status, JSON, error_body(status, code, message), headers, route
        return error

    def _refusal(self, exc: NotOwnerError, ctx: tuple[Any, ...], auth: bytes | None,
                 route: str) -> Pending:
        """Another node owns the key: forwarded (or 421/503) by ``ClusterHttp.refuse``,
        whose callback answers (``Pending.start``; ``result()`` for other callers)."""
        assert self.cluster is not None
        cluster, error = self.cluster, self._error(route)

        def start(reply: Callable[[Response], None]) -> None:
            cluster.refuse(exc, ctx[0], ctx[1], auth, ctx[2], route, error, reply)

        async def run() -> Response:
            future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            start(lambda answer: None if future.done() else future.set_result(answer))
            return await future

        return Pending(route, run, start)

    def _in_thread(self, name: str | None, count: int, work: Callable[[], Response],
                   ctx: tuple[Any, ...], auth: bytes | None, route: str) -> Pending:
        """``work`` (the node's ``next_id``/``next_ids``, which may wait for a hand-off or
        refuse) in a worker thread; ``count`` IDs counted under ``name`` once served."""
        assert self.cluster is not None
        cluster = self.cluster
        served: list[bool] = []

        def counted() -> Response:
            answer = work()
            served.append(True)
            return answer

        async def run() -> Response:
            answer = await cluster.serve(counted, ctx[0], ctx[1], auth, ctx[2], route,
                                         self._error(route))
            if served and name is not None:
                self.issued[name] += count
            return answer

        return Pending(route, run)

    def _strict_leaf(self, key: str, name: str | None, ctx: tuple[Any, ...],
                     auth: bytes | None) -> Response | Pending:
        cluster, node = self._cluster_node()
        memory = self.cluster_memory
        # an owned key whose IDs are in memory: on the loop (every check made after the
        # draw, as in a thread); a moving key, a refill or a refusal: off it, below
        got = memory.try_next_id(key) if memory is not None else None
        if got is not None:
            if name is not None:
                self.issued[name] += 1
            return 200, TEXT, b"%d" % got[0], epoch_header(got[1]), "leaf_segment"
        elsewhere = cluster.owned_elsewhere(key)
        if elsewhere is not None:   # forwarded (or 421/503) on the loop, no thread
            return self._refusal(elsewhere, ctx, auth, "leaf_segment")

        def work() -> Response:
            value, epoch = node.next_id(key)
            return 200, TEXT, b"%d" % value, epoch_header(epoch), "leaf_segment"

        return self._in_thread(name, 1, work, ctx, auth, "leaf_segment")

    def forwarded_batch(self, url: bytes) -> Response | None:
        """The transport's path for what a coalescing node sends an owner,
        ``/api/v1/next/NAME?count=N`` with ``X-Flakekit-Forwarded-By``: answered on the
        loop, as :meth:`_strict_next` answers it, when NAME is an open strict generator
        whose IDs are in memory on this owner; None otherwise (the long way round)."""
        memory = self.cluster_memory
        if memory is None:
            return None
        known = self._batch_urls.get(url)
        if known is None:
            known = self._batch_url(url)
            if known is None:
                return None
            if len(self._batch_urls) >= BATCH_URLS_KEPT:
                self._batch_urls.clear()
            self._batch_urls[url] = known
        name, key, count = known
        return self._in_memory(memory, name, key, count, "numbers")

    def _in_memory(self, memory: NonBlockingKeys, name: str, key: str, count: int,
                   fmt: str) -> Response | None:
        """``count`` IDs of the strict ``key`` (generator ``name``) in format ``fmt``,
        drawn on the loop when its buffers on this owner hold them; None (nothing taken)
        otherwise."""
        got: Any
        if count == 1 and fmt != "ranges":
            single = memory.try_next_id(key)
            got = None if single is None else ((single[0],), None, single[1])
        else:
            many = memory.try_next_ids(key, count)
            got = None if many is None else (many[0], many[0].ranges, many[1])
        if got is None:
            return None
        self.issued[name] += count
        return self.bodies.format(name, count, fmt, got[0], got[1], epoch_header(got[2]))

    def _batch_url(self, url: bytes) -> tuple[str, str, int] | None:
        path, _, query = url.partition(b"?")
        if not path.startswith(_NEXT) or not query.startswith(b"count="):
            return None
        name = path[len(_NEXT):].decode("latin-1")
        raw = query[6:]
        if (name not in self.strict or self.options.tokens.protected(name)
                or not raw.isdigit() or len(raw) > 6):
            return None
        count = int(raw)
        if not 1 <= count <= self.options.max_count or count >= self.options.offload_count:
            return None
        return name, self.strict[name], count

    def _strict_next(self, name: str, count: int, fmt: str, ctx: tuple[Any, ...],
                     auth: bytes | None) -> Response | Pending:
        cluster, node = self._cluster_node()
        key = self.strict[name]
        one = count == 1 and fmt != "ranges"
        memory = self.cluster_memory
        if count < self.options.offload_count and memory is not None:
            # on the loop, as _strict_leaf (a large batch is drawn and encoded in a thread)
            answer = self._in_memory(memory, name, key, count, fmt)
            if answer is not None:
                return answer
            elsewhere = cluster.owned_elsewhere(key)
            if elsewhere is not None:
                return self._refusal(elsewhere, ctx, auth, "next")

        def work() -> Response:
            ids: Any
            ranges: Any = None
            if one:
                value, epoch = node.next_id(key)
                ids = (value,)
            else:
                ids, epoch = node.next_ids(key, count)
                ranges = ids.ranges
            return self.bodies.format(name, count, fmt, ids, ranges, epoch_header(epoch))

        return self._in_thread(name, count, work, ctx, auth, "next")
