"""Built-in ``static`` allocator: a fixed worker id that never expires.

The id comes from config, from an environment variable, or from the ordinal at the end
of a StatefulSet-style host name (``web-3`` → 3). Only the operator can keep two
processes from using the same static id: prefer ``sql`` or ``zookeeper`` where you can.

``worker_id`` may also name several ids, ``"0-63"`` or ``[0, 1, 5]``, for a generator with
``workers = N``: each acquire hands out the lowest one this process does not hold yet.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import ConfigError
from flakekit.leases.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.pluginhost.markers import registers

if TYPE_CHECKING:  # annotations only: the plugin host loads this module for --help
    from flakekit.assembly.context import BuildContext


def _hostname() -> str:
    import socket  # when an allocator is built: `flakekit --help` loads this module

    return socket.gethostname()

_ORDINAL = re.compile(r"-(\d+)$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_FORMS = 'an integer (7), a range ("0-63") or a list ([0, 1, 5])'


def parse_worker_ids(value: Any, where: str) -> tuple[int, ...]:
    """``7``, ``"7"``, ``"0-63"`` or ``[0, 1, 5]`` as a sorted tuple of distinct ids."""
    if isinstance(value, bool):
        raise ConfigError(where, f"expected {_FORMS}, got {value!r}")
    if isinstance(value, int):
        ids: list[int] = [value]
    elif isinstance(value, str):
        text = value.strip()
        match = _RANGE.match(text)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise ConfigError(where, f"range {value!r} runs backwards; write "
                                  f'"{high}-{low}"')
            ids = list(range(low, high + 1))
        else:
            try:
                ids = [int(text)]
            except ValueError:
                raise ConfigError(where, f"expected {_FORMS}, got {value!r}") from None
    elif isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(where, f"the list is empty; expected {_FORMS}")
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise ConfigError(where, f"list item {bad[0]!r} is not a whole number; "
                              f"expected {_FORMS}")
        ids = list(value)
        dupes = sorted({v for v in ids if ids.count(v) > 1})
        if dupes:
            raise ConfigError(where, f"worker id {dupes[0]} is listed twice; list each "
                              "id once")
    else:
        raise ConfigError(where, f"expected {_FORMS}, got {value!r}")
    negative = [v for v in ids if v < 0]
    if negative:
        raise ConfigError(where, f"worker id {negative[0]} is negative; ids start at 0")
    return tuple(sorted(ids))


@attrs.frozen
class StaticSettings:
    """``allocator = {type = "static", ...}``.

    Attributes:
        worker_id: the id itself, or several for ``workers = N``: ``"0-63"`` or
            ``[0, 1, 5]``.
        env: the environment variable to read it from when ``worker_id`` is not set
            (the same forms: ``7``, ``0-63``).
        from_hostname: take the trailing ordinal of the host name (``web-3`` → 3).
    """

    worker_id: Any = None  # int, "lo-hi" or a list: checked by parse_worker_ids
    env: str = "FLAKEKIT_WORKER_ID"
    from_hostname: bool = False


@attrs.define
class StaticAllocator:
    """Hands out one configured worker id with a lease that never expires."""

    settings: StaticSettings
    path: str = "allocator"
    renew_interval: None = None
    #: every process gets this id (the FixedWorker capability): one process per generator
    fixed_worker = True
    hostname: str = attrs.Factory(_hostname)

    #: several ids at once (``workers = N``): each acquire takes the lowest free one
    several_leases = True
    _held: set[int] = attrs.Factory(set)
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _pid: int = attrs.Factory(os.getpid)   # a forked child holds none of its parent's

    def worker_ids(self) -> tuple[tuple[int, ...], str]:
        """The configured ids and where they came from."""
        s = self.settings
        if s.worker_id is not None:
            where = f"{self.path}.worker_id"
            return parse_worker_ids(s.worker_id, where), where
        raw = os.environ.get(s.env)
        if raw is not None:
            try:
                ids = parse_worker_ids(raw, f"{self.path}.env")
            except ConfigError:
                raise ConfigError(
                    f"{self.path}.env", f"environment variable {s.env}={raw!r} is not an "
                    f"integer or a range (0-63)"
                ) from None
            return ids, f"environment variable {s.env}"
        if s.from_hostname:
            match = _ORDINAL.search(self.hostname)
            if match is None:
                raise ConfigError(
                    f"{self.path}.from_hostname",
                    f"host name {self.hostname!r} does not end in -<number> (e.g. 'web-3')",
                )
            return (int(match.group(1)),), f"the ordinal of host name {self.hostname!r}"
        raise ConfigError(
            f"{self.path}.worker_id",
            f"no worker id: set worker_id, the environment variable {s.env}, or "
            "from_hostname = true (or use allocator = \"sql\" to lease one)",
        )

    def worker_id(self) -> tuple[int, str]:
        """The (first) configured id and where it came from."""
        ids, source = self.worker_ids()
        return ids[0], source

    @property
    def worker_count(self) -> int | None:
        """How many ids are configured (``workers = N`` takes N from it); None when that
        cannot be known yet (a missing environment variable fails at acquire)."""
        try:
            return len(self.worker_ids()[0])
        except ConfigError:
            return None

    def acquire(self, request: LeaseRequest) -> WorkerLease:
        ids, source = self.worker_ids()
        for worker in ids:
            if not 0 <= worker <= request.max_worker_id:
                raise ConfigError(
                    f"{self.path}.worker_id",
                    f"worker id {worker} (from {source}) is outside the layout's worker "
                    f"range 0..{request.max_worker_id}",
                )
        if self._pid != os.getpid():
            self._held, self._lock, self._pid = set(), threading.Lock(), os.getpid()
        with self._lock:
            free = [w for w in ids if w not in self._held]
            if not free:
                raise ConfigError(
                    f"{self.path}.worker_id",
                    f"all {len(ids)} configured worker id(s) (from {source}) are in use by "
                    "this process; list one per worker, e.g. worker_id = \"0-3\" for "
                    "workers = 4",
                )
            worker = free[0]
            self._held.add(worker)
        return WorkerLease(worker_id=worker, epoch=1,
                           holder=f"static@{request.host or self.hostname}")

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        # A fixed id never lapses: every renewal succeeds (a new value, so the keeper
        # counts it and fires flakekit_lease_renewed; the same object means "nothing new").
        return attrs.evolve(lease)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        with self._lock:
            self._held.discard(lease.worker_id)

    def records(self) -> list[WorkerRecord]:
        try:
            ids, source = self.worker_ids()
        except ConfigError:
            return []
        return [WorkerRecord(w, f"static ({source})", 1, None, "static", mine=True) for w in ids]

    def close(self) -> None:
        pass


def build_static(settings: StaticSettings | None, ctx: BuildContext) -> StaticAllocator:
    """Check a configured id against the layout now, so `config check` catches it."""
    settings = settings or StaticSettings()
    layout = ctx.layout
    if settings.worker_id is not None:
        ids = parse_worker_ids(settings.worker_id, f"{ctx.path}.worker_id")
        if layout is not None and layout.worker_field:
            top = layout.max_value(layout.worker_field)
            outside = [w for w in ids if not 0 <= w <= top]
            if outside:
                raise ConfigError(
                    f"{ctx.path}.worker_id", f"worker id {outside[0]} is outside the worker "
                    f"range 0..{top} of layout {layout.name!r}",
                )
    return StaticAllocator(settings, path=ctx.path)


flakekit_register_allocators = registers(
    "static", build_static, settings=StaticSettings,
    description="a fixed worker id from config, an environment variable or the host name",
)
