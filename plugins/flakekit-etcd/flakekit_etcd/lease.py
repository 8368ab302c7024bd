"""The ``etcd`` allocator: the core's key-value lease algorithm over one etcd lease.

Keys under ``{root}/{service}`` (default ``/flakekit/{generator}``)::

    workers/{id}   no lease (it survives its holder): JSON {epoch, holder, session,
                   lease_ms, state, issued_until}; the high-water mark a successor waits
                   past
    claims/{id}    attached to the holder's etcd lease, created by a txn
                   ``create_revision == 0``; its revision is the lease's epoch

Everything that decides who holds an id is :class:`flakekit.plugin.KvLeaseAllocator`;
this module adds what ``flakekit workers`` shows for etcd: the epoch (the claim's
revision), the lease and its TTL left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from flakekit.plugin import (
    BackendError,
    KvLeaseAllocator,
    LeaseLostError,
    WorkerRecord,
)
from flakekit_etcd.store import EtcdStore

if TYPE_CHECKING:
    from flakekit.plugin import BuildContext

__all__ = ["EtcdLeaseAllocator", "build_lease_allocator"]


@attrs.define(eq=False)
class EtcdLeaseAllocator(KvLeaseAllocator):
    """The core's key-value lease allocator over an :class:`EtcdStore`."""

    endpoints: str = ""
    service: str = ""

    @property
    def etcd(self) -> EtcdStore:
        store = self.store
        assert isinstance(store, EtcdStore)
        return store

    def records(self) -> list[WorkerRecord]:
        """The core's rows, with each held id's epoch (its claim's revision), lease id
        and TTL left (seconds, as etcd counts them)."""
        rows = super().records()
        with self._lock:
            try:
                held = [r.worker_id for r in rows if r.state == "held"]
                claims = self.etcd.get_many([self._c(w) for w in held])
                out = []
                ttls: dict[int, int] = {}
                for row in rows:
                    entry = claims.get(self._c(row.worker_id))
                    if entry is None:
                        out.append(attrs.evolve(row, extra={**row.extra, "claims": row.epoch}))
                        continue
                    lease = entry.owner or 0
                    if lease not in ttls:
                        ttls[lease] = self.etcd.time_to_live(lease) if lease else -1
                    # lease and TTL first: the table shows the first 60 characters
                    out.append(attrs.evolve(row, epoch=entry.version, extra={
                        "lease": f"0x{lease:x}", "ttl_left": ttls[lease], **row.extra,
                        "claims": row.epoch}))
            except (BackendError, LeaseLostError) as exc:
                raise BackendError(str(exc)) from None
            return out


def build_lease_allocator(settings: Any, endpoints: str, service: str, root: str,
                          ctx: BuildContext) -> EtcdLeaseAllocator:
    store = EtcdStore(endpoints, settings.ttl // 1_000_000_000, settings.connect_timeout / 1e9,
                      username=settings.username, password=settings.password,
                      watch=settings.watch)
    return EtcdLeaseAllocator.from_settings(store, f"{root}/{service}", settings, ctx,
                                            endpoints=endpoints, service=service)
