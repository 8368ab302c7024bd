"""Built-in ``static`` allocator: a fixed worker id that never expires.

The id comes from config, from an environment variable, or from the ordinal at the end
of a StatefulSet-style host name (``web-3`` → 3). Only the operator can keep two
processes from using the same static id: prefer ``sql`` or ``zookeeper`` where you can.
"""

from __future__ import annotations

import os
import re
import socket

import attrs

from flakekit import hookimpl
from flakekit.context import BuildContext
from flakekit.errors import ConfigError
from flakekit.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit.registry import Register

_ORDINAL = re.compile(r"-(\d+)$")


@attrs.frozen
class StaticSettings:
    """``allocator = {type = "static", ...}``.

    Attributes:
        worker_id: the id itself.
        env: the environment variable to read it from when ``worker_id`` is not set.
        from_hostname: take the trailing ordinal of the host name (``web-3`` → 3).
    """

    worker_id: int | None = None
    env: str = "FLAKEKIT_WORKER_ID"
    from_hostname: bool = False


@attrs.define
class StaticAllocator:
    """Hands out one configured worker id with a lease that never expires."""

    settings: StaticSettings
    path: str = "allocator"
    renew_interval: None = None
    hostname: str = attrs.Factory(socket.gethostname)

    def worker_id(self) -> tuple[int, str]:
        """The configured id and where it came from."""
        s = self.settings
        if s.worker_id is not None:
            return s.worker_id, f"{self.path}.worker_id"
        raw = os.environ.get(s.env)
        if raw is not None:
            try:
                return int(raw.strip()), f"environment variable {s.env}"
            except ValueError:
                raise ConfigError(
                    f"{self.path}.env", f"environment variable {s.env}={raw!r} is not an integer"
                ) from None
        if s.from_hostname:
            match = _ORDINAL.search(self.hostname)
            if match is None:
                raise ConfigError(
                    f"{self.path}.from_hostname",
                    f"host name {self.hostname!r} does not end in -<number> (e.g. 'web-3')",
                )
            return int(match.group(1)), f"the ordinal of host name {self.hostname!r}"
        raise ConfigError(
            f"{self.path}.worker_id",
            f"no worker id: set worker_id, the environment variable {s.env}, or "
            "from_hostname = true (or use allocator = \"sql\" to lease one)",
        )

    def acquire(self, request: LeaseRequest) -> WorkerLease:
        worker, source = self.worker_id()
        if not 0 <= worker <= request.max_worker_id:
            raise ConfigError(
                f"{self.path}.worker_id",
                f"worker id {worker} (from {source}) is outside the layout's worker range "
                f"0..{request.max_worker_id}",
            )
        return WorkerLease(worker_id=worker, epoch=1, holder=f"static@{request.host or self.hostname}")

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        return lease

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        pass

    def records(self) -> list[WorkerRecord]:
        try:
            worker, source = self.worker_id()
        except ConfigError:
            return []
        return [WorkerRecord(worker, f"static ({source})", 1, None, "static", mine=True)]

    def close(self) -> None:
        pass


def build_static(settings: StaticSettings | None, ctx: BuildContext) -> StaticAllocator:
    """Check a configured id against the layout now, so `config check` catches it."""
    settings = settings or StaticSettings()
    layout = ctx.layout
    if settings.worker_id is not None and layout is not None and layout.worker_field:
        top = layout.max_value(layout.worker_field)
        if not 0 <= settings.worker_id <= top:
            raise ConfigError(
                f"{ctx.path}.worker_id", f"worker id {settings.worker_id} is outside the worker range "
                f"0..{top} of layout {layout.name!r}",
            )
    return StaticAllocator(settings, path=ctx.path)


@hookimpl
def flakekit_register_allocators(register: Register) -> None:
    register(
        "static", build_static, settings=StaticSettings,
        description="a fixed worker id from config, an environment variable or the host name",
    )
