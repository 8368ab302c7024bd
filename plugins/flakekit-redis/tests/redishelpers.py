"""Helpers shared by the Redis plugin tests (not collected: no test_ prefix)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from flakekit_redis import (
    RedisSettings,
    RedisStoreSettings,
    build_redis_allocator,
    build_redis_store,
)

from flakekit.assembly.context import BuildContext
from flakekit.testing import free_port, listening
from flakekit.values.clock import MonotonicClock
from flakekit.values.events import Events


def ping(url: str) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.exceptions.RedisError:
        return False


def context(name: str = "t", *, clock: Any = None, events: Events | None = None,
            host: str = "10.9.8.7", port: int = 8080) -> BuildContext:
    return BuildContext(name, "generators.t.allocator", None, clock or MonotonicClock(),
                        events or Events(), None, None, host, port, 0)  # type: ignore[arg-type]


def allocator(url: str, prefix: str, service: str = "svc", *, port: int = 8080,
              clock: Any = None, events: Events | None = None, **settings: Any) -> Any:
    return build_redis_allocator(RedisSettings(url=url, prefix=prefix, service=service,
                                               **settings),
                                 context(service, clock=clock, events=events, port=port))


def store(url: str, prefix: str, **settings: Any) -> Any:
    return build_redis_store(RedisStoreSettings(url=url, prefix=prefix, **settings),
                             context())


def seed(url: str, prefix: str, floor: int = 0, hold_ms: int = 0) -> None:
    """What ``flakekit redis reseed --floor N`` does, for a new namespace."""
    from flakekit_redis.guard import guard_for

    guard_for(url, prefix, 5.0).reseed(floor, hold_ms)


class RedisServer:
    """A throw-away ``redis-server`` on a free loopback port, nothing on disk."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.dir = tmp
        self.extra = extra   # more redis-server options ("--replicaof", host, port)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir),
             "--daemonize", "no", "--loglevel", "warning", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while not (listening(self.port) and ping(self.url)):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def restart_without_data(self) -> None:
        """SHUTDOWN NOSAVE, then start again on the same port: every key is gone."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            client.shutdown(nosave=True)
        except redis.exceptions.ConnectionError:
            pass   # the server closes the connection as it goes
        assert self.proc is not None
        self.proc.wait(10)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
