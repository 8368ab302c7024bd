"""The installed ``flakekit`` command in a child process, as an operator runs it: the
script beside this interpreter, without the caller's ``$FLAKEKIT_CONFIG`` (a test or a
benchmark names its config; one exported in the shell must not leak in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["FLAKEKIT", "run_flakekit"]

#: the ``flakekit`` script of this interpreter's environment
FLAKEKIT = str(Path(sys.executable).with_name("flakekit"))


def run_flakekit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``flakekit ARGS...`` in a child process; its exit status and output, as text."""
    env = {k: v for k, v in os.environ.items() if k != "FLAKEKIT_CONFIG"}
    return subprocess.run([FLAKEKIT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)
