"""Run a check in a forked child process: what a generator does after ``os.fork()``."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["in_forked_child"]


def in_forked_child(check: Callable[[], bytes]) -> bytes:
    """``check()`` in a child process forked here; the bytes it returned (a raised error as
    ``b"raised TYPE: MESSAGE"``). The child always ends with ``os._exit``: it never runs
    the rest of the test, nor the test runner's clean-up, a second time."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        answer = b""
        try:
            answer = check()
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            answer = f"raised {type(exc).__name__}: {exc}".encode()
        finally:
            os.write(write, answer)
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as answer_pipe:
        return answer_pipe.read()
