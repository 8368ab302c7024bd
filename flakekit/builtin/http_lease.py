"""Built-in ``http`` allocator: a worker id leased from a ``flakekit serve``, no database
credentials.

``allocator = {type = "http", url = "http://ids:8080", token = "${IDS_TOKEN}"}``

The server holds the real registry (its generator of the same name, with an ``sql``
allocator) and grants each client a registry lease of its own
(``flakekit_server/lease_api.py``). This side keeps the rule every lease keeps: the
deadline is counted from the *send* time of the last confirmed grant or renewal, for the
validity the server states (its own deadline less the instant it received the request),
less this side's ``safety_window``; so a client cut off from the server stops before the
server's deadline, which is itself a safety window before the registry could give the id
to anyone else. The mark sent with every renewal is this host's clock plus the lease: the
id's successor waits past what this client could have stamped.

It lives in the core, on :mod:`http.client`, so a library process needs neither the
server plugin nor its dependencies; it reuses nothing of :mod:`flakekit.client` (a higher
layer), and needs nothing of it: four small POSTs.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import attrs
from attrs.validators import instance_of, optional

from flakekit.errors import BackendError, ConfigError, LeaseLostError
from flakekit.leases.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.pluginhost.markers import registers
from flakekit.values.timeunits import Duration, duration_field

if TYPE_CHECKING:  # annotations only: the plugin host loads this module for --help
    from flakekit.assembly.context import BuildContext
    from flakekit.values.clock import Clock

__all__ = ["HttpAllocator", "HttpAllocatorSettings", "build_http_allocator"]

NS = 1_000_000_000
#: the largest safety window used when none is configured (else a fifth of the validity)
MAX_DEFAULT_WINDOW_NS = 5 * NS
PREFIX = "/api/v1/leases/"


def _url(value: Any) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
            or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"url must be the server's base URL such as 'http://ids:8080', "
                         f"got {value!r}")
    return value.rstrip("/")


@attrs.frozen(kw_only=True)
class HttpAllocatorSettings:
    """``allocator = {type = "http", ...}``.

    Attributes:
        url: the server's base URL, ``http://host:port`` (or ``https://``); required.
        token: the bearer token that opens the generator on the server (its
            ``--token-file`` line); use ``${ENV}`` interpolation. Required by the server.
        generator: the server's generator whose registry leases the id (default: this
            generator's name). Its layout must hold this layout's worker range.
        timeout: the longest one request waits (default ``"5s"``).
        safety_window: stop issuing this long before the server's deadline (default: a
            fifth of the validity the server grants, at most 5 s; less than half of it).
    """

    url: str = attrs.field(converter=_url)
    token: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    generator: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    timeout: Duration = duration_field("5s", minimum=1, example="5s")
    safety_window: Duration | None = duration_field(None, minimum=1, example="5s",
                                                     optional=True)


@attrs.define
class HttpAllocator:
    """Worker ids leased over HTTP (see the module docstring)."""

    settings: HttpAllocatorSettings
    clock: Clock
    generator: str
    path: str = "allocator"
    #: a server restart forgets its grants: take a new id and go on (the old one lapses)
    default_on_lease_lost = "restart"
    several_leases = True
    _interval: float | None = None
    _leases: dict[tuple[int, int], str] = attrs.Factory(dict)   # (worker, epoch) -> lease id
    _ttl: dict[tuple[int, int], int] = attrs.Factory(dict)
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    @property
    def renew_interval(self) -> float | None:
        """The registry's heartbeat, as the server stated it (1 s until the first grant)."""
        return self._interval if self._interval is not None else 1.0

    @property
    def name(self) -> str:
        return self.settings.generator or self.generator

    # -- the lease ------------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        send = self.clock.monotonic_ns()
        query = {"max_worker_id": request.max_worker_id, "clock": self.clock.time_ns()}
        answer = self._call("POST", "", query, granting=True)
        try:
            lease = self._lease(answer, send, None)
        except (BackendError, ConfigError):
            self._give_back(answer)   # unusable here: let the server free it at once
            raise
        with self._lock:
            self._leases[lease.worker_id, lease.epoch] = str(answer["lease"])
            self._ttl[lease.worker_id, lease.epoch] = int(answer["ttl_ns"])
        return lease

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        lease_id, ttl = self._of(lease)
        if lease_id is None:
            raise LeaseLostError(f"worker {lease.worker_id} was released or never leased here")
        send = self.clock.monotonic_ns()
        # what this host could stamp until the next renewal: the id's mark in the registry
        mark = max(issued_until_ns, self.clock.time_ns() + ttl)
        answer = self._call("POST", f"/{lease_id}/renew",
                            {"epoch": lease.epoch, "mark": mark})
        if (answer.get("worker_id"), answer.get("epoch")) != (lease.worker_id, lease.epoch):
            raise LeaseLostError(f"the server renewed {answer.get('worker_id')!r} epoch "
                                 f"{answer.get('epoch')!r}, not worker {lease.worker_id} "
                                 f"epoch {lease.epoch}")
        return self._lease(answer, send, lease)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        lease_id, _ = self._of(lease, forget=True)
        if lease_id is None:
            return
        try:
            self._call("POST", f"/{lease_id}/release",
                       {"epoch": lease.epoch, "mark": max(issued_until_ns, 0)})
        except LeaseLostError:
            pass   # the server no longer holds it: nothing to give back

    def _give_back(self, answer: dict[str, Any]) -> None:
        try:
            self._call("POST", f"/{answer['lease']}/release",
                       {"epoch": int(answer["epoch"]), "mark": self.clock.time_ns()})
        except (KeyError, TypeError, ValueError, BackendError, LeaseLostError):
            pass   # it lapses on the server

    def records(self) -> list[WorkerRecord]:
        answer = self._call("GET", "", {})
        with self._lock:
            holders = set(self._leases)
        out = []
        for row in answer.get("records", []):
            key = (row["worker_id"], row["epoch"])
            out.append(WorkerRecord(
                worker_id=row["worker_id"], holder=row["holder"] or "", epoch=row["epoch"],
                last_seen=None, state=row["state"],
                mine=key in holders and row["state"] == "held",
                extra={"server": self.settings.url}))
        return out

    def close(self) -> None:
        """Nothing to free: every call opens (and closes) its own connection."""

    # -- helpers -----------------------------------------------------------------------------
    def _of(self, lease: WorkerLease, forget: bool = False) -> tuple[str | None, int]:
        key = (lease.worker_id, lease.epoch)
        with self._lock:
            if forget:
                self._ttl.pop(key, None)
                return self._leases.pop(key, None), 0
            return self._leases.get(key), self._ttl.get(key, 0)

    def _lease(self, answer: dict[str, Any], send: int, old: WorkerLease | None) -> WorkerLease:
        try:
            valid = int(answer["valid_for_ns"])
            self._interval = float(answer["renew_interval_s"])
            configured = self.settings.safety_window
            window = min(valid // 5, MAX_DEFAULT_WINDOW_NS) if configured is None else configured
            deadline = send + valid - window
            stamp_until = int(answer["stamp_until_ns"])
            lease = WorkerLease(
                worker_id=int(answer["worker_id"]), epoch=int(answer["epoch"]),
                holder=str(answer["holder"]), ttl=valid / NS, deadline_ns=deadline,
                not_before_ns=int(answer["not_before_ns"]), stamp_until_ns=stamp_until,
                extra={str(k): int(v) for k, v in (answer.get("extra") or {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"lease server {self.settings.url}: the answer is malformed "
                               f"({exc!r}); is it a flakekit server of the same version?") from None
        if window * 2 >= valid:
            raise ConfigError(f"{self.path}.safety_window", f"the server grants "
                              f"{valid / NS:g} s; the safety window must be less than half "
                              "of it")
        if deadline <= self.clock.monotonic_ns():
            raise BackendError(f"lease server {self.settings.url}: the answer came after the "
                               "lease's deadline (the request took longer than the validity)")
        if old is None:
            return lease
        return attrs.evolve(old, deadline_ns=deadline, stamp_until_ns=stamp_until)

    def _call(self, method: str, tail: str, query: dict[str, int],
              granting: bool = False) -> dict[str, Any]:
        """One request; its answer, or the error it means (every one names the server)."""
        # imported here: the plugin host loads this module for every `flakekit --help`
        import http.client
        import json
        import socket
        from urllib.parse import quote, urlencode, urlsplit

        s = self.settings
        parts = urlsplit(s.url)
        conn_type = (http.client.HTTPSConnection if parts.scheme == "https"
                     else http.client.HTTPConnection)
        conn = conn_type(parts.hostname or "", parts.port, timeout=s.timeout / NS)
        target = f"{PREFIX}{quote(self.name, safe='')}{quote(tail)}"
        if query:
            target += "?" + urlencode(query)
        headers = {"Authorization": f"Bearer {s.token}"} if s.token else {}
        try:
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            status, body = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            why = ("timed out" if isinstance(exc, socket.timeout)
                   else str(exc) or type(exc).__name__)
            raise BackendError(f"lease server {s.url}: {why}") from None
        finally:
            conn.close()
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if status == 200:
            return data
        message = f"lease server {s.url}: {data.get('message') or body[:200]!r} (HTTP {status})"
        if status == 410:
            raise LeaseLostError(message)
        if granting and status in (400, 401, 403, 404, 409):
            where = {401: "token", 403: "token", 404: "generator"}.get(status, "url")
            raise ConfigError(f"{self.path}.{where}", message)
        raise BackendError(message)


def build_http_allocator(settings: HttpAllocatorSettings | None, ctx: BuildContext) -> Any:
    """Factory registered as ``http``."""
    if settings is None:
        raise ConfigError(f"{ctx.path}.url", "is required: allocator = {type = \"http\", "
                          "url = \"http://ids:8080\", token = \"${IDS_TOKEN}\"}")
    return HttpAllocator(settings, ctx.clock, ctx.generator, ctx.path)


flakekit_register_allocators = registers(
    "http", build_http_allocator, settings=HttpAllocatorSettings,
    description="a worker id leased from a `flakekit serve` (no database credentials)",
)

