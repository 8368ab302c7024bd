"""The ID service behind the HTTP transport: routing, validation, errors, status.

:class:`IdService` turns ``(method, url, authorization)`` into a response tuple, so the
transport (:mod:`flakekit_server.http`) stays a thin byte pump and the service can be
tested without sockets. Every error is a JSON body naming the problem, with a status
code that says whose fault it is: 400 bad input, 401 token, 404 unknown key or
generator, 405 method, 503 cannot issue right now (lease, segment refill, clock); an
unexpected failure is logged with its traceback and answered with a one-line 500.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus

import attrs

from flakekit.embed import pool_durability
from flakekit.plugin import (
    ENCODINGS,
    KEY_RE,
    KEY_RULE,
    ClockMovedBackwardsError,
    ClusterUnavailableError,
    FlakekitError,
    HasStats,
    IdBatch,
    IdFormat,
    InvalidIdError,
    KeyMovingError,
    LayoutError,
    LeaseError,
    NotOwnerError,
    NotStartedError,
    OrdersKeys,
    SegmentStats,
    SegmentUnavailableError,
    SnowflakeStats,
    TimeOverflowError,
    UnknownKeyError,
    iso_utc,
    suggest,
)
from flakekit_server.auth import Tokens
from flakekit_server.cluster import ClusterHttp, Hints, epoch_header
from flakekit_server.metrics import EVENTS, RequestStats, durability_metrics, os_stats, render

__all__ = ["HttpError", "IdService", "Pending", "ServerOptions"]

log = logging.getLogger("flakekit.server")

TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
HTML = b"text/html; charset=utf-8"
PROM = b"text/plain; version=0.0.4; charset=utf-8"
#: seconds of per-second IDs counts kept per generator (the monitor page's sparklines)
RATE_SAMPLES = 300
#: a snapshot of another process older than this counts as "not ready"
STALE_S = 5.0

Response = tuple[int, bytes, bytes, bytes, str]   # status, content type, body, headers, route
#: batches of at least this many IDs are made and encoded in a worker thread, so a 100k
#: batch does not hold up the single-ID requests behind it on the event loop
OFFLOAD_COUNT = 4096
#: threads making large batches per process (a batch holds one for milliseconds)
BATCH_THREADS = 2
#: an offloaded batch is drawn this many IDs at a time, a quarter of a snowflake tick: a
#: generator holds its lock while it draws (and waits out the ticks a batch needs), so
#: single IDs of the same generator get the lock, and IDs of the tick, between slices
BATCH_SLICE = 1024
#: the pause after each slice: long enough for a thread woken by the lock's release (the
#: event loop, for a single ID) to take it before the next slice does; a batch needs a
#: tick per 4096 IDs anyway, so four pauses per tick cost it nothing
SLICE_PAUSE_S = 50e-6
#: an offloaded batch is encoded on the event loop this many IDs at a time (about 0.1 ms
#: each), and the loop answers other requests between slices. Not in the worker thread:
#: encoding 100k IDs is one 18 ms C call that holds the GIL, and the loop would wait for
#: it (or for the 5 ms switch interval) on every request meanwhile
ENCODE_SLICE = 1024
#: the same for decimal IDs, written in bulk (:func:`decimal_join`, about 8x faster per ID)
DECIMAL_SLICE = 8192
#: consecutive IDs are written a block at a time: the IDs k*1000 .. k*1000+999 are
#: ``str(k).join(_pieces(sep))``, one C call per block instead of a ``str()`` per ID
_BLOCK = 1000
_PIECES: dict[bytes, list[bytes]] = {}


def _pieces(sep: bytes) -> list[bytes]:
    """``b""``, then three digits and ``sep`` for each of 000..999 (what goes between
    the copies of a block's ``str(k)``)."""
    pieces = _PIECES.get(sep)
    if pieces is None:
        pieces = _PIECES[sep] = [b"", *(b"%03d%s" % (i, sep) for i in range(_BLOCK))]
    return pieces


def decimal_join(ids: Any, sep: bytes) -> bytes:
    """``sep.join`` of ``ids`` written in decimal, as bytes; an :class:`IdBatch` or a
    ``range`` of step 1 in bulk (a batch is a few such ranges), anything else one by one."""
    if isinstance(ids, IdBatch):
        return sep.join([_range_bytes(r, sep) for r in ids.ranges if len(r)])
    if isinstance(ids, range):
        return _range_bytes(ids, sep)
    return sep.join([b"%d" % i for i in ids])


def _range_bytes(r: range, sep: bytes) -> bytes:
    start, stop = r.start, r.stop
    if r.step != 1 or start < 0 or stop - start < 8:
        return sep.join([b"%d" % i for i in r])
    if start < _BLOCK:   # "007" is no way to write 7: the numbers below 1000 one by one
        head = sep.join([b"%d" % i for i in range(start, min(stop, _BLOCK))])
        return head if stop <= _BLOCK else head + sep + _range_bytes(range(_BLOCK, stop), sep)
    pieces = _pieces(sep)
    parts = []
    k, i = divmod(start, _BLOCK)
    left = stop - start
    while left > 0:
        j = min(_BLOCK, i + left)
        if i == 0 and j == _BLOCK:
            parts.append((b"%d" % k).join(pieces))
        else:
            some = pieces[i:j + 1]   # entries i..j-1 behind what becomes b""
            some[0] = b""
            parts.append((b"%d" % k).join(some))
        left -= j - i
        k += 1
        i = 0
    return b"".join(parts)[:-len(sep)]


def _decimal(sep: bytes) -> Callable[[Any], bytes]:
    def decimal(ids: Any) -> bytes:
        return decimal_join(ids, sep)
    return decimal


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How the server runs (CLI options of ``flakekit serve``)."""

    host: str = "127.0.0.1"
    port: int = 8080
    #: the port asked for (``--port``); ``port`` becomes the bound one. 0 stays the
    #: identity's port: a random port is no stable identity for allocators.
    requested_port: int | None = None
    workers: int = 1
    max_count: int = 100_000
    tokens: Tokens = attrs.field(factory=Tokens)
    snowflake_default: str | None = None
    max_connections: int = 1024
    idle_timeout: float = 30.0
    header_timeout: float = 10.0
    max_url: int = 4096
    max_header_bytes: int = 16384
    max_body: int = 0
    grace: float = 10.0
    loop: str = "auto"
    offload_count: int = OFFLOAD_COUNT
    #: cluster mode: ``--node`` / ``--advertise`` (override the config's ``[cluster]``)
    node: str | None = None
    advertise: str | None = None
    #: cluster mode with ``--workers N``: the first private port of the node's processes
    #: (``--member-port``; default ``port + 1``; see flakekit.cluster.processes)
    member_port: int | None = None


class HttpError(Exception):
    """An error answer: status, machine-readable code, one line for people."""

    def __init__(self, status: int, code: str, message: str, headers: bytes = b"") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def not_found(code: str, what: str, name: str, known: Iterable[str], hint: str = "") -> HttpError:
    """404 naming what was asked for, what exists and the nearest match."""
    names = sorted(known)
    return HttpError(404, code, f"{what}; known: {', '.join(names) or '(none)'}"
                                f"{suggest(name, names)}{hint}")


def error_body(status: int, code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message, "status": status}).encode()


class Pending:
    """An answer made off the event loop (a large batch, a strict key, a forward): the
    transport awaits :meth:`result` and answers the connection's next request after it.
    With ``start`` (a forward), the transport calls ``start(reply)`` instead: ``reply``
    gets the answer, on the loop, with no task in between."""

    __slots__ = ("_make", "route", "start")

    def __init__(self, route: str, make: Callable[[], Awaitable[Response]],
                 start: Callable[[Callable[[Response], None]], None] | None = None) -> None:
        self.route = route
        self._make = make
        self.start = start

    async def result(self) -> Response:
        """The answer; never raises (a failure is an error answer, as :meth:`IdService.handle`)."""
        try:
            return await self._make()
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            err = from_exception(exc)
            return (err.status, JSON, error_body(err.status, err.code, err.message),
                    err.headers, self.route)


def from_exception(exc: BaseException) -> HttpError:
    """The HTTP answer for an exception raised while issuing or decoding."""
    retry = b"Retry-After: 1\r\n"
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, UnknownKeyError):
        return HttpError(404, "unknown_key", str(exc))
    if isinstance(exc, (KeyMovingError, ClusterUnavailableError)):
        code = "key_moving" if isinstance(exc, KeyMovingError) else "cluster_unavailable"
        return HttpError(503, code, str(exc), b"Retry-After: %d\r\n" % max(1, round(exc.retry_after)))
    if isinstance(exc, NotOwnerError):
        return HttpError(503, "not_owner", str(exc), retry)
    if isinstance(exc, SegmentUnavailableError):
        return HttpError(503, "segment_unavailable", str(exc), retry)
    if isinstance(exc, LeaseError):
        return HttpError(503, "lease_invalid", str(exc), retry)
    if isinstance(exc, ClockMovedBackwardsError):
        return HttpError(503, "clock_moved_backwards", str(exc), retry)
    if isinstance(exc, NotStartedError):
        return HttpError(503, "not_started", str(exc), retry)
    if isinstance(exc, TimeOverflowError):
        return HttpError(503, "time_overflow", str(exc))
    if isinstance(exc, (InvalidIdError, LayoutError)):
        return HttpError(400, "invalid_id", str(exc))
    if isinstance(exc, FlakekitError):
        return HttpError(503, "unavailable", str(exc), retry)
    log.error("internal error", exc_info=exc)
    return HttpError(500, "internal", "internal server error (the traceback is in the server log)")


def _params(query: bytes, allowed: Mapping[str, str], *, lenient: bool = False) -> dict[str, str]:
    """Parse a query string; unknown or repeated parameters are a 400 (``lenient``, as
    Leaf's endpoints: ignored, the first of a repeated one counts)."""
    out: dict[str, str] = {}
    if not query:
        return out
    try:
        text = query.decode("ascii")
    except UnicodeDecodeError:
        if lenient:
            text = query.decode("ascii", errors="replace")
        else:
            raise HttpError(400, "bad_request", "the query string must be ASCII (percent-encode the rest)") from None
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name, value = unquote_plus(name), unquote_plus(value)
        if lenient:
            if name in allowed:
                out.setdefault(name, value)
            continue
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "(none)"
            raise HttpError(400, "bad_request", f"unknown query parameter {name!r}; this endpoint takes: {known}")
        if name in out:
            raise HttpError(400, "bad_request", f"query parameter {name!r} is given twice")
        out[name] = value
    return out


def _key(raw: str, what: str) -> str:
    """A key or generator name of a URL, by the core's rule (``flakekit.values.keys``: the
    one ``flakekit segments create`` applies)."""
    if not KEY_RE.fullmatch(raw):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise HttpError(400, "bad_request", f"{what} {shown!r} is not valid: {KEY_RULE}")
    return raw


class IdService:
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
        self.generators: dict[str, Any] = {name: kit[name] for name in kit}
        # what each generator is, asked from it (its capabilities), never from its name
        self.info = {name: kit.describe(name) for name in kit}
        self.id_formats = {name: kit.id_format(name) for name in kit}
        self.strategy = {name: info.strategy for name, info in self.info.items()}
        #: IDs answered per generator, but those of the fast Leaf URLs: their histograms
        #: count them (:meth:`issued_count`)
        self.issued: dict[str, int] = dict.fromkeys(self.generators, 0)
        self._fast_counts: dict[str, list[list[int]]] = {}
        self._draw_pool: ThreadPoolExecutor | None = None
        self._heads: dict[tuple[str, int], bytes] = {}
        # cluster mode: strict keys are served only through the node's ClusterNode (never
        # from the kit's generator directly, never on the fast path)
        # (``Kit.cluster_node()``, started by the runner; None: not in cluster mode)
        self.cluster: ClusterHttp | None = ClusterHttp(cluster) if cluster is not None else None
        self.strict: dict[str, str] = {}     # strict generator name -> its segment key
        for name, gen in self.generators.items():
            key = self.info[name].key
            if isinstance(gen, OrdersKeys) and gen.order == "strict" or (
                    key is not None and self.cluster is not None and self.cluster.is_strict(key)):
                self.strict[name] = str(key or name)
        if self.cluster is not None:   # Leaf URLs of strict keys: forwards coalesce by generator
            self.cluster.set_generators(self.strict)
        self._batch_pool: ThreadPoolExecutor | None = None
        self._batch_locks = {name: threading.Lock() for name in self.generators}
        self.offloaded = 0   # batches made in a worker thread (a test checks it moves)
        # IDs issued at each of the last RATE_SAMPLES ticks (sample_rates, once a second, off
        # the request path): the monitor page's sparklines
        self.rate_samples: dict[str, deque[int]] = {
            name: deque(maxlen=RATE_SAMPLES + 1) for name in self.generators}
        # Leaf's segment key is the biz_tag; a generator's name works too
        self.segment_keys: dict[str, str] = {}
        for name, info in self.info.items():
            if info.key is not None:
                self.segment_keys.setdefault(info.key, name)
        for name, info in self.info.items():
            if info.key is not None:
                self.segment_keys.setdefault(name, name)
        # time-ordered generators with a layout: Leaf's snowflake URL and decoding
        self.snowflakes = [n for n, info in self.info.items() if info.layout is not None]
        # stores with keys = "all": every other biz_tag of the table, as Leaf serves them
        self.key_services: dict[str, Any] = self._key_services()
        self._reread = threading.Event()   # set on a miss: the tables are re-read soon
        self._reader: threading.Thread | None = None
        if self.key_services:
            self._reader = threading.Thread(target=self._reread_keys, daemon=True,
                                            name="flakekit-server-keys")
            self._reader.start()
        self._db_page: tuple[float, bytes] = (0.0, b"")
        self._db_thread: threading.Thread | None = None
        if options.snowflake_default is not None and options.snowflake_default not in self.snowflakes:
            raise UnknownKeyError(options.snowflake_default)  # checked earlier by the CLI
        # the hot path: exact Leaf URLs of open generators -> (generator, a function giving
        # the ID or None, the metrics route, the URL's histogram of 200 answers)
        self.fast: dict[bytes, tuple[str, Callable[[], int | None], str, list[int]]] = {}
        for key, name in self.segment_keys.items():
            self._add_fast(b"/api/segment/get/" + key.encode(), name)
        for name in self.snowflakes:
            self._add_fast(b"/api/snowflake/get/" + name.encode(), name)
        # cluster mode: the Leaf URLs of strict keys -> (the cluster key, the node's
        # try_next_id, the URL's histogram of 200 answers). The transport serves an owned
        # key whose IDs are in memory on the loop; anything else goes through handle()
        self.strict_fast: dict[bytes, tuple[str, Callable[[str], tuple[int, int] | None],
                                            list[int]]] = {}
        try_next = getattr(cluster, "try_next_id", None)
        for url_key, name in self.segment_keys.items():
            if (try_next is None or name not in self.strict
                    or self.options.tokens.protected(name) or not KEY_RE.fullmatch(url_key)):
                continue
            url = b"/api/segment/get/" + url_key.encode()
            hist = self.stats.ok_histogram(url, "leaf_segment")
            self._fast_counts.setdefault(name, []).append(hist)
            self.strict_fast[url] = (self.strict[name], try_next, hist)
        self.routes: dict[str, Callable[[bytes, bytes | None], Response | Pending]] = {
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
        self.leaf_routes: dict[str, Callable[[bytes, bytes | None], Response | Pending]] = {
            "/decodeSnowflakeId": self._leaf_decode,
            "/cache": self._cache,
            "/db": self._leaf_db,
        }
        # worker-id leases for library clients (allocator type "http"): POST, off the loop
        from flakekit_server.lease_api import LeaseApi

        self.leases = LeaseApi(kit, options.tokens, workers=options.workers)

    def _key_services(self) -> dict[str, Any]:
        """A started :class:`~flakekit.generators.segment_service.SegmentService` per segment generator
        whose store says ``keys = "all"`` (one per table), keyed by generator name."""
        from flakekit.embed import SegmentService, SqlStoreOptions

        out: dict[str, Any] = {}
        tables: set[str] = set()
        for name, gen in self.generators.items():
            if name in self.strict:   # its keys are the cluster's (fenced), never served here
                continue
            options = [p.settings for p in self.kit.parts_of(name, "segment store")
                       if isinstance(p.settings, SqlStoreOptions) and p.settings.keys == "all"]
            if not options:
                continue
            where = f"{options[0].backend}/{options[0].table}"
            if where in tables:
                continue
            tables.add(where)
            # a new key's first segment is fetched in the background, not on the event loop
            # (not attrs.evolve: it runs the duration converters again and reads their
            # nanoseconds as seconds -- a 1s wait_budget would become 31 years)
            settings = copy.copy(gen.settings)
            object.__setattr__(settings, "preload", False)
            out[name] = SegmentService(gen.store, settings, events=gen.events).start()
        return out

    def _reread_keys(self) -> None:
        """Re-read the key tables after a miss, at most once a second: the event loop never
        waits for the database to learn whether a key exists."""
        while not self.stopping:
            self._reread.wait(5.0)
            if self.stopping:
                return
            if not self._reread.is_set():
                continue
            self._reread.clear()
            for service in self.key_services.values():
                try:
                    service.refresh_keys()
                except FlakekitError as exc:
                    log.warning("re-reading segment keys failed: %s", exc)
            time.sleep(1.0)

    def close(self) -> None:
        """Stop the key services (their tails go back); the kit closes the rest."""
        self.stopping = True
        self._reread.set()
        if self._reader is not None:
            self._reader.join(5)
        for service in self.key_services.values():
            service.close()
        for pool in (self._batch_pool, self._draw_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self.cluster is not None:
            self.cluster.close()
        self.leases.close()

    def _add_fast(self, url: bytes, name: str) -> None:
        if name in self.strict or self.options.tokens.protected(name) or not KEY_RE.fullmatch(url.rsplit(b"/", 1)[1].decode()):
            return
        gen = self.generators[name]
        # a segment key's try_next_id never waits for the database: None, and the transport
        # asks draw_later() (a worker thread) instead of holding up the event loop
        draw = getattr(gen, "try_next_id", None) or gen.next_id
        route = "leaf_" + self.strategy[name]
        hist = self.stats.ok_histogram(url, route)
        self._fast_counts.setdefault(name, []).append(hist)
        self.fast[url] = (name, draw, route, hist)

    def issued_count(self, name: str) -> int:
        """IDs of generator ``name`` answered by this process."""
        return self.issued[name] + sum(h[-1] for h in self._fast_counts.get(name, ()))

    def _pool(self) -> ThreadPoolExecutor:
        if self._draw_pool is None:
            self._draw_pool = ThreadPoolExecutor(BATCH_THREADS,
                                                 thread_name_prefix="flakekit-server-draw")
        return self._draw_pool

    def draw_later(self, name: str, route: str, gen: Any = None) -> Pending:
        """One ID of ``gen`` (default: generator ``name``'s; counted under ``name``) drawn in
        a worker thread: its buffers were empty, and the wait for the database (up to its
        ``wait_budget``) must not hold up the event loop."""
        draw = (gen if gen is not None else self.generators[name]).next_id

        async def run() -> Response:
            value = await asyncio.get_running_loop().run_in_executor(self._pool(), draw)
            self.issued[name] += 1
            return 200, TEXT, b"%d" % value, b"", route

        return Pending(route, run)

    def _one(self, name: str, gen: Any, route: str) -> Response | Pending:
        """One ID as Leaf answers it: from memory on the loop, else :meth:`draw_later`."""
        try_next = getattr(gen, "try_next_id", None)
        value = try_next() if try_next is not None else gen.next_id()
        if value is None:
            return self.draw_later(name, route, gen)
        self.issued[name] += 1
        return 200, TEXT, b"%d" % value, b"", route

    # -- dispatch ------------------------------------------------------------------------------
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
                raise HttpError(400, "bad_request", "the path must be ASCII (percent-encoded UTF-8 keys are not valid keys)") from None
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
            err = from_exception(exc)
            return (err.status, JSON, error_body(err.status, err.code, err.message), err.headers, route)

    def _check_auth(self, name: str, authorization: bytes | None) -> None:
        if not self.options.tokens.allows(name, authorization):
            raise HttpError(401, "unauthorized",
                            f"generator {name!r} needs a token: send 'Authorization: Bearer TOKEN'",
                            b'WWW-Authenticate: Bearer realm="flakekit"\r\n')

    # -- Leaf-compatible endpoints ----------------------------------------------------------
    def _leaf_segment(self, rest: str, query: bytes, auth: bytes | None,
                      ctx: tuple[Any, ...]) -> Response | Pending:
        key = _key(rest, "key")
        name = self.segment_keys.get(key)
        if self.cluster is not None:
            strict = self._strict_key(key, name, auth)
            if strict is not None:
                return self._strict_leaf(strict, name, ctx, auth)
        if name is None:
            for owner, service in self.key_services.items():
                if not service.knows(key):   # as of the last read of the table
                    continue
                self._check_auth(owner, auth)
                return self._one(owner, service.get(key), "leaf_segment")
            if self.key_services:  # in no table served with keys = "all" (re-read soon)
                self._reread.set()
                raise UnknownKeyError(key, " (the tables are re-read within a second of a "
                                      "miss: retry after creating it)", self.kit.config.source)
            known = sorted(self.segment_keys)
            raise not_found("unknown_key", f"no segment generator serves key {key!r}", key, known,
                            " (a store with keys = \"all\" serves every key of its table)")
        self._check_auth(name, auth)
        return self._one(name, self.generators[name], "leaf_segment")

    def _leaf_snowflake(self, rest: str, query: bytes, auth: bytes | None,
                        ctx: tuple[Any, ...]) -> Response:
        key = _key(rest, "key")
        name = key if key in self.snowflakes else self.options.snowflake_default
        if name is None:
            raise not_found("unknown_key", f"no snowflake generator named {key!r}", key,
                            self.snowflakes, " (start the server with --snowflake-default NAME "
                            "to serve any key, as Leaf does)")
        self._check_auth(name, auth)
        value = self.generators[name].next_id()
        self.issued[name] += 1
        return 200, TEXT, b"%d" % value, b"", "leaf_snowflake"

    # -- JSON API ---------------------------------------------------------------------------------
    def _count(self, raw: str | None) -> int:
        if raw is None:
            return 1
        limit = self.options.max_count
        if not raw.isascii() or not raw.isdigit() or len(raw) > 12 or not 1 <= int(raw) <= limit:
            shown = raw if len(raw) <= 20 else raw[:20] + "..."
            raise HttpError(400, "bad_request", f"count must be an integer from 1 to {limit} "
                            f"(--max-count), got {shown!r}")
        return int(raw)

    def _next(self, rest: str, query: bytes, auth: bytes | None,
              ctx: tuple[Any, ...]) -> Response | Pending:
        name = _key(rest, "generator")
        params = _params(query, {"count": "", "format": ""})
        count = self._count(params.get("count"))
        fmt = params.get("format", "numbers")
        if fmt not in ("numbers", "strings", "ranges", "text", *ENCODINGS):
            raise HttpError(400, "bad_request", "format must be numbers, strings, ranges, text "
                            f"or an encoding ({', '.join(ENCODINGS)}), got {fmt[:20]!r}")
        gen = self.generators.get(name)
        if gen is None:
            known = sorted(self.generators)
            raise not_found("unknown_generator", f"unknown generator {name!r}", name, known)
        self._check_auth(name, auth)
        if name in self.strict:
            return self._strict_next(name, count, fmt, ctx, auth)
        if count >= self.options.offload_count:
            return self._offload(name, count, fmt)
        try_next = getattr(gen, "try_next_ids", None)
        if try_next is not None:   # a segment key: from memory, or in a thread (no wait here)
            batch = try_next(count)
            if batch is None:
                return self._offload(name, count, fmt)
        elif count == 1 and fmt != "ranges":
            self.issued[name] += 1
            return self._format(name, 1, fmt, (gen.next_id(),), None)
        else:
            batch = gen.next_ids(count)
        self.issued[name] += count
        return self._format(name, count, fmt, batch, batch.ranges)

    def _format(self, name: str, count: int, fmt: str, ids: Any, ranges: Any,
                headers: bytes = b"") -> Response:
        """The JSON API's answer: ``ids`` (or their ``ranges``) in format ``fmt``."""
        if fmt == "ranges":
            head = self._head(name, count)
            parts = ",".join(f'{{"start":{r.start},"stop":{r.stop},"step":{r.step}}}' for r in ranges)
            return 200, JSON, head + b'"ranges":[' + parts.encode() + b"]}", headers, "next"
        ctype, before, _, encode, after = self._body_form(name, count, fmt)
        return 200, ctype, b"".join((before, encode(ids), after)), headers, "next"

    async def _format_in_slices(self, name: str, count: int, fmt: str,
                                batch: IdBatch) -> Response:
        """:meth:`_format` of a large batch, ``ENCODE_SLICE`` IDs at a time with the event
        loop's other work in between; the same bytes."""
        if fmt == "ranges":
            return self._format(name, count, fmt, batch, batch.ranges)
        ctype, before, sep, encode, after = self._body_form(name, count, fmt)
        size = DECIMAL_SLICE if encode.__name__ == "decimal" else ENCODE_SLICE
        parts: list[bytes] = []
        for r in batch.ranges:
            for at in range(0, len(r), size):
                parts.append(encode(r[at:at + size]))
                await asyncio.sleep(0)
        return 200, ctype, b"".join((before, sep.join(parts), after)), b"", "next"

    def _head(self, name: str, count: int) -> bytes:
        head = self._heads.get((name, count))
        if head is None:
            head = b'{"generator":' + json.dumps(name).encode() + b',"count":%d,' % count
            if len(self._heads) < 4096:
                self._heads[name, count] = head
        return head

    def _body_form(self, name: str, count: int, fmt: str
                   ) -> tuple[bytes, bytes, bytes, Callable[[Any], bytes], bytes]:
        """How a list of IDs is written in format ``fmt`` (not ``ranges``): content type,
        what comes before the IDs, their separator, ``encode(ids)`` (the IDs joined by
        it; named ``decimal`` when written in bulk) and what comes after."""
        if fmt == "text":
            return TEXT, b"", b"\n", _decimal(b"\n"), b"\n"
        head = self._head(name, count)
        if fmt == "strings" or fmt in ENCODINGS:
            # strings: the generator's configured form (decimal by default); an encoding:
            # that encoding with the generator's prefix (flakekit.formats)
            own = self.id_formats[name]
            form = own if fmt == "strings" else IdFormat(fmt, own.prefix)
            if form == IdFormat():
                return JSON, head + b'"ids":["', b'","', _decimal(b'","'), b'"]}'
            return (JSON, head + b'"ids":["', b'","',
                    lambda ids: '","'.join(form.encode_many(ids)).encode(), b'"]}')
        return JSON, head + b'"ids":[', b",", _decimal(b","), b"]}"

    def _offload(self, name: str, count: int, fmt: str) -> Pending:
        """A large batch: drawn in a worker thread (a snowflake generator waits out the
        ticks it needs there), then encoded on the loop in slices, so single IDs keep
        flowing meanwhile."""
        gen = self.generators[name]

        def draw() -> IdBatch:
            ranges: list[range] = []
            left = count
            with self._batch_locks[name]:  # one large batch of a generator at a time
                while left:
                    part = gen.next_ids(min(left, BATCH_SLICE))
                    if not len(part):
                        raise FlakekitError(f"generator {name!r} returned no IDs for a batch")
                    ranges.extend(part.ranges)
                    left -= len(part)
                    time.sleep(SLICE_PAUSE_S)  # the loop, waiting for the GIL or the lock, goes first
            return IdBatch(ranges)

        async def run() -> Response:
            if self._batch_pool is None:
                self._batch_pool = ThreadPoolExecutor(
                    BATCH_THREADS, thread_name_prefix="flakekit-server-batch")
            batch = await asyncio.get_running_loop().run_in_executor(self._batch_pool, draw)
            self.issued[name] += count
            self.offloaded += 1
            return await self._format_in_slices(name, count, fmt, batch)

        return Pending("next", run)

    # -- strict keys (cluster mode) -----------------------------------------------------------
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

    def _strict_leaf(self, key: str, name: str | None, ctx: tuple[Any, ...],
                     auth: bytes | None) -> Response | Pending:
        assert self.cluster is not None
        cluster = self.cluster
        node = cluster.node
        # an owned key whose IDs are in memory: on the loop (every check made after the
        # draw, as in a thread); a moving key, a refill or a refusal: off it, below
        got = node.try_next_id(key) if hasattr(node, "try_next_id") else None
        if got is not None:
            if name is not None:
                self.issued[name] += 1
            return 200, TEXT, b"%d" % got[0], epoch_header(got[1]), "leaf_segment"
        elsewhere = cluster.owned_elsewhere(key)
        if elsewhere is not None:   # forwarded (or 421/503) on the loop, no thread
            return self._refusal(elsewhere, ctx, auth, "leaf_segment")
        served: list[bool] = []

        def work() -> Response:
            value, epoch = node.next_id(key)
            served.append(True)
            return 200, TEXT, b"%d" % value, epoch_header(epoch), "leaf_segment"

        async def run() -> Response:
            answer = await cluster.serve(work, ctx[0], ctx[1], auth, ctx[2], "leaf_segment",
                                         self._error("leaf_segment"))
            if served and name is not None:
                self.issued[name] += 1
            return answer

        return Pending("leaf_segment", run)

    def _strict_next(self, name: str, count: int, fmt: str, ctx: tuple[Any, ...],
                     auth: bytes | None) -> Response | Pending:
        assert self.cluster is not None
        cluster = self.cluster
        node = cluster.node
        key = self.strict[name]
        if count < self.options.offload_count and hasattr(node, "try_next_ids"):
            # on the loop, as _strict_leaf (a large batch is drawn and encoded in a thread)
            if count == 1 and fmt != "ranges":
                one = node.try_next_id(key)
                got: Any = None if one is None else ((one[0],), None, one[1])
            else:
                many = node.try_next_ids(key, count)
                got = None if many is None else (many[0], many[0].ranges, many[1])
            if got is not None:
                self.issued[name] += count
                return self._format(name, count, fmt, got[0], got[1], epoch_header(got[2]))
            elsewhere = cluster.owned_elsewhere(key)
            if elsewhere is not None:
                return self._refusal(elsewhere, ctx, auth, "next")
        served: list[bool] = []

        def work() -> Response:
            if count == 1 and fmt != "ranges":
                value, epoch = node.next_id(key)
                ids: Any = (value,)
                ranges: Any = None
            else:
                batch, epoch = node.next_ids(key, count)
                ids, ranges = batch, batch.ranges
            served.append(True)
            return self._format(name, count, fmt, ids, ranges, epoch_header(epoch))

        async def run() -> Response:
            answer = await cluster.serve(work, ctx[0], ctx[1], auth, ctx[2], "next",
                                         self._error("next"))
            if served:
                self.issued[name] += count
            return answer

        return Pending("next", run)

    def _layout_for(self, params: Mapping[str, str]) -> Any:
        from flakekit.embed import get_host, resolve_layout

        if "generator" in params and "layout" in params:
            raise HttpError(400, "bad_request", "give generator or layout, not both")
        if "generator" in params:
            name = _key(params["generator"], "generator")
            if name not in self.snowflakes:
                raise not_found("unknown_generator", f"no snowflake generator named {name!r}",
                                name, self.snowflakes)
            return self.generators[name].layout
        if "layout" in params:
            try:
                return resolve_layout(self.kit.config, get_host(), params["layout"], "layout")
            except FlakekitError as exc:
                raise HttpError(404, "unknown_layout", str(exc)) from None
        default = self.kit.config.default
        if default in self.snowflakes:
            return self.generators[default].layout
        if self.snowflakes:
            return self.generators[self.snowflakes[0]].layout
        return get_host().layout("snowflake")

    def _decode(self, rest: str, query: bytes, auth: bytes | None,
                ctx: tuple[Any, ...]) -> Response:
        params = _params(query, {"generator": "", "layout": ""})
        layout = self._layout_for(params)
        if not rest or len(rest) > 40:
            raise HttpError(400, "invalid_id", f"expected an ID (a non-negative integer), got {rest[:40]!r}")
        try:
            value = layout.check_id(rest)
            parts = layout.decompose(value)
            when = layout.timestamp(value)
        except (InvalidIdError, LayoutError, ValueError) as exc:
            raise HttpError(400, "invalid_id", str(exc)) from None
        body = {"id": value, "id_str": str(value), "layout": layout.name, **parts,
                "timestamp": iso_utc(when)}
        return 200, JSON, json.dumps(body).encode(), b"", "decode"

    def _leaf_decode(self, query: bytes, auth: bytes | None) -> Response:
        from flakekit.embed import get_host

        params = _params(query, {"snowflakeId": ""}, lenient=True)
        raw = params.get("snowflakeId")
        if raw is None:  # Spring answers a missing @RequestParam with a 400 too
            raise HttpError(400, "bad_request", "the query parameter snowflakeId is required "
                            "(/decodeSnowflakeId?snowflakeId=ID)")
        layout = get_host().layout("snowflake")  # Leaf's twepoch 1288834974657 and 5+5+12 bits
        try:
            value = layout.check_id(raw)
        except (InvalidIdError, LayoutError, ValueError) as exc:
            # Leaf: 200 with errorMsg when the ID does not parse
            body = json.dumps({"errorMsg": f"snowflakeId: {exc}"}).encode()
            return 200, JSON, body, b"", "decode"
        parts = layout.decompose(value)
        when = layout.timestamp(value)
        ms = layout.epoch_ms + parts["time"]
        fields = {"timestamp": f"{ms}({when.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]})",
                  "workerId": str(parts["worker"]), "sequenceId": str(parts["sequence"])}
        return 200, JSON, json.dumps(fields).encode(), b"", "decode"

    def _leaf_db(self, query: bytes, auth: bytes | None) -> Response | Pending:
        """Leaf's /db page: the rows of every segment table served. Read in a thread at
        most every 2 s (requests never turn into queries); the first page is waited for
        up to 1 s, off the event loop."""
        read_at, page = self._db_page
        reader = self._db_thread
        if time.monotonic() - read_at > 2.0 and (reader is None or not reader.is_alive()):
            reader = self._db_thread = threading.Thread(
                target=self._read_db, daemon=True, name="flakekit-server-db-page")
            reader.start()
        if page:
            return 200, HTML, page, b"Cache-Control: no-store\r\n", "monitor"

        async def first() -> Response:
            if reader is not None:
                await asyncio.get_running_loop().run_in_executor(self._pool(), reader.join, 1.0)
            page = self._db_page[1]
            if not page:
                raise HttpError(503, "unavailable", "the segment tables did not answer within "
                                "1 s; retry", b"Retry-After: 1\r\n")
            return 200, HTML, page, b"Cache-Control: no-store\r\n", "monitor"

        return Pending("monitor", first)

    def _read_db(self) -> None:
        try:
            self._db_page = (time.monotonic(), self._render_db())
        except Exception:  # the page says nothing new; logged
            log.exception("reading the segment tables for /db failed")

    def _render_db(self) -> bytes:
        from html import escape

        from flakekit.embed import SqlSegmentStore, segments_report, store_targets

        parts = ["<!doctype html><meta charset=utf-8><title>flakekit: segment tables</title>"
                 "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}"
                 "</style><h1>Segment tables</h1><p><a href=/>monitor page</a></p>"]
        if not any(info.key is not None for info in self.info.values()):
            parts.append("<p>no segment generator is served</p>")
            return "".join(parts).encode()
        for target in store_targets(self.kit.config):
            parts.append(f"<h2>{escape(target.table)} on backend {escape(target.backend)}</h2>")
            try:
                engine = self.kit.pool.engine(target.backend, f"backends.{target.backend}")
                report = segments_report(SqlSegmentStore(engine, target.table), target)
            except FlakekitError as exc:
                parts.append(f"<p>cannot read the table: {escape(str(exc))}</p>")
                continue
            parts.append("<table><tr><th>tag</th><th>max</th><th>step</th><th>update</th>"
                         "<th>generator</th></tr>")
            for row in report["keys"]:
                cells = (row["key"], row["max_id"], row["step"], row["update_time"] or "-",
                         row["generator"] or "-")
                parts.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
            parts.append("</table>")
        return "".join(parts).encode()

    _leaf_prefixes: tuple[tuple[str, Callable[..., Response | Pending], str], ...] = (
        ("/api/segment/get/", _leaf_segment, "leaf_segment"),
        ("/api/snowflake/get/", _leaf_snowflake, "leaf_snowflake"),
    )
    _prefixes: tuple[tuple[str, Callable[..., Response | Pending], str], ...] = (
        ("/api/v1/next/", _next, "next"),
        ("/api/v1/decode/", _decode, "decode"),
    )

    # -- operations --------------------------------------------------------------------------
    def _health(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        body = {"status": "stopping" if self.stopping else "ok", "process": self.process, "pid": os.getpid()}
        return 200, JSON, json.dumps(body).encode(), b"", "health"

    def _ready(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        snaps = self.snapshots()
        sup = self.supervision(snaps)
        problems = [p for s in snaps for p in s["problems"]] + sup["problems"]
        body = {"ready": not problems, "processes": len(snaps), "expected": sup["expected"],
                "running": sup["running"], "problems": problems}
        status = 200 if not problems else 503
        return status, JSON, json.dumps(body).encode(), b"", "ready"

    def _metrics(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        snaps = self.snapshots()
        text = render(snaps, self.supervision(snaps)) + durability_metrics(
            pool_durability(self.kit.pool))
        return 200, PROM, text.encode(), b"", "metrics"

    def _status(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        snaps = self.snapshots()
        sup = self.supervision(snaps)
        problems = [p for s in snaps for p in s["problems"]] + sup["problems"]
        from flakekit_server import __version__

        body = {
            "server": {
                "version": __version__, "stack": self.stack, "host": self.options.host,
                "port": self.options.port, "processes": self.options.workers,
                "max_count": self.options.max_count, "config": self.kit.config.source,
                "time": time.time(),
            },
            "ready": not problems, "problems": problems, "processes": snaps,
            "supervision": sup, "databases": pool_durability(self.kit.pool),
        }
        return 200, JSON, json.dumps(body, default=str).encode(), b"", "status"

    def _list(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        out = []
        for name in self.generators:
            info: dict[str, Any] = {"name": name, "strategy": self.strategy[name],
                                    "token_required": self.options.tokens.protected(name)}
            what = self.info[name]
            if what.layout is not None:
                info["layout"] = what.layout.name
                info["leaf_url"] = f"/api/snowflake/get/{name}"
            elif what.key is not None:
                info["key"] = what.key
                info["leaf_url"] = f"/api/segment/get/{info['key']}"
            info["url"] = f"/api/v1/next/{name}"
            out.append(info)
        return 200, JSON, json.dumps({"generators": out, "max_count": self.options.max_count}).encode(), b"", "generators"

    def _cluster(self, query: bytes, auth: bytes | None) -> Response | Pending:
        """The view a flakekit client routes by: epoch, hash, members, owners of the
        strict keys (``ClusterNode.status()`` without the claims' internals)."""
        _params(query, {})
        cluster = self.cluster
        if cluster is None:
            raise HttpError(404, "no_cluster", "this server is not in cluster mode (the config "
                            "has no [cluster] section; docs/cluster.md)")

        async def run() -> Response:   # status() reads the membership store: off the loop
            status = await asyncio.get_running_loop().run_in_executor(
                cluster.pool(), cluster.public_status)
            body = json.dumps(status, default=str).encode()
            return 200, JSON, body, b"Cache-Control: no-store\r\n", "cluster"

        return Pending("cluster", run)

    def _openapi(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        from flakekit_server import __version__
        from flakekit_server.openapi import document_bytes

        formats = ("numbers", "strings", "ranges", "text", *ENCODINGS)
        return (200, JSON, document_bytes(__version__, self.options.max_count, formats), b"",
                "openapi")

    def _monitor(self, query: bytes, auth: bytes | None) -> Response:
        from flakekit_server.monitor import PAGE

        return 200, HTML, PAGE, b"Cache-Control: no-store\r\n", "monitor"

    def _cache(self, query: bytes, auth: bytes | None) -> Response:
        return 302, TEXT, b"see /\n", b"Location: /\r\n", "monitor"

    # -- status of this process and its siblings ----------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """This process's numbers (JSON-able), for /metrics, /ready and the monitor page."""
        gens = []
        problems: list[str] = []
        where = f"process {self.process}: " if self.options.workers > 1 else ""
        for name, gen in self.generators.items():
            try:
                stats = gen.stats() if isinstance(gen, HasStats) else None
                service = self.key_services.get(name)
                others = list(service.stats().values()) if service is not None else []
                info = describe(name, self.info[name], stats, others)
            except Exception as exc:  # noqa: BLE001 - a broken stats() is a problem, not a crash
                info = {"name": name, "strategy": self.strategy[name],
                        "kind": _kind(self.info[name]), "ready": False,
                        "problem": f"stats() failed: {exc}"}
            info["issued"] = self.issued_count(name)
            samples = list(self.rate_samples[name])
            info["rate_per_s"] = [after - before for before, after in pairwise(samples)]
            gens.append(info)
            if not info["ready"]:
                problems.append(f"{where}generator {name!r}: {info['problem']}")
        if self.stopping:
            problems.append(f"{where}shutting down")
        cluster = None
        if self.cluster is not None:
            cluster = self.cluster.snapshot()
            lease = (cluster["status"].get("lease") or {}).get("remaining_s")
            if isinstance(lease, (int, float)) and lease <= 0:
                problems.append(f"{where}cluster membership lapsed {-lease:.1f} s ago: no strict "
                                "key is served (the membership store is unreachable?)")
        return {
            "process": self.process, "pid": os.getpid(), "started": self.started,
            "time": time.time(), "ready": not problems, "problems": problems,
            "generators": gens, "http": self.stats.snapshot(), "events": EVENTS.snapshot(),
            "os": os_stats(), "offloaded_batches": self.offloaded, "cluster": cluster,
        }

    def sample_rates(self) -> None:
        """Record the issued counters (called once a second by the process's tick)."""
        for name, ring in self.rate_samples.items():
            ring.append(self.issued_count(name))

    def snapshots(self) -> list[dict[str, Any]]:
        """This process's live snapshot and the latest of every sibling process."""
        own = self.snapshot()
        out = [own]
        if self.run_dir is None:
            return out
        now = time.time()
        for file in sorted(self.run_dir.glob("process-*.json")):
            try:
                snap = json.loads(file.read_text())
            except (OSError, ValueError):
                continue
            if snap.get("process") == self.process:
                continue
            age = now - float(snap.get("time", 0))
            if age > STALE_S:
                snap["stale"] = True
                snap["ready"] = False
                snap["problems"] = [*snap.get("problems", []),
                                    f"process {snap.get('process')}: no report for {age:.0f} s"]
            out.append(snap)
        out.sort(key=lambda s: s["process"])
        return out

    def supervision(self, snaps: list[dict[str, Any]]) -> dict[str, Any]:
        """Expected vs running processes and restarts (the supervisor's ``supervisor.json``);
        a process that is expected but not serving is a problem (so /ready is 503)."""
        expected = self.options.workers
        sup: dict[str, Any] = {}
        if self.run_dir is not None:
            try:
                sup = json.loads((self.run_dir / "supervisor.json").read_text())
            except (OSError, ValueError):
                sup = {}
        known = {p.get("process"): p for p in sup.get("processes", []) if isinstance(p, dict)}
        reporting = {s["process"]: s for s in snaps}
        processes, problems = [], []
        for i in range(expected):
            info = known.get(i, {})
            snap = reporting.get(i)
            running = snap is not None and not snap.get("stale")
            restarts = int(info.get("restarts") or 0)
            processes.append({"process": i, "pid": snap["pid"] if snap else info.get("pid"),
                              "running": running, "restarts": restarts,
                              "last_error": info.get("last_error")})
            if snap is None:  # a stale one already says "no report for N s"
                why = f"; last error: {info['last_error']}" if info.get("last_error") else ""
                problems.append(f"process {i} is not running (restarted {restarts} times{why})")
        return {"expected": expected, "running": sum(p["running"] for p in processes),
                "restarts": sum(p["restarts"] for p in processes), "processes": processes,
                "problems": problems}

    def write_snapshot(self) -> None:
        """Publish this process's snapshot for its siblings (atomic rename)."""
        if self.run_dir is None:
            return
        data = json.dumps(self.snapshot(), default=str)
        tmp = self.run_dir / f".process-{self.process}.tmp"
        tmp.write_text(data)
        os.replace(tmp, self.run_dir / f"process-{self.process}.json")


def _kind(what: Any) -> str:
    """``"time-ordered"`` (a layout, a worker lease), ``"segment"`` (ranges of a key) or
    ``"other"`` (a plugin's strategy with neither)."""
    return "time-ordered" if what.layout is not None else (
        "segment" if what.key is not None else "other")


def describe(name: str, what: Any, stats: Any,
             others: Iterable[SegmentStats] = ()) -> dict[str, Any]:
    """A generator's stats, normalised, with readiness and the reason when not ready;
    ``what`` is its :class:`GeneratorInfo` (``Kit.describe``), ``others`` the stats of the
    other keys its table serves (a segment generator's :class:`SegmentService`)."""
    kind = _kind(what)
    info: dict[str, Any] = {"name": name, "strategy": what.strategy, "kind": kind}
    problem: str | None = None
    if kind == "time-ordered" and isinstance(stats, SnowflakeStats):
        for field in ("layout", "clock", "ids_drawn", "worker_id", "epoch", "lease_remaining_s",
                      "renewals", "renew_failures", "lost", "acquires", "acquire_ns_total"):
            info[field] = getattr(stats, field)
        info["acquire_buckets"] = list(stats.acquire_buckets)
        remaining = stats.lease_remaining_s
        if stats.lost:
            problem = f"lease lost: {stats.lost}"
        elif stats.worker_id is None:
            problem = "no worker lease"
        elif remaining is not None and remaining <= 0:
            problem = f"lease on worker {stats.worker_id} expired {-remaining:.1f} s ago (renewals failing)"
    elif kind == "segment" and isinstance(stats, SegmentStats):
        by_key = {stats.key: stats, **{o.key: o for o in others}}  # its own key first
        keys = []
        empty = []
        for key in by_key.values():
            buffers = [
                {f: getattr(b, f) for f in ("slot", "ready", "start", "position", "end", "step",
                                            "idle")}
                for b in key.buffers
            ]
            entry: dict[str, Any] = {f: getattr(key, f) for f in (
                "key", "step", "min_step", "max_id", "fetches", "fetch_failures", "fetch_ms_last",
                "fetch_ms_max", "fetch_ms_mean", "waits", "unavailable", "last_error")}
            entry["buffers"] = buffers
            keys.append(entry)
            if not any(b["ready"] for b in buffers):
                empty.append(str(entry["key"]))
        info["keys"] = keys
        if stats.closed:
            problem = "closed"
        elif empty:
            problem = f"no buffer ready for key {', '.join(map(repr, empty))}"
    # else: a plugin's strategy or record: nothing to judge
    info["ready"] = problem is None
    info["problem"] = problem
    return info
