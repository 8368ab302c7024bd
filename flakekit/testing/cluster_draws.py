"""Concurrent draws of one strict key through cluster nodes, and the checks on what they got.

The cluster drills (in memory, on ZooKeeper, on etcd, through the server) all run client
threads that draw a key through the nodes while it is handed off, following
``NotOwnerError`` to the owner, and then check the two promises on the records:
no duplicate (I1) and per-key real-time order (I2: a request that starts after another
ended gets a larger ID)::

    with DrawingClients(nodes, "hot") as clients:
        wait_until(lambda: owns(nodes["a"], "hot"))
        ...
    check_order(clients.records)
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = ["DrawingClients", "Record", "check_order", "owns"]

#: one draw: (start, end) on ``time.perf_counter_ns``, the value, the node that served it
Record = tuple[int, int, int, str]


def owns(node: Any, key: str) -> bool:
    """True when ``node`` (a ClusterNode) serves ``key`` under a claim of its own."""
    return bool(node.status()["claims"].get(key, {}).get("state") == "owned")


def check_order(records: Iterable[tuple[Any, ...]]) -> None:
    """I1 and I2 on ``(start, end, value, ...)`` records: at least one, no value twice,
    and each value larger than every value whose request ended before it started."""
    records = list(records)
    values = [r[2] for r in records]
    assert values and len(values) == len(set(values)), "duplicate IDs (I1)"
    ends = sorted((r[1], r[2]) for r in records)
    best_before: list[int] = []
    top = -1
    for _, value in ends:
        top = max(top, value)
        best_before.append(top)
    for start, _, value, *_ in records:
        i = bisect.bisect_left(ends, (start, -1))
        if i:
            assert value > best_before[i - 1], "a later request got a smaller ID (I2)"


@attrs.define(eq=False)
class DrawingClients:
    """``clients`` threads drawing ``key`` through ``nodes`` (name -> ClusterNode), client
    ``i`` starting at the ``i % len(nodes)``-th node; a NotOwnerError sends it to the
    owner. On KeyMovingError or ClusterUnavailableError it tries the next node when
    ``switch_when_moving`` (else the same one again) after ``moving_pause_s``; after each
    draw it rests ``pause_s`` (keeping the record list small). Records are ``Record``."""

    nodes: Mapping[str, Any]
    key: str
    clients: int = 4
    pause_s: float = attrs.field(default=0.0, kw_only=True)
    moving_pause_s: float = attrs.field(default=0.0, kw_only=True)
    switch_when_moving: bool = attrs.field(default=False, kw_only=True)
    records: list[Record] = attrs.field(factory=list, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _stop: threading.Event = attrs.field(factory=threading.Event, init=False)
    _threads: list[threading.Thread] = attrs.field(init=False)

    @_threads.default
    def _make_threads(self) -> list[threading.Thread]:
        return [threading.Thread(target=self._draw, args=(i,), daemon=True,
                                 name=f"drawing-client-{i}") for i in range(self.clients)]

    def _draw(self, i: int) -> None:
        from flakekit.errors import ClusterUnavailableError, KeyMovingError, NotOwnerError

        names = list(self.nodes)
        via = names[i % len(names)]
        while not self._stop.is_set():
            start = time.perf_counter_ns()
            try:
                value, _ = self.nodes[via].next_id(self.key)
            except NotOwnerError as exc:
                if exc.owner is not None:
                    via = exc.owner.node
                continue
            except (KeyMovingError, ClusterUnavailableError):
                if self.switch_when_moving:
                    via = names[(names.index(via) + 1) % len(names)]
                if self.moving_pause_s:
                    time.sleep(self.moving_pause_s)
                continue
            end = time.perf_counter_ns()
            with self._lock:
                self.records.append((start, end, value, via))
            if self.pause_s:
                time.sleep(self.pause_s)

    def start(self) -> DrawingClients:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop every client and wait for it (10 s each at most)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(10)

    def served_by(self, node: str) -> int:
        """How many draws ``node`` served."""
        return sum(1 for r in self.records if r[3] == node)

    def __enter__(self) -> DrawingClients:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
