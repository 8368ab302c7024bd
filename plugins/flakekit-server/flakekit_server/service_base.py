"""What the route groups of :class:`~flakekit_server.app.IdService` share: the state
``IdService.__init__`` sets (declared here, for the reader and the type checker) and the
few helpers every group calls (the token check, the issued counters, the draw pool).

The groups, one concept a module: :mod:`~flakekit_server.leaf_routes` (Leaf's URLs),
:mod:`~flakekit_server.api_routes` (the JSON API), :mod:`~flakekit_server.strict_routes`
(cluster mode's strict keys), :mod:`~flakekit_server.offload` (answers made in a worker
thread), :mod:`~flakekit_server.ops_routes` (health, metrics, status pages) and
:mod:`~flakekit_server.reports` (this process's numbers and its siblings').
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flakekit.plugin import GeneratorInfo, NonBlocking, NonBlockingKeys
from flakekit_server.answers import HttpError
from flakekit_server.cluster import ClusterHttp
from flakekit_server.encoding import Bodies
from flakekit_server.key_tables import KeyTables
from flakekit_server.lazy_pool import LazyPool
from flakekit_server.metrics import RequestStats
from flakekit_server.options import ServerOptions

__all__ = ["ServiceBase"]


class ServiceBase:
    """The state of one :class:`~flakekit_server.app.IdService` (set by its ``__init__``)."""

    kit: Any
    options: ServerOptions
    process: int
    run_dir: Path | None
    stack: str
    started: float
    stopping: bool
    stats: RequestStats
    generators: dict[str, Any]
    #: what each generator is, asked from it (its capabilities), never from its name
    info: dict[str, GeneratorInfo]
    strategy: dict[str, str]
    #: generators that can answer from memory (segment keys): asked on the loop, and a
    #: refill is waited for in a thread (checked once, when the routes are built)
    memory: dict[str, NonBlocking]
    bodies: Bodies
    #: IDs answered per generator, but those of the fast Leaf URLs: their histograms
    #: count them (:meth:`issued_count`)
    issued: dict[str, int]
    _fast_counts: dict[str, list[list[int]]]
    rate_samples: dict[str, deque[int]]
    #: cluster mode: the node's HTTP side (None: not in cluster mode), and its node when
    #: that can answer from memory on the loop
    cluster: ClusterHttp | None
    cluster_memory: NonBlockingKeys | None
    strict: dict[str, str]     # strict generator name -> its segment key
    #: forwarded batch URL -> (strict generator, its key, count) (StrictRoutes.forwarded_batch)
    _batch_urls: dict[bytes, tuple[str, str, int]]
    segment_keys: dict[str, str]
    snowflakes: list[str]
    tables: KeyTables
    key_services: dict[str, Any]
    offloaded: int
    _batch_locks: dict[str, threading.Lock]
    _batch_pool: LazyPool
    _draw_pool: LazyPool
    _db_page: tuple[float, bytes]
    _db_thread: threading.Thread | None

    def _check_auth(self, name: str, authorization: bytes | None) -> None:
        if not self.options.tokens.allows(name, authorization):
            raise HttpError(401, "unauthorized",
                            f"generator {name!r} needs a token: send 'Authorization: Bearer "
                            "TOKEN'", b'WWW-Authenticate: Bearer realm="flakekit"\r\n')

    def issued_count(self, name: str) -> int:
        """IDs of generator ``name`` answered by this process."""
        return self.issued[name] + sum(h[-1] for h in self._fast_counts.get(name, ()))

    def _pool(self) -> ThreadPoolExecutor:
        return self._draw_pool.get()
