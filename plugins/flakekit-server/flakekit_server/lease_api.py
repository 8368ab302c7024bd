"""Worker-id leases for library clients (``allocator = {type = "http"}``): grant, renew, release.

A client that wants local-speed snowflake IDs without database credentials leases its
worker id here; the server holds the real registry (the allocator of one of its own
snowflake generators, ``sql`` today). Why it is safe:

- **One registry lease per grant.** Every grant is a fresh ``acquire`` in the registry
  (its own holder token and epoch), handed to one client under a random lease id; no
  registry lease ever serves two clients, and the server never re-grants one.
- **Renewed only when the client renews.** The server renews a grant's registry lease
  when (and only when) its client asks, so a client that dies or is cut off lets it
  lapse exactly as a direct holder's would. A grant whose registry deadline has passed
  is released (its client has stopped by then: its deadline is earlier, see below).
- **Deadlines chain.** An answer carries ``valid_for_ns``: the registry lease's deadline
  less the instant the server *received* the request. The client counts it from the
  instant it *sent* the request (earlier), less its own safety window, so it stops
  before the server's deadline, which is a safety window before the registry could
  give the id away.
- **The client's clock marks the ids.** The high-water mark stored with the id is the
  client's (``mark``: its wall clock plus the lease), as a direct holder stores its own,
  so a successor waits past what this client could have stamped.
- **Refused, never guessed.** A renewal of a lease this process does not hold (it
  restarted, the grant lapsed, a wrong epoch) is answered 410; the client stops.
  A closing server keeps its grants' registry leases: they lapse after the client's
  deadline, never before.

Leases are authenticated (a generator that serves leases must have a token in
``--token-file``), rate-limited per token, and served by a single server process
(``--workers 1``): a grant lives in the memory of the process that made it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from flakekit.plugin import (
    BackendError,
    LeaseLostError,
    LeaseRequest,
    SeveralLeases,
    WorkerAllocator,
    WorkerLease,
)
from flakekit_server.answers import (
    JSON,
    NO_STORE,
    HttpError,
    Pending,
    Response,
    not_found,
    query_params,
)

__all__ = ["LEASES_PREFIX", "Grant", "LeaseApi", "RateLimit"]

log = logging.getLogger("flakekit.server.leases")

LEASES_PREFIX = "/api/v1/leases/"
#: requests per second each client (token) may make, and the burst it may save up
RATE = 20.0
BURST = 40.0
#: how often grants past their registry deadline are looked for (and released)
REAP_EVERY_S = 0.5
#: threads talking to the registry (a grant or a renewal holds one for a transaction)
THREADS = 4
NS = 1_000_000_000
_ACTIONS = ("renew", "release")


@attrs.define
class Grant:
    """One registry lease handed to one client."""

    id: str
    generator: str
    client: str              # a digest of the client's token: who may renew it
    lease: WorkerLease       # the registry's lease (deadline on this server's clock)
    mark: int                # the client's high-water mark (its wall ns)
    lock: threading.Lock = attrs.Factory(threading.Lock)


@attrs.define
class RateLimit:
    """A token bucket per client: ``rate`` requests a second, ``burst`` at once."""

    rate: float = RATE
    burst: float = BURST
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, tuple[float, float]] = attrs.Factory(dict)
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def take(self, client: str) -> float:
        """0 if the request may go; else the seconds until it may."""
        now = self.clock()
        with self._lock:
            level, then = self._buckets.get(client, (self.burst, now))
            level = min(self.burst, level + (now - then) * self.rate)
            if level < 1.0 - 1e-9:   # (a client that waited as told is not refused by rounding)
                self._buckets[client] = (level, now)
                return (1.0 - level) / self.rate
            self._buckets[client] = (max(0.0, level - 1.0), now)
            return 0.0


class LeaseApi:
    """The lease endpoints of one server process (see the module docstring)."""

    def __init__(self, kit: Any, tokens: Any, *, workers: int = 1,
                 limit: RateLimit | None = None) -> None:
        self.kit = kit
        self.tokens = tokens
        self.workers = workers
        self.limit = limit or RateLimit()
        self.grants: dict[str, Grant] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # -- dispatch -----------------------------------------------------------------------------
    def handle(self, method: bytes, rest: str, query: bytes,
               auth: bytes | None) -> Response | Pending:
        """``POST {gen}`` grants, ``POST {gen}/{lease}/renew|release``, ``GET {gen}`` lists."""
        parts = rest.split("/")
        name = parts[0]
        if len(parts) not in (1, 3) or (len(parts) == 3 and parts[2] not in _ACTIONS):
            raise HttpError(404, "not_found", "lease endpoints are POST /api/v1/leases/{generator} "
                            "and POST /api/v1/leases/{generator}/{lease}/renew|release")
        allowed = b"GET, POST" if len(parts) == 1 else b"POST"
        if method not in allowed.split(b", "):
            raise HttpError(405, "method_not_allowed", f"{method.decode('latin-1')} is not "
                            f"allowed; use {allowed.decode()}", b"Allow: %s\r\n" % allowed)
        allocator = self._allocator(name)
        client = self._client(name, auth)
        wait = self.limit.take(client)
        if wait:
            raise HttpError(429, "rate_limited", f"more than {self.limit.rate:g} lease requests a "
                            f"second from this token; retry in {wait:.2f} s",
                            b"Retry-After: %d\r\n" % max(1, round(wait)))
        if len(parts) == 1 and method == b"GET":
            query_params(query, {})
            return self._off_loop("lease_records", lambda: self._records(allocator))
        if len(parts) == 1:
            p = query_params(query, {"max_worker_id": "", "clock": ""})
            top = _int(p, "max_worker_id")
            clock = _int(p, "clock")
            return self._off_loop("lease_grant", lambda: self._grant(name, allocator, client,
                                                                     top, clock))
        p = query_params(query, {"epoch": "", "mark": ""})
        epoch, mark = _int(p, "epoch"), _int(p, "mark")
        if parts[2] == "renew":
            return self._off_loop("lease_renew", lambda: self._renew(
                name, allocator, client, parts[1], epoch, mark))
        return self._off_loop("lease_release", lambda: self._release(
            name, allocator, client, parts[1], epoch, mark))

    def _allocator(self, name: str) -> Any:
        if name not in self.kit:
            raise not_found("unknown_generator", f"no generator {name!r}", name, self.kit)
        parts = self.kit.parts_of(name, "allocator")
        alloc = parts[0].obj if parts else None
        if not isinstance(alloc, WorkerAllocator) or alloc.renew_interval is None:
            raise HttpError(409, "no_leases", f"generator {name!r} has no leased worker ids to "
                            "hand out: give it a registry, e.g. allocator = {type = \"sql\"}")
        if not (isinstance(alloc, SeveralLeases) and alloc.several_leases):
            raise HttpError(409, "no_leases", f"the allocator of generator {name!r} holds one "
                            "lease per process; serve leases from an sql allocator")
        if self.workers > 1:
            raise HttpError(409, "no_leases", "lease endpoints need a single server process "
                            "(--workers 1): a grant lives in the process that made it")
        return alloc

    def _client(self, name: str, auth: bytes | None) -> str:
        if not self.tokens.protected(name):
            raise HttpError(403, "token_required", f"leases of generator {name!r} need a token: "
                            f"add a line '{name} TOKEN' to --token-file")
        if not self.tokens.allows(name, auth):
            raise HttpError(401, "unauthorized", f"generator {name!r} needs a token: send "
                            "'Authorization: Bearer TOKEN'",
                            b'WWW-Authenticate: Bearer realm="flakekit"\r\n')
        return hashlib.sha256(auth or b"").hexdigest()[:32]

    def _off_loop(self, route: str, work: Callable[[], dict[str, Any]]) -> Pending:
        """Registry calls block: they run in a thread of their own, never on the loop."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="flakekit-leases")
            self._reaper = threading.Thread(target=self._reap, daemon=True,
                                            name="flakekit-lease-reaper")
            self._reaper.start()
        pool = self._pool

        async def run() -> Response:
            body = await asyncio.get_running_loop().run_in_executor(pool, work)
            return 200, JSON, json.dumps(body).encode(), NO_STORE, route

        return Pending(route, run)

    # -- the operations (in a worker thread) ----------------------------------------------------
    def _grant(self, name: str, allocator: Any, client: str, top: int,
               clock: int) -> dict[str, Any]:
        layout = self.kit.describe(name).layout
        own = layout.max_value(layout.worker_field) if layout is not None else top
        if top > own:
            raise HttpError(400, "bad_request", f"max_worker_id {top} is above generator "
                            f"{name!r}'s worker range 0..{own}: the client's layout must match")
        t0 = time.monotonic_ns()
        lease = allocator.acquire(LeaseRequest(name, top, ""))
        grant = Grant(secrets.token_urlsafe(18), name, client, lease, 0)
        try:
            # the id's high-water mark on the client's clock (which stamps the IDs)
            self._extend(grant, allocator, clock + _ttl_ns(lease))
        except BaseException:
            allocator.release(lease, lease.not_before_ns)
            raise
        with self._lock:
            self.grants[grant.id] = grant
        log.info("%s: worker %d (epoch %d) leased to client %s as %s", name, lease.worker_id,
                 lease.epoch, client[:8], grant.id[:8])
        return self._answer(grant, t0, lease.not_before_ns)

    def _renew(self, name: str, allocator: Any, client: str, lease_id: str, epoch: int,
               mark: int) -> dict[str, Any]:
        grant = self._held(name, client, lease_id, epoch)
        t0 = time.monotonic_ns()
        with grant.lock:
            try:
                self._extend(grant, allocator, mark)
            except LeaseLostError as exc:
                self._forget(grant)
                raise HttpError(410, "lease_lost", f"worker {grant.lease.worker_id} is no "
                                f"longer held: {exc}") from None
        return self._answer(grant, t0, grant.lease.not_before_ns)

    def _release(self, name: str, allocator: Any, client: str, lease_id: str, epoch: int,
                 mark: int) -> dict[str, Any]:
        grant = self._held(name, client, lease_id, epoch)
        self._forget(grant)
        with grant.lock:
            allocator.release(grant.lease, max(mark, grant.lease.not_before_ns))
        return {"released": True, "worker_id": grant.lease.worker_id}

    def _records(self, allocator: Any) -> dict[str, Any]:
        return {"records": [
            {"worker_id": r.worker_id, "holder": r.holder, "epoch": r.epoch, "state": r.state,
             "last_seen": r.last_seen.isoformat() if r.last_seen else None}
            for r in allocator.records()]}

    def _extend(self, grant: Grant, allocator: Any, mark: int) -> None:
        """Renew the registry lease with the client's mark; the deadline must be ahead."""
        new = allocator.renew(grant.lease, mark)
        if new.deadline_ns is None or new.deadline_ns <= time.monotonic_ns():
            raise BackendError("the registry renewed the lease too late to use it")
        grant.lease, grant.mark = new, max(grant.mark, mark)

    def _held(self, name: str, client: str, lease_id: str, epoch: int) -> Grant:
        with self._lock:
            grant = self.grants.get(lease_id)
        if grant is None or grant.generator != name or grant.client != client:
            raise HttpError(410, "lease_lost", f"this server holds no lease {lease_id[:8]!r} of "
                            f"{name!r} (it restarted, or the lease lapsed): acquire a new one")
        if grant.lease.epoch != epoch:
            raise HttpError(410, "lease_lost", f"lease {lease_id[:8]!r} is at epoch "
                            f"{grant.lease.epoch}, not {epoch}: acquire a new one")
        return grant

    def _answer(self, grant: Grant, t0: int, not_before: int) -> dict[str, Any]:
        lease = grant.lease
        assert lease.deadline_ns is not None  # checked by _extend
        return {
            "lease": grant.id, "generator": grant.generator, "worker_id": lease.worker_id,
            "epoch": lease.epoch, "holder": lease.holder, "extra": lease.extra,
            # counted by the client from its send time, which came before t0
            # (never more than the ttl: the client's mark covers that much)
            "valid_for_ns": min(lease.deadline_ns - t0, _ttl_ns(lease)), "ttl_ns": _ttl_ns(lease),
            "renew_interval_s": self._interval(grant.generator),
            "not_before_ns": not_before, "stamp_until_ns": grant.mark,
        }

    def _interval(self, name: str) -> float:
        return float(self.kit.parts_of(name, "allocator")[0].obj.renew_interval)

    def _forget(self, grant: Grant) -> None:
        with self._lock:
            self.grants.pop(grant.id, None)

    # -- lapsed grants ---------------------------------------------------------------------
    def _reap(self) -> None:
        """Release grants whose registry deadline has passed: their clients stopped before
        it (a shorter deadline), so the id may go back with the client's mark."""
        while not self._stop.wait(REAP_EVERY_S):
            now = time.monotonic_ns()
            with self._lock:
                due = [g for g in self.grants.values()
                       if g.lease.deadline_ns is not None and g.lease.deadline_ns < now]
            for grant in due:
                with grant.lock:
                    if grant.lease.deadline_ns is None or grant.lease.deadline_ns >= now:
                        continue   # renewed meanwhile
                    self._forget(grant)
                    alloc = self.kit.parts_of(grant.generator, "allocator")[0].obj
                    try:
                        alloc.release(grant.lease, max(grant.mark, grant.lease.not_before_ns))
                    except Exception as exc:  # noqa: BLE001 - it lapses in the registry on its own
                        log.warning("%s: releasing lapsed worker %d: %s", grant.generator,
                                    grant.lease.worker_id, exc)
                log.info("%s: worker %d lapsed (its client stopped renewing)",
                         grant.generator, grant.lease.worker_id)

    def close(self) -> None:
        """Stop; the grants' registry leases are NOT released: their clients may still be
        issuing until their deadlines, and the leases lapse after those."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _int(params: dict[str, str], name: str) -> int:
    raw = params.get(name)
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise HttpError(400, "bad_request", f"query parameter {name!r} must be a non-negative "
                        "integer")
    return int(raw)


def _ttl_ns(lease: WorkerLease) -> int:
    return int((lease.ttl or 0) * NS)
