"""A loopback TCP fault proxy for drills: cut a server off, slow it down, or stall it."""

from __future__ import annotations

import select
import socket
import threading
import time

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to <target_host>:<target_port> (loopback by default).

    ``cut()`` drops every connection and refuses new ones (a dead network path);
    ``restore()`` lets connections through again; ``stall()`` keeps every connection open
    but forwards nothing, like a network that drops packets (``unstall()`` ends it);
    ``delay_s`` adds latency to each chunk sent towards the server (so each query round
    trip gets slower by about that much).

    ``stall_at(b"COMMIT")`` arms a one-shot partition of a single connection: the first
    client chunk that contains the marker is dropped (``forward=True``: delivered), and
    from then on that connection forwards nothing either way, while its server-side
    session stays open -- a peer cut off inside its transaction, as after a partition.
    Other connections keep flowing; ``marker_hit`` is set when it happened.
    ``stall_at(b"COMMIT", hold_s=2.0)`` instead holds that one chunk for ``hold_s`` and
    then delivers it, the connection flowing on: a COMMIT that arrives late.
    """

    def __init__(self, target_port: int, delay_s: float = 0.0,
                 target_host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.target_host = target_host
        self.delay_s = delay_s
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._cut = False
        self._stalled = False
        self._stopped = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._forward_marker = False
        self._hold_s: float | None = None
        self.marker_hit = threading.Event()

    @classmethod
    def in_front_of(cls, hosts: str) -> TcpProxy:
        """A started proxy for the first ``host:port`` of ``hosts`` (a ZooKeeper
        connect string, say); connect to :attr:`address` instead."""
        host, _, port = hosts.split(",")[0].rpartition(":")
        proxy = cls(int(port), target_host=host or "127.0.0.1")
        proxy.start()
        return proxy

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: where clients connect."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept_loop, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self.cut()
        self._listener.close()

    def cut(self) -> None:
        """Drop every open connection and refuse new ones."""
        self._cut = True
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def restore(self) -> None:
        self._cut = False

    def stall(self) -> None:
        """Forward nothing (data is dropped), but keep the connections open."""
        self._stalled = True

    def unstall(self) -> None:
        self._stalled = False

    def stall_at(self, marker: bytes, forward: bool = False,
                 hold_s: float | None = None) -> None:
        """Partition the connection whose client next sends ``marker``, or with
        ``hold_s`` deliver that chunk late (see the class)."""
        self.marker_hit.clear()
        self._forward_marker = forward
        self._hold_s = hold_s
        self._marker = marker

    def _hits_marker(self, data: bytes) -> bool:
        """True (once) when ``data`` from a client carries the armed marker."""
        with self._lock:
            if self._marker is None or self._marker not in data:
                return False
            self._marker = None
        self.marker_hit.set()
        return True

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                client.close()
                continue
            try:
                server = socket.create_connection((self.target_host, self.target_port),
                                                  timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        pair = {client: server, server: client}
        partitioned = False
        try:
            while not self._cut:
                ready, _, _ = select.select(list(pair), [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        if partitioned and len(pair) > 1:  # the other side must not notice
                            del pair[sock]
                            continue
                        return
                    if partitioned or self._stalled:
                        continue
                    if sock is client and self._hits_marker(data):
                        if self._hold_s is not None:
                            time.sleep(self._hold_s)
                            server.sendall(data)
                            continue
                        partitioned = True
                        if self._forward_marker:
                            server.sendall(data)
                        continue
                    if sock is client and self.delay_s:
                        time.sleep(self.delay_s)
                    pair[sock].sendall(data)
        except (OSError, ValueError):  # ValueError: select() on a socket cut() closed
            pass
        finally:
            for sock in (client, server):
                try:
                    sock.close()
                except OSError:
                    pass
