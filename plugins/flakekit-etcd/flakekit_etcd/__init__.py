"""flakekit-etcd: worker ids leased from etcd.

``allocator = {type = "etcd", endpoints = "127.0.0.1:2379", service = "orders", ttl = "10s"}``

One etcd lease per process holds all its worker keys; an id is claimed by a transaction
``create_revision == 0`` whose revision is the epoch; the high-water mark lives in a key
without a lease; every renewal and release is fenced on the claim (its revision and
lease); IDs stop ``safety_window`` before the lease could end, counted from the send
time of the keep-alive that succeeded. The algorithm is the core's
:class:`flakekit.plugin.KvLeaseAllocator`, shared with the ZooKeeper lease mode.

Also a cluster membership store:
``[cluster] membership = {type = "etcd", endpoints = "127.0.0.1:2379"}`` (a member key
per node on an etcd lease of its own, created by ``create_revision == 0`` whose revision
is the incarnation; the view in a key moved by compare-and-set on its ``mod_revision``):
:class:`flakekit_etcd.membership.EtcdMembership`.

See ``docs/choosing-allocators.md``, ``docs/cluster.md`` and this plugin's README.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from attrs.validators import instance_of, optional

import flakekit.plugin as fk

if TYPE_CHECKING:  # annotations only: the host imports this module for `flakekit --help`
    from flakekit.plugin import BuildContext, WorkerAllocator
    from flakekit_etcd.membership import EtcdMembership

__all__ = ["EtcdMembershipSettings", "EtcdSettings", "build_etcd_allocator",
           "build_etcd_membership"]

__version__ = "0.1.0"

DEFAULT_ENDPOINTS = "127.0.0.1:2379"
DEFAULT_ROOT = "/flakekit"
#: etcd raises a smaller TTL to about 1.5 x its election timeout (2 s by default)
MIN_TTL_NS = 2_000_000_000


def _check_ttl(ttl: int | None, safety_window: int | None) -> None:
    """The lease TTL etcd keeps as asked (whole seconds, at least 2 s) and a window inside it."""
    if ttl is not None and ttl < MIN_TTL_NS:
        raise fk.FieldError("ttl", "'ttl' must be at least 2s (etcd raises a smaller TTL "
                            "to 1.5 x its election timeout, 2 s by default)")
    if ttl is not None and ttl % 1_000_000_000:
        raise fk.FieldError("ttl", f"'ttl' must be whole seconds (etcd counts lease TTLs "
                            f"in seconds), got {ttl / 1e9:g} s")
    fk.check_safety_window(safety_window, ttl, "the TTL", "ttl")


def _check_access(endpoints: str | None, username: str | None, password: str | None) -> None:
    if endpoints is not None:
        from flakekit_etcd.endpoints import parse_endpoints

        try:
            parse_endpoints(endpoints)
        except ValueError as exc:
            raise fk.FieldError("endpoints", f"'endpoints' {exc}") from None
    if (username is None) != (password is None):
        missing = "password" if password is None else "username"
        raise fk.FieldError(missing, f"'{missing}' must be set too: etcd's auth needs "
                            "both username and password")


def _endpoints(configured: str | None, ctx: BuildContext) -> str:
    """The endpoints to use: the settings', else ``$ETCD_ENDPOINTS``, else the default."""
    from flakekit_etcd.endpoints import parse_endpoints

    return fk.address_from_env(configured, "ETCD_ENDPOINTS", DEFAULT_ENDPOINTS,
                               path=f"{ctx.path}.endpoints", check=parse_endpoints)


@attrs.frozen(kw_only=True)
class _EtcdClientSettings:
    """What the allocator and the membership settings share: where etcd is, the lease
    TTL and window (checked alike), how long a call waits, auth and the watch hint."""

    endpoints: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    root: str = fk.root_field(DEFAULT_ROOT, example=DEFAULT_ROOT)
    ttl: fk.Duration | None = fk.duration_field(None, minimum=1, optional=True)
    connect_timeout: fk.Duration = fk.duration_field("5s", minimum=1)
    safety_window: fk.Duration | None = fk.duration_field(None, optional=True)
    username: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    password: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    watch: bool = attrs.field(default=True, validator=instance_of(bool))

    def __attrs_post_init__(self) -> None:
        _check_ttl(self.ttl, self.safety_window)
        _check_access(self.endpoints, self.username, self.password)


@attrs.frozen(kw_only=True)
class EtcdSettings(_EtcdClientSettings):
    """``allocator = {type = "etcd", ...}``.

    Attributes:
        endpoints: the cluster's client URLs, ``"host:port,host:port"`` (``http://`` or
            ``https://`` allowed; default: the environment variable ``ETCD_ENDPOINTS``,
            else ``"127.0.0.1:2379"``).
        service: the namespace of the ids (default: the generator's name). Generators
            that share a layout must not share a service.
        root: the key prefix above ``{service}`` (default ``"/flakekit"``).
        ttl: the lease TTL asked for, whole seconds, at least 2 s (default ``"10s"``);
            the TTL etcd grants is the one used.
        connect_timeout: the longest any call waits (default ``"5s"``; renewals wait a
            third of the TTL).
        safety_window: stop issuing this long before the lease could end (default: a
            fifth of the TTL; less than half of it).
        quarantine: how long a freed id stays unclaimable after its holder's last
            possible ID (default ``"30s"``; 0 allowed).
        username, password: etcd's auth (``etcdctl auth enable``); both or neither.
        watch: watch the claims for a quick reaction to a revoked lease (a hint only;
            default true).
    """

    service: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    ttl: fk.Duration = fk.duration_field("10s", minimum=1)
    safety_window: fk.Duration = fk.safety_window_field("ttl")
    quarantine: fk.Duration = fk.duration_field("30s")

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        fk.check_path_name("service", self.service)


def build_etcd_allocator(settings: EtcdSettings | None, ctx: BuildContext) -> WorkerAllocator:
    """Factory registered as ``etcd``: an :class:`~flakekit_etcd.lease.EtcdLeaseAllocator`."""
    from flakekit_etcd.lease import build_lease_allocator

    s = settings or EtcdSettings()
    endpoints = _endpoints(s.endpoints, ctx)
    service = fk.namespace_of(s.service, ctx.generator, path=ctx.path, field="service")
    return build_lease_allocator(s, endpoints=endpoints, service=service, root=s.root,
                                 ctx=ctx)


@attrs.frozen(kw_only=True)
class EtcdMembershipSettings(_EtcdClientSettings):
    """``[cluster] membership = {type = "etcd", ...}``.

    Attributes:
        endpoints: the cluster's client URLs, ``"host:port,host:port"`` (default: the
            environment variable ``ETCD_ENDPOINTS``, else ``"127.0.0.1:2379"``).
        root: the key prefix above ``clusters/{cluster}`` (default ``"/flakekit"``).
        ttl: the member lease's TTL, whole seconds, at least 2 s (default: the
            ``[cluster] lease`` rounded up to whole seconds); the TTL etcd grants is the
            one used.
        connect_timeout: the longest any call waits (default ``"5s"``).
        safety_window: a member stops this long before its lease could end (default: a
            fifth of the TTL; less than half of it).
        username, password: etcd's auth; both or neither.
        watch: watch the view key for a quick reaction to a new view (a hint only;
            default true).
    """


def build_etcd_membership(settings: EtcdMembershipSettings | None,
                          ctx: BuildContext) -> EtcdMembership:
    """Factory registered as membership ``etcd`` (nothing connects until first use)."""
    from flakekit_etcd.membership import EtcdMembership

    s = settings or EtcdMembershipSettings()
    endpoints = _endpoints(s.endpoints, ctx)
    return EtcdMembership(
        endpoints, ctx.clock, root=s.root,
        ttl_s=None if s.ttl is None else s.ttl // 1_000_000_000,
        connect_timeout_s=s.connect_timeout / 1e9, safety_window_ns=s.safety_window,
        username=s.username, password=s.password, watch=s.watch)


flakekit_register_memberships = fk.registers(
    "etcd", build_etcd_membership, settings=EtcdMembershipSettings,
    description="cluster members as keys on etcd leases (create_revision == 0, the "
                "revision as incarnation) and the view as a key moved by "
                "compare-and-set on its mod_revision",
)


flakekit_register_allocators = fk.registers(
    "etcd", build_etcd_allocator, settings=EtcdSettings,
    description="worker ids leased from etcd: one lease per process, claims by "
                "create_revision == 0, the claim's revision as the epoch, quarantine",
)
