"""Ending a drill's child process with SIGTERM, as a service manager would, and telling
whether it ended in time: a process that does not is killed and reaped, so a failed drill
leaves nothing running::

    if not ended_on_sigterm(proc, 30):
        raise AssertionError("SIGTERM did not end the process within 30 s")
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any

__all__ = ["ended_on_sigterm"]


def ended_on_sigterm(proc: subprocess.Popen[Any], timeout: float,
                     wait: Callable[..., object] | None = None) -> bool:
    """SIGTERM ``proc`` and give it ``timeout`` seconds to end; False if it did not (it is
    killed and reaped then). ``wait`` is how to wait: ``proc.wait`` (the default, for a
    process whose pipes a thread reads) or ``proc.communicate`` (reads its pipes meanwhile,
    so a full pipe cannot hold it up)."""
    wait = wait or proc.wait
    proc.send_signal(signal.SIGTERM)
    try:
        wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        wait()
        return False
    return True
