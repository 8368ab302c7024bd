"""Services a test session starts for itself with the project's scripts (scripts/zookeeper.sh,
scripts/etcd.sh): the env file they write and a start/stop pair around a session."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["read_env", "script_service", "shared_or_own"]


def read_env(svc: Path) -> dict[str, str]:
    """The ``KEY=value`` lines of ``svc/env`` (what the service scripts wrote); {} if none."""
    out = {}
    try:
        for line in (svc / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            out[key] = value
    except FileNotFoundError:
        pass
    return out


@contextmanager
def script_service(script: Path, svc: Path, start: str, stop: str, key: str) -> Iterator[str]:
    """Run ``bash script start`` with ``FLAKEKIT_SVC_DIR=svc``, yield the ``key`` it wrote
    to the env file (its addresses), and ``bash script stop`` afterwards."""
    env = {**os.environ, "FLAKEKIT_SVC_DIR": str(svc)}
    subprocess.run(["bash", str(script), start], check=True, timeout=300, env=env)
    value = read_env(svc).get(key, "")
    assert value, f"{script.name} {start} wrote no {key}"
    try:
        yield value
    finally:
        subprocess.run(["bash", str(script), stop], check=False, timeout=60, env=env)


@contextmanager
def shared_or_own(var: str, found: str | None, script: Path, svc: Path) -> Iterator[str]:
    """The running service's address ``found`` (from ``var`` or an env file), else one of
    this session's own (``script`` start/stop in ``svc``); ``var`` is exported meanwhile."""
    if found:
        os.environ[var] = found
        yield found
        return
    with script_service(script, svc, "start", "stop", var) as value:
        os.environ[var] = value
        try:
            yield value
        finally:
            os.environ.pop(var, None)
