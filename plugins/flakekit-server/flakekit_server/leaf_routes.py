"""Leaf's own endpoints, as Leaf answers them: ``/api/segment/get/{key}``,
``/api/snowflake/get/{key}``, ``/decodeSnowflakeId`` and the ``/db`` page (the exact URLs
of open generators are answered by the transport itself: ``IdService.fast``)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

from flakekit.plugin import (
    FlakekitError,
    InvalidIdError,
    LayoutError,
    NonBlocking,
    UnknownKeyError,
)
from flakekit_server.answers import (
    HTML,
    JSON,
    NO_STORE,
    TEXT,
    HttpError,
    Pending,
    Response,
    key_name,
    not_found,
    query_params,
)
from flakekit_server.offload import Offload
from flakekit_server.strict_routes import StrictRoutes

__all__ = ["LeafRoutes"]

log = logging.getLogger("flakekit.server")


class LeafRoutes(StrictRoutes, Offload):
    """Leaf's endpoints of an :class:`~flakekit_server.app.IdService`."""

    def _one(self, name: str, gen: Any, memory: NonBlocking | None,
             route: str) -> Response | Pending:
        """One ID as Leaf answers it: from ``memory`` on the loop (None: it waits for no
        database), else :meth:`draw_later`."""
        value = memory.try_next_id() if memory is not None else gen.next_id()
        if value is None:
            return self.draw_later(name, route, gen)
        self.issued[name] += 1
        return 200, TEXT, b"%d" % value, b"", route

    def _leaf_segment(self, rest: str, query: bytes, auth: bytes | None,
                      ctx: tuple[Any, ...]) -> Response | Pending:
        key = key_name(rest, "key")
        name = self.segment_keys.get(key)
        if self.cluster is not None:
            strict = self._strict_key(key, name, auth)
            if strict is not None:
                return self._strict_leaf(strict, name, ctx, auth)
        if name is not None:
            self._check_auth(name, auth)
            return self._one(name, self.generators[name], self.memory.get(name),
                             "leaf_segment")
        for owner, service in self.key_services.items():
            if not service.knows(key):   # as of the last read of the table
                continue
            self._check_auth(owner, auth)
            gen = service.get(key)
            return self._one(owner, gen, gen, "leaf_segment")
        if self.key_services:  # in no table served with keys = "all" (re-read soon)
            self.tables.missed()
            raise UnknownKeyError(key, " (the tables are re-read within a second of a "
                                  "miss: retry after creating it)", self.kit.config.source)
        known = sorted(self.segment_keys)
        raise not_found("unknown_key", f"no segment generator serves key {key!r}", key, known,
                        " (a store with keys = \"all\" serves every key of its table)")

    def _leaf_snowflake(self, rest: str, query: bytes, auth: bytes | None,
                        ctx: tuple[Any, ...]) -> Response:
        key = key_name(rest, "key")
        name = key if key in self.snowflakes else self.options.snowflake_default
        if name is None:
            raise not_found("unknown_key", f"no snowflake generator named {key!r}", key,
                            self.snowflakes, " (start the server with --snowflake-default NAME "
                            "to serve any key, as Leaf does)")
        self._check_auth(name, auth)
        value = self.generators[name].next_id()
        self.issued[name] += 1
        return 200, TEXT, b"%d" % value, b"", "leaf_snowflake"

    def _leaf_decode(self, query: bytes, auth: bytes | None) -> Response:
        from flakekit.embed import get_host

        params = query_params(query, {"snowflakeId": ""}, lenient=True)
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
            return 200, HTML, page, NO_STORE, "monitor"

        async def first() -> Response:
            if reader is not None:
                await asyncio.get_running_loop().run_in_executor(self._pool(), reader.join, 1.0)
            page = self._db_page[1]
            if not page:
                raise HttpError(503, "unavailable", "the segment tables did not answer within "
                                "1 s; retry", b"Retry-After: 1\r\n")
            return 200, HTML, page, NO_STORE, "monitor"

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
                parts.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells)
                             + "</tr>")
            parts.append("</table>")
        return "".join(parts).encode()
