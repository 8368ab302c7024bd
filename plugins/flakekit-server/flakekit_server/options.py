"""How the server runs: :class:`ServerOptions` (the CLI options of ``flakekit serve``) and
the limits of the answers made off the event loop."""

from __future__ import annotations

import attrs

from flakekit_server.auth import Tokens

__all__ = ["BATCH_SLICE", "BATCH_THREADS", "OFFLOAD_COUNT", "SLICE_PAUSE_S", "ServerOptions"]

#: batches of at least this many IDs are made and encoded in a worker thread, so a 100k
#: batch does not hold up the single-ID requests behind it on the event loop
OFFLOAD_COUNT = 4096
#: threads making large batches per process (a batch holds one for milliseconds)
BATCH_THREADS = 2
#: an offloaded batch is drawn this many IDs at a time, a quarter of a snowflake tick: a
#: generator holds its lock while it draws (and waits out the ticks a batch needs), so
#: single IDs of the same generator get the lock, and IDs of the tick, between slices
BATCH_SLICE = 1024
#: the pause after each slice: long enough for a thread woken by the lock's release (the
#: event loop, for a single ID) to take it before the next slice does; a batch needs a
#: tick per 4096 IDs anyway, so four pauses per tick cost it nothing
SLICE_PAUSE_S = 50e-6


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How the server runs (CLI options of ``flakekit serve``)."""

    host: str = "127.0.0.1"
    port: int = 8080
    #: the port asked for (``--port``); ``port`` becomes the bound one. 0 stays the
    #: identity's port: a random port is no stable identity for allocators.
    requested_port: int | None = None
    workers: int = 1
    max_count: int = 100_000
    tokens: Tokens = attrs.field(factory=Tokens)
    snowflake_default: str | None = None
    max_connections: int = 1024
    idle_timeout: float = 30.0
    header_timeout: float = 10.0
    max_url: int = 4096
    max_header_bytes: int = 16384
    max_body: int = 0
    grace: float = 10.0
    loop: str = "auto"
    offload_count: int = OFFLOAD_COUNT
    #: cluster mode: ``--node`` / ``--advertise`` (override the config's ``[cluster]``)
    node: str | None = None
    advertise: str | None = None
    #: cluster mode with ``--workers N``: the first private port of the node's processes
    #: (``--member-port``; default ``port + 1``; see flakekit.cluster.processes)
    member_port: int | None = None
