"""The ID service behind the HTTP transport: the route tables and the dispatch.

:class:`IdService` turns ``(method, url, authorization)`` into a response tuple, so the
transport (:mod:`flakekit_server.http`) stays a thin byte pump and the service can be
tested without sockets. Every error is a JSON body naming the problem
(:mod:`flakekit_server.answers`).

The service is built from one module per concept (:mod:`flakekit_server.service_base`
lists them); this one builds the route tables once, when the service starts, asking each
generator what it can do (its capabilities: :class:`~flakekit.plugin.NonBlocking`...),
so no request asks it again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from flakekit.plugin import KEY_RE, NonBlocking, NonBlockingKeys, OrdersKeys, UnknownKeyError
from flakekit_server.answers import HttpError, Pending, Response, from_exception
from flakekit_server.api_routes import ApiRoutes
from flakekit_server.cluster import ClusterHttp, Hints
from flakekit_server.encoding import Bodies, decimal_join
from flakekit_server.key_tables import KeyTables
from flakekit_server.lazy_pool import LazyPool
from flakekit_server.leaf_routes import LeafRoutes
from flakekit_server.metrics import RequestStats
from flakekit_server.ops_routes import OpsRoutes
from flakekit_server.options import BATCH_THREADS, OFFLOAD_COUNT, ServerOptions
from flakekit_server.reports import RATE_SAMPLES, describe

__all__ = ["OFFLOAD_COUNT", "HttpError", "IdService", "Pending", "ServerOptions", "decimal_join",
           "describe"]

#: a route of the tables below: ``(query, authorization) -> answer``
Endpoint = Callable[[bytes, bytes | None], Response | Pending]
#: the transport's hot path: URL -> (generator, draw, metrics route, histogram)
FastRoute = tuple[str, Callable[[], int | None], str, list[int]]
#: the same for a strict key: URL -> (cluster key, the node's try_next_id, histogram of its IDs
#: served here, histogram of its forwarded answers)
StrictFastRoute = tuple[str, Callable[[str], tuple[int, int] | None], list[int], list[int]]
#: a URL prefix, its handler ``(service, rest of the path, query, authorization, ctx)``
#: and its metrics route
Prefix = tuple[str, Callable[..., Response | Pending], str]


class IdService(LeafRoutes, ApiRoutes, OpsRoutes):
    """Routes requests to the generators of one started :class:`~flakekit.assembly.kit.Kit`."""

    def __init__(
        self, kit: Any, options: ServerOptions, *, process: int = 0,
        run_dir: str | Path | None = None, stack: str = "", cluster: Any = None,
    ) -> None:
        self.kit = kit
        self.options = options
        self.process = process
        self.run_dir = Path(run_dir) if run_dir else None
        self.stack = stack
        self.started = time.time()
        self.stopping = False
        self.stats = RequestStats()
        self.generators = {name: kit[name] for name in kit}
        self.info = {name: kit.describe(name) for name in kit}
        self.strategy = {name: info.strategy for name, info in self.info.items()}
        self.memory = {name: gen for name, gen in self.generators.items()
                       if isinstance(gen, NonBlocking)}
        self.bodies = Bodies({name: kit.id_format(name) for name in kit})
        self.issued = dict.fromkeys(self.generators, 0)
        self._fast_counts = {}
        self._batch_urls = {}
        self._draw_pool = LazyPool(BATCH_THREADS, "flakekit-server-draw")
        self._batch_pool = LazyPool(BATCH_THREADS, "flakekit-server-batch")
        self._batch_locks = {name: threading.Lock() for name in self.generators}
        self.offloaded = 0   # batches made in a worker thread (a test checks it moves)
        # cluster mode: strict keys are served only through the node's ClusterNode
        # (``Kit.cluster_node()``, started by the runner; None: not in cluster mode)
        self.cluster = ClusterHttp(cluster) if cluster is not None else None
        self.cluster_memory = cluster if isinstance(cluster, NonBlockingKeys) else None
        self.strict = {}
        for name, gen in self.generators.items():
            key = self.info[name].key
            if isinstance(gen, OrdersKeys) and gen.order == "strict" or (
                    key is not None and self.cluster is not None and self.cluster.is_strict(key)):
                self.strict[name] = str(key or name)
        if self.cluster is not None:   # Leaf URLs of strict keys: forwards coalesce by generator
            self.cluster.set_generators(self.strict)
        # IDs issued at each of the last RATE_SAMPLES ticks (sample_rates, once a second, off
        # the request path): the monitor page's sparklines
        self.rate_samples = {name: deque(maxlen=RATE_SAMPLES + 1) for name in self.generators}
        # Leaf's segment key is the biz_tag; a generator's name works too
        self.segment_keys = {}
        for name, info in self.info.items():
            if info.key is not None:
                self.segment_keys.setdefault(info.key, name)
        for name, info in self.info.items():
            if info.key is not None:
                self.segment_keys.setdefault(name, name)
        # time-ordered generators with a layout: Leaf's snowflake URL and decoding
        self.snowflakes = [n for n, info in self.info.items() if info.layout is not None]
        # stores with keys = "all": every other biz_tag of the table, as Leaf serves them
        self.tables = KeyTables(kit, self.generators, self.strict)
        self.key_services = self.tables.services
        self._db_page = (0.0, b"")
        self._db_thread = None
        default = options.snowflake_default
        if default is not None and default not in self.snowflakes:
            raise UnknownKeyError(default)  # checked earlier by the CLI
        self.fast = self._fast_routes()
        self.strict_fast = self._strict_fast_routes()
        #: cluster mode: the transport's forward of a strict key's Leaf URL another node
        #: owns (ClusterHttp.forward_one), beside strict_fast
        self.forward_one = self.cluster.forward_one if self.cluster is not None else None
        self.routes: dict[str, Endpoint] = {
            "/": self._monitor,
            "/health": self._health,
            "/healthz": self._health,
            "/ready": self._ready,
            "/readyz": self._ready,
            "/metrics": self._metrics,
            "/api/v1/status": self._status,
            "/api/v1/generators": self._list,
            "/api/v1/cluster": self._cluster,
            "/openapi.json": self._openapi,   # every route is in flakekit_server/openapi.py
        }
        # Leaf's own pages: any method, unknown query parameters ignored, "/" at the end ok
        self.leaf_routes: dict[str, Endpoint] = {
            "/decodeSnowflakeId": self._leaf_decode,
            "/cache": self._cache,
            "/db": self._leaf_db,
        }
        # worker-id leases for library clients (allocator type "http"): POST, off the loop
        from flakekit_server.lease_api import LeaseApi

        self.leases = LeaseApi(kit, options.tokens, workers=options.workers)

    # -- the transport's hot path ---------------------------------------------------------------
    def _served_fast(self, name: str, url: bytes) -> bool:
        """Whether ``url`` of generator ``name`` is answered by the transport itself: an
        open (no token), non-strict generator with a key a URL can carry."""
        return (name not in self.strict and not self.options.tokens.protected(name)
                and KEY_RE.fullmatch(url.rsplit(b"/", 1)[1].decode()) is not None)

    def _histogram(self, name: str, url: bytes, route: str) -> list[int]:
        """The histogram of ``url``'s 200 answers, counted as IDs of ``name``."""
        hist = self.stats.ok_histogram(url, route)
        self._fast_counts.setdefault(name, []).append(hist)
        return hist

    def _fast_routes(self) -> dict[bytes, FastRoute]:
        """The exact Leaf URLs of open generators -> (generator, a function giving the ID
        or None, the metrics route, the URL's histogram of 200 answers). A segment key's
        ``try_next_id`` never waits for the database: None, and the transport asks
        :meth:`draw_later` (a worker thread) instead of holding up the event loop."""
        urls = [(b"/api/segment/get/" + key.encode(), name)
                for key, name in self.segment_keys.items()]
        urls += [(b"/api/snowflake/get/" + name.encode(), name) for name in self.snowflakes]
        fast: dict[bytes, FastRoute] = {}
        for url, name in urls:
            if not self._served_fast(name, url):
                continue
            memory = self.memory.get(name)
            draw = memory.try_next_id if memory is not None else self.generators[name].next_id
            route = "leaf_" + self.strategy[name]
            fast[url] = (name, draw, route, self._histogram(name, url, route))
        return fast

    def _strict_fast_routes(self) -> dict[bytes, StrictFastRoute]:
        """Cluster mode: the Leaf URLs of strict keys -> (the cluster key, the node's
        ``try_next_id``, the URL's histogram of 200 answers served here, and of those
        forwarded: not IDs this node issued). The transport serves an owned key whose IDs
        are in memory on the loop and forwards one another node owns
        (:meth:`ClusterHttp.forward_one`); anything else goes through :meth:`handle`."""
        memory = self.cluster_memory
        if memory is None:
            return {}
        out: dict[bytes, StrictFastRoute] = {}
        for url_key, name in self.segment_keys.items():
            url = b"/api/segment/get/" + url_key.encode()
            if (name in self.strict and not self.options.tokens.protected(name)
                    and KEY_RE.fullmatch(url_key)):
                out[url] = (self.strict[name], memory.try_next_id,
                            self._histogram(name, url, "leaf_segment"),
                            self.stats.ok_histogram((b"forwarded", url), "leaf_segment"))
        return out

    def close(self) -> None:
        """Stop the key services (their tails go back); the kit closes the rest."""
        self.stopping = True
        self.tables.close()
        for pool in (self._batch_pool, self._draw_pool):
            pool.close()
        if self.cluster is not None:
            self.cluster.close()
        self.leases.close()

    # -- dispatch ------------------------------------------------------------------------------
    _leaf_prefixes: tuple[Prefix, ...] = (
        ("/api/segment/get/", LeafRoutes._leaf_segment, "leaf_segment"),
        ("/api/snowflake/get/", LeafRoutes._leaf_snowflake, "leaf_snowflake"),
    )
    _prefixes: tuple[Prefix, ...] = (
        ("/api/v1/next/", ApiRoutes._next, "next"),
        ("/api/v1/decode/", ApiRoutes._decode, "decode"),
    )

    def handle(self, method: bytes, url: bytes, authorization: bytes | None,
               hints: Hints | None = None) -> Response | Pending:
        """Answer one request; never raises. A :class:`Pending` is made off the event loop
        (await its ``result()``); ``hints`` are the request's cluster headers, if any."""
        route = "other"
        try:
            if hints is not None and hints.view_epoch is not None and not (
                    hints.view_epoch.isdigit() and len(hints.view_epoch) <= 19):
                raise HttpError(400, "bad_request", "X-Flakekit-View-Epoch must be the view "
                                "epoch the client routes by (a non-negative integer)")
            ctx = (method, url, hints)
            path_b, _, query = url.partition(b"?")
            try:
                path = unquote(path_b.decode("ascii"), errors="strict")
            except UnicodeDecodeError:
                raise HttpError(400, "bad_request", "the path must be ASCII (percent-encoded "
                                "UTF-8 keys are not valid keys)") from None
            # Leaf's endpoints as Leaf's Spring mappings take them: any method, a "/" at the
            # end, unknown query parameters (cache-busters) ignored. Only a literal "/": an
            # encoded one (%2F) is part of the key, and no key has one
            slash = path_b[1:].endswith(b"/")
            for prefix, handler, name in self._leaf_prefixes:
                if path.startswith(prefix):
                    route = name
                    if method == b"HEAD":   # RFC 9110 9.3.2: a HEAD must not spend an ID
                        raise HttpError(405, "method_not_allowed", "HEAD would spend an ID on "
                                        "this URL: use GET (or POST, as Leaf's clients may)",
                                        b"Allow: GET, POST\r\n")
                    rest = path[len(prefix):]
                    return handler(self, rest[:-1] if slash and rest[1:].endswith("/") else rest,
                                   query, authorization, ctx)
            leaf = self.leaf_routes.get(path[:-1] if slash else path)
            if leaf is not None:
                route = leaf.__name__.lstrip("_")
                return leaf(query, authorization)
            if path.startswith("/api/v1/leases/"):   # POST as well: flakekit_server/lease_api.py
                route = "leases"
                return self.leases.handle(method, path[15:], query, authorization)
            # HEAD (GET's headers, no body: http.py) only where a GET has no effect: never
            # on /api/v1/next, which would spend IDs
            if method != b"GET" and not (method == b"HEAD" and path in self.routes):
                allow = b"GET, HEAD" if path in self.routes else b"GET"
                raise HttpError(405, "method_not_allowed",
                                f"{method.decode('latin-1')} is not allowed; use GET",
                                b"Allow: %s\r\n" % allow)
            for prefix, handler, name in self._prefixes:
                if path.startswith(prefix):
                    route = name
                    return handler(self, path[len(prefix):], query, authorization, ctx)
            endpoint = self.routes.get(path)
            if endpoint is None:
                route = "not_found"
                raise HttpError(404, "not_found", f"no such endpoint {path[:80]!r}; see / for the "
                                "monitor page and docs/server.md for the API")
            route = endpoint.__name__.lstrip("_")
            return endpoint(query, authorization)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            return from_exception(exc).answer(route)
