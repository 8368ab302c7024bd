"""Helpers shared by the etcd plugin tests (not collected: no test_ prefix)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from flakekit_etcd import EtcdSettings, build_etcd_allocator

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


def etcdctl(endpoints: str, *args: str, check: bool = True) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ETCDCTL_API": "3"}
    out = subprocess.run(["etcdctl", f"--endpoints={endpoints}", *args], env=env,
                         capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise AssertionError(f"etcdctl {' '.join(args)}: {out.stderr}")
    return out.stdout


def allocator(service: str, *, clock: Any = None, events: Events | None = None,
              host: str = "10.9.8.7", port: int = 8080, **settings: Any) -> Any:
    ctx = BuildContext(service, "generators.t.allocator", None, clock or MonotonicClock(),
                       events or Events(), None, None, host, port, 0)  # type: ignore[arg-type]
    return build_etcd_allocator(EtcdSettings(service=service, **settings), ctx)


def generator(service: str, layout: str | BitLayout = "snowflake", *, clock: Any = None,
              events: Events | None = None, on_lease_lost: str = "stop",
              **settings: Any) -> SnowflakeGenerator:
    import flakekit

    clock = clock or MonotonicClock()
    events = events or Events()
    lay = layout if isinstance(layout, BitLayout) else flakekit.layout(layout)
    alloc = allocator(service, clock=clock, events=events, **settings)
    return SnowflakeGenerator(lay, clock, alloc, name=service, events=events,
                              on_lease_lost=on_lease_lost)


def tiny_layout() -> BitLayout:
    """Two worker ids (0 and 1), so drills can force two processes onto one id."""
    return BitLayout.from_mapping("tiny", {
        "fields": [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]],
        "unit": "1ms", "epoch": "2024-01-01T00:00:00Z"})


def write_config(tmp: Path, name: str, allocator_table: str, layout: str = "snowflake") -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(TINY_LAYOUT + textwrap.dedent(f"""
        [generators.{name}]
        strategy = "snowflake"
        layout = "{layout}"
        allocator = {allocator_table}
    """))
    return path


def spawn(config: Path, name: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "FLAKEKIT_HOST": "10.9.8.7", "FLAKEKIT_PORT": "8080",
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([PYTHON, "-m", WORKER, str(config), name, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
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
    """ "ID <id> <mono_before>" lines -> [(id, mono_before)]."""
    return [(int(line.split()[1]), int(line.split()[2])) for line in text.splitlines()
            if line.startswith("ID ")]
