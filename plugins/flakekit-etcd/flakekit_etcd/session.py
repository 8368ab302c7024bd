"""One etcd lease per process: the HTTP clients of the endpoints, the lease, and the
calls made on its behalf, shared by every :class:`~flakekit_etcd.store.EtcdStore` of the
process with the same endpoints, TTL and credentials.

Each allocator's store attaches on ``connect`` and detaches on ``close``; the lease is
granted by the first and revoked when the last one detaches. A lease that is lost
(keep-alive answering TTL <= 0, ``lease not found``) is LOST for every attached store at
once; the next ``connect`` grants a new one. Per process means per pid: a forked child
never shares its parent's lease.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import etcd3gw
import requests

from flakekit.plugin import BackendError, KvState, LeaseLostError
from flakekit_etcd.endpoints import parse_endpoints
from flakekit_etcd.errors import EtcdAuthError, EtcdVersionError

__all__ = ["EtcdSession", "session_for"]

log = logging.getLogger("flakekit.etcd")

#: phrases of etcd's auth errors (the gateway answers 400/401/403 with them)
_AUTH = ("user name is empty", "invalid auth token", "permission denied",
         "authentication failed", "auth: revision in header is old", "user name not found",
         "invalid user id or password")

_SESSIONS: dict[tuple[Any, ...], EtcdSession] = {}
_SESSIONS_LOCK = threading.Lock()


def session_for(endpoints: str, ttl_s: int, connect_timeout_s: float,
                username: str | None, password: str | None) -> EtcdSession:
    """This process's session for these settings (made on first use)."""
    key = (os.getpid(), endpoints, ttl_s, connect_timeout_s, username, password)
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = EtcdSession(endpoints, ttl_s, connect_timeout_s,
                                                   username=username, password=password)
        return session


class EtcdSession:
    """The lease and the HTTP clients (see the module docstring)."""

    def __init__(self, endpoints: str, ttl_s: int, connect_timeout_s: float, *,
                 username: str | None = None, password: str | None = None) -> None:
        self.endpoints = endpoints
        self.where = f"etcd at {endpoints}"
        self.ttl_s = ttl_s
        self.connect_timeout_s = connect_timeout_s
        self.username, self.password = username, password
        self.targets = parse_endpoints(endpoints)
        self._clients = [etcd3gw.client(host=h, port=p, protocol=proto,
                                        timeout=connect_timeout_s, api_path="/v3/")
                         for h, p, proto in self.targets]
        self.current = 0
        self._checked = False           # the version was read (the v3 API is there)
        self.token: str | None = None
        self.lease: int | None = None
        self.granted_ms = ttl_s * 1000
        self.state = KvState.CLOSED
        self._failing = False
        self._attached: list[Callable[[str], None]] = []
        self._lock = threading.RLock()
        #: the last lease keepalive's answer (TTL seconds), for tests
        self.last_ttl: int | None = None

    def _url(self, i: int, path: str) -> str:
        return f"{self._clients[i].base_url}/v3/{path}"

    def _post(self, path: str, payload: dict[str, Any], timeout: float | None = None,
              *, auth: bool = True) -> dict[str, Any]:
        """POST to the current endpoint, moving on to the next ones when one refuses the
        connection or answers 5xx, all within ``timeout``."""
        budget = self.connect_timeout_s if timeout is None else timeout
        end = time.monotonic() + budget
        n = len(self._clients)
        problem = ""
        for k in range(n):
            i = (self.current + k) % n
            left = end - time.monotonic()
            if left <= 0:
                break
            headers = {"Authorization": self.token} if auth and self.token else {}
            try:
                resp = self._clients[i].session.post(self._url(i, path), json=payload,
                                                     headers=headers, timeout=left)
            except requests.exceptions.Timeout:
                self.current = (i + 1) % n   # next call tries another member first
                raise BackendError(f"{self.where}: {self._name(i)} did not answer "
                                   f"{path} within {budget:g} s") from None
            except requests.exceptions.ConnectionError as exc:
                problem = f"{self._name(i)}: cannot connect ({_reason(exc)})"
                continue
            if resp.status_code >= 500:
                problem = f"{self._name(i)}: {resp.status_code} {_message(resp)}"
                continue
            self.current = i
            if resp.status_code == 200:
                try:
                    body: dict[str, Any] = resp.json()
                except ValueError:
                    raise EtcdVersionError(self._not_v3(i, resp)) from None
                return body
            self._raise_for(i, path, resp)
        raise BackendError(f"{self.where} did not answer: {problem or 'timed out'}; is it "
                           "running? (scripts/etcd.sh start)")

    def _name(self, i: int) -> str:
        host, port, _ = self.targets[i]
        return f"{host}:{port}"

    def _not_v3(self, i: int, resp: requests.Response) -> str:
        return (f"{self._name(i)} does not serve etcd's v3 API (HTTP {resp.status_code} "
                f"{_message(resp)!r}); flakekit needs etcd 3.4 or newer, and endpoints "
                "must be its client URLs (port 2379)")

    def _raise_for(self, i: int, path: str, resp: requests.Response) -> None:
        msg = _message(resp)
        low = msg.lower()
        if any(p in low for p in _AUTH) or resp.status_code in (401, 403):
            hint = ("set username and password" if not self.username
                    else "check username and password")
            raise EtcdAuthError(f"{self.where}: authentication failed ({msg}); {hint}")
        if "lease not found" in low:
            raise LeaseLostError(f"the etcd lease {self._hex(self.lease)} is gone ({msg})")
        if resp.status_code == 404 and "etcdserver" not in low:
            raise EtcdVersionError(self._not_v3(i, resp))
        raise BackendError(f"{self.where}: {path} failed: {resp.status_code} {msg}")

    @staticmethod
    def _hex(lease: int | None) -> str:
        return f"0x{lease or 0:x}"

    # -- session ---------------------------------------------------------------------------
    def _check_version(self) -> None:
        """GET /version: an etcd whose cluster speaks 3.4+ (the /v3/ gateway)."""
        problem = ""
        for i, client in enumerate(self._clients):
            try:
                resp = client.session.get(f"{client.base_url}/version",
                                          timeout=self.connect_timeout_s)
            except requests.exceptions.RequestException as exc:
                problem = f"{self._name(i)}: cannot connect ({_reason(exc)})"
                continue
            try:
                info = resp.json()
                server = str(info["etcdserver"])
                cluster = str(info.get("etcdcluster") or server)
            except (ValueError, KeyError, TypeError):
                raise EtcdVersionError(self._not_v3(i, resp)) from None
            try:
                major, minor = (int(x) for x in cluster.split(".")[:2])
            except ValueError:
                raise EtcdVersionError(f"{self._name(i)}: unreadable etcd version "
                                       f"{cluster!r}") from None
            if (major, minor) < (3, 4):
                raise EtcdVersionError(
                    f"{self._name(i)} runs etcd {server} (cluster version {cluster}); the "
                    "etcd allocator needs the v3 API of etcd 3.4 or newer")
            self.current = i
            self._checked = True
            return
        raise BackendError(f"{self.where} did not answer: {problem}; is it running? "
                           "(scripts/etcd.sh start)")

    def _authenticate(self) -> None:
        if not self.username:
            return
        body = self._post("auth/authenticate",
                          {"name": self.username, "password": self.password or ""},
                          auth=False)
        token = body.get("token")
        if not token:
            raise EtcdAuthError(f"{self.where}: authentication gave no token; is auth "
                                "enabled (etcdctl auth enable)?")
        self.token = str(token)

    def attach(self, listener: Callable[[str], None]) -> None:
        """A store's ``connect``: grant a lease unless a live one is there."""
        with self._lock:
            if self.state == KvState.CONNECTED and self.lease is not None \
                    and listener not in self._attached:
                try:   # a newcomer never inherits a lease that ended unnoticed
                    self.keepalive()
                except LeaseLostError:
                    pass   # LOST told to the stores on it; a new lease below
            if self.state != KvState.CONNECTED or self.lease is None:
                if not self._checked:
                    self._check_version()
                self._authenticate()
                body = self._post("lease/grant", {"TTL": self.ttl_s, "ID": 0})
                self.lease = int(body["ID"])
                self.granted_ms = int(body.get("TTL", self.ttl_s)) * 1000
                self.state = KvState.CONNECTED
                self._failing = False
                log.debug("etcd lease %s granted, TTL %d ms", self._hex(self.lease),
                          self.granted_ms)
            if listener not in self._attached:
                self._attached.append(listener)

    def attached(self, listener: Callable[[str], None]) -> bool:
        return listener in self._attached

    def detach(self, listener: Callable[[str], None]) -> None:
        """A store's ``close``: the last one out revokes the lease (its keys go at once)."""
        with self._lock:
            if listener in self._attached:
                self._attached.remove(listener)
            if self._attached:
                return
            lease, self.lease = self.lease, None
            was, self.state = self.state, KvState.CLOSED
        if lease is not None and was == KvState.CONNECTED:
            try:
                self._post("lease/revoke", {"ID": lease},
                           timeout=min(1.0, self.connect_timeout_s))
            except (BackendError, LeaseLostError) as exc:
                log.debug("revoking etcd lease %s: %s (it expires by itself)",
                          self._hex(lease), exc)

    def _tell(self, state: str) -> None:
        for listener in list(self._attached):
            try:
                listener(state)
            except Exception:  # pragma: no cover - a listener must not break a call
                log.exception("etcd state listener failed")

    def lost(self, why: str, lease: int | None) -> LeaseLostError:
        """The lease ``lease`` is gone: LOST for every store on it (once)."""
        with self._lock:
            fire = self.state == KvState.CONNECTED and lease == self.lease
            if fire:
                self.state = KvState.LOST
        if fire:
            self._tell(KvState.LOST)
        return LeaseLostError(why)

    def call(self, path: str, payload: dict[str, Any],
             timeout: float | None = None) -> dict[str, Any]:
        """A call on the lease's behalf: failures are reported (SUSPENDED once), the
        first success after them too (CONNECTED: renew now)."""
        lease = self.lease
        if self.state != KvState.CONNECTED:
            raise BackendError(f"{self.where}: the lease is {self.state}")
        try:
            body = self._post(path, payload, timeout)
        except LeaseLostError as exc:
            raise self.lost(str(exc), lease) from None
        except EtcdAuthError as exc:
            if self.token is None or "invalid auth token" not in str(exc).lower():
                raise
            self._authenticate()   # the simple token expired: one more try
            body = self._post(path, payload, timeout)
        except BackendError:
            if not self._failing:
                self._failing = True
                self._tell(KvState.SUSPENDED)
            raise
        if self._failing:
            self._failing = False
            self._tell(KvState.CONNECTED)
        return body

    def keepalive(self, timeout: float | None = None) -> None:
        """One ``lease keepalive``; TTL <= 0 (or none) in the answer: LOST at once."""
        lease = self.lease
        body = self.call("lease/keepalive", {"ID": lease}, timeout)
        ttl = int((body.get("result") or {}).get("TTL", -1))
        self.last_ttl = ttl
        if ttl <= 0:
            raise self.lost(f"the etcd lease {self._hex(lease)} expired or was revoked "
                            "(keepalive answered TTL <= 0)", lease)
        self.granted_ms = min(self.granted_ms, ttl * 1000)

    def request(self, path: str, payload: dict[str, Any],
                timeout: float | None = None) -> dict[str, Any]:
        """A plain call, on behalf of no lease of this session (the cluster membership's
        transport): the v3 API is checked and the credentials presented on first use; the
        endpoints are tried in turn as for every call; an expired auth token is renewed
        once."""
        if not self._checked:
            self._check_version()
        if self.username and self.token is None:
            self._authenticate()
        try:
            return self._post(path, payload, timeout)
        except EtcdAuthError as exc:
            if self.token is None or "invalid auth token" not in str(exc).lower():
                raise
            self._authenticate()
            return self._post(path, payload, timeout)

    def close_clients(self) -> None:
        """Close the HTTP sessions (a session made for one owner, not shared)."""
        for client in self._clients:
            try:
                client.session.close()
            except Exception:  # pragma: no cover - closing sockets only
                log.debug("closing an etcd HTTP session failed", exc_info=True)

    def time_to_live(self, lease: int, timeout: float | None = None) -> int:
        """Seconds left on ``lease`` (-1: gone), for ``flakekit workers``."""
        body = self._post("lease/timetolive", {"ID": lease}, timeout)
        return int(body.get("TTL", -1))

    def client_for_watch(self) -> Any:
        """A client of its own (its own HTTP session) on the current endpoint."""
        host, port, proto = self.targets[self.current]
        client = etcd3gw.client(host=host, port=port, protocol=proto,
                                timeout=self.connect_timeout_s, api_path="/v3/")
        if self.token:
            client.session.headers["Authorization"] = self.token
        return client


def _message(resp: requests.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("message") or body.get("error") or body)[:200]
    except ValueError:
        return (resp.text or resp.reason or "").strip().splitlines()[0][:200] \
            if (resp.text or resp.reason) else ""


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known",
                   "No route to host", "timed out", "Connection reset"):
        if marker in text:
            return marker
    return type(exc).__name__

