"""Cluster mode over HTTP: strict keys served through the node's ``ClusterNode``.

A strict key has one owner in the view. On the owner the request is served on the event
loop when the key's IDs are in memory and every check passes (``ClusterNode.try_next_id``:
the member deadline, the view epoch and the claim, after the draw); otherwise (a refill, a
key that is moving: it may hold the request up to ``handoff_wait``) in a worker thread, so
the event loop keeps serving every other key meanwhile. Every ID answer carries
``X-Flakekit-Owner-Epoch``. On another node (known from the applied view on the loop,
``ClusterNode.other_owner``, or from the runtime's refusal):

* a request with ``X-Flakekit-View-Epoch`` (a flakekit client that routes by itself)
  gets **421** ``{owner, advertise, epoch}``: it updates its view and retries there;
* a request with ``X-Flakekit-Forwarded-By`` (already forwarded once) gets **503** with
  ``Retry-After``: never a second hop, whatever the views say;
* any other request is forwarded once to the owner, whose answer is relayed unchanged;
  single-ID requests of one generator share upstream batches (coalesce.py, with the
  argument that real-time order still holds), each answered as the owner would have.

A moving key or a lapsed membership is a 503 with ``Retry-After``; nothing is served
that the runtime refused.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from flakekit.plugin import LATENCY_BUCKETS_S as HANDOFF_BUCKETS_S
from flakekit.plugin import ClusterUnavailableError, KeyMovingError, NotOwnerError
from flakekit_server.answers import JSON, error_body
from flakekit_server.coalesce import Coalescer, Shape, single_shape
from flakekit_server.forward import OWNER_EPOCH, Forwarder, ForwardError, Relayed
from flakekit_server.lazy_pool import LazyPool

if TYPE_CHECKING:
    from flakekit.embed import ClusterNode

__all__ = ["REFUSAL_REASONS", "ClusterHttp", "Hints", "epoch_header"]

#: why a strict-key request got a 503 (the label of flakekit_cluster_refused_total)
REFUSAL_REASONS = ("key_moving", "cluster_unavailable", "forwarded_not_owner",
                   "owner_unreachable")
log = logging.getLogger("flakekit.server")
#: worker threads serving strict keys per process (each holds at most handoff_wait)
STRICT_THREADS = 16
#: request URLs whose coalescing shape is remembered (coalesce.single_shape)
SHAPES_KEPT = 4096


class Hints:
    """The cluster headers of one request (absent on almost every request: None)."""

    __slots__ = ("forwarded_by", "view_epoch")

    def __init__(self) -> None:
        self.forwarded_by: bytes | None = None
        self.view_epoch: bytes | None = None


def _retry_after(seconds: float) -> bytes:
    return b"Retry-After: %d\r\n" % max(1, math.ceil(seconds))


def epoch_header(epoch: int) -> bytes:
    return b"%s: %d\r\n" % (OWNER_EPOCH, epoch)


class ClusterHttp:
    """What the HTTP side of one node adds to its ``ClusterNode``: the worker threads,
    the forwarder and the counters ``/metrics`` shows."""

    def __init__(self, node: ClusterNode, forward_timeout: float | None = None,
                 refresh: float = 1.0) -> None:
        self.node = node
        settings = node.settings
        self.name = str(settings.node)
        # the owner may hold a forwarded request up to its handoff_wait, then answers 503
        self.forwarder = Forwarder(self.name, forward_timeout or settings.handoff_wait + 3.0)
        #: single-ID forwards of one key share upstream requests (coalesce.py); the
        #: server sets ``generators`` (Leaf key -> its strict generator) for Leaf's URL
        self.coalescer = Coalescer(self.forwarder)
        self.coalesce = True
        self.generators: dict[str, str] = {}
        self._shapes: dict[tuple[str, bytes], Shape | None] = {}
        self._elsewhere: dict[str, NotOwnerError] = {}
        self._relays: dict[tuple[str, str, str], _Relay] = {}
        self._pool = LazyPool(STRICT_THREADS, "flakekit-server-strict")
        self.forwards: Counter[str] = Counter({"ok": 0, "failed": 0})
        self.misdirected = 0
        self.refused: Counter[str] = Counter(dict.fromkeys(REFUSAL_REASONS, 0))
        # status() reads the membership store: never on the event loop. A thread keeps a
        # copy for /metrics, /ready and the monitor page; /api/v1/cluster reads it afresh
        # in a worker thread
        self._status: dict[str, Any] = {}
        self._stats: dict[str, Any] = {}
        self._handoffs_seen = 0
        self.handoff_buckets = [0] * (len(HANDOFF_BUCKETS_S) + 1)
        self.handoff_sum_ms = 0.0
        self.handoff_count = 0
        self._stop = threading.Event()
        self._refresh()
        self._thread = threading.Thread(target=self._refresher, args=(refresh,), daemon=True,
                                        name="flakekit-server-cluster")
        self._thread.start()

    def _refresher(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self._refresh()
            except Exception:  # the pages show the last good copy
                log.exception("reading the cluster status failed")

    def _refresh(self) -> None:
        status = self._safe_status()
        try:
            stats = dict(self.node.stats())
        except Exception:  # noqa: BLE001
            stats = {}
        done = int(stats.get("handoffs", 0) or 0)
        new = done - self._handoffs_seen
        if new > 0:   # the runtime keeps the newest durations: add the new ones once
            recent = list(stats.get("handoff_ms") or [])[-new:] if new else []
            for ms in recent:
                self.handoff_buckets[bisect.bisect_left(HANDOFF_BUCKETS_S, ms / 1e3)] += 1
                self.handoff_sum_ms += ms
                self.handoff_count += 1
            self._handoffs_seen = done
        self._status, self._stats = status, stats

    def set_generators(self, strict: dict[str, str]) -> None:
        """The server's strict generators (name -> key): a Leaf URL names a key or a
        generator, and its coalesced forwards ask the owner for that generator's IDs."""
        generators = {key: name for name, key in strict.items()}
        for name in strict:
            generators.setdefault(name, name)
        self.generators = generators

    def pool(self) -> ThreadPoolExecutor:
        return self._pool.get()

    def is_strict(self, key: str) -> bool:
        try:
            return bool(self.node.is_strict(key))
        except Exception:  # noqa: BLE001 - an unknown key is not strict
            return False

    async def serve(
        self, work: Callable[[], tuple[Any, ...]], method: bytes, url: bytes,
        authorization: bytes | None, hints: Hints | None, route: str,
        error: Callable[..., Any],
    ) -> Any:
        """Run ``work`` (which calls the node's ``next_id``/``next_ids``) off the loop and
        turn the runtime's refusals into answers; ``error(status, code, message, headers)``
        builds an error answer in the endpoint's form; a 421 names the owner in JSON."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool(), work)
        except NotOwnerError as exc:
            return await self._not_owner(exc, method, url, authorization, hints, route, error)
        except KeyMovingError as exc:
            self.refused["key_moving"] += 1
            return error(503, "key_moving", str(exc), _retry_after(exc.retry_after))
        except ClusterUnavailableError as exc:
            self.refused["cluster_unavailable"] += 1
            return error(503, "cluster_unavailable", str(exc), _retry_after(exc.retry_after))

    def owned_elsewhere(self, key: str) -> NotOwnerError | None:
        """Another node owns ``key`` in the applied view (``ClusterNode.other_owner``, no
        lock, no wait): the refusal :meth:`serve` would get from the runtime, so the
        request is forwarded (or answered 421/503) on the event loop, without a thread."""
        got = self.node.other_owner(key)
        if got is None:
            return None
        owner, epoch = got
        known = self._elsewhere.get(key)   # the same refusal as last time: not made again
        if known is not None and known.owner is owner and known.epoch == epoch:
            return known
        if len(self._elsewhere) >= SHAPES_KEPT:
            self._elsewhere.clear()
        known = self._elsewhere[key] = NotOwnerError(
            f"strict key {key!r} is owned by node {owner.node!r} in view epoch {epoch}",
            owner=owner, epoch=epoch)
        return known

    def refuse(self, exc: NotOwnerError, method: bytes, url: bytes,
               authorization: bytes | None, hints: Hints | None, route: str,
               error: Callable[..., Any], reply: Callable[[Any], None]) -> None:
        """A request for a key another node owns, answered through ``reply`` (once, on
        the event loop): forwarded once, or 421/503, as :meth:`serve` answers a
        ``NotOwnerError``. No task and no coroutine: a forward is a write and a callback."""
        owner = exc.owner
        node = owner.node if owner is not None else ""
        advertise = owner.advertise if owner is not None else ""
        if hints is not None and hints.forwarded_by is not None:
            self.refused["forwarded_not_owner"] += 1
            by = hints.forwarded_by.decode("latin-1")[:64]
            reply(error(503, "not_owner", f"forwarded by {by!r}, but this node does not own "
                        f"the key either (it sees owner {node!r} at view epoch {exc.epoch}); "
                        "the views are changing: retry", _retry_after(1.0)))
            return
        if hints is not None and hints.view_epoch is not None:
            self.misdirected += 1
            body = json.dumps({
                "error": "misdirected", "status": 421, "owner": node, "advertise": advertise,
                "epoch": exc.epoch,
                "message": f"node {self.name!r} does not own the key: {node!r} at {advertise} "
                           f"does in view epoch {exc.epoch}"}).encode()
            reply((421, b"application/json", body, b"", route))
            return
        if not advertise or node == self.name:
            self.refused["owner_unreachable"] += 1
            reply(error(503, "owner_unreachable", f"the owner {node!r} has no advertise URL",
                        _retry_after(1.0)))
            return

        relay = self._relay(node, advertise, route)
        shape = self._shape(route, url) if self.coalesce else None
        if shape is not None:   # one ID: with the others waiting for the key (coalesce.py)
            self.coalescer.submit((advertise, shape[0], authorization),
                                  (shape[1], reply, route, relay, relay.suffix))
        else:
            self.forwarder.send(advertise, method, url, authorization,
                                lambda answer, fexc: relay(reply, answer, fexc))

    def forward_one(self, key: str, url: bytes, authorization: bytes | None,
                    reply: Callable[[Any], None]) -> bool:
        """The transport's path for a Leaf URL of a strict key that another node owns in
        the applied view, asked with no cluster header: queued at once with the key's other
        single-ID forwards (coalesce.py), ``reply`` answered on the event loop, as
        :meth:`refuse` would (no routing, no refusal object, no closure per request).
        False when that is not the case: the transport goes the long way round."""
        exc = self.owned_elsewhere(key)
        if exc is None or not self.coalesce:
            return False
        owner = exc.owner
        if owner is None or not owner.advertise or owner.node == self.name:
            return False
        shape = self._shape("leaf_segment", url)
        if shape is None:
            return False
        relay = self._relay(owner.node, owner.advertise, "leaf_segment")
        self.coalescer.submit((owner.advertise, shape[0], authorization),
                              (shape[1], reply, "leaf_segment", relay, relay.suffix))
        return True

    def _shape(self, route: str, url: bytes) -> Shape | None:
        try:
            return self._shapes[route, url]
        except KeyError:   # parsed once per distinct URL (a few per key in practice)
            shape = single_shape(route, url, self.generators)
            if len(self._shapes) < SHAPES_KEPT:
                self._shapes[route, url] = shape
            return shape

    def _relay(self, node: str, advertise: str, route: str) -> _Relay:
        relay = self._relays.get((node, advertise, route))
        if relay is None:
            if len(self._relays) >= SHAPES_KEPT:
                self._relays.clear()
            relay = self._relays[node, advertise, route] = _Relay(self, node, advertise, route)
        return relay

    async def _not_owner(self, exc: NotOwnerError, method: bytes, url: bytes,
                         authorization: bytes | None, hints: Hints | None, route: str,
                         error: Callable[..., Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def reply(answer: Any) -> None:
            if not future.done():
                future.set_result(answer)

        self.refuse(exc, method, url, authorization, hints, route, error, reply)
        return await future

    def _safe_status(self) -> dict[str, Any]:
        try:
            status = self.node.status()
        except Exception:  # noqa: BLE001 - status for pages only
            return {}
        return dict(status) if isinstance(status, dict) else {}

    def public_status(self) -> dict[str, Any]:
        """``GET /api/v1/cluster``: the view clients route by (no claim internals). Reads
        the membership store: call it off the event loop."""
        status = self._safe_status()
        if status:
            self._status = status
        out = {k: status.get(k) for k in ("cluster", "node", "epoch", "hash", "members",
                                           "owners", "lease")}
        out["members"] = [
            {f: m.get(f) for f in ("node", "advertise", "weight", "state")}
            for m in (out.get("members") or []) if isinstance(m, dict)]
        out["owners"] = dict(out.get("owners") or {})
        return out

    def snapshot(self) -> dict[str, Any]:
        """Status, the runtime's counters and this server's (for /metrics and the page):
        the copy the refresher thread keeps, at most a second old."""
        stats = self._stats
        return {
            "status": self._status,
            "handoffs": int(stats.get("handoffs", 0) or 0),
            "handoff_buckets": list(self.handoff_buckets),
            "handoff_sum_ms": self.handoff_sum_ms,
            "handoff_count": self.handoff_count,
            "runtime": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
            "forwards": {"ok": self.forwards["ok"] + self.coalescer.served,
                         "failed": self.forwards["failed"]},
            "coalesced": {"batches": self.coalescer.batches,
                          "requests": self.coalescer.requests},
            "misdirected": self.misdirected,
            "refused": dict(self.refused),
        }

    def close(self) -> None:
        self._stop.set()
        self._pool.close()
        self.forwarder.close()


#: names the owner a relayed answer came from (every relayed answer carries it)
RELAYED_FROM = b"X-Flakekit-Relayed-From: "


class _Relay:
    """How a forward to one owner is answered (one per owner and route, made once):
    ``relay(reply, answer, error)`` relays the owner's answer with the node it came
    from (a refusal naming that node), or answers 503 ``owner_unreachable``."""

    __slots__ = ("advertise", "cluster", "node", "route", "suffix")

    def __init__(self, cluster: ClusterHttp, node: str, advertise: str, route: str) -> None:
        self.cluster, self.node, self.advertise, self.route = cluster, node, advertise, route
        #: the header line every relayed answer carries
        self.suffix = RELAYED_FROM + node.encode("latin-1") + b"\r\n"

    def __call__(self, reply: Callable[[Any], None], answer: Relayed | None,
                 fexc: ForwardError | None) -> None:
        cluster = self.cluster
        if fexc is not None or answer is None:
            cluster.forwards["failed"] += 1
            cluster.refused["owner_unreachable"] += 1
            reply((503, JSON, error_body(503, "owner_unreachable", f"forwarding to the owner "
                                         f"{self.node!r} failed: {fexc}"),
                   _retry_after(1.0), self.route))
            return
        cluster.forwards["ok"] += 1
        status, ctype, body, headers = answer
        if status >= 400:   # a relayed refusal says which node refused (issue 20)
            body = _name_refuser(body, self.node, self.advertise)
        reply((status, ctype, body, headers + self.suffix, self.route))


def _name_refuser(body: bytes, node: str, advertise: str) -> bytes:
    """The owner's JSON error with ``node`` (and where it is) in its message and a
    ``node`` field: a relayed ``404 unknown_key`` otherwise names neither node."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict):
        return body
    message = str(parsed.get("message", ""))
    parsed.setdefault("node", node)
    parsed["message"] = f"node {node!r} ({advertise}) answered: {message}"
    return json.dumps(parsed).encode()
