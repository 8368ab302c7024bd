"""Helpers shared by the ZooKeeper plugin tests (not collected: no test_ prefix)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from flakekit_zookeeper import ZooKeeperSettings, build_zookeeper_allocator

from flakekit.clock import MonotonicClock
from flakekit.context import BuildContext
from flakekit.events import Events
from flakekit.layout import BitLayout
from flakekit.snowflake import SnowflakeGenerator

HERE = Path(__file__).resolve().parent
WORKER = HERE / "zk_drill_worker.py"
PYTHON = sys.executable

TINY_LAYOUT = """
[layouts.tiny]
fields = [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]]
unit = "1ms"
epoch = "2024-01-01T00:00:00Z"
"""


class Recorder:
    """An Events hook relay that records every event call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("flakekit_"):
            raise AttributeError(name)
        return lambda **kw: self.calls.append((name, kw))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def allocator(name: str, *, clock: Any = None, events: Events | None = None,
              host: str = "10.9.8.7", port: int = 8080, instance: int = 0,
              **settings: Any) -> Any:
    ctx = BuildContext(name, "generators.t.allocator", None, clock or MonotonicClock(),
                       events or Events(), None, None, host, port, instance)  # type: ignore[arg-type]
    return build_zookeeper_allocator(ZooKeeperSettings(**settings), ctx)


def generator(name: str, layout: str | BitLayout = "snowflake", *, clock: Any = None,
              events: Events | None = None, on_lease_lost: str = "stop",
              **settings: Any) -> SnowflakeGenerator:
    clock = clock or MonotonicClock()
    events = events or Events()
    lay = layout if isinstance(layout, BitLayout) else _layout(layout)
    alloc = allocator(name, clock=clock, events=events, **settings)
    return SnowflakeGenerator(lay, clock, alloc, name=name, events=events,
                              on_lease_lost=on_lease_lost)


def _layout(name: str) -> BitLayout:
    import flakekit

    return flakekit.layout(name)


def write_config(tmp: Path, name: str, allocator_table: str, layout: str = "snowflake") -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(TINY_LAYOUT + textwrap.dedent(f"""
        [generators.{name}]
        strategy = "snowflake"
        layout = "{layout}"
        allocator = {allocator_table}
    """))
    return path


def spawn(config: Path, name: str, *args: str, env: dict[str, str] | None = None,
          ) -> subprocess.Popen[str]:
    full = {**os.environ, "FLAKEKIT_HOST": "10.9.8.7", "FLAKEKIT_PORT": "8080",
            "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([PYTHON, str(WORKER), str(config), name, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
    """Read lines until one starts with prefix; returns it (and keeps the others)."""
    end = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"no {prefix!r} line from the worker; stderr: {err[-2000:]}")


def parse_ids(text: str) -> list[tuple[int, int]]:
    """ "ID <id> <mono_before>" lines → [(id, mono_before)]."""
    out = []
    for line in text.splitlines():
        if line.startswith("ID "):
            _, i, t = line.split()
            out.append((int(i), int(t)))
    return out


def tiny_layout() -> BitLayout:
    """Two worker ids (0 and 1), so drills can force two processes onto one id."""
    return BitLayout.from_mapping("tiny", {
        "fields": [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]],
        "unit": "1ms", "epoch": "2024-01-01T00:00:00Z"})


class ZkProxy:
    """A TCP proxy in front of ZooKeeper; ``cut()`` makes it unreachable for this client
    only (the shared server keeps running)."""

    def __init__(self, target: str) -> None:
        import socket
        import threading

        self._socket, self._threading = socket, threading
        self.target = target.split(",")[0]
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen()
        self.hosts = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self.up = True
        self.socks: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            host, port = self.target.rsplit(":", 1)
            server = self._socket.create_connection((host, int(port)))
            self.socks += [client, server]
            for a, b in ((client, server), (server, client)):
                self._threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: Any, b: Any) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(self._socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.up = False
        for s in self.socks:
            try:
                s.shutdown(self._socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.cut()
        self.lsock.close()
