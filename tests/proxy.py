"""A loopback TCP proxy for fault drills: cut the database off, or slow it down."""

from __future__ import annotations

import select
import socket
import threading
import time


class TcpProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target_port>.

    ``cut()`` drops every connection and refuses new ones (a dead network path);
    ``restore()`` lets connections through again; ``stall()`` keeps every connection open
    but forwards nothing, like a network that drops packets (``unstall()`` ends it);
    ``delay_s`` adds latency to each chunk sent towards the server (so each query round
    trip gets slower by about that much).
    """

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self.target_port = target_port
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

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, daemon=True).start()

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
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        pair = {client: server, server: client}
        try:
            while not self._cut:
                ready, _, _ = select.select(list(pair), [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if self._stalled:
                        continue
                    if sock is client and self.delay_s:
                        time.sleep(self.delay_s)
                    pair[sock].sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                try:
                    sock.close()
                except OSError:
                    pass
