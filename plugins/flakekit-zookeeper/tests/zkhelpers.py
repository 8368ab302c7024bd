"""Helpers shared by the ZooKeeper plugin tests (not collected: no test_ prefix); the
process drill helpers are flakekit.testing.drills'."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from flakekit_zookeeper import ZooKeeperSettings, build_zookeeper_allocator

from flakekit.assembly.context import BuildContext
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.testing.drills import generator_over
from flakekit.testing.requests import DRILL_HOST, DRILL_PORT
from flakekit.values.clock import MonotonicClock
from flakekit.values.events import Events
from flakekit.values.layout import BitLayout


def allocator(name: str, *, clock: Any = None, events: Events | None = None,
              host: str = DRILL_HOST, port: int = DRILL_PORT, instance: int = 0,
              **settings: Any) -> Any:
    ctx = BuildContext(name, "generators.t.allocator", None, clock or MonotonicClock(),
                       events or Events(), None, None, host, port, instance)  # type: ignore[arg-type]
    return build_zookeeper_allocator(ZooKeeperSettings(**settings), ctx)


def generator(name: str, layout: str | BitLayout = "snowflake",
              **kw: Any) -> SnowflakeGenerator:
    """A SnowflakeGenerator on the allocator ``allocator(name, **kw)`` makes."""
    gen: SnowflakeGenerator = generator_over(allocator, name, layout, **kw)
    return gen


def expire_session(client: Any, hosts: str) -> None:
    """End a kazoo ``client``'s session on the server (a second client with the same
    session id and password closes it): its ephemerals go, the client goes LOST, then
    kazoo opens a new session by itself."""
    from kazoo.client import KazooClient

    sid, pwd = client.client_id
    dup = KazooClient(hosts=hosts, client_id=(sid, pwd))
    dup.start(timeout=10)
    dup.stop()
    dup.close()


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
