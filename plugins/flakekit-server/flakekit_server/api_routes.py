"""The JSON API's ID endpoints: ``/api/v1/next/{generator}`` (one ID or a batch, in any
format) and ``/api/v1/decode/{id}``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flakekit.plugin import ENCODINGS, FlakekitError, InvalidIdError, LayoutError, iso_utc
from flakekit_server.answers import (
    JSON,
    HttpError,
    Pending,
    Response,
    key_name,
    not_found,
    query_params,
)
from flakekit_server.encoding import FORMATS
from flakekit_server.offload import Offload
from flakekit_server.strict_routes import StrictRoutes

__all__ = ["ApiRoutes"]


class ApiRoutes(StrictRoutes, Offload):
    """The ID endpoints of an :class:`~flakekit_server.app.IdService`'s JSON API."""

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
        name = key_name(rest, "generator")
        params = query_params(query, {"count": "", "format": ""})
        count = self._count(params.get("count"))
        fmt = params.get("format", "numbers")
        if fmt not in FORMATS:
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
        memory = self.memory.get(name)
        if memory is not None:   # a segment key: from memory, or in a thread (no wait here)
            batch = memory.try_next_ids(count)
            if batch is None:
                return self._offload(name, count, fmt)
        elif count == 1 and fmt != "ranges":
            self.issued[name] += 1
            return self.bodies.format(name, 1, fmt, (gen.next_id(),), None)
        else:
            batch = gen.next_ids(count)
        self.issued[name] += count
        return self.bodies.format(name, count, fmt, batch, batch.ranges)

    def _layout_for(self, params: Mapping[str, str]) -> Any:
        from flakekit.embed import get_host, resolve_layout

        if "generator" in params and "layout" in params:
            raise HttpError(400, "bad_request", "give generator or layout, not both")
        if "generator" in params:
            name = key_name(params["generator"], "generator")
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
        params = query_params(query, {"generator": "", "layout": ""})
        layout = self._layout_for(params)
        if not rest or len(rest) > 40:
            raise HttpError(400, "invalid_id",
                            f"expected an ID (a non-negative integer), got {rest[:40]!r}")
        try:
            value = layout.check_id(rest)
            parts = layout.decompose(value)
            when = layout.timestamp(value)
        except (InvalidIdError, LayoutError, ValueError) as exc:
            raise HttpError(400, "invalid_id", str(exc)) from None
        body = {"id": value, "id_str": str(value), "layout": layout.name, **parts,
                "timestamp": iso_utc(when)}
        return 200, JSON, json.dumps(body).encode(), b"", "decode"
