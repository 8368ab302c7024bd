"""The ``[cluster]`` section: which cluster this node joins, as which node, through which
membership store.

Parsed with the rest of the file (:func:`parse_cluster`: every key, type and range), then
resolved against the environment when the kit is built (:func:`resolve_cluster`), so
``flakekit config check`` refuses what a start-up would, before any connection.

Why the environment overrides the file for ``node`` and ``advertise``: one config file is
shared by every node of a cluster, and each node's identity comes from where it runs
(``FLAKEKIT_NODE`` from the pod name, ``FLAKEKIT_ADVERTISE`` from its address). The order
is: an explicit value (``flakekit serve --node/--advertise``) > the environment > the file
> the host name (``node`` only; ``advertise`` has no default).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from flakekit.assembly.settings import PluginRef, check_keys
from flakekit.errors import ConfigError
from flakekit.values.owners import MAX_WEIGHT
from flakekit.values.timeunits import format_unit, parse_duration_ns, parsed_or

if TYPE_CHECKING:
    from flakekit.cluster.settings import ClusterSettings

__all__ = [
    "ADVERTISE_ENV", "CLUSTER_KEYS", "NODE_ENV", "ClusterSpec", "ResolvedCluster",
    "check_advertise", "check_node", "parse_cluster", "resolve_cluster",
]

NODE_ENV = "FLAKEKIT_NODE"
ADVERTISE_ENV = "FLAKEKIT_ADVERTISE"
CLUSTER_KEYS = {"name", "membership", "node", "advertise", "weight", "lease", "handoff_wait"}
DEFAULT_MEMBERSHIP: dict[str, Any] = {"type": "sql", "backend": "default"}
DEFAULT_LEASE = "10s"
DEFAULT_HANDOFF_WAIT = "2s"
MIN_LEASE_NS = 1_000_000_000
#: a request held longer than this is worse than a 503 with Retry-After
MAX_HANDOFF_WAIT_NS = 60_000_000_000
#: cluster names and node ids end up in SQL columns, znode paths and etcd keys, and a
#: node id is hashed as ``f"{node}#{r}"``: no '/', '#' or spaces
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_ID_LEN = 64


def _check_id(value: Any, where: str, what: str, example: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(where, f"expected {what} such as {example!r}, got {value!r}")
    if len(value) > MAX_ID_LEN or not _ID.match(value):
        raise ConfigError(where, f"{value!r} is not a valid {what}: up to {MAX_ID_LEN} letters, "
                          f"digits, '.', '_' or '-', starting with a letter or digit "
                          f"(e.g. {example!r})")
    return value


def check_node(value: Any, where: str) -> str:
    """A node id: stable across restarts (never ip:port), safe in every store's keys."""
    return _check_id(value, where, "node id", "web-1")


def check_advertise(value: Any, where: str) -> str:
    """``http://host:port`` (no path, query or credentials), returned without a trailing
    slash: peers forward requests to it and clients are sent to it. ``https`` is refused
    here, at ``config check``: node-to-node forwarding speaks plain HTTP only, so every
    forwarded request would fail at run time (terminate TLS in front of the nodes)."""
    example = "http://10.0.0.5:8080"
    if not isinstance(value, str) or not value:
        raise ConfigError(where, f"expected a URL such as {example!r}, got {value!r}")
    fix = f"expected http://HOST:PORT such as {example!r}"
    if value.lower().startswith("https://"):
        raise ConfigError(where, f"{value!r}: https is not supported (nodes forward requests "
                          "to each other over plain HTTP); advertise the node's http:// "
                          f"address and terminate TLS in front of it, e.g. {example!r}")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(where, f"{value!r} is not a URL ({exc}); {fix}") from None
    if parts.scheme != "http":
        raise ConfigError(where, f"{value!r}: the scheme must be http; {fix}")
    if not parts.hostname:
        raise ConfigError(where, f"{value!r} has no host; {fix}")
    if port is None or port == 0:
        raise ConfigError(where, f"{value!r} has no port (peers must not guess it); {fix}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(where, f"{value!r} carries credentials; {fix}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(where, f"{value!r} has a path, query or fragment; {fix}")
    return value.rstrip("/")


@attrs.frozen
class ClusterSpec:
    """The ``[cluster]`` table as written, checked (the environment is not read yet).

    Attributes:
        name: the cluster's name (every node of it uses the same).
        membership: the membership store (a ``membership`` plugin reference).
        node / advertise: as written in the file (None: not written).
        weight: this node's share of the strict keys (1..64).
        lease_ns: the node's membership lease.
        handoff_wait_ns: how long a request for a moving key is held before a 503.
    """

    name: str
    membership: PluginRef
    node: str | None = None
    advertise: str | None = None
    weight: int = 1
    lease_ns: int = 10_000_000_000
    handoff_wait_ns: int = 2_000_000_000
    path: str = "cluster"


def _duration(table: Any, path: str, key: str, default: str) -> int:
    """``table[key]`` (else ``default``) in ns; a ConfigError naming ``path.key``."""
    return parsed_or(ConfigError, f"{path}.{key}", parse_duration_ns, table.get(key, default))


def parse_cluster(table: Any, path: str = "cluster") -> ClusterSpec:
    """Check a ``[cluster]`` table: unknown keys, types, ranges; ``name`` is required."""
    if not isinstance(table, Mapping):
        raise ConfigError(path, f"expected a table, got {type(table).__name__}")
    check_keys(table, CLUSTER_KEYS, path)
    if "name" not in table:
        raise ConfigError(f"{path}.name", "is required: the cluster's name, the same on every "
                          "node (e.g. name = \"ids\")")
    name = _check_id(table["name"], f"{path}.name", "cluster name", "ids")
    membership = PluginRef.parse("membership", table.get("membership", DEFAULT_MEMBERSHIP),
                                 f"{path}.membership", default_type="sql")
    node = check_node(table["node"], f"{path}.node") if "node" in table else None
    advertise = (check_advertise(table["advertise"], f"{path}.advertise")
                 if "advertise" in table else None)
    weight = table.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise ConfigError(f"{path}.weight", f"expected an integer from 1 to {MAX_WEIGHT} (this "
                          f"node's share of the strict keys), got {weight!r}")
    lease = _duration(table, path, "lease", DEFAULT_LEASE)
    if lease < MIN_LEASE_NS:
        raise ConfigError(f"{path}.lease", f"must be at least 1s (renewed every third of it), "
                          f"got {format_unit(lease)}")
    wait = _duration(table, path, "handoff_wait", DEFAULT_HANDOFF_WAIT)
    if wait > MAX_HANDOFF_WAIT_NS:
        raise ConfigError(f"{path}.handoff_wait", f"must be at most 60s (a request for a moving "
                          f"key is held this long, then answered 503), got {format_unit(wait)}")
    return ClusterSpec(name, membership, node, advertise, weight, lease, wait, path)


@attrs.frozen
class ResolvedCluster:
    """A :class:`ClusterSpec` with this process's node id and address filled in, and
    where each came from (for ``flakekit config check``)."""

    spec: ClusterSpec
    node: str
    node_from: str
    advertise: str
    advertise_from: str

    def settings(self) -> ClusterSettings:
        """The runtime's settings (seconds, as :class:`ClusterSettings` takes them)."""
        from flakekit.cluster.settings import ClusterSettings

        spec = self.spec
        return ClusterSettings(
            name=spec.name, node=self.node, advertise=self.advertise, weight=spec.weight,
            lease=spec.lease_ns / 1e9, handoff_wait=spec.handoff_wait_ns / 1e9,
        )

    def describe(self) -> str:
        """One line: who this node is in which cluster, through what."""
        spec = self.spec
        store = ", ".join(f"{k} {v}" for k, v in sorted(spec.membership.settings.items()))
        return (f"cluster {spec.name!r}: node {self.node!r} ({self.node_from}), advertise "
                f"{self.advertise} ({self.advertise_from}), weight {spec.weight}, membership "
                f"{spec.membership.type}{f' ({store})' if store else ''}, lease "
                f"{format_unit(spec.lease_ns)}, handoff_wait {format_unit(spec.handoff_wait_ns)}")


def _first(explicit: str | None, flag: str, env: Mapping[str, str], var: str,
           written: str | None, where: str,
           check: Callable[[Any, str], str]) -> tuple[str | None, str]:
    """The first of: ``explicit`` (a server flag), ``$var``, the file's value (checked
    when parsed); and where it came from. ``(None, "")``: none is given."""
    if explicit is not None:
        return check(explicit, flag), flag
    if env.get(var):
        return check(env[var], var), f"${var}"
    if written is not None:
        return written, where
    return None, ""


def resolve_cluster(
    spec: ClusterSpec, env: Mapping[str, str] | None = None, *, node: str | None = None,
    advertise: str | None = None, node_flag: str = "--node",
    advertise_flag: str = "--advertise",
) -> ResolvedCluster:
    """This process's ``node`` and ``advertise``: an explicit value (a server flag) >
    ``$FLAKEKIT_NODE`` / ``$FLAKEKIT_ADVERTISE`` > the file > the host name (node only)."""
    env = os.environ if env is None else env
    path = spec.path
    node_id, node_from = _first(node, node_flag, env, NODE_ENV, spec.node, f"{path}.node",
                                check_node)
    if node_id is None:
        host = socket.gethostname()
        try:
            node_id = check_node(host, f"{path}.node")
        except ConfigError:
            raise ConfigError(f"{path}.node", f"the host name {host!r} is not a valid node id "
                              f"(letters, digits, '.', '_', '-', at most {MAX_ID_LEN}); set "
                              f"{path}.node or ${NODE_ENV}") from None
        node_from = "the host name"
    url, url_from = _first(advertise, advertise_flag, env, ADVERTISE_ENV, spec.advertise,
                           f"{path}.advertise", check_advertise)
    if url is None:
        raise ConfigError(f"{path}.advertise", "is required: the URL peers and clients reach "
                          "this node at, e.g. advertise = \"http://10.0.0.5:8080\" (or pass "
                          f"{advertise_flag} or set ${ADVERTISE_ENV})")
    return ResolvedCluster(spec, node_id, node_from, url, url_from)
