"""Contracts: every protocol a plugin's factory result must meet, in one place.

Why checked at build time: an allocator without ``renew()`` would otherwise surface as a
lease expiry in a background thread minutes after start. :func:`check_contract` runs
when the config is built (so ``flakekit config check`` catches it) and names the plugin,
its distribution and the missing members in one line.

The required contracts are small (a generator needs ``start``, ``next_id``,
``next_ids``, ``close``); what the server and the CLI may also use is an optional
capability with its own protocol (:class:`HasStats` returning a
:class:`StatsRecord`, :class:`HasLayout`, :class:`HasKey`, :class:`Describes`,
:class:`FormatsIds`, :class:`NonBlocking`), tested with ``isinstance``, never guessed
with ``getattr``. Allocators, stores and memberships declare theirs the same way
(:class:`SeveralLeases`, :class:`CountsWorkers`, :class:`FixedWorker`,
:class:`ListsKeys`, :class:`PeriodStore`, :class:`Locates`, :class:`TellsStalls`,
:class:`LapseMeansStopped`, :class:`PollsView`, :class:`ReadsViewAndMembers`,
:class:`ServeShare`, :class:`LeaseGranularity`).

``Clock``, ``WorkerAllocator`` and its capabilities, the lease machine's ``Lease`` /
``LeaseSource`` / ``LeaseTarget`` / ``LeaseEvents`` / ``Pushes``, the key-value lease
store's ``KeyValueStore``, ``SegmentStore`` with its capabilities and the
:class:`Allocation` its ``fetch`` returns, and cluster mode's ``Membership`` /
``KeyFence`` and their capabilities are defined in their own (lower) layers, which use
them at run time, and are re-exported here; the rest live here.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from flakekit.cluster.store_contracts import (
    KeyFence,
    LapseMeansStopped,
    Membership,
    PollsView,
    ReadsViewAndMembers,
    ServeShare,
)
from flakekit.errors import ContractError
from flakekit.generators.stores import (
    ListsKeys,
    Locates,
    PeriodStore,
    SegmentStore,
    TellsStalls,
)
from flakekit.leases.keeper import LeaseTarget
from flakekit.leases.kv import KeyValueStore
from flakekit.leases.lease import (
    CountsWorkers,
    Lease,
    LeaseEvents,
    LeaseSource,
    Pushes,
    SeveralLeases,
    WorkerAllocator,
)
from flakekit.values.allocation import Allocation
from flakekit.values.clock import Clock

if TYPE_CHECKING:
    from flakekit.pluginhost.registry import Registration
    from flakekit.values.batch import IdBatch
    from flakekit.values.formats import IdFormat
    from flakekit.values.layout import BitLayout

__all__ = [
    "Allocation",
    "Clock",
    "CountsWorkers",
    "Describes",
    "FixedWorker",
    "FormatsIds",
    "Generator",
    "GeneratorInfo",
    "HasKey",
    "HasLayout",
    "HasStats",
    "IssuesIds",
    "KeyFence",
    "KeyValueStore",
    "LapseMeansStopped",
    "Lease",
    "LeaseEvents",
    "LeaseGranularity",
    "LeaseSource",
    "LeaseTarget",
    "ListsKeys",
    "Locates",
    "Membership",
    "NamesLayout",
    "NonBlocking",
    "NonBlockingKeys",
    "OrdersKeys",
    "PeriodStore",
    "PollsView",
    "Pushes",
    "ReadsViewAndMembers",
    "SegmentStore",
    "ServeShare",
    "SeveralLeases",
    "StatsRecord",
    "TellsStalls",
    "WorkerAllocator",
    "check_contract",
    "members",
]


@runtime_checkable
class Generator(Protocol):
    """What every strategy's factory returns: the minimal generator."""

    def start(self) -> Any:
        """Acquire what it needs (leases, segments); idempotent."""

    def next_id(self) -> int: ...
    def next_ids(self, n: int) -> Any: ...
    def close(self) -> None: ...


@runtime_checkable
class IssuesIds(Protocol):
    """Anything that hands out integer IDs one at a time (what ``flakekit.sqlalchemy``'s
    column default calls): every :class:`Generator`, a cluster node's strict key..."""

    def next_id(self) -> int: ...


# -- optional generator capabilities ----------------------------------------------------------
@runtime_checkable
class StatsRecord(Protocol):
    """What ``stats()`` returns: a record read by attribute (``SnowflakeStats``,
    ``SegmentStats``, a plugin's own) with its JSON shape from :meth:`as_dict`."""

    def as_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class HasStats(Protocol):
    """A generator that reports counters (``/metrics``, the monitor, ``flakekit stats``)."""

    def stats(self) -> StatsRecord: ...


@runtime_checkable
class HasLayout(Protocol):
    """A generator whose IDs follow a bit layout (decode, Leaf's snowflake endpoint)."""

    @property
    def layout(self) -> BitLayout: ...


@runtime_checkable
class HasKey(Protocol):
    """A generator that serves one named key of a segment store (Leaf's ``biz_tag``)."""

    @property
    def key(self) -> str: ...


@runtime_checkable
class NonBlocking(IssuesIds, Protocol):
    """A generator that can answer from memory without waiting (segment generators): the
    asyncio wrapper calls these on the event loop and waits for a refill in a thread
    only when they return None."""

    def try_next_id(self) -> int | None: ...
    def try_next_ids(self, n: int) -> IdBatch | None: ...


@runtime_checkable
class NonBlockingKeys(Protocol):
    """A server of several keys that can answer from memory without waiting (a cluster
    node's strict keys): ``(IDs, owner epoch)``, or None where the caller then asks
    ``next_id(key)`` / ``next_ids(key, n)`` off the event loop. The server checks this
    once, when it builds its routes."""

    def try_next_id(self, key: str) -> tuple[int, int] | None: ...
    def try_next_ids(self, key: str, n: int) -> tuple[IdBatch, int] | None: ...


@runtime_checkable
class NamesLayout(Protocol):
    """Strategy settings that name a bit layout (``layout = "snowflake"``): tools such as
    ``flakekit decode`` read it without building the generator."""

    layout: str


@runtime_checkable
class LeaseGranularity(Protocol):
    """A membership whose store grants leases in steps (seconds): etcd TTLs are whole
    seconds. ``[cluster] lease`` must be at least three steps."""

    lease_granularity: float


@runtime_checkable
class OrdersKeys(Protocol):
    """Strategy settings (or a generator) with ``order = "node" | "strict"`` (segment
    generators): a ``"strict"`` one needs a ``[cluster]`` and is served only by its key's
    owner."""

    order: str


@runtime_checkable
class FixedWorker(Protocol):
    """An allocator that gives every process the same worker id (``static``): several
    processes serving one generator would issue the same IDs."""

    fixed_worker: bool


@runtime_checkable
class FormatsIds(Protocol):
    """A generator that gives string IDs in a configured format (``format = ...``)."""

    id_format: IdFormat

    def next_str(self) -> str: ...


@attrs.frozen
class GeneratorInfo:
    """What a generator says it is, for the server and the CLI (instead of them
    switching on strategy names).

    Attributes:
        strategy: the registered strategy name.
        layout: the bit layout of its IDs (:class:`HasLayout`), else None.
        key: the segment key it serves (:class:`HasKey`), else None.
        allocator: the registered name of its worker allocator, if any.
        store: the registered name of its segment store, if any.
        fixed_worker: True when every process gets the same worker id
            (:class:`FixedWorker`): several server processes would issue the same IDs.
    """

    strategy: str
    layout: BitLayout | None = None
    key: str | None = None
    allocator: str | None = None
    store: str | None = None
    fixed_worker: bool = False


@runtime_checkable
class Describes(Protocol):
    """A generator that says what it is (:class:`GeneratorInfo`)."""

    def describe(self) -> GeneratorInfo: ...


# -- checking ---------------------------------------------------------------------------------
def members(contract: type) -> list[str]:
    """The public members a protocol requires (methods, properties, attributes)."""
    found: set[str] = set()
    for base in contract.__mro__:
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        found.update(n for n in vars(base) if not n.startswith("_"))
        found.update(n for n in getattr(base, "__annotations__", {}) if not n.startswith("_"))
    return sorted(found)


def _methods(contract: type) -> set[str]:
    return {n for n in members(contract)
            if inspect.isfunction(inspect.getattr_static(contract, n, None))}


def check_contract(obj: Any, contract: type, reg: Registration, path: str) -> Any:
    """Return ``obj`` if it has every member of ``contract``; else raise
    :class:`ContractError` naming the plugin, its origin and what is missing."""
    methods = _methods(contract)
    missing = []
    for name in members(contract):
        try:
            value = inspect.getattr_static(obj, name)
        except AttributeError:
            missing.append(f"{name}()" if name in methods else name)
            continue
        if name in methods and not callable(value) and not isinstance(
                value, (staticmethod, classmethod)):
            missing.append(f"{name}() (it is not callable)")
    if missing or not isinstance(obj, contract):
        raise ContractError(path, reg.kind, reg.name, reg.origin or repr(reg.plugin),
                            type(obj).__name__, contract.__name__, missing)
    return obj
