"""A client for ``flakekit serve``: IDs over HTTP from one or more nodes (standard library only).

:class:`Client` keeps keep-alive connections per node, and in cluster mode routes each
strict key to its owner by itself: it reads the view (``GET /api/v1/cluster``), computes
the owner with the published hash (:mod:`flakekit.values.owners`), sends its view epoch
(``X-Flakekit-View-Epoch``), follows a 421 to the owner the node names, waits out 503s
within ``retry_budget`` seconds, and refuses any answer whose ``X-Flakekit-Owner-Epoch``
is older than one it has seen for the key (the IDs could be out of order). Keys that are
not strict go to any node; for those a local buffer (``buffer=N``) hides the round trip.

The routing decisions live in :class:`Routing` (no I/O), shared with the asyncio client
(:mod:`flakekit.aio_client`).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import attrs

from flakekit.errors import (
    ClientConfigError,
    ClientConnectionError,
    ClientError,
    ClientRefusedError,
    ClientUnavailableError,
    StaleOwnerEpochError,
)
from flakekit.values.cluster import Member, View
from flakekit.values.owners import HASH_NAME, OwnerMap

__all__ = ["Client", "ClusterView", "NodeUrl", "Routing", "RoutingClient", "ViewRead", "parse_url"]

CLUSTER_PATH = "/api/v1/cluster"
GENERATORS_PATH = "/api/v1/generators"
VIEW_EPOCH = "X-Flakekit-View-Epoch"
OWNER_EPOCH = "x-flakekit-owner-epoch"   # answers' header names are compared lower-case
#: the default seconds one call may spend retrying: longer than the worst crash hand-off
#: of every bundled membership store with the default 10 s lease (docs/cluster.md,
#: "Hand-off windows": etcd's is the longest, about 25 s), so a call made when an owner
#: dies still gets its ID
DEFAULT_RETRY_BUDGET = 30.0
#: the longest a 503 with no (or a garbled) Retry-After waits before the next try
DEFAULT_RETRY_AFTER = 0.5
#: a node that refused a connection is tried last for this long
DOWN_FOR = 1.0
#: re-read the view at least this often (a 421 or a newer owner epoch re-reads it at once)
VIEW_MAX_AGE = 30.0
#: how many redirects (421) one call follows before it gives up
MAX_REDIRECTS = 8


@attrs.frozen
class NodeUrl:
    """A node's base URL, checked: ``http`` or ``https``, a host, a port."""

    scheme: str
    host: str
    port: int

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_url(url: object, where: str = "url") -> NodeUrl:
    """Check a node URL (``http://host:port``); a wrong one is a one-line ClientConfigError."""
    if not isinstance(url, str) or not url.strip():
        raise ClientConfigError(where, f"a node URL must be a non-empty string like "
                                f"'http://127.0.0.1:8080', got {url!r}")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ClientConfigError(where, f"{url!r} is not a valid URL ({exc}); use "
                                "'http://host:port'") from None
    if parts.scheme not in ("http", "https"):
        raise ClientConfigError(where, f"{url!r}: the scheme must be http or https, got "
                                f"{parts.scheme or '(none)'!r}; use 'http://host:port'")
    if not parts.hostname:
        raise ClientConfigError(where, f"{url!r} names no host; use 'http://host:port'")
    if parts.username or parts.password:
        raise ClientConfigError(where, f"{url!r}: credentials in the URL are not supported; "
                                "pass token= instead")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ClientConfigError(where, f"{url!r}: give only scheme://host:port (no path, query "
                                "or fragment): the client knows the API's paths")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    if not 1 <= port <= 65535:
        raise ClientConfigError(where, f"{url!r}: the port must be 1 to 65535, got {port}")
    return NodeUrl(parts.scheme, parts.hostname, port)


def check_options(timeout: float, retry_budget: float, buffer: int) -> None:
    for name, value in (("timeout", timeout), ("retry_budget", retry_budget)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                name == "timeout" and value == 0):
            raise ClientConfigError(name, f"must be a number of seconds "
                                    f"{'> 0' if name == 'timeout' else '>= 0'}, got {value!r}")
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        raise ClientConfigError("buffer", f"must be an integer >= 0 (IDs kept per key; 0: no "
                                f"buffer), got {buffer!r}")


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ClientConfigError("key", f"a key (generator name or segment key) must be a "
                                f"non-empty string, got {key!r}")
    return key


def check_count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ClientConfigError("n", f"must be an integer >= 1, got {n!r}")
    return n


@attrs.frozen
class ClusterView:
    """What ``GET /api/v1/cluster`` answered: the view, its hash, the advertised owners."""

    epoch: int
    hash: str
    members: tuple[Member, ...]
    owners: dict[str, str]   # strict key -> node, as the node published them
    states: dict[str, str]   # node -> state

    def owner_map(self) -> OwnerMap | None:
        """The owner map of the view (None: no member, or a hash this client does not know)."""
        if self.hash != HASH_NAME or not self.members:
            return None
        try:
            return OwnerMap(View("", self.epoch, self.members))
        except ValueError:
            return None


def parse_view(body: bytes, url: str) -> ClusterView:
    try:
        data = json.loads(body)
        members = []
        for raw in data["members"]:
            members.append(Member(str(raw["node"]), str(raw.get("advertise") or ""),
                                  int(raw.get("weight", 1))))
        owners = data.get("owners") or {}
        return ClusterView(int(data["epoch"]), str(data.get("hash", "")), tuple(members),
                           {str(k): str(v) for k, v in owners.items()},
                           {str(r["node"]): str(r.get("state", "")) for r in data["members"]})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ClientError(f"{url}{CLUSTER_PATH}: the cluster view is not the expected JSON "
                          f"({type(exc).__name__}: {exc})") from None


@attrs.frozen
class Plan:
    """One request to send: where, what, and for which key."""

    base: str
    path: str
    headers: dict[str, str]
    key: str
    count: int
    strict: bool
    leaf: bool


@attrs.frozen
class Retry:
    """Try again after ``delay`` s (re-reading the view first if ``refresh``); when the
    budget does not allow it, raise ``error``."""

    delay: float
    error: ClientError
    refresh: str | None = None   # re-read the view, from another node than this base ("": any)
    redirect: bool = False       # a 421 to another owner (counts toward MAX_REDIRECTS)


@attrs.frozen
class Done:
    ids: list[int]


class Routing:
    """The client's state and decisions, without I/O: which node gets a key, what an answer
    means (IDs, retry, or an error). Thread-safe (one lock around the small state)."""

    def __init__(self, urls: str | Iterable[str], *, timeout: float, retry_budget: float,
                 buffer: int, token: str | None = None) -> None:
        check_options(timeout, retry_budget, buffer)
        given = [urls] if isinstance(urls, str) else list(urls)
        if not given:
            raise ClientConfigError("urls", "give at least one node URL, like "
                                    "'http://127.0.0.1:8080'")
        self.nodes: dict[str, NodeUrl] = {}
        for i, url in enumerate(given):
            node = parse_url(url, f"urls[{i}]" if not isinstance(urls, str) else "urls")
            self.nodes.setdefault(node.base, node)
        self.given = list(self.nodes)
        self.timeout, self.retry_budget, self.buffer = float(timeout), float(retry_budget), buffer
        self.token = token
        self.lock = threading.Lock()
        self.view: ClusterView | None = None
        self.owner_map: OwnerMap | None = None
        self.view_read_at: float | None = None   # monotonic; None: never answered
        self.hints: dict[str, tuple[int, str]] = {}     # key -> (epoch, base) from a 421
        self.epochs: dict[str, int] = {}                # key -> highest owner epoch seen
        self.learned_strict: set[str] = set()           # answered with an owner epoch
        self.leaf_keys: set[str] = set()                # served only by the Leaf URL
        self.route_keys: dict[str, str] = {}            # generator name -> its segment key
        self.down: dict[str, float] = {}                # base -> monotonic until
        self._rr = 0

    # -- the view ---------------------------------------------------------------------------
    def view_due(self, now: float) -> bool:
        return self.view_read_at is None or now - self.view_read_at > VIEW_MAX_AGE

    def set_view(self, view: ClusterView | None, now: float) -> None:
        """A view read (None: the node has no cluster endpoint: no strict routing)."""
        with self.lock:
            self.view_read_at = now
            if view is None:
                self.view, self.owner_map = None, None
                return
            if self.view is not None and view.epoch < self.view.epoch:
                return   # a node behind the others: keep the newer view
            self.view, self.owner_map = view, view.owner_map()
            for member in view.members:
                try:
                    node = parse_url(member.advertise, "advertise")
                except ClientConfigError:
                    continue
                self.nodes.setdefault(node.base, node)
            self.hints = {k: h for k, h in self.hints.items() if h[0] >= view.epoch}

    def view_sources(self, refused: str | None) -> list[str]:
        """Nodes to read the view from, best first: ``refused`` (the node that just
        refused or redirected the request) last, since its view may be the stale one
        that named itself (issue 20)."""
        order = self.ordered()
        if refused and refused in self.nodes:
            order.remove(refused)
            order.append(refused)
        return order

    def set_route_keys(self, body: bytes) -> None:
        """``GET /api/v1/generators``: a segment generator is owned by its key (the
        biz_tag), not by its name: route the name by the key."""
        try:
            listed = json.loads(body)["generators"]
            keys = {str(g["name"]): str(g["key"]) for g in listed if g.get("key")}
        except (ValueError, KeyError, TypeError, AttributeError):
            return   # routing by name: a 421 corrects it
        with self.lock:
            self.route_keys = keys

    # -- routing ----------------------------------------------------------------------------
    def route_key(self, name: str) -> str:
        """What the owner map hashes for a requested name: a generator's key, else the name."""
        return self.route_keys.get(name, name)

    def is_strict(self, key: str) -> bool:
        view = self.view
        route = self.route_key(key)
        return route in self.learned_strict or (view is not None and route in view.owners)

    def ordered(self) -> list[str]:
        """Every known node, round-robin, the ones that refused recently last."""
        now = time.monotonic()
        with self.lock:
            bases = list(self.nodes)
            self._rr = (self._rr + 1) % len(bases)
            start = self._rr
            down = {b for b, until in self.down.items() if until > now}
        turn = bases[start:] + bases[:start]
        return [b for b in turn if b not in down] + [b for b in turn if b in down]

    def owner_base(self, key: str) -> str | None:
        """The base URL of the key's owner as this client knows it, or None."""
        view = self.view
        hint = self.hints.get(key)
        if hint is not None and (view is None or hint[0] >= view.epoch):
            return hint[1]
        if view is None:
            return None
        route = self.route_key(key)
        node = view.owners.get(route)
        if node is None and self.owner_map is not None:
            node = self.owner_map.owner(route).node
        member = next((m for m in view.members if m.node == node), None)
        if member is None:
            return None
        try:
            return parse_url(member.advertise, "advertise").base
        except ClientConfigError:
            return None

    def plan(self, key: str, count: int, tried: Sequence[str]) -> Plan:
        strict = self.is_strict(key)
        leaf = key in self.leaf_keys
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        base = self.owner_base(key) if strict else None
        if base is not None and self.view is not None:
            headers[VIEW_EPOCH] = str(self.view.epoch)
        if base is None:
            order = self.ordered()
            fresh = [b for b in order if b not in tried]
            base = (fresh or order)[0]
        name = quote(key, safe="")
        if leaf:
            path, count = f"/api/segment/get/{name}", 1
        else:
            path = f"/api/v1/next/{name}?count={count}&format=ranges"
        return Plan(base, path, headers, key, count, strict, leaf)

    # -- answers ----------------------------------------------------------------------------
    def on_connection_error(self, plan: Plan, exc: BaseException, tries: int) -> Retry:
        with self.lock:
            self.down[plan.base] = time.monotonic() + DOWN_FOR
        reason = _describe(exc)
        error = ClientConnectionError(f"{plan.base}: cannot reach the node ({reason})"
                                      + (f"; tried {tries} times" if tries > 1 else ""))
        # another node may serve a non-strict key at once; else back off (0.05 s .. 0.5 s)
        others = not plan.strict and tries < len(self.nodes)
        delay = 0.0 if others else min(0.05 * 2 ** min(tries, 4), 0.5)
        # a strict key's owner is gone: the view will name the new one once it moves
        return Retry(delay, error, refresh="" if plan.strict else None)

    def on_answer(self, plan: Plan, status: int, headers: dict[str, str], body: bytes,
                  now: float, tries: int = 1) -> Done | Retry:
        url = plan.base + plan.path.split("?", 1)[0]
        if status == 200:
            ids = self._ids(plan, url, body)
            self._check_epoch(plan, url, headers)
            return Done(ids)
        info = _error_info(body)
        code, message = info.get("error", ""), info.get("message", "") or _snippet(body)
        if status == 421:
            return self._redirect(plan, url, info, message)
        if status == 503:
            after = _retry_after(headers.get("retry-after"))
            error = ClientUnavailableError(
                f"{url}: 503 {code or 'unavailable'}: {message} (retried for up to "
                f"{self.retry_budget:g} s)", status=503, code=code, url=url)
            if not plan.strict and tries < len(self.nodes):
                with self.lock:   # another node may have IDs of the key now
                    self.down[plan.base] = now + min(after, DOWN_FOR)
                return Retry(0.0, error)
            return Retry(after, error, refresh=plan.base if plan.strict else None)
        if status == 404 and code == "unknown_generator" and not plan.leaf:
            with self.lock:
                self.leaf_keys.add(plan.key)   # a key of a keys = "all" table: Leaf's URL
            return Retry(0.0, ClientRefusedError(f"{url}: 404 {code}: {message}",
                                                 status=404, code=code, url=url))
        raise ClientRefusedError(f"{url}: {status} {code or 'error'}: {message}",
                                 status=status, code=code, url=url)

    def _redirect(self, plan: Plan, url: str, info: dict[str, Any], message: str) -> Retry:
        error = ClientRefusedError(f"{url}: 421 misdirected: the key moved more than "
                                   f"{MAX_REDIRECTS} times in a row; {message}",
                                   status=421, code="misdirected", url=url)
        try:
            epoch = int(info.get("epoch", 0))
            target = parse_url(info.get("advertise") or "", "advertise")
        except (ValueError, TypeError):
            return Retry(0.0, error, refresh=plan.base, redirect=True)   # the view says
        with self.lock:
            known = max(self.hints.get(plan.key, (0, ""))[0],
                        self.view.epoch if self.view is not None else 0)
            behind = epoch < known
            if not behind:
                self.nodes.setdefault(target.base, target)
                self.hints[plan.key] = (epoch, target.base)
            self.learned_strict.add(self.route_key(plan.key))
            unreachable = self.down.get(target.base, 0.0) > time.monotonic()
        if behind:
            # that node has not seen the view this client knows (views differ for up to a
            # renewal interval during a hand-off): keep the newer knowledge, wait a moment
            return Retry(0.05, ClientUnavailableError(
                f"{url}: the node answered with view epoch {epoch}, older than {known}; "
                f"the nodes have not agreed yet (retried for up to {self.retry_budget:g} s)",
                status=421, code="views_differ", url=url), refresh=plan.base)
        if unreachable:
            # the named owner just failed to answer (it crashed and the cluster has not
            # moved the key yet): wait within the budget, as for a 503, re-reading the view
            waiting = ClientUnavailableError(
                f"{url}: the key's owner {target.base} does not answer and the cluster has "
                f"not moved the key yet (retried for up to {self.retry_budget:g} s)",
                status=421, code="owner_unreachable", url=url)
            return Retry(0.25, waiting, refresh=plan.base)
        return Retry(0.0, error, refresh=plan.base, redirect=True)

    def _ids(self, plan: Plan, url: str, body: bytes) -> list[int]:
        try:
            if plan.leaf:
                return [int(body.strip())]
            data = json.loads(body)
            ids: list[int] = []
            for r in data["ranges"]:
                ids.extend(range(int(r["start"]), int(r["stop"]), int(r["step"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"{url}: the answer is not the expected ID list "
                              f"({type(exc).__name__}: {_snippet(body)})") from None
        if len(ids) != plan.count:
            raise ClientError(f"{url}: asked for {plan.count} IDs, got {len(ids)}")
        return ids

    def _check_epoch(self, plan: Plan, url: str, headers: dict[str, str]) -> None:
        raw = headers.get(OWNER_EPOCH)
        if raw is None:
            return
        try:
            epoch = int(raw)
        except ValueError:
            raise ClientError(f"{url}: {OWNER_EPOCH} is not an integer: {raw[:40]!r}; IDs "
                              "dropped") from None
        route = self.route_key(plan.key)
        with self.lock:
            seen = self.epochs.get(route, 0)
            if epoch < seen:
                raise StaleOwnerEpochError(
                    f"{url}: answered key {route!r} from owner epoch {epoch}, older than "
                    f"epoch {seen} already seen: its IDs were dropped (they may be out of "
                    "order); retry", key=route, epoch=epoch, seen=seen)
            self.epochs[route] = epoch
            self.learned_strict.add(route)
            if self.view is not None and epoch > self.view.epoch:
                self.view_read_at = -VIEW_MAX_AGE * 2   # a newer epoch exists: re-read soon


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: is `flakekit serve` running there?"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror or exc}"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _error_info(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _snippet(body: bytes) -> str:
    text = body[:200].decode("utf-8", errors="replace").strip().replace("\n", " ")
    return text or "(empty body)"


def _retry_after(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_RETRY_AFTER
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_RETRY_AFTER   # an HTTP date: not worth a parser here
    return min(max(value, 0.0), 60.0)


# -- the synchronous client ------------------------------------------------------------------------
CONNECTION_ERRORS = (OSError, http.client.HTTPException)


class Attempts:
    """One call's retries, without I/O (``Client`` and ``AsyncClient`` drive it alike): the
    next node to try, and whether another try fits ``retry_budget`` and ``MAX_REDIRECTS``."""

    def __init__(self, routing: Routing, key: str, count: int, now: float) -> None:
        self.routing, self.key, self.count = routing, key, count
        self.deadline = now + routing.retry_budget
        self.tried: list[str] = []
        self.redirects = 0

    def next(self) -> Plan:
        plan = self.routing.plan(self.key, self.count, self.tried)
        self.tried.append(plan.base)
        return plan

    def settle(self, plan: Plan, answer: Answer, now: float) -> Done | Retry:
        """What ``answer`` (a reply, or the connection error) means: the IDs, or a retry to
        wait for; raises the retry's error when the redirects or the budget are spent."""
        if isinstance(answer, BaseException):
            step: Done | Retry = self.routing.on_connection_error(plan, answer, len(self.tried))
        else:
            step = self.routing.on_answer(plan, *answer, now, len(self.tried))
        if isinstance(step, Done):
            return step
        if step.redirect:
            self.redirects += 1
            if self.redirects > MAX_REDIRECTS:
                raise step.error
        if now + step.delay > self.deadline:
            raise step.error
        return step


#: what a request got: ``(status, headers, body)``, or the connection error
Answer = tuple[int, dict[str, str], bytes] | BaseException
#: a request to send: ``(base, path, headers)``
Request = tuple[str, str, dict[str, str]]


class ViewRead:
    """Reading the cluster view, without I/O (``Client`` and ``AsyncClient`` drive it
    alike): iterate for the requests to send and hand each one's answer to
    :meth:`answer`. The first node that answers 200 gives the view (and the generators'
    route keys); a 404 says the nodes are no cluster; when no node answers, the view
    read before stays (the request itself will say why)."""

    def __init__(self, routing: Routing, prefer: str | None) -> None:
        self.routing, self.prefer = routing, prefer
        self._answer: Answer | None = None

    def answer(self, answer: Answer) -> None:
        self._answer = answer

    def __iter__(self) -> Iterator[Request]:
        routing = self.routing
        for base in routing.view_sources(self.prefer):
            yield base, CLUSTER_PATH, {"Accept": "application/json"}
            status, body = self._take()
            if status == 200:
                view = parse_view(body, base)
                yield base, GENERATORS_PATH, {}
                status, listed = self._take()
                if status == 200:
                    routing.set_route_keys(listed)
                routing.set_view(view, time.monotonic())
                return
            if status == 404:
                routing.set_view(None, time.monotonic())
                return

    def _take(self) -> tuple[int, bytes]:
        """The last answer's status and body (status 0: no answer)."""
        answer, self._answer = self._answer, None
        if answer is None or isinstance(answer, BaseException):
            return 0, b""
        return answer[0], answer[2]


class _Pool:
    """Idle keep-alive connections to one node (a request takes one, gives it back)."""

    def __init__(self, node: NodeUrl, timeout: float) -> None:
        self.node, self.timeout = node, timeout
        self.idle: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def take(self, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        with self.lock:
            if self.idle and not fresh:
                return self.idle.pop(), True
        cls = (http.client.HTTPSConnection if self.node.scheme == "https"
               else http.client.HTTPConnection)
        return cls(self.node.host, self.node.port, timeout=self.timeout), False

    def give(self, conn: http.client.HTTPConnection) -> None:
        with self.lock:
            self.idle.append(conn)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


@attrs.define
class _Buffer:
    ids: deque[int] = attrs.field(factory=deque)
    filling: bool = False
    cond: threading.Condition = attrs.field(factory=threading.Condition)


class RoutingClient:
    """What :class:`Client` and :class:`~flakekit.aio_client.AsyncClient` share: the
    arguments, checked into a :class:`Routing`; each adds its I/O state (``_init_io``)."""

    def __init__(self, urls: str | Iterable[str], *, timeout: float = 5.0,
                 retry_budget: float = DEFAULT_RETRY_BUDGET, buffer: int = 0,
                 token: str | None = None) -> None:
        self.routing = Routing(urls, timeout=timeout, retry_budget=retry_budget, buffer=buffer,
                               token=token)
        self._closed = False
        self._init_io()

    _buffers: dict[str, Any]   # key -> its buffered IDs (each client keeps its own kind)

    def _init_io(self) -> None:
        raise NotImplementedError

    def _attempts(self, key: str, n: int) -> Attempts:
        """The attempts of one call for ``n`` IDs of ``key`` (ClientError once closed)."""
        if self._closed:
            raise ClientError(f"the client is closed; make a new {type(self).__name__}")
        return Attempts(self.routing, key, n, time.monotonic())

    def _learned_strict(self, key: str) -> bool:
        """Whether ``key`` is strict as far as this client knows; a strict key's buffer
        is dropped (buffered IDs would break its order)."""
        if self.routing.is_strict(key):
            self._buffers.pop(key, None)
            return True
        return False


class Client(RoutingClient):
    """IDs from ``flakekit serve`` nodes (thread-safe).

    Args:
        urls: one node URL (``"http://127.0.0.1:8080"``) or several.
        timeout: seconds one request may take (connect, then each read).
        retry_budget: seconds a call may spend retrying (503s, refused connections,
            redirects) before it raises.
        buffer: keep up to this many IDs per non-strict key in memory, fetched in
            batches (0: every call is a request). Strict keys are never buffered.
        token: sent as ``Authorization: Bearer TOKEN``.
    """

    def _init_io(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self._buffers: dict[str, _Buffer] = {}
        self._lock = threading.Lock()
        self._view_lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    # -- the API -----------------------------------------------------------------------------
    def next_id(self, key: str) -> int:
        """One ID of ``key`` (a generator name, or a segment key the server serves)."""
        check_key(key)
        if self.routing.buffer and not self._strict(key):
            return self._buffered(key)
        return self._fetch(key, 1)[0]

    def next_ids(self, key: str, n: int) -> list[int]:
        """``n`` IDs of ``key`` in one request (a Leaf-only key: one request per ID)."""
        check_key(key)
        return self._fetch(key, check_count(n))

    def view(self) -> ClusterView | None:
        """The cluster view as last read (reads it now if never read); None: not a cluster."""
        if self.routing.view_read_at is None:
            self._refresh_view(None)
        return self.routing.view

    def close(self) -> None:
        """Close every connection; buffered IDs are dropped (gaps, never reuse)."""
        self._closed = True
        for thread in list(self._threads):
            thread.join(self.routing.timeout)
        with self._lock:
            pools, self._pools = self._pools, {}
            self._buffers.clear()
        for pool in pools.values():
            pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- buffer ------------------------------------------------------------------------------
    def _strict(self, key: str) -> bool:
        if self.routing.view_due(time.monotonic()):
            self._refresh_view(None)
        return self._learned_strict(key)

    def _buffered(self, key: str) -> int:
        size = self.routing.buffer
        with self._lock:
            buf = self._buffers.setdefault(key, _Buffer())
        low = max(1, size // 5)
        with buf.cond:
            while True:
                if buf.ids:
                    value = buf.ids.popleft()
                    if len(buf.ids) < low and not buf.filling and not self._closed:
                        buf.filling = True
                        self._spawn(key, buf, size)
                    return value
                if not buf.filling:
                    buf.filling = True
                    break
                buf.cond.wait(self.routing.timeout + self.routing.retry_budget)
        try:
            ids = self._fetch(key, size)
        except BaseException:
            with buf.cond:
                buf.filling = False
                buf.cond.notify_all()
            raise
        with buf.cond:
            buf.ids.extend(ids[1:])
            buf.filling = False
            buf.cond.notify_all()
        return ids[0]

    def _spawn(self, key: str, buf: _Buffer, size: int) -> None:
        def refill() -> None:
            ids: list[int] = []
            try:
                ids = self._fetch(key, size)
            except Exception:  # noqa: BLE001 - the next call on an empty buffer fetches and raises
                pass
            finally:
                with buf.cond:
                    if ids and not self._closed and not self.routing.is_strict(key):
                        buf.ids.extend(ids)
                    buf.filling = False
                    buf.cond.notify_all()
                self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=refill, name=f"flakekit-client-refill-{key}", daemon=True)
        self._threads.add(thread)
        thread.start()

    # -- requests ----------------------------------------------------------------------------
    def _fetch(self, key: str, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += self._call(key, n - len(out))
        return out

    def _call(self, key: str, n: int) -> list[int]:
        attempts = self._attempts(key, n)
        if self.routing.view_due(time.monotonic()):
            self._refresh_view(None)
        while True:
            plan = attempts.next()
            step = attempts.settle(plan, self._exchange(plan.base, plan.path, plan.headers),
                                   time.monotonic())
            if isinstance(step, Done):
                return step.ids
            if step.delay:
                time.sleep(step.delay)
            if step.refresh is not None:
                self._refresh_view(step.refresh or None)

    def _refresh_view(self, prefer: str | None) -> None:
        """Read the view; threads arriving meanwhile use that read instead of their own."""
        routing = self.routing
        before = routing.view_read_at
        with self._view_lock:
            if routing.view_read_at != before:
                return   # another thread read it while this one waited
            self._read_view(prefer)

    def _read_view(self, prefer: str | None) -> None:
        read = ViewRead(self.routing, prefer)
        for request in read:
            read.answer(self._exchange(*request))

    def _exchange(self, base: str, path: str, headers: dict[str, str]) -> Answer:
        """``_send``, with a connection error as the answer instead of raised."""
        try:
            return self._send(base, path, headers)
        except CONNECTION_ERRORS as exc:
            return exc

    def _pool(self, base: str) -> _Pool:
        pool = self._pools.get(base)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(base, _Pool(self.routing.nodes[base],
                                                          self.routing.timeout))
        return pool

    def _send(self, base: str, path: str, headers: dict[str, str]
              ) -> tuple[int, dict[str, str], bytes]:
        pool = self._pool(base)
        for again in (False, True):
            conn, reused = pool.take(fresh=again)
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
            except CONNECTION_ERRORS as exc:
                conn.close()
                # a kept-alive connection the server closed meanwhile: once more, on a new one
                if reused and not isinstance(exc, TimeoutError):
                    continue
                raise
            answer = {k.lower(): v for k, v in resp.getheaders()}
            if resp.will_close or self._closed:
                conn.close()
            else:
                pool.give(conn)
            return resp.status, answer, body
        raise AssertionError("unreachable")  # pragma: no cover - the fresh try raises
