"""asyncio access to a generator: ``await ids.anext_id()`` never blocks the event loop.

A segment generator answers from memory almost always; only when both buffers are empty
does a caller have to wait for the database. The fast path takes the ID on the loop (no
thread hop); only a caller that would wait goes to a worker thread, so the loop keeps
running while the refill is on its way. A Snowflake generator's ``next_id()`` waits at most
for the next tick (a millisecond with the default layout) and raises instead of waiting on a
lease, so it runs on the loop; its batches, which may span many ticks, go to a thread
(a large batch drawn by another thread holds the generator's lock meanwhile: give the
loop's generator to the loop alone).

    ids = flakekit.aio.wrap(kit["orders"])
    order_id = await ids.anext_id()
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from flakekit.generators.segment import SegmentGenerator
from flakekit.pluginhost.contracts import FormatsIds, NonBlocking
from flakekit.values.batch import IdBatch
from flakekit.values.formats import DECIMAL

__all__ = ["AsyncIds", "wrap"]


@attrs.frozen
class AsyncIds:
    """Awaitable ``next_id`` / ``next_ids`` over a started generator (a thin wrapper: the
    generator keeps its own state, closing it is still the kit's job)."""

    generator: Any
    #: the generator when it can answer from memory (asked once: a protocol check costs
    #: more than the ID)
    _memory: NonBlocking | None = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(
            lambda self: self.generator if isinstance(self.generator, NonBlocking) else None,
            takes_self=True))

    async def anext_id(self) -> int:
        """The next ID; waits for a refill in a worker thread, never on the loop."""
        gen = self.generator
        if isinstance(gen, SegmentGenerator):
            value = gen.try_next_id()
            if value is not None:
                return value
            return await asyncio.to_thread(gen.next_id)
        memory = self._memory
        if memory is not None:  # another generator with a non-blocking path
            value = memory.try_next_id()
            if value is not None:
                return int(value)
            return int(await asyncio.to_thread(memory.next_id))
        return int(gen.next_id())  # Snowflake: waits at most for the next tick

    async def anext_ids(self, n: int) -> IdBatch:
        """``n`` IDs; from memory on the loop when they are there, else in a worker thread."""
        if self._memory is not None:
            batch = self._memory.try_next_ids(n)
            if batch is not None:
                return batch
        return await asyncio.to_thread(self.generator.next_ids, n)  # type: ignore[no-any-return]

    async def anext_str(self) -> str:
        """The next ID in the generator's string form (its ``id_format``, as ``next_str``)."""
        gen = self.generator
        fmt = gen.id_format if isinstance(gen, FormatsIds) else DECIMAL
        return str(fmt.encode(await self.anext_id()))

def wrap(generator: Any) -> AsyncIds:
    """An :class:`AsyncIds` over ``generator`` (for example ``kit["orders"]``)."""
    return AsyncIds(generator)
