"""The operations endpoints: health and readiness, Prometheus metrics, the status and
generator lists, the cluster view, the OpenAPI document and the monitor page."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from flakekit.embed import pool_durability
from flakekit_server.answers import (
    HTML,
    JSON,
    NO_STORE,
    PROM,
    TEXT,
    HttpError,
    Pending,
    Response,
    query_params,
)
from flakekit_server.encoding import FORMATS
from flakekit_server.metrics import durability_metrics, render
from flakekit_server.reports import Reports

__all__ = ["OpsRoutes"]


def _json(status: int, body: Any, route: str, headers: bytes = b"") -> Response:
    return status, JSON, json.dumps(body, default=str).encode(), headers, route


class OpsRoutes(Reports):
    """The operations endpoints of an :class:`~flakekit_server.app.IdService` (each takes
    no query parameter)."""

    def _health(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
        return _json(200, {"status": "stopping" if self.stopping else "ok",
                           "process": self.process, "pid": os.getpid()}, "health")

    def _problems(self) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
        """Every process's snapshot, the supervision and the problems of both."""
        snaps = self.snapshots()
        sup = self.supervision(snaps)
        return snaps, sup, [p for s in snaps for p in s["problems"]] + sup["problems"]

    def _ready(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
        snaps, sup, problems = self._problems()
        body = {"ready": not problems, "processes": len(snaps), "expected": sup["expected"],
                "running": sup["running"], "problems": problems}
        return _json(200 if not problems else 503, body, "ready")

    def _metrics(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
        snaps = self.snapshots()
        text = render(snaps, self.supervision(snaps)) + durability_metrics(
            pool_durability(self.kit.pool))
        return 200, PROM, text.encode(), b"", "metrics"

    def _status(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
        snaps, sup, problems = self._problems()
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
        return _json(200, body, "status")

    def _list(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
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
        return _json(200, {"generators": out, "max_count": self.options.max_count},
                     "generators")

    def _cluster(self, query: bytes, auth: bytes | None) -> Response | Pending:
        """The view a flakekit client routes by: epoch, hash, members, owners of the
        strict keys (``ClusterNode.status()`` without the claims' internals)."""
        query_params(query, {})
        cluster = self.cluster
        if cluster is None:
            raise HttpError(404, "no_cluster", "this server is not in cluster mode (the config "
                            "has no [cluster] section; docs/cluster.md)")

        async def run() -> Response:   # status() reads the membership store: off the loop
            status = await asyncio.get_running_loop().run_in_executor(
                cluster.pool(), cluster.public_status)
            return _json(200, status, "cluster", NO_STORE)

        return Pending("cluster", run)

    def _openapi(self, query: bytes, auth: bytes | None) -> Response:
        query_params(query, {})
        from flakekit_server import __version__
        from flakekit_server.openapi import document_bytes

        return (200, JSON, document_bytes(__version__, self.options.max_count, FORMATS), b"",
                "openapi")

    def _monitor(self, query: bytes, auth: bytes | None) -> Response:
        from flakekit_server.monitor import PAGE

        return 200, HTML, PAGE, NO_STORE, "monitor"

    def _cache(self, query: bytes, auth: bytes | None) -> Response:
        return 302, TEXT, b"see /\n", b"Location: /\r\n", "monitor"
