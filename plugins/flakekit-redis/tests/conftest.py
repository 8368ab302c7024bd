"""Fixtures for the Redis plugin: the machine's Redis (``REDIS_URL``, else
127.0.0.1:6379, else a ``redis-server`` of this test session's own), a key prefix per
test (its keys deleted afterwards), and throw-away servers for the restart drills."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from redishelpers import RedisServer, ping  # noqa: E402


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory):
    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    if ping(url):
        yield url
        return
    if shutil.which("redis-server") is None:
        pytest.skip(f"no Redis at {url} and no redis-server to start one "
                    "(apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def rprefix(redis_url: str):
    """A key prefix of this test's own; its keys are deleted afterwards."""
    import redis

    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def throwaway_redis(tmp_path: Path):
    """A ``redis-server`` on a free port with no persistence, stopped afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
