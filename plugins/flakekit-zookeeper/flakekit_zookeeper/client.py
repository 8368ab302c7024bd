"""One kazoo client per allocator: connecting, the negotiated session timeout, states."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from flakekit.errors import BackendError

__all__ = ["ZkConnection", "ZK_ERRORS"]

log = logging.getLogger("flakekit.zookeeper")

#: what a ZooKeeper call raises when the service cannot answer
ZK_ERRORS: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError, OSError)


class ZkConnection:
    """A started :class:`KazooClient` with the session facts the allocators need.

    ``negotiated_ms`` is the session timeout the server granted (it clamps the request
    to its ``[minSessionTimeout, maxSessionTimeout]``); deadlines must use the smaller of
    that and the request.
    """

    def __init__(self, hosts: str, session_timeout_s: float, connect_timeout_s: float,
                 retry_max_delay_s: float = 2.0) -> None:
        self.hosts = hosts
        self.requested_ms = int(session_timeout_s * 1000)
        self.connect_timeout_s = connect_timeout_s
        self.negotiated_ms: int | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
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
            except Exception:  # pragma: no cover
                pass
            return result

        conn._connect = _connect  # type: ignore[union-attr]

    def add_listener(self, fn: Callable[[str], None]) -> None:
        self._listeners.append(fn)

    def _on_state(self, state: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(state)
            except Exception:  # pragma: no cover - a listener must not break kazoo
                log.exception("zookeeper state listener failed")

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> KazooClient:
        """Connect within ``connect_timeout``; BackendError when ZooKeeper does not answer."""
        if self.client.connected:
            return self.client
        try:
            self.client.start(timeout=self.connect_timeout_s)
        except ZK_ERRORS as exc:
            raise BackendError(
                f"ZooKeeper at {self.hosts} did not answer within "
                f"{self.connect_timeout_s:g} s ({exc or type(exc).__name__}); is it running? "
                "(scripts/zookeeper.sh start)"
            ) from None
        return self.client

    def start_async(self) -> None:
        """Keep trying to connect in kazoo's own thread."""
        self.client.start_async()

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
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # pragma: no cover
            log.debug("closing the ZooKeeper client failed", exc_info=True)
