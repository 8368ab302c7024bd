"""The stable surface for plugin authors: what a plugin implements and calls.

Bundled plugins (``plugins/``) and the example plugin import only from this module, from
:mod:`flakekit` itself and, to embed flakekit (the server), from :mod:`flakekit.embed` (a
test enforces it), so the modules behind it can move without breaking a plugin. A name
here changes only with a release note. Names are imported on first use, so a plugin that
needs only ``hookimpl`` does not pull in SQLAlchemy.

The names are written once, in :data:`_FROM`; ``__all__`` and ``__dir__`` come from it and
the ``TYPE_CHECKING`` imports (what mypy reads) are checked against it by
``tests/test_architecture.py``. The assembly names this module used to export
(``build_kit``, ``load_config``, ...) moved to :mod:`flakekit.embed` and still resolve here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flakekit._lazy import exports, table

if TYPE_CHECKING:  # what mypy reads; the same names as _FROM (a test checks)
    from flakekit.assembly.context import (
        BuildContext,
        Part,
    )
    from flakekit.assembly.settings import (
        PluginRef,
        plugin_ref,
    )
    from flakekit.cli import (
        config_option,
    )
    from flakekit.cluster.kv_membership import (
        KvMembershipBase,
    )
    from flakekit.cluster.member_records import (
        SAFETY_SHARE,
        ClusterKeys,
        as_int,
        check_join,
        check_proposal,
        check_seen_epoch,
        cluster_of,
        decode_record,
        encode_record,
        held_by_error,
        holder_token,
        live_member_info,
        log_view_change,
        member_of,
        no_longer_ours,
        roster_member_info,
        safety_window_ns,
        stored_view,
        view_entries,
        view_members,
    )
    from flakekit.cluster.settings import (
        ClusterSettings,
    )
    from flakekit.cluster.store_contracts import (
        MAX_WEIGHT,
        JoinRequest,
        KeyClaim,
        KeyFence,
        KeyOwnerRecord,
        MemberLease,
        Membership,
        check_key_segment,
        proposed_members,
    )
    from flakekit.errors import (
        BackendError,
        ClockMovedBackwardsError,
        ClusterError,
        ClusterUnavailableError,
        ConfigError,
        ContractError,
        DuplicateRegistrationError,
        FenceError,
        FieldError,
        FlakekitError,
        ForkedProcessError,
        InvalidIdError,
        KeyMovingError,
        LayoutError,
        LeaseError,
        LeaseExpiredError,
        LeaseLostError,
        NotOwnerError,
        NotStartedError,
        PartValueError,
        PluginLoadError,
        SchemaError,
        SegmentRowError,
        SegmentUnavailableError,
        TimeOverflowError,
        UnknownKeyError,
        UnknownNameError,
        WaitTooLongError,
        WorkerExhaustedError,
        suggest,
    )
    from flakekit.leases.kv import (
        KeyValueStore,
        KvEntry,
        KvLeaseAllocator,
        KvOp,
        KvState,
        KvStoreBase,
    )
    from flakekit.leases.lease import (
        LeaseRequest,
        WorkerLease,
        WorkerRecord,
    )
    from flakekit.pluginhost.contracts import (
        Allocation,
        CountsWorkers,
        Describes,
        FixedWorker,
        FormatsIds,
        Generator,
        GeneratorInfo,
        HasKey,
        HasLayout,
        HasStats,
        IssuesIds,
        LapseMeansStopped,
        LeaseTarget,
        ListsKeys,
        Locates,
        NamesLayout,
        NonBlocking,
        NonBlockingKeys,
        OrdersKeys,
        PeriodStore,
        PollsView,
        ReadsViewAndMembers,
        SegmentStore,
        ServeShare,
        SeveralLeases,
        StatsRecord,
        TellsStalls,
        WorkerAllocator,
        check_contract,
    )
    from flakekit.pluginhost.markers import (
        hookimpl,
        registers,
    )
    from flakekit.pluginhost.registry import (
        AllocatorFactory,
        ClockFactory,
        LayoutFactory,
        MembershipFactory,
        Register,
        SegmentStoreFactory,
        StrategyFactory,
    )
    from flakekit.sql.schema import (
        Component,
        Migration,
        SchemaChange,
        check_schema,
        register_component,
    )
    from flakekit.values.allocation import (
        check_new_range,
    )
    from flakekit.values.batch import (
        IdBatch,
    )
    from flakekit.values.clock import (
        Clock,
    )
    from flakekit.values.cluster import (
        Member,
        MemberInfo,
        View,
    )
    from flakekit.values.events import (
        Events,
    )
    from flakekit.values.formats import (
        ENCODINGS,
        IdFormat,
    )
    from flakekit.values.keys import (
        KEY_RE,
        KEY_RULE,
        key_problem,
        root_field,
    )
    from flakekit.values.layout import (
        BitLayout,
    )
    from flakekit.values.lease_settings import (
        check_path_name,
        check_safety_window,
        safety_window_field,
    )
    from flakekit.values.nanoseconds import (
        NS_PER_MS,
        NS_PER_S,
    )
    from flakekit.values.stats import (
        LATENCY_BUCKETS_S,
        BufferStats,
        LeaseStats,
        SegmentStats,
        SnowflakeStats,
    )
    from flakekit.values.store_location import (
        address_from_env,
        namespace_of,
    )
    from flakekit.values.timeunits import (
        Duration,
        duration_field,
        iso_utc,
        parse_duration_ns,
        to_duration,
    )

#: module -> the names it gives the surface; one line of a tuple per module
_FROM = {
    "flakekit.assembly.context": ("BuildContext", "Part"),
    "flakekit.assembly.settings": ("PluginRef", "plugin_ref"),
    "flakekit.cli": ("config_option",),
    "flakekit.cluster.member_records": (
        "SAFETY_SHARE", "ClusterKeys", "as_int", "check_join", "check_proposal",
        "check_seen_epoch", "cluster_of", "decode_record", "encode_record", "held_by_error",
        "holder_token", "live_member_info", "log_view_change", "member_of", "no_longer_ours",
        "roster_member_info", "safety_window_ns", "stored_view", "view_entries", "view_members"
    ),
    "flakekit.cluster.kv_membership": ("KvMembershipBase",),
    "flakekit.cluster.store_contracts": (
        "MAX_WEIGHT", "JoinRequest", "KeyClaim", "KeyFence", "KeyOwnerRecord", "MemberLease",
        "Membership", "check_key_segment", "proposed_members"
    ),
    "flakekit.cluster.settings": ("ClusterSettings",),
    "flakekit.errors": (
        "BackendError", "ClockMovedBackwardsError", "ClusterError", "ClusterUnavailableError",
        "ConfigError", "ContractError", "DuplicateRegistrationError", "FenceError", "FieldError",
        "FlakekitError", "ForkedProcessError", "InvalidIdError", "KeyMovingError", "LayoutError",
        "LeaseError", "LeaseExpiredError", "LeaseLostError", "NotOwnerError", "NotStartedError",
        "PartValueError", "PluginLoadError", "SchemaError", "SegmentRowError",
        "SegmentUnavailableError", "TimeOverflowError", "UnknownKeyError", "UnknownNameError",
        "WaitTooLongError", "WorkerExhaustedError", "suggest"
    ),
    "flakekit.leases.kv": (
        "KeyValueStore", "KvEntry", "KvLeaseAllocator", "KvOp", "KvState", "KvStoreBase"
    ),
    "flakekit.leases.lease": ("LeaseRequest", "WorkerLease", "WorkerRecord"),
    "flakekit.pluginhost.contracts": (
        "Allocation", "CountsWorkers", "Describes", "FixedWorker", "FormatsIds", "Generator",
        "GeneratorInfo", "HasKey", "HasLayout", "HasStats", "IssuesIds", "LapseMeansStopped",
        "LeaseTarget", "ListsKeys", "Locates", "NamesLayout", "NonBlocking", "NonBlockingKeys",
        "OrdersKeys", "PeriodStore", "PollsView", "ReadsViewAndMembers", "SegmentStore",
        "ServeShare", "SeveralLeases", "StatsRecord", "TellsStalls", "WorkerAllocator",
        "check_contract"
    ),
    "flakekit.pluginhost.markers": ("hookimpl", "registers"),
    "flakekit.pluginhost.registry": (
        "AllocatorFactory", "ClockFactory", "LayoutFactory", "MembershipFactory", "Register",
        "SegmentStoreFactory", "StrategyFactory"
    ),
    "flakekit.sql.schema": (
        "Component", "Migration", "SchemaChange", "check_schema", "register_component"
    ),
    "flakekit.values.allocation": ("check_new_range",),
    "flakekit.values.batch": ("IdBatch",),
    "flakekit.values.clock": ("Clock",),
    "flakekit.values.cluster": ("Member", "MemberInfo", "View"),
    "flakekit.values.events": ("Events",),
    "flakekit.values.formats": ("ENCODINGS", "IdFormat"),
    "flakekit.values.keys": ("KEY_RE", "KEY_RULE", "key_problem", "root_field"),
    "flakekit.values.layout": ("BitLayout",),
    "flakekit.values.nanoseconds": ("NS_PER_MS", "NS_PER_S"),
    "flakekit.values.lease_settings": (
        "check_path_name", "check_safety_window", "safety_window_field"
    ),
    "flakekit.values.stats": (
        "LATENCY_BUCKETS_S", "BufferStats", "LeaseStats", "SegmentStats", "SnowflakeStats"
    ),
    "flakekit.values.store_location": ("address_from_env", "namespace_of"),
    "flakekit.values.timeunits": (
        "Duration", "duration_field", "iso_utc", "parse_duration_ns", "to_duration"
    ),
}
_WHERE = table(_FROM)


def _embedding(name: str) -> Any:
    """A name that moved to :mod:`flakekit.embed`: still importable from here."""
    import flakekit.embed

    if name not in flakekit.embed.__all__:
        raise AttributeError(f"module 'flakekit.plugin' has no attribute {name!r}")
    return getattr(flakekit.embed, name)


__all__ = sorted(_WHERE)
_getattr, __dir__ = exports(__name__, _WHERE, globals(), fallback=_embedding)


def __getattr__(name: str) -> Any:  # a `def`, so that mypy knows the module has one
    return _getattr(name)
