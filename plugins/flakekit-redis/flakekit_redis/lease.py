"""The ``redis`` allocator: the core's key-value lease algorithm over a Redis session.

Keys under ``{prefix}/{service}`` (``{flakekit}/orders``)::

    workers/{id}   no session (it survives its holder): JSON {epoch, holder, session,
                   lease_ms, state, issued_until}; ``t`` is the server's clock at the last
                   heartbeat or release, so quarantines are measured on it
    claims/{id}    names the holder's session ({prefix}/session/{n}, PX ttl); counts as
                   gone once that key expired; its revision is the lease's epoch

Everything that decides who holds an id is :class:`flakekit.plugin.KvLeaseAllocator`;
:mod:`flakekit_redis.kvstore` maps it onto Lua scripts behind the marker guard.
"""

from __future__ import annotations

from typing import Any

import attrs

from flakekit.plugin import KvLeaseAllocator
from flakekit_redis.guard import Guard
from flakekit_redis.kvstore import RedisKvStore

__all__ = ["RedisLeaseAllocator", "build_lease_allocator"]


@attrs.define(eq=False)
class RedisLeaseAllocator(KvLeaseAllocator):
    """The core's key-value lease allocator over a :class:`RedisKvStore`."""

    service: str = ""

    @property
    def guard(self) -> Guard:
        store = self.store
        assert isinstance(store, RedisKvStore)
        return store.guard


def build_lease_allocator(settings: Any, guard: Guard, service: str,
                          ctx: Any) -> RedisLeaseAllocator:
    store = RedisKvStore(guard, settings.ttl // 1_000_000)
    return RedisLeaseAllocator.from_settings(store, f"{guard.ns}/{service}", settings, ctx,
                                             service=service)
