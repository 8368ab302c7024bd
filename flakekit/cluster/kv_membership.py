"""KvMembershipBase: what the key-value memberships (etcd, ZooKeeper) hold besides their
connection, written once.

Both keep a cluster under ``{root}/clusters/{cluster}`` (:class:`ClusterKeys`), bound
every call by a connect timeout, keep a safety window of at least ``SAFETY_SHARE`` of
the lease, retry a lost compare-and-set a few times, read the view as often, and refuse
every call once closed with the same line. How they connect, fence and renew is theirs.
Plugins reach it through :mod:`flakekit.plugin`.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import attrs

from flakekit.cluster.member_records import ClusterKeys, safety_window_ns
from flakekit.errors import BackendError

__all__ = ["KvMembershipBase"]


@attrs.define(eq=False)
class KvMembershipBase:
    """The shared half of a key-value :class:`~flakekit.cluster.store_contracts.Membership`.

    A subclass names its store and the attribute that says where it is
    (``store_and_address``), and takes the lock around its own connection state.

    Args:
        root: the key prefix (or znode) above ``clusters/``.
        connect_timeout_s: the longest any call (and a connect) waits.
        safety_window_ns: a member stops this long before its lease could end (None, or
            anything less: ``SAFETY_SHARE`` of the lease, which claimers count on).
    """

    #: the store in messages (``"etcd"``) and the attribute holding its address
    store_and_address: ClassVar[tuple[str, str]] = ("a key-value store", "root")
    #: how often a write re-reads after losing a compare-and-set race
    races: ClassVar[int] = 8
    #: nodes read the view and the members this often (seconds), so every renewal is
    #: first read within that time of its write (the view watch stays a hint)
    view_poll_s: ClassVar[float] = 0.25

    root: str = attrs.field(default="/flakekit", kw_only=True)
    connect_timeout_s: float = attrs.field(default=5.0, kw_only=True)
    safety_window_ns: int | None = attrs.field(default=None, kw_only=True)
    #: where ``root`` puts each cluster's members, roster and view (not an argument)
    keys: ClusterKeys = attrs.field(init=False, default=attrs.Factory(
        lambda self: ClusterKeys(self.root), takes_self=True))
    _closed: bool = attrs.field(init=False, default=False)
    _lock: threading.RLock = attrs.field(init=False, factory=threading.RLock)

    @property
    def where(self) -> str:
        """``etcd at 127.0.0.1:2379 (/flakekit/clusters)``: for every message."""
        store, attribute = self.store_and_address
        return f"{store} at {getattr(self, attribute)} ({self.root}/clusters)"

    def _check_open(self) -> None:
        """BackendError once closed (the caller holds the lock)."""
        if self._closed:
            raise BackendError(f"cluster membership in {self.where} was closed")

    def _safety_ns(self, lease_ns: int) -> int:
        return safety_window_ns(lease_ns, self.safety_window_ns)
