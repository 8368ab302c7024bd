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

from flakekit.assembly.context import BuildContext
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.values.clock import MonotonicClock
from flakekit.values.events import Events
from flakekit.values.layout import BitLayout

#: the drill process (flakekit.testing.drill_worker), run with ``-m``
WORKER = "flakekit.testing.drill_worker"
PYTHON = sys.executable

TINY_LAYOUT = """
[layouts.tiny]
fields = [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]]
unit = "1ms"
epoch = "2024-01-01T00:00:00Z"
"""


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
    return subprocess.Popen([PYTHON, "-m", WORKER, str(config), name, *args],
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


def zk_mode(port: int) -> str:
    """A ZooKeeper server's mode (srvr): leader, follower, standalone, or down."""
    out = subprocess.run(
        ["bash", "-c", 'exec 3<>/dev/tcp/127.0.0.1/$1 && printf srvr >&3 && cat <&3', "_",
         str(port)], capture_output=True, text=True, timeout=5).stdout
    for line in out.splitlines():
        if line.startswith("Mode: "):
            return line.split()[1]
    return "down"


def ensemble_roles(hosts: str, wait: float = 20.0) -> tuple[int, int]:
    """(leader port, a follower port) of the 3-node ensemble, once it has one leader and
    two followers (it may still be electing right after start)."""
    ports = [int(h.rsplit(":", 1)[1]) for h in hosts.split(",")]
    deadline = time.monotonic() + wait
    modes: dict[int, str] = {}
    while time.monotonic() < deadline:
        modes = {p: zk_mode(p) for p in ports}
        if sorted(modes.values()) == ["follower", "follower", "leader"]:
            break
        time.sleep(0.2)
    assert sorted(modes.values()) == ["follower", "follower", "leader"], modes
    leader = next(p for p, m in modes.items() if m == "leader")
    follower = next(p for p, m in modes.items() if m == "follower")
    return leader, follower


def ensemble_pid(svc: Path, port: int) -> int:
    """The pid of the ensemble node (scripts/zookeeper.sh) serving ``port``."""
    for n in (1, 2, 3):
        d = svc / "zk-ensemble" / f"n{n}"
        if f"clientPort={port}\n" in (d / "zoo.cfg").read_text():
            return int((d / "zk.pid").read_text())
    raise AssertionError(f"no ensemble node on port {port}")
