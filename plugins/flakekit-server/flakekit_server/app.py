"""The ID service behind the HTTP transport: routing, validation, errors, status.

:class:`IdService` turns ``(method, url, authorization)`` into a response tuple, so the
transport (:mod:`flakekit_server.http`) stays a thin byte pump and the service can be
tested without sockets. Every error is a JSON body naming the problem, with a status
code that says whose fault it is: 400 bad input, 401 token, 404 unknown key or
generator, 405 method, 503 cannot issue right now (lease, segment refill, clock); an
unexpected failure is logged with its traceback and answered with a one-line 500.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus

import attrs

from flakekit.errors import (
    ClockMovedBackwardsError,
    FlakekitError,
    InvalidIdError,
    LayoutError,
    LeaseError,
    NotStartedError,
    SegmentUnavailableError,
    TimeOverflowError,
    UnknownKeyError,
    suggest,
)
from flakekit_server.auth import Tokens
from flakekit_server.metrics import EVENTS, RequestStats, render

__all__ = ["HttpError", "IdService", "ServerOptions"]

log = logging.getLogger("flakekit.server")

#: a key or generator name in a URL: Leaf's biz_tag is varchar(128)
KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}$")
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
HTML = b"text/html; charset=utf-8"
PROM = b"text/plain; version=0.0.4; charset=utf-8"
#: a snapshot of another process older than this counts as "not ready"
STALE_S = 5.0

Response = tuple[int, bytes, bytes, bytes, str]   # status, content type, body, headers, route


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How the server runs (CLI options of ``flakekit serve``)."""

    host: str = "127.0.0.1"
    port: int = 8080
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


def from_exception(exc: BaseException) -> HttpError:
    """The HTTP answer for an exception raised while issuing or decoding."""
    retry = b"Retry-After: 1\r\n"
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, UnknownKeyError):
        return HttpError(404, "unknown_key", str(exc))
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


def _params(query: bytes, allowed: Mapping[str, str]) -> dict[str, str]:
    """Parse a query string; unknown or repeated parameters are a 400."""
    out: dict[str, str] = {}
    if not query:
        return out
    try:
        text = query.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "bad_request", "the query string must be ASCII (percent-encode the rest)") from None
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name, value = unquote_plus(name), unquote_plus(value)
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "(none)"
            raise HttpError(400, "bad_request", f"unknown query parameter {name!r}; this endpoint takes: {known}")
        if name in out:
            raise HttpError(400, "bad_request", f"query parameter {name!r} is given twice")
        out[name] = value
    return out


def _key(raw: str, what: str) -> str:
    if not KEY_RE.match(raw):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise HttpError(
            400, "bad_request", f"{what} {shown!r} is not valid: use 1 to 128 of A-Z a-z 0-9 _ . : - "
            "(not starting with . : -)"
        )
    return raw


class IdService:
    """Routes requests to the generators of one started :class:`~flakekit.kit.Kit`."""

    def __init__(
        self, kit: Any, options: ServerOptions, *, process: int = 0,
        run_dir: str | Path | None = None, stack: str = "",
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
        self.strategy = {name: kit.config.generators[name].strategy for name in kit}
        self.issued: dict[str, int] = dict.fromkeys(self.generators, 0)
        # Leaf's segment key is the biz_tag; a generator's name works too
        self.segment_keys: dict[str, str] = {}
        for name, gen in self.generators.items():
            if self.strategy[name] == "segment":
                self.segment_keys.setdefault(str(getattr(gen, "key", name)), name)
        for name in self.generators:
            if self.strategy[name] == "segment":
                self.segment_keys.setdefault(name, name)
        self.snowflakes = [n for n in self.generators if self.strategy[n] == "snowflake"]
        if options.snowflake_default is not None and options.snowflake_default not in self.snowflakes:
            raise UnknownKeyError(options.snowflake_default)  # checked earlier by the CLI
        # the hot path: exact Leaf URLs of open generators -> a function giving the ID
        self.fast: dict[bytes, tuple[str, Callable[[], int]]] = {}
        for key, name in self.segment_keys.items():
            self._add_fast(b"/api/segment/get/" + key.encode(), name)
        for name in self.snowflakes:
            self._add_fast(b"/api/snowflake/get/" + name.encode(), name)
        self.routes: dict[str, Callable[[bytes, bytes | None], Response]] = {
            "/": self._monitor,
            "/health": self._health,
            "/healthz": self._health,
            "/ready": self._ready,
            "/readyz": self._ready,
            "/metrics": self._metrics,
            "/api/v1/status": self._status,
            "/api/v1/generators": self._list,
            "/decodeSnowflakeId": self._leaf_decode,
            "/cache": self._cache,
        }

    def _add_fast(self, url: bytes, name: str) -> None:
        if self.options.tokens.protected(name) or not KEY_RE.match(url.rsplit(b"/", 1)[1].decode()):
            return
        issued = self.issued
        draw = self.generators[name].next_id

        def next_id() -> int:
            value = draw()
            issued[name] += 1
            return value

        self.fast[url] = (name, next_id)

    # -- dispatch ------------------------------------------------------------------------------
    def handle(self, method: bytes, url: bytes, authorization: bytes | None) -> Response:
        """Answer one request; never raises."""
        route = "other"
        try:
            path_b, _, query = url.partition(b"?")
            try:
                path = unquote(path_b.decode("ascii"), errors="strict")
            except UnicodeDecodeError:
                raise HttpError(400, "bad_request", "the path must be ASCII (percent-encoded UTF-8 keys are not valid keys)") from None
            if method != b"GET":
                raise HttpError(405, "method_not_allowed",
                                f"{method.decode('latin-1')} is not allowed; use GET", b"Allow: GET\r\n")
            for prefix, handler, name in self._prefixes:
                if path.startswith(prefix):
                    route = name
                    return handler(self, path[len(prefix):], query, authorization)
            handler = self.routes.get(path)
            if handler is None:
                route = "not_found"
                raise HttpError(404, "not_found", f"no such endpoint {path[:80]!r}; see / for the "
                                "monitor page and docs/server.md for the API")
            route = handler.__name__.lstrip("_")
            return handler(query, authorization)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            err = from_exception(exc)
            return (err.status, JSON, error_body(err.status, err.code, err.message), err.headers, route)

    def _check_auth(self, name: str, authorization: bytes | None) -> None:
        if not self.options.tokens.allows(name, authorization):
            raise HttpError(401, "unauthorized",
                            f"generator {name!r} needs a token: send 'Authorization: Bearer TOKEN'",
                            b'WWW-Authenticate: Bearer realm="flakekit"\r\n')

    # -- Leaf-compatible endpoints ----------------------------------------------------------
    def _leaf_segment(self, rest: str, query: bytes, auth: bytes | None) -> Response:
        key = _key(rest, "key")
        _params(query, {})
        name = self.segment_keys.get(key)
        if name is None:
            known = sorted(self.segment_keys)
            raise not_found("unknown_key", f"no segment generator serves key {key!r}", key, known)
        self._check_auth(name, auth)
        value = self.generators[name].next_id()
        self.issued[name] += 1
        return 200, TEXT, b"%d" % value, b"", "leaf_segment"

    def _leaf_snowflake(self, rest: str, query: bytes, auth: bytes | None) -> Response:
        key = _key(rest, "key")
        _params(query, {})
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

    def _next(self, rest: str, query: bytes, auth: bytes | None) -> Response:
        name = _key(rest, "generator")
        params = _params(query, {"count": "", "format": ""})
        count = self._count(params.get("count"))
        fmt = params.get("format", "numbers")
        if fmt not in ("numbers", "strings", "ranges", "text"):
            raise HttpError(400, "bad_request", f"format must be numbers, strings, ranges or text, got {fmt[:20]!r}")
        gen = self.generators.get(name)
        if gen is None:
            known = sorted(self.generators)
            raise not_found("unknown_generator", f"unknown generator {name!r}", name, known)
        self._check_auth(name, auth)
        if count == 1 and fmt != "ranges":
            ids: Any = (gen.next_id(),)
            ranges: Any = None
        else:
            batch = gen.next_ids(count)
            ranges = batch.ranges
            ids = batch
        self.issued[name] += count
        head = b'{"generator":' + json.dumps(name).encode() + b',"count":%d,' % count
        if fmt == "text":
            return 200, TEXT, "\n".join(map(str, ids)).encode() + b"\n", b"", "next"
        if fmt == "ranges":
            parts = ",".join(f'{{"start":{r.start},"stop":{r.stop},"step":{r.step}}}' for r in ranges)
            return 200, JSON, head + b'"ranges":[' + parts.encode() + b"]}", b"", "next"
        if fmt == "strings":
            body = '","'.join(map(str, ids))
            return 200, JSON, head + b'"ids":["' + body.encode() + b'"]}', b"", "next"
        return 200, JSON, head + b'"ids":[' + ",".join(map(str, ids)).encode() + b"]}", b"", "next"

    def _layout_for(self, params: Mapping[str, str]) -> Any:
        from flakekit.host import get_host
        from flakekit.kit import resolve_layout

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

    def _decode(self, rest: str, query: bytes, auth: bytes | None) -> Response:
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
                "timestamp": when.isoformat().replace("+00:00", "Z")}
        return 200, JSON, json.dumps(body).encode(), b"", "decode"

    def _leaf_decode(self, query: bytes, auth: bytes | None) -> Response:
        from flakekit.host import get_host

        params = _params(query, {"snowflakeId": ""})
        raw = params.get("snowflakeId", "")
        layout = get_host().layout("snowflake")  # Leaf's twepoch 1288834974657 and 5+5+12 bits
        try:
            value = layout.check_id(raw)
        except (InvalidIdError, LayoutError, ValueError) as exc:
            raise HttpError(400, "invalid_id", f"snowflakeId: {exc}") from None
        parts = layout.decompose(value)
        when = layout.timestamp(value)
        ms = layout.epoch_ms + parts["time"]
        body = {"timestamp": f"{ms}({when.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]})",
                "workerId": str(parts["worker"]), "sequenceId": str(parts["sequence"])}
        return 200, JSON, json.dumps(body).encode(), b"", "decode"

    _prefixes: tuple[tuple[str, Callable[..., Response], str], ...] = (
        ("/api/segment/get/", _leaf_segment, "leaf_segment"),
        ("/api/snowflake/get/", _leaf_snowflake, "leaf_snowflake"),
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
        problems = [p for s in snaps for p in s["problems"]]
        body = {"ready": not problems, "processes": len(snaps), "problems": problems}
        status = 200 if not problems else 503
        return status, JSON, json.dumps(body).encode(), b"", "ready"

    def _metrics(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        return 200, PROM, render(self.snapshots()).encode(), b"", "metrics"

    def _status(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        snaps = self.snapshots()
        problems = [p for s in snaps for p in s["problems"]]
        from flakekit_server import __version__

        body = {
            "server": {
                "version": __version__, "stack": self.stack, "host": self.options.host,
                "port": self.options.port, "processes": self.options.workers,
                "max_count": self.options.max_count, "config": self.kit.config.source,
                "time": time.time(),
            },
            "ready": not problems, "problems": problems, "processes": snaps,
        }
        return 200, JSON, json.dumps(body, default=str).encode(), b"", "status"

    def _list(self, query: bytes, auth: bytes | None) -> Response:
        _params(query, {})
        out = []
        for name, gen in self.generators.items():
            info: dict[str, Any] = {"name": name, "strategy": self.strategy[name],
                                    "token_required": self.options.tokens.protected(name)}
            if self.strategy[name] == "snowflake":
                info["layout"] = gen.layout.name
                info["leaf_url"] = f"/api/snowflake/get/{name}"
            else:
                info["key"] = getattr(gen, "key", name)
                info["leaf_url"] = f"/api/segment/get/{info['key']}"
            info["url"] = f"/api/v1/next/{name}"
            out.append(info)
        return 200, JSON, json.dumps({"generators": out, "max_count": self.options.max_count}).encode(), b"", "generators"

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
                info = describe(name, self.strategy[name], gen.stats())
            except Exception as exc:  # noqa: BLE001 - a broken stats() is a problem, not a crash
                info = {"name": name, "strategy": self.strategy[name], "ready": False,
                        "problem": f"stats() failed: {exc}"}
            info["issued"] = self.issued[name]
            gens.append(info)
            if not info["ready"]:
                problems.append(f"{where}generator {name!r}: {info['problem']}")
        if self.stopping:
            problems.append(f"{where}shutting down")
        return {
            "process": self.process, "pid": os.getpid(), "started": self.started,
            "time": time.time(), "ready": not problems, "problems": problems,
            "generators": gens, "http": self.stats.snapshot(), "events": EVENTS.snapshot(),
        }

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
                snap["ready"] = False
                snap["problems"] = [*snap.get("problems", []),
                                    f"process {snap.get('process')}: no report for {age:.0f} s"]
            out.append(snap)
        out.sort(key=lambda s: s["process"])
        return out

    def write_snapshot(self) -> None:
        """Publish this process's snapshot for its siblings (atomic rename)."""
        if self.run_dir is None:
            return
        data = json.dumps(self.snapshot(), default=str)
        tmp = self.run_dir / f".process-{self.process}.tmp"
        tmp.write_text(data)
        os.replace(tmp, self.run_dir / f"process-{self.process}.json")


def _segment_keys(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The keys of a segment generator's stats (one key today; a list or dict if many)."""
    keys = stats.get("keys")
    if isinstance(keys, Mapping):
        return [{"key": k, **v} for k, v in keys.items()]
    if isinstance(keys, list):
        return [dict(k) for k in keys]
    return [dict(stats)]


def describe(name: str, strategy: str, stats: Mapping[str, Any]) -> dict[str, Any]:
    """A generator's stats, normalised, with readiness and the reason when not ready."""
    info: dict[str, Any] = {"name": name, "strategy": strategy}
    if strategy == "snowflake":
        for field in ("layout", "clock", "ids_drawn", "worker_id", "epoch", "lease_remaining_s",
                      "renewals", "renew_failures", "lost"):
            info[field] = stats.get(field)
        remaining = stats.get("lease_remaining_s")
        if stats.get("lost"):
            problem = f"lease lost: {stats['lost']}"
        elif stats.get("worker_id") is None:
            problem = "no worker lease"
        elif remaining is not None and remaining <= 0:
            problem = f"lease on worker {stats['worker_id']} expired {-remaining:.1f} s ago (renewals failing)"
        else:
            problem = None
    else:
        keys = []
        empty = []
        for key in _segment_keys(stats):
            buffers = [
                {f: b.get(f) for f in ("slot", "ready", "start", "position", "end", "step", "idle")}
                for b in key.get("buffers") or []
            ]
            entry = {f: key.get(f) for f in (
                "key", "step", "min_step", "max_id", "fetches", "fetch_failures", "fetch_ms_last",
                "fetch_ms_max", "fetch_ms_mean", "waits", "unavailable", "last_error")}
            entry["buffers"] = buffers
            keys.append(entry)
            if not any(b["ready"] for b in buffers):
                empty.append(str(entry["key"]))
        info["keys"] = keys
        if stats.get("closed"):
            problem = "closed"
        elif empty:
            problem = f"no buffer ready for key {', '.join(map(repr, empty))}"
        else:
            problem = None
    info["ready"] = problem is None
    info["problem"] = problem
    return info
