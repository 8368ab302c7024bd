"""A thread pool made on first use: most servers never draw off the loop, forward a strict
key or make a large batch, so they should not start threads for it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LazyPool"]


class LazyPool:
    """``threads`` worker threads named ``prefix``-N, started by the first :meth:`get`
    (from any thread); :meth:`close` drops the queued work without waiting."""

    def __init__(self, threads: int, prefix: str) -> None:
        self.threads = threads
        self.prefix = prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.prefix)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
