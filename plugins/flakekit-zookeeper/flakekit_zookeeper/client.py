"""One kazoo client per allocator: connecting, the negotiated session timeout, states."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, KazooException
from kazoo.handlers.threading import KazooTimeoutError

from flakekit.plugin import BackendError

__all__ = ["ZkConnection", "ZK_ERRORS", "start_held"]

log = logging.getLogger("flakekit.zookeeper")

#: what a ZooKeeper call raises when the service cannot answer
ZK_ERRORS: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError, OSError)


class ZkConnection:
    """A started :class:`KazooClient` with the session facts the allocators need.

    ``negotiated_ms`` is the session timeout the server granted (it clamps the request
    to its ``[minSessionTimeout, maxSessionTimeout]``); deadlines must use the smaller of
    that and the request.

    Once started, kazoo reconnects by itself (to the same session while it lives, else
    to a new one): :meth:`start` then only waits for that, because calling kazoo's
    ``start()`` on a reconnecting client blocks. Every call goes through :meth:`call`,
    which never waits longer than ``op_timeout_s``: kazoo queues a request made while
    disconnected until it reconnects, which may be never.
    """

    def __init__(self, hosts: str, session_timeout_s: float, connect_timeout_s: float,
                 retry_max_delay_s: float | None = None) -> None:
        self.hosts = hosts
        self.requested_ms = int(session_timeout_s * 1000)
        self.connect_timeout_s = connect_timeout_s
        self.negotiated_ms: int | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._up = threading.Event()   # CONNECTED now
        self._started = False          # kazoo's connection loop runs (it retries forever)
        self._closed = False
        if retry_max_delay_s is None:
            # retry often enough that a blip shorter than the session keeps the session
            retry_max_delay_s = min(2.0, max(0.1, session_timeout_s / 10))
        self.client = KazooClient(
            hosts=hosts, timeout=session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2,
                              "max_delay": retry_max_delay_s},
            command_retry=None,
        )
        self._wrap_connect()
        self.client.add_listener(self._on_state)

    def _wrap_connect(self) -> None:
        # kazoo keeps the negotiated timeout in a local variable; its connection
        # handler's _connect returns read_timeout = negotiated * 2/3 (ms).
        conn = getattr(self.client, "_connection", None)
        original = getattr(conn, "_connect", None)
        if original is None:  # pragma: no cover - other kazoo versions
            log.warning("kazoo internals changed: assuming the requested session timeout")
            return

        def _connect(*args: object) -> object:
            result = original(*args)
            try:
                self.negotiated_ms = int(round(result[0] * 1.5))  # type: ignore[index]
            except (TypeError, IndexError, ValueError):  # pragma: no cover - kazoo changed
                pass
            return result

        conn._connect = _connect  # type: ignore[union-attr]

    def add_listener(self, fn: Callable[[str], None]) -> None:
        self._listeners.append(fn)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._up.set()
        else:
            self._up.clear()
        for fn in list(self._listeners):
            try:
                fn(state)
            except Exception:  # pragma: no cover - a listener must not break kazoo
                log.exception("zookeeper state listener failed")

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> KazooClient:
        """Connect within ``connect_timeout``; BackendError when ZooKeeper does not answer.

        A client that was started and is reconnecting is only waited for (kazoo's own
        ``start()`` would try to stop its running connection loop and hang)."""
        if self.client.connected:
            return self.client
        if self._closed:
            raise BackendError(f"the ZooKeeper client for {self.hosts} was closed")
        if self._started:
            if not self._up.wait(self.connect_timeout_s) or not self.client.connected:
                raise BackendError(
                    f"ZooKeeper at {self.hosts} is {self.client.state}: not reconnected "
                    f"within {self.connect_timeout_s:g} s; kazoo keeps trying")
            return self.client
        self._started = True
        try:
            self.client.start(timeout=self.connect_timeout_s)
        except ZK_ERRORS as exc:
            self._started = False   # kazoo stopped and closed it
            raise BackendError(
                f"ZooKeeper at {self.hosts} did not answer within "
                f"{self.connect_timeout_s:g} s ({exc or type(exc).__name__}); is it running? "
                "(scripts/zookeeper.sh start)"
            ) from None
        return self.client

    def call(self, method: str, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        """``client.<method>_async(...)``, waited for at most ``timeout`` (default:
        ``connect_timeout``). A call made while disconnected fails at once with
        ConnectionLoss instead of being queued until kazoo reconnects."""
        if not self.connected:
            raise ConnectionLoss(f"ZooKeeper connection is {self.client.state}")
        result = getattr(self.client, f"{method}_async")(*args, **kw)
        return result.get(timeout=self.connect_timeout_s if timeout is None else timeout)

    def commit(self, tx: Any, timeout: float | None = None) -> list[Any]:
        """A transaction's results (errors are returned, not raised), bounded like call."""
        if not self.connected:
            raise ConnectionLoss(f"ZooKeeper connection is {self.client.state}")
        return tx.commit_async().get(
            timeout=self.connect_timeout_s if timeout is None else timeout)

    @property
    def connected(self) -> bool:
        return self.client.state == KazooState.CONNECTED

    @property
    def session_id(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None

    def session_ms(self) -> int:
        """The session timeout to plan with: the smaller of requested and granted."""
        if self.negotiated_ms is None:
            return self.requested_ms
        return min(self.requested_ms, self.negotiated_ms)

    def close(self) -> None:
        """Stop kazoo (safe from any thread, while another call is in flight)."""
        self._closed = True
        self._up.clear()
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # pragma: no cover
            log.debug("closing the ZooKeeper client failed", exc_info=True)


def start_held(holder: Any, attr: str, make: Callable[[], ZkConnection]) -> ZkConnection:
    """The started connection ``holder`` keeps in ``attr`` (``make()`` when it has none).
    One that does not start (BackendError) is closed and forgotten, so the next call
    makes a new one (the lease allocators: a new session rather than a stuck one)."""
    conn = getattr(holder, attr)
    if conn is None:
        conn = make()
        setattr(holder, attr, conn)
    try:
        conn.start()
    except BackendError:
        if getattr(holder, attr) is conn:
            setattr(holder, attr, None)
        conn.close()
        raise
    return conn
