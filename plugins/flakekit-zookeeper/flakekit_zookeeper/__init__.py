"""flakekit-zookeeper: worker ids from ZooKeeper.

``allocator = {type = "zookeeper", hosts = "zk1:2181,zk2:2181", mode = "lease"}``

- ``mode = "leaf"``: Meituan Leaf's Snowflake mode, compatible with its znodes
  (``/snowflake/{name}/forever/{ip}:{port}-{seq}``, worker id = the sequence number),
  with the time reported every 3 s, a local cache file for start-up while ZooKeeper is
  down, and the clock check Leaf swallows made fatal. Ids are never recycled.
- ``mode = "lease"``: seed 002's rules: an ephemeral claim per worker id, the lowest free
  id, the session is the lease (no ID after ``session_timeout - safety_window`` without
  contact), a quarantine before a freed id is claimed again, an epoch per claim.

Also a cluster membership store:
``[cluster] membership = {type = "zookeeper", hosts = "zk1:2181"}`` (ephemeral member
znodes, the session is the member's lease; the view is a versioned znode; see
``docs/cluster.md``).

See ``docs/choosing-allocators.md`` and this plugin's README.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import attrs
from attrs.validators import ge, in_, instance_of, le, optional

import flakekit.plugin as fk

if TYPE_CHECKING:  # annotations only: the host imports this module for `flakekit --help`
    from pathlib import Path

    from flakekit.plugin import BuildContext, WorkerAllocator
    from flakekit_zookeeper.membership import ZkMembership

__all__ = [
    "ZooKeeperMembershipSettings",
    "ZooKeeperSettings",
    "build_zookeeper_allocator",
    "build_zookeeper_membership",
]

__version__ = "0.1.0"

DEFAULT_HOSTS = "127.0.0.1:2181"
DEFAULT_ROOTS = {"leaf": "/snowflake", "lease": "/flakekit"}
PORT_0 = ("leaf mode keys the worker id by ip:port, and the port is 0 (none given, or "
          "`flakekit serve --port 0`, which would take a new worker id on every start): "
          "set FLAKEKIT_PORT=N or port = N")


def _hosts(configured: str | None) -> str:
    """The ensemble to use: the settings', else ``$ZK_HOSTS``, else the default."""
    return fk.address_from_env(configured, "ZK_HOSTS", DEFAULT_HOSTS)


def _check_session(session: int | None, safety_window: int | None) -> None:
    """A session ZooKeeper can grant (at least 1 s) and a safety window inside it."""
    if session is not None and session < 1_000_000_000:
        raise fk.FieldError("session_timeout", "'session_timeout' must be at least 1s "
                            "(ZooKeeper's floor is 2 ticks; scripts/zookeeper.sh allows 1s)")
    fk.check_safety_window(safety_window, session, "the session timeout",
                           "the session timeout")


@attrs.frozen(kw_only=True)
class _ZkClientSettings:
    """What the allocator and the membership settings share: the ensemble, the session
    and its safety window (checked alike) and how long a connect waits."""

    hosts: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    session_timeout: fk.Duration | None = fk.duration_field(None, minimum=1, optional=True)
    connect_timeout: fk.Duration = fk.duration_field("5s", minimum=1)
    safety_window: fk.Duration | None = fk.duration_field(None, optional=True)

    def __attrs_post_init__(self) -> None:
        _check_session(self.session_timeout, self.safety_window)


@attrs.frozen(kw_only=True)
class ZooKeeperSettings(_ZkClientSettings):
    """``allocator = {type = "zookeeper", ...}``.

    Attributes:
        hosts: the ensemble, ``"host:port,host:port"`` (default: the environment
            variable ``ZK_HOSTS``, else ``"127.0.0.1:2181"``).
        mode: ``"leaf"`` (Leaf-compatible, persistent ids, local cache) or ``"lease"``
            (recyclable ids; the session is the lease). Default ``"lease"``.
        name: Leaf's ``leaf.name`` / the namespace of the ids (default: the generator's
            name). Generators that share a layout must not share a name.
        root: the znode under which ``{name}`` lives (default ``"/snowflake"`` in leaf
            mode, as Leaf has it; ``"/flakekit"`` in lease mode).
        session_timeout: the ZooKeeper session timeout (default ``"10s"``; the server
            may grant less, which is then used).
        connect_timeout: how long start-up waits for ZooKeeper (default ``"5s"``); in
            leaf mode the cache file is used after that.
        safety_window: stop issuing this long before the session could have expired
            (lease mode; leaf mode after a pause) (default: a fifth of the session
            timeout, 2 s for 10 s; it must be less than half of it).
        quarantine: lease mode: how long a freed id stays unclaimable after its holder
            stopped (default ``"30s"``; 0 allowed).
        report_interval: leaf mode: how often the time is reported (default ``"3s"``).
        cache_dir: leaf mode: where the cache file goes (default
            ``$XDG_STATE_HOME/flakekit/zookeeper`` or ``~/.local/state/flakekit/zookeeper``).
        cache_file: leaf mode: the cache file itself (default
            ``{cache_dir}/{name}/{ip}_{port}.json``).
        ip: leaf mode: the ip in the znode name (default: ``FLAKEKIT_HOST`` when it is an
            address, else this host's first non-loopback IPv4 address, as Leaf does).
        port: leaf mode: the port in the znode name (default ``FLAKEKIT_PORT`` or 0).
    """

    mode: str = attrs.field(default="lease", validator=in_(("leaf", "lease")))
    name: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    root: str | None = fk.root_field(None, example="/snowflake", what="a znode path")
    session_timeout: fk.Duration = fk.duration_field("10s", minimum=1)
    safety_window: fk.Duration = fk.safety_window_field("session_timeout")
    quarantine: fk.Duration = fk.duration_field("30s")
    report_interval: fk.Duration = fk.duration_field("3s", minimum=1)
    cache_dir: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    cache_file: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    ip: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    port: int | None = attrs.field(default=None, validator=optional([instance_of(int),
                                                                    ge(0), le(65535)]))

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        fk.check_path_name("name", self.name)
        if self.ip is not None:
            import ipaddress  # when checked: the host imports this module for --help

            try:
                ipaddress.ip_address(self.ip)
            except ValueError:
                raise fk.FieldError("ip", f"'ip' must be an IP address, got {self.ip!r}") from None


def resolve_ip(host: str) -> str:
    """Leaf's identity ip: ``host`` if it is an address, else the first non-loopback
    IPv4 address of this host (the one outgoing traffic uses, else the resolver's)."""
    import ipaddress
    import socket  # here, not at import: the host imports this module for `flakekit --help`

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))  # no packet is sent
            addr = sock.getsockname()[0]
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    except OSError:
        pass
    try:
        for addr in socket.gethostbyname_ex(socket.gethostname())[2]:
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    except OSError:
        pass
    return "127.0.0.1"


def default_cache_dir() -> Path:
    from pathlib import Path

    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return Path(base) / "flakekit" / "zookeeper"


def build_zookeeper_allocator(settings: ZooKeeperSettings | None,
                              ctx: BuildContext) -> WorkerAllocator:
    """Factory registered as ``zookeeper``: a LeafAllocator or a LeaseAllocator."""
    s = settings or ZooKeeperSettings()
    hosts = _hosts(s.hosts)
    name = fk.namespace_of(s.name, ctx.generator, path=ctx.path, field="name")
    root = s.root or DEFAULT_ROOTS[s.mode]
    if s.mode == "leaf":
        from pathlib import Path

        from flakekit_zookeeper.leaf import LeafAllocator

        ip = s.ip or resolve_ip(ctx.host)
        port = s.port if s.port is not None else ctx.port
        if s.port == 0:
            raise fk.ConfigError(f"{ctx.path}.port", PORT_0)
        instance = ctx.instance
        suffix = f".{instance}" if instance else ""
        cache = Path(s.cache_file) if s.cache_file else (
            (Path(s.cache_dir) if s.cache_dir else default_cache_dir())
            / name / f"{ip}_{port}{suffix}.json")
        if s.cache_file and instance:
            cache = cache.with_name(f"{cache.stem}{suffix}{cache.suffix}")
        return LeafAllocator(settings=s, hosts=hosts, name=name, root=root, ip=ip, port=port,
                             instance=instance, cache_path=cache, clock=ctx.clock,
                             events=ctx.events, generator=ctx.generator, path=ctx.path)
    from flakekit_zookeeper.lease import build_lease_allocator

    return build_lease_allocator(s, hosts=hosts, name=name, root=root, ctx=ctx)


@attrs.frozen(kw_only=True)
class ZooKeeperMembershipSettings(_ZkClientSettings):
    """``[cluster] membership = {type = "zookeeper", ...}``.

    Attributes:
        hosts: the ensemble (default: ``$ZK_HOSTS``, else ``"127.0.0.1:2181"``).
        root: the znode under which ``clusters/{cluster}`` lives (default ``"/flakekit"``).
        session_timeout: the ZooKeeper session, which is the member's lease (default: the
            ``[cluster] lease``; the server may grant less, which is then used).
        connect_timeout: the longest a connect or any call waits (default ``"5s"``).
        safety_window: a member stops this long before its session could have expired
            (default: a fifth of the session; less than half of it).
    """

    root: str = fk.root_field("/flakekit", example="/flakekit", what="a znode path")

    def __attrs_post_init__(self) -> None:
        if self.hosts is not None and not self.hosts.strip():
            raise fk.FieldError("hosts", "'hosts' must name the ensemble, such as "
                                "'zk1:2181,zk2:2181', got ''")
        super().__attrs_post_init__()


def build_zookeeper_membership(settings: ZooKeeperMembershipSettings | None,
                               ctx: BuildContext) -> ZkMembership:
    """Factory registered as membership ``zookeeper`` (nothing connects until first use)."""
    from flakekit_zookeeper.membership import ZkMembership

    s = settings or ZooKeeperMembershipSettings()
    hosts = _hosts(s.hosts)
    return ZkMembership(
        hosts, ctx.clock, root=s.root,
        session_timeout_s=None if s.session_timeout is None else s.session_timeout / 1e9,
        connect_timeout_s=s.connect_timeout / 1e9, safety_window_ns=s.safety_window)


flakekit_register_memberships = fk.registers(
    "zookeeper", build_zookeeper_membership, settings=ZooKeeperMembershipSettings,
    description="cluster members as ephemeral znodes (the session is the lease) and "
                "the view as a versioned znode",
)


flakekit_register_allocators = fk.registers(
    "zookeeper", build_zookeeper_allocator, settings=ZooKeeperSettings,
    description="worker ids from ZooKeeper: Leaf-compatible (mode = \"leaf\") or "
                "session leases with quarantine (mode = \"lease\")",
)
