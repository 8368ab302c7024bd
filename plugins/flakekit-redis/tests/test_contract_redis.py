"""The allocator and segment-store contracts against the ``redis`` plugin on a real
Redis (a key prefix per test, seeded as `flakekit redis reseed --floor 0` would).

``expire`` deletes the holder's session key, as its expiry after a crash would: the
claim is gone at once and, with quarantine 0, the id is free after the holder's lease.
"""

from __future__ import annotations

from functools import partial

import pytest
from redishelpers import allocator, seed, store

from flakekit.testing import AllocatorContract, SegmentStoreContract
from flakekit.testing.contract_ports import on_own_ports


class TestRedisAllocatorContract(AllocatorContract):
    @pytest.fixture
    def make_allocator(self, redis_url, rprefix, closing):
        seed(redis_url, rprefix)
        return on_own_ports(closing, partial(allocator, redis_url, rprefix, quarantine="0s",
                                             ttl="2s", safety_window="400ms"))

    @pytest.fixture
    def expire(self, redis_url, rprefix):
        import redis

        client = redis.Redis.from_url(redis_url)

        def expire(lease):
            # the holder crashed: its session key expired, and its last heartbeat is
            # older than its lease (the record's time, as a crash leaves it)
            keys = list(client.scan_iter(match="{" + rprefix + "}/session/*"))
            assert keys
            client.delete(*keys)
            for key in client.scan_iter(match="{" + rprefix + "}/svc/workers/*"):
                client.hset(key, "t", int(client.hget(key, "t")) - 10_000)

        yield expire
        client.close()


class TestRedisSegmentStoreContract(SegmentStoreContract):
    @pytest.fixture
    def make_store(self, redis_url, rprefix):
        seed(redis_url, rprefix)

        def make(keys):
            s = store(redis_url, rprefix)
            for key, step in keys.items():
                s.create(key, step, start=1)
            return s

        return make
