"""The per-host lock of ``leaf`` mode: one live process per identity on this host.

Leaf keys a worker id by ip:port alone, so two live processes with one identity would
stamp the same IDs. The lock is an exclusive ``fcntl.flock`` on a file beside the cache
file, named after the identity, held from start-up to the stop. The kernel drops it when
the process dies (kill -9 included), so a crash never blocks the next start.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["HostLock", "HostLockTaken"]


class HostLockTaken(Exception):
    """Another process on this host holds the lock (its pid when it wrote one)."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path, self.holder = path, holder
        super().__init__(f"{path} is locked by {holder or 'another process'}")


class HostLock:
    """``acquire()`` or HostLockTaken; ``release()`` (idempotent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            raise HostLockTaken(self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)   # closing the descriptor drops the flock
