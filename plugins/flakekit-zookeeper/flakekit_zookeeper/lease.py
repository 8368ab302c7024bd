"""``mode = "lease"``: recyclable worker ids; the ZooKeeper session is the lease (seed 002).

The algorithm (lowest free id, claim by create-if-absent, an epoch per claim,
quarantine, the high-water mark, the safety window, the deadline from the send time of
the last confirmed contact) is the core's :class:`flakekit.plugin.KvLeaseAllocator`;
this module gives it ZooKeeper (:class:`~flakekit_zookeeper.store.ZkStore`). Znodes
under ``{root}/{name}`` (default ``/flakekit/{generator}``)::

    workers/{id}   persistent; JSON {epoch, holder, session, lease_ms, state,
                   issued_until}; its mtime (ZooKeeper's clock) is the last heartbeat
                   or the release
    claims/{id}    ephemeral, owned by the holder's session
    clock          written to read ZooKeeper's time
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from flakekit.plugin import KvLeaseAllocator
from flakekit_zookeeper.client import ZkConnection
from flakekit_zookeeper.store import ZkStore

if TYPE_CHECKING:
    from flakekit.plugin import BuildContext

__all__ = ["LeaseAllocator", "build_lease_allocator"]


@attrs.define(eq=False)
class LeaseAllocator(KvLeaseAllocator):
    """The core's key-value lease allocator over one kazoo client."""

    hosts: str = ""
    name: str = ""

    @property
    def _conn(self) -> ZkConnection | None:
        """The kazoo connection (None when closed), for tests and drills."""
        store = self.store
        return store.conn if isinstance(store, ZkStore) else None


def build_lease_allocator(settings: Any, hosts: str, name: str, root: str,
                          ctx: BuildContext) -> LeaseAllocator:
    store = ZkStore(hosts, settings.session_timeout / 1e9, settings.connect_timeout / 1e9)
    return LeaseAllocator.from_settings(store, f"{root}/{name}", settings, ctx,
                                        hosts=hosts, name=name)
