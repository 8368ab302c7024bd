"""The OpenAPI 3.1 document of the server (``GET /openapi.json``).

Written next to the route tables of :class:`~flakekit_server.app.IdService`:
:func:`served_paths` reads those tables, and a test checks that they and ``PATHS`` name the
same endpoints (and schemathesis checks the answers against the document).
"""

from __future__ import annotations

import json
from typing import Any

from flakekit.plugin import KEY_RE

__all__ = ["document", "paths", "served_paths"]

_KEY = f"^{KEY_RE.pattern}$"  # the core's segment-key rule
_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: Any, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _text(description: str, media: str = "text/plain") -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": {"type": "string"}}}}


_RETRY = {"Retry-After": {"description": "Seconds to wait before retrying",
                          "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
#: the owner epoch every ID answer of a strict key carries (cluster mode)
_EPOCH = {"X-Flakekit-Owner-Epoch": {
    "description": "Cluster mode, strict keys: the epoch of the owner's claim on the key "
                   "(a client rejects an answer with a lower epoch than it has seen)",
    "required": False, "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
#: the header a flakekit client that routes by the view sends (cluster mode)
_VIEW_EPOCH = {"name": "X-Flakekit-View-Epoch", "in": "header", "required": False,
               "description": "Cluster mode: the view epoch the client routes by; a node that "
                              "does not own the strict key answers 421 instead of forwarding",
               "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}}
_MISDIRECTED = {"type": "object", "required": ["error", "message", "status", "owner",
                                               "advertise", "epoch"],
                "properties": {"error": {"const": "misdirected"}, "message": {"type": "string"},
                               "status": {"const": 421}, "owner": {"type": "string"},
                               "advertise": {"type": "string"}, "epoch": {"type": "integer"}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {400: "Bad request (the message names the field)", 401: "A token is required",
           404: "Unknown generator, key or layout", 414: "The URL is too long (4096 bytes)",
           503: "Not available now (retry after Retry-After seconds)"}
    out = {str(c): _json(_ERROR, why[c]) for c in codes}
    if "503" in out:
        out["503"]["headers"] = _RETRY
    return out


def _misdirected() -> dict[str, Any]:
    return {"421": _json(_MISDIRECTED, "Cluster mode: this node does not own the strict key "
                                       "(the request carried X-Flakekit-View-Epoch): ask "
                                       "the owner at advertise")}


def _path_param(name: str, description: str, pattern: str | None = _KEY) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if pattern:
        schema["pattern"] = pattern
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": schema}


def _any_method(operation: dict[str, Any]) -> dict[str, Any]:
    """A Leaf endpoint: documented as GET, though it answers every method as Leaf's Spring
    mappings do (``x-any-method``)."""
    return {"get": {**operation, "x-any-method": True}}


def _leaf_id(what: str, cluster: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "The ID",
                          "content": {"text/plain": {"schema": {"type": "string",
                                                                "pattern": "^[0-9]+$"}}}}
    params = [_path_param("key", "Key or generator name")]
    if cluster:   # a strict key: forwarded to its owner, or 421 to a client that routes
        ok["headers"] = _EPOCH
        params.append(_VIEW_EPOCH)
    return _any_method({
            "summary": f"One ID from {what}, as Leaf answers it (the decimal number as text)",
            "tags": ["leaf"], "parameters": params,
            "responses": {"200": ok, **_errors(400, 401, 404, 414, 503),
                          **(_misdirected() if cluster else {})},
    })


_HEALTH = {"type": "object", "required": ["status", "process", "pid"],
           "properties": {"status": {"enum": ["ok", "stopping"]}, "process": {"type": "integer"},
                          "pid": {"type": "integer"}}}
_READY = {"type": "object", "required": ["ready", "problems"],
          "properties": {"ready": {"type": "boolean"}, "processes": {"type": "integer"},
                         "expected": {"type": "integer"}, "running": {"type": "integer"},
                         "problems": {"type": "array", "items": {"type": "string"}}}}


_MEMBER = {"type": "object", "required": ["node", "advertise", "weight", "state"],
           "properties": {"node": {"type": "string"}, "advertise": {"type": "string"},
                          "weight": {"type": "integer"}, "state": {"type": "string"}}}
_CLUSTER = {"type": "object", "required": ["cluster", "node", "epoch", "hash", "members", "owners"],
            "properties": {"cluster": {"type": "string"}, "node": {"type": "string"},
                           "epoch": {"type": "integer"}, "hash": {"type": "string"},
                           "members": {"type": "array", "items": _MEMBER},
                           "owners": {"type": "object",
                                      "additionalProperties": {"type": "string"}},
                           "lease": {"type": ["object", "null"]}}}


def _ops(summary: str, ok: dict[str, Any], tag: str = "operations",
         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A GET (and its HEAD: same status and headers, no body) of an operations page."""
    responses = {"200": ok, **(extra or {})}
    return {"get": {"summary": summary, "tags": [tag], "responses": responses},
            "head": {"summary": summary + " (headers only)", "tags": [tag],
                     "responses": {code: {"description": r["description"]}
                                   for code, r in responses.items()}}}


def paths(max_count: int, formats: tuple[str, ...]) -> dict[str, Any]:
    """Every endpoint, by OpenAPI path template (``max_count``: ``--max-count``)."""
    return {
        "/api/segment/get/{key}": _leaf_id("a segment key (Leaf's biz_tag)", cluster=True),
        "/api/snowflake/get/{key}": _leaf_id("a snowflake generator"),
        "/api/v1/next/{generator}": {
            "get": {
                "summary": "count IDs from a generator",
                "tags": ["json"],
                "parameters": [
                    _path_param("generator", "Generator name"),
                    {"name": "count", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": max_count,
                                "default": 1},
                     "description": "How many IDs (at most --max-count)"},
                    {"name": "format", "in": "query", "required": False,
                     "schema": {"enum": list(formats), "default": "numbers"},
                     "description": "numbers, strings, ranges, text, or an encoding "
                                    "(hex, base62, base32)"},
                    _VIEW_EPOCH,
                ],
                "responses": {
                    "200": {"description": "The IDs", "headers": _EPOCH,
                            "content": {"application/json": {"schema": {
                                "type": "object", "required": ["generator", "count"],
                                "properties": {"generator": {"type": "string"},
                                               "count": {"type": "integer"},
                                               "ids": {"type": "array"},
                                               "ranges": {"type": "array"}}}},
                                "text/plain": {"schema": {"type": "string"}}}},
                    **_errors(400, 401, 404, 414, 503), **_misdirected(),
                },
            },
        },
        "/api/v1/decode/{id}": {
            "get": {
                "summary": "The parts of an ID under a generator's or a named layout",
                "tags": ["json"],
                "parameters": [
                    _path_param("id", "The ID (decimal)", None),
                    {"name": "generator", "in": "query", "required": False,
                     "schema": {"type": "string", "pattern": _KEY},
                     "description": "A snowflake generator's layout (not with layout)"},
                    {"name": "layout", "in": "query", "required": False,
                     "schema": {"type": "string", "minLength": 1},
                     "description": "A layout name (not with generator)"},
                ],
                "responses": {
                    "200": _json({"type": "object", "required": ["id", "layout", "timestamp"],
                                  "properties": {"id": {"type": "integer"},
                                                 "id_str": {"type": "string"},
                                                 "layout": {"type": "string"},
                                                 "timestamp": {"type": "string"}}},
                                 "The ID's parts"),
                    **_errors(400, 404),
                },
            },
        },
        "/decodeSnowflakeId": _any_method({
                "summary": "Leaf's decoder (Leaf's layout; errorMsg with 200 when the ID is bad)",
                "tags": ["leaf"],
                "parameters": [{"name": "snowflakeId", "in": "query", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": _json({"type": "object"}, "timestamp, workerId, sequenceId"),
                              **_errors(400)},
        }),
        "/cache": _any_method({"summary": "Leaf's cache page: redirects to the monitor page",
                               "tags": ["leaf"], "responses": {"302": {"description": "To /"}}}),
        "/db": _any_method({"summary": "Leaf's db page: the rows of every segment table served",
                            "tags": ["leaf"],
                            "responses": {"200": _text("HTML table", "text/html"),
                                          **_errors(503)}}),
        "/": _ops("The monitor page", _text("HTML", "text/html"), "monitor"),
        "/health": _ops("Liveness: the process answers", _json(_HEALTH, "Alive")),
        "/healthz": _ops("Liveness (alias of /health)", _json(_HEALTH, "Alive")),
        "/ready": _ops("Readiness: every lease valid, every segment key buffered",
                       _json(_READY, "Ready"), extra={"503": _json(_READY, "Not ready")}),
        "/readyz": _ops("Readiness (alias of /ready)", _json(_READY, "Ready"),
                        extra={"503": _json(_READY, "Not ready")}),
        "/metrics": _ops("Prometheus text exposition (0.0.4)", _text("Metrics")),
        "/api/v1/status": _ops("Every process's numbers", _json({"type": "object"}, "Status")),
        "/api/v1/generators": _ops("The generators served",
                                   _json({"type": "object"}, "Generators")),
        "/api/v1/cluster": _ops(
            "Cluster mode: the view clients route by (epoch, hash, members, owners)",
            _json(_CLUSTER, "The view"), "cluster",
            extra={"404": _json(_ERROR, "Not in cluster mode (no [cluster] in the config)")}),
        "/openapi.json": _ops("This document", _json({"type": "object"}, "OpenAPI 3.1")),
        **_lease_paths(),
    }


_GRANT = {"type": "object",
          "required": ["lease", "generator", "worker_id", "epoch", "holder", "valid_for_ns",
                       "ttl_ns", "renew_interval_s", "not_before_ns", "stamp_until_ns"],
          "properties": {"lease": {"type": "string"}, "generator": {"type": "string"},
                         "worker_id": {"type": "integer"}, "epoch": {"type": "integer"},
                         "holder": {"type": "string"}, "extra": {"type": "object"},
                         "valid_for_ns": {"type": "integer"}, "ttl_ns": {"type": "integer"},
                         "renew_interval_s": {"type": "number"},
                         "not_before_ns": {"type": "integer"},
                         "stamp_until_ns": {"type": "integer"}}}


def _lease_paths() -> dict[str, Any]:
    """Worker-id leases for the ``http`` allocator (flakekit_server/lease_api.py)."""
    def q(name: str, description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": True, "description": description,
                "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}}

    gen = _path_param("generator", "A snowflake generator of this server (its registry)")
    lease = _path_param("lease", "The lease id the grant answered", None)
    why = {403: "The generator has no token in --token-file: leases need one",
           409: "This generator cannot lease to clients (no registry, or --workers > 1)",
           410: "This server holds no such lease (restarted, lapsed, other epoch): stop",
           429: "Too many lease requests from this token (retry after Retry-After seconds)"}
    errors = {**_errors(400, 401, 404, 503),
              **{str(c): _json(_ERROR, text) for c, text in why.items()}}
    errors["429"]["headers"] = _RETRY
    secure: list[dict[str, list[str]]] = [{"bearer": []}]
    mark = q("mark", "The client's high-water mark: wall ns it may stamp IDs up to")
    epoch = q("epoch", "The lease's epoch (fencing token)")
    renewed = _json(_GRANT, "Renewed: valid_for_ns counts from the request's send time")
    released = _json({"type": "object", "required": ["released", "worker_id"],
                      "properties": {"released": {"type": "boolean"},
                                     "worker_id": {"type": "integer"}}}, "Released")

    def op(summary: str, parameters: list[dict[str, Any]], ok: dict[str, Any]) -> dict[str, Any]:
        return {"summary": summary, "tags": ["leases"], "security": secure,
                "parameters": parameters, "responses": {"200": ok, **errors}}

    return {
        "/api/v1/leases/{generator}": {
            "post": op("Grant a worker-id lease from the generator's registry", [
                gen, q("max_worker_id", "The client layout's largest worker id"),
                q("clock", "The client's wall clock (ns) when it sent the request")],
                _json(_GRANT, "Granted")),
            "get": op("The registry's records (for `flakekit workers`)", [gen],
                      _json({"type": "object"}, "Records"))},
        "/api/v1/leases/{generator}/{lease}/renew": {
            "post": op("Renew a lease (refused with 410 once it is not held)",
                       [gen, lease, epoch, mark], renewed)},
        "/api/v1/leases/{generator}/{lease}/release": {
            "post": op("Give a lease back (the client has stopped issuing)",
                       [gen, lease, epoch, mark], released)},
    }


def document(version: str, max_count: int = 100_000,
             formats: tuple[str, ...] = ("numbers",)) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-able dict)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "flakekit server", "version": version,
                 "description": "Unique, time-ordered 64-bit IDs over HTTP (docs/server.md)."},
        "paths": paths(max_count, formats),
        "components": {
            "schemas": {"Error": {"type": "object", "required": ["error", "message", "status"],
                                  "properties": {"error": {"type": "string"},
                                                 "message": {"type": "string"},
                                                 "status": {"type": "integer"}}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "Generators named in --token-file"}},
        },
    }


def document_bytes(version: str, max_count: int, formats: tuple[str, ...]) -> bytes:
    return json.dumps(document(version, max_count, formats)).encode()


def served_paths(service: Any) -> set[str]:
    """The endpoints an :class:`~flakekit_server.app.IdService` routes, as path templates."""
    params = {"/api/segment/get/": "key", "/api/snowflake/get/": "key",
              "/api/v1/next/": "generator", "/api/v1/decode/": "id"}
    out = set(service.routes) | set(service.leaf_routes)
    for prefix, _, _ in (*service._leaf_prefixes, *service._prefixes):
        out.add(prefix + "{" + params.get(prefix, "param") + "}")
    out |= {"/api/v1/leases/{generator}", "/api/v1/leases/{generator}/{lease}/renew",
            "/api/v1/leases/{generator}/{lease}/release"}   # IdService.leases
    return out
