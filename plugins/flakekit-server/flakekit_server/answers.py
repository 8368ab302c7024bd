"""Answers and errors: the response tuple, its content types, and how every failure
becomes a JSON error with a status code that says whose fault it is (400 bad input, 401
token, 404 unknown key or generator, 405 method, 503 cannot issue right now; an unexpected
failure is logged with its traceback and answered with a one-line 500).

Also the two parsers every route shares: the query string and a key of a URL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from urllib.parse import unquote_plus

from flakekit.plugin import (
    KEY_RE,
    KEY_RULE,
    ClockMovedBackwardsError,
    ClusterUnavailableError,
    FlakekitError,
    InvalidIdError,
    KeyMovingError,
    LayoutError,
    LeaseError,
    NotOwnerError,
    NotStartedError,
    SegmentUnavailableError,
    TimeOverflowError,
    UnknownKeyError,
    suggest,
)

__all__ = [
    "HTML", "JSON", "NO_STORE", "PROM", "TEXT", "HttpError", "Pending", "Response",
    "error_body", "from_exception", "key_name", "not_found", "query_params",
]

log = logging.getLogger("flakekit.server")

TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"
HTML = b"text/html; charset=utf-8"
PROM = b"text/plain; version=0.0.4; charset=utf-8"

Response = tuple[int, bytes, bytes, bytes, str]   # status, content type, body, headers, route

#: the header of an answer that is current only now (a page, a view, a lease)
NO_STORE = b"Cache-Control: no-store\r\n"

_RETRY = b"Retry-After: 1\r\n"


class HttpError(Exception):
    """An error answer: status, machine-readable code, one line for people."""

    def __init__(self, status: int, code: str, message: str, headers: bytes = b"") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers

    def answer(self, route: str) -> Response:
        """This error as the response tuple of ``route``."""
        return (self.status, JSON, error_body(self.status, self.code, self.message),
                self.headers, route)


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
        """The answer; never raises (a failure is an error answer, as
        :meth:`~flakekit_server.app.IdService.handle`)."""
        try:
            return await self._make()
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            return from_exception(exc).answer(self.route)


#: exceptions answered 503 with ``Retry-After: 1``, and their codes (the first match counts)
_UNAVAILABLE: tuple[tuple[type[BaseException], str], ...] = (
    (NotOwnerError, "not_owner"),
    (SegmentUnavailableError, "segment_unavailable"),
    (LeaseError, "lease_invalid"),
    (ClockMovedBackwardsError, "clock_moved_backwards"),
    (NotStartedError, "not_started"),
)


def from_exception(exc: BaseException) -> HttpError:
    """The HTTP answer for an exception raised while issuing or decoding."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, UnknownKeyError):
        return HttpError(404, "unknown_key", str(exc))
    if isinstance(exc, (KeyMovingError, ClusterUnavailableError)):
        code = "key_moving" if isinstance(exc, KeyMovingError) else "cluster_unavailable"
        return HttpError(503, code, str(exc),
                         b"Retry-After: %d\r\n" % max(1, round(exc.retry_after)))
    for kind, code in _UNAVAILABLE:
        if isinstance(exc, kind):
            return HttpError(503, code, str(exc), _RETRY)
    if isinstance(exc, TimeOverflowError):
        return HttpError(503, "time_overflow", str(exc))
    if isinstance(exc, (InvalidIdError, LayoutError)):
        return HttpError(400, "invalid_id", str(exc))
    if isinstance(exc, FlakekitError):
        return HttpError(503, "unavailable", str(exc), _RETRY)
    log.error("internal error", exc_info=exc)
    return HttpError(500, "internal", "internal server error (the traceback is in the server log)")


def query_params(query: bytes, allowed: Mapping[str, str], *,
                 lenient: bool = False) -> dict[str, str]:
    """Parse a query string; unknown or repeated parameters are a 400 (``lenient``, as
    Leaf's endpoints: ignored, the first of a repeated one counts)."""
    out: dict[str, str] = {}
    if not query:
        return out
    try:
        text = query.decode("ascii")
    except UnicodeDecodeError:
        if not lenient:
            raise HttpError(400, "bad_request", "the query string must be ASCII "
                            "(percent-encode the rest)") from None
        text = query.decode("ascii", errors="replace")
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
            raise HttpError(400, "bad_request",
                            f"unknown query parameter {name!r}; this endpoint takes: {known}")
        if name in out:
            raise HttpError(400, "bad_request", f"query parameter {name!r} is given twice")
        out[name] = value
    return out


def key_name(raw: str, what: str) -> str:
    """A key or generator name of a URL, by the core's rule (``flakekit.values.keys``: the
    one ``flakekit segments create`` applies)."""
    if not KEY_RE.fullmatch(raw):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise HttpError(400, "bad_request", f"{what} {shown!r} is not valid: {KEY_RULE}")
    return raw
