"""Helpers shared by the etcd plugin tests (not collected: no test_ prefix); the process
drill helpers are flakekit.testing.drills'."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from flakekit_etcd import EtcdSettings, build_etcd_allocator

from flakekit.assembly.context import BuildContext
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.testing.drills import generator_over
from flakekit.testing.requests import DRILL_HOST, DRILL_PORT
from flakekit.values.clock import MonotonicClock
from flakekit.values.events import Events
from flakekit.values.layout import BitLayout

#: scripts/etcd.sh (here rather than in conftest.py: ``from conftest import`` finds
#: whichever conftest module pytest imported first, tests/conftest.py in a whole run)
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "etcd.sh"


def etcdctl(endpoints: str, *args: str, check: bool = True) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ETCDCTL_API": "3"}
    out = subprocess.run(["etcdctl", f"--endpoints={endpoints}", *args], env=env,
                         capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise AssertionError(f"etcdctl {' '.join(args)}: {out.stderr}")
    return out.stdout


def compact_history(endpoints: str, noise_key: str) -> None:
    """50 writes to ``noise_key``, then the whole history compacted (physically) up to
    the current revision: a watch from an older revision can no longer resume."""
    for n in range(50):
        etcdctl(endpoints, "put", noise_key, str(n))
    rev = json.loads(etcdctl(endpoints, "get", "/", "-w", "json"))["header"]["revision"]
    etcdctl(endpoints, "compact", str(rev), "--physical")


def leader(endpoints: str) -> str:
    """The endpoint of the cluster's leader (etcdctl endpoint status)."""
    status = json.loads(etcdctl(endpoints, "endpoint", "status", "-w", "json"))
    for st in status:
        if st["Status"]["leader"] == st["Status"]["header"]["member_id"]:
            return str(st["Endpoint"])
    raise AssertionError(f"no leader in {status}")


def member_pid(svc: Path, endpoint: str) -> int:
    """The pid of the 3-member cluster's member (scripts/etcd.sh) serving ``endpoint``."""
    for n in (1, 2, 3):
        d = svc / "etcd-cluster" / f"m{n}"
        if (d / "port").read_text().strip() == endpoint.rsplit(":", 1)[1]:
            return int((d / "etcd.pid").read_text())
    raise AssertionError(f"no member on {endpoint}")


def allocator(service: str, *, clock: Any = None, events: Events | None = None,
              host: str = DRILL_HOST, port: int = DRILL_PORT, **settings: Any) -> Any:
    ctx = BuildContext(service, "generators.t.allocator", None, clock or MonotonicClock(),
                       events or Events(), None, None, host, port, 0)  # type: ignore[arg-type]
    return build_etcd_allocator(EtcdSettings(service=service, **settings), ctx)


def generator(service: str, layout: str | BitLayout = "snowflake",
              **kw: Any) -> SnowflakeGenerator:
    """A SnowflakeGenerator on the allocator ``allocator(service, **kw)`` makes."""
    gen: SnowflakeGenerator = generator_over(allocator, service, layout, **kw)
    return gen
