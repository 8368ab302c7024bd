"""Answers made off the event loop, in a worker thread: one ID whose segment buffers were
empty (the wait for the database must not hold up the loop), and a large batch (drawn in
slices in a thread, then encoded on the loop in slices, so single IDs keep flowing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from flakekit.plugin import FlakekitError, IdBatch
from flakekit_server.answers import TEXT, Pending, Response
from flakekit_server.options import BATCH_SLICE, SLICE_PAUSE_S
from flakekit_server.service_base import ServiceBase

__all__ = ["Offload"]


class Offload(ServiceBase):
    """:meth:`draw_later` and :meth:`_offload` of an :class:`~flakekit_server.app.IdService`."""

    def draw_later(self, name: str, route: str, gen: Any = None) -> Pending:
        """One ID of ``gen`` (default: generator ``name``'s; counted under ``name``) drawn in
        a worker thread: its buffers were empty, and the wait for the database (up to its
        ``wait_budget``) must not hold up the event loop."""
        draw = (gen if gen is not None else self.generators[name]).next_id

        async def run() -> Response:
            value = await asyncio.get_running_loop().run_in_executor(self._pool(), draw)
            self.issued[name] += 1
            return 200, TEXT, b"%d" % value, b"", route

        return Pending(route, run)

    def _offload(self, name: str, count: int, fmt: str) -> Pending:
        """A large batch: drawn in a worker thread (a snowflake generator waits out the
        ticks it needs there), then encoded on the loop in slices, so single IDs keep
        flowing meanwhile."""
        gen = self.generators[name]

        def draw() -> IdBatch:
            ranges: list[range] = []
            left = count
            with self._batch_locks[name]:  # one large batch of a generator at a time
                while left:
                    part = gen.next_ids(min(left, BATCH_SLICE))
                    if not len(part):
                        raise FlakekitError(f"generator {name!r} returned no IDs for a batch")
                    ranges.extend(part.ranges)
                    left -= len(part)
                    # the loop, waiting for the GIL or the lock, goes first
                    time.sleep(SLICE_PAUSE_S)
            return IdBatch(ranges)

        async def run() -> Response:
            batch = await asyncio.get_running_loop().run_in_executor(self._batch_pool.get(),
                                                                     draw)
            self.issued[name] += count
            self.offloaded += 1
            return await self.bodies.format_in_slices(name, count, fmt, batch)

        return Pending("next", run)
