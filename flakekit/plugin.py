"""The stable surface for plugin authors: everything a plugin imports from flakekit.

Bundled plugins (``plugins/``) and the example plugin import only from this module and
from :mod:`flakekit` itself (a test enforces it), so the modules behind it can move
without breaking a plugin. A name here changes only with a release note. Names are
imported on first use, so a plugin that needs only ``hookimpl`` does not pull in
SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flakekit.assembly.config import load_config
    from flakekit.assembly.context import BuildContext, Part
    from flakekit.assembly.kit import (
        Identity,
        build_kit,
        default_identity,
        resolve_layout,
        typed_generators,
    )
    from flakekit.assembly.settings import PluginRef, plugin_ref
    from flakekit.builtin.segments import SqlStoreOptions, segments_report, store_targets
    from flakekit.cli import USAGE_ERRORS, config_option
    from flakekit.cluster.membership import (
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
    from flakekit.cluster.settings import ClusterSettings
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
    from flakekit.generators.segment_service import SegmentService
    from flakekit.leases.kv import KeyValueStore, KvEntry, KvLeaseAllocator, KvOp, KvState
    from flakekit.leases.lease import LeaseRequest, WorkerLease, WorkerRecord
    from flakekit.pluginhost.contracts import (
        Describes,
        FixedWorker,
        FormatsIds,
        Generator,
        GeneratorInfo,
        HasKey,
        HasLayout,
        HasStats,
        LeaseTarget,
        NamesLayout,
        SegmentStore,
        StatsRecord,
        WorkerAllocator,
        check_contract,
    )
    from flakekit.pluginhost.host import get_host
    from flakekit.pluginhost.markers import hookimpl
    from flakekit.pluginhost.registry import Register
    from flakekit.sql.durability import pool_durability
    from flakekit.sql.leaf import SqlSegmentStore
    from flakekit.sql.schema import (
        Component,
        Migration,
        SchemaChange,
        check_schema,
        register_component,
    )
    from flakekit.values.batch import IdBatch
    from flakekit.values.clock import Clock
    from flakekit.values.cluster import Member, MemberInfo, View
    from flakekit.values.events import Events
    from flakekit.values.formats import ENCODINGS, IdFormat
    from flakekit.values.keys import KEY_RE, KEY_RULE, key_problem
    from flakekit.values.layout import BitLayout
    from flakekit.values.stats import (
        LATENCY_BUCKETS_S,
        BufferStats,
        LeaseStats,
        SegmentStats,
        SnowflakeStats,
    )
    from flakekit.values.timeunits import iso_utc, parse_duration_ns

# name -> module; imported on first use so that loading a plugin stays cheap
_WHERE = {
    "Describes": "flakekit.pluginhost.contracts",
    "FixedWorker": "flakekit.pluginhost.contracts",
    "FormatsIds": "flakekit.pluginhost.contracts",
    "Generator": "flakekit.pluginhost.contracts",
    "GeneratorInfo": "flakekit.pluginhost.contracts",
    "HasKey": "flakekit.pluginhost.contracts",
    "HasLayout": "flakekit.pluginhost.contracts",
    "HasStats": "flakekit.pluginhost.contracts",
    "LeaseTarget": "flakekit.pluginhost.contracts",
    "NamesLayout": "flakekit.pluginhost.contracts",
    "SegmentStore": "flakekit.pluginhost.contracts",
    "StatsRecord": "flakekit.pluginhost.contracts",
    "WorkerAllocator": "flakekit.pluginhost.contracts",
    "check_contract": "flakekit.pluginhost.contracts",
    "PluginRef": "flakekit.assembly.settings",
    "plugin_ref": "flakekit.assembly.settings",
    "Part": "flakekit.assembly.context",
    "typed_generators": "flakekit.assembly.kit",
    "SqlStoreOptions": "flakekit.builtin.segments",
    "load_config": "flakekit.assembly.config",
    "BuildContext": "flakekit.assembly.context",
    "Identity": "flakekit.assembly.kit",
    "build_kit": "flakekit.assembly.kit",
    "default_identity": "flakekit.assembly.kit",
    "resolve_layout": "flakekit.assembly.kit",
    "segments_report": "flakekit.builtin.segments",
    "pool_durability": "flakekit.sql.durability",
    "store_targets": "flakekit.builtin.segments",
    "USAGE_ERRORS": "flakekit.cli",
    "config_option": "flakekit.cli",
    "BackendError": "flakekit.errors",
    "ClockMovedBackwardsError": "flakekit.errors",
    "ClusterError": "flakekit.errors",
    "ClusterUnavailableError": "flakekit.errors",
    "KeyMovingError": "flakekit.errors",
    "NotOwnerError": "flakekit.errors",
    "iso_utc": "flakekit.values.timeunits",
    "KEY_RE": "flakekit.values.keys",
    "KEY_RULE": "flakekit.values.keys",
    "key_problem": "flakekit.values.keys",
    "Member": "flakekit.values.cluster",
    "IdBatch": "flakekit.values.batch",
    "MemberInfo": "flakekit.values.cluster",
    "View": "flakekit.values.cluster",
    "FenceError": "flakekit.errors",
    "JoinRequest": "flakekit.cluster.membership",
    "KeyClaim": "flakekit.cluster.membership",
    "KeyFence": "flakekit.cluster.membership",
    "KeyOwnerRecord": "flakekit.cluster.membership",
    "MemberLease": "flakekit.cluster.membership",
    "Membership": "flakekit.cluster.membership",
    "MAX_WEIGHT": "flakekit.cluster.membership",
    "check_key_segment": "flakekit.cluster.membership",
    "proposed_members": "flakekit.cluster.membership",
    "ClusterSettings": "flakekit.cluster.settings",
    "ConfigError": "flakekit.errors",
    "DuplicateRegistrationError": "flakekit.errors",
    "FieldError": "flakekit.errors",
    "FlakekitError": "flakekit.errors",
    "ForkedProcessError": "flakekit.errors",
    "InvalidIdError": "flakekit.errors",
    "LayoutError": "flakekit.errors",
    "LeaseError": "flakekit.errors",
    "LeaseExpiredError": "flakekit.errors",
    "LeaseLostError": "flakekit.errors",
    "NotStartedError": "flakekit.errors",
    "PartValueError": "flakekit.errors",
    "SchemaError": "flakekit.errors",
    "SegmentRowError": "flakekit.errors",
    "SegmentUnavailableError": "flakekit.errors",
    "TimeOverflowError": "flakekit.errors",
    "UnknownKeyError": "flakekit.errors",
    "UnknownNameError": "flakekit.errors",
    "ContractError": "flakekit.errors",
    "PluginLoadError": "flakekit.errors",
    "WaitTooLongError": "flakekit.errors",
    "WorkerExhaustedError": "flakekit.errors",
    "suggest": "flakekit.errors",
    "SegmentService": "flakekit.generators.segment_service",
    "KeyValueStore": "flakekit.leases.kv",
    "KvEntry": "flakekit.leases.kv",
    "KvLeaseAllocator": "flakekit.leases.kv",
    "KvOp": "flakekit.leases.kv",
    "KvState": "flakekit.leases.kv",
    "LeaseRequest": "flakekit.leases.lease",
    "WorkerLease": "flakekit.leases.lease",
    "WorkerRecord": "flakekit.leases.lease",
    "get_host": "flakekit.pluginhost.host",
    "hookimpl": "flakekit.pluginhost.markers",
    "Register": "flakekit.pluginhost.registry",
    "SqlSegmentStore": "flakekit.sql.leaf",
    "Component": "flakekit.sql.schema",
    "Migration": "flakekit.sql.schema",
    "SchemaChange": "flakekit.sql.schema",
    "register_component": "flakekit.sql.schema",
    "check_schema": "flakekit.sql.schema",
    "Clock": "flakekit.values.clock",
    "Events": "flakekit.values.events",
    "ENCODINGS": "flakekit.values.formats",
    "IdFormat": "flakekit.values.formats",
    "BitLayout": "flakekit.values.layout",
    "BufferStats": "flakekit.values.stats",
    "LeaseStats": "flakekit.values.stats",
    "SegmentStats": "flakekit.values.stats",
    "LATENCY_BUCKETS_S": "flakekit.values.stats",
    "SnowflakeStats": "flakekit.values.stats",
    "parse_duration_ns": "flakekit.values.timeunits",
}


__all__ = [
    "Describes",
    "FixedWorker",
    "FormatsIds",
    "Generator",
    "GeneratorInfo",
    "HasKey",
    "HasLayout",
    "HasStats",
    "LeaseTarget",
    "NamesLayout",
    "SegmentStore",
    "StatsRecord",
    "WorkerAllocator",
    "check_contract",
    "PluginRef",
    "plugin_ref",
    "Part",
    "typed_generators",
    "SqlStoreOptions",
    "ENCODINGS",
    "USAGE_ERRORS",
    "BackendError",
    "BitLayout",
    "BufferStats",
    "BuildContext",
    "Clock",
    "ClockMovedBackwardsError",
    "ClusterError",
    "ClusterSettings",
    "ClusterUnavailableError",
    "Component",
    "ConfigError",
    "DuplicateRegistrationError",
    "FenceError",
    "FieldError",
    "Events",
    "FlakekitError",
    "ForkedProcessError",
    "IdBatch",
    "IdFormat",
    "Identity",
    "InvalidIdError",
    "JoinRequest",
    "KeyClaim",
    "KeyFence",
    "KeyMovingError",
    "KeyOwnerRecord",
    "KeyValueStore",
    "KvEntry",
    "KvLeaseAllocator",
    "KvOp",
    "KvState",
    "LayoutError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseLostError",
    "LeaseRequest",
    "LeaseStats",
    "Member",
    "MemberInfo",
    "MemberLease",
    "Membership",
    "MAX_WEIGHT",
    "check_key_segment",
    "proposed_members",
    "KEY_RE",
    "KEY_RULE",
    "iso_utc",
    "key_problem",
    "Migration",
    "NotOwnerError",
    "NotStartedError",
    "PartValueError",
    "Register",
    "SchemaChange",
    "SchemaError",
    "SegmentRowError",
    "SegmentService",
    "SegmentStats",
    "LATENCY_BUCKETS_S",
    "SegmentUnavailableError",
    "SnowflakeStats",
    "SqlSegmentStore",
    "TimeOverflowError",
    "UnknownKeyError",
    "UnknownNameError",
    "View",
    "ContractError",
    "PluginLoadError",
    "WaitTooLongError",
    "WorkerExhaustedError",
    "WorkerLease",
    "WorkerRecord",
    "build_kit",
    "check_schema",
    "config_option",
    "default_identity",
    "get_host",
    "hookimpl",
    "load_config",
    "parse_duration_ns",
    "register_component",
    "resolve_layout",
    "segments_report",
    "pool_durability",
    "store_targets",
    "suggest",
]


def __getattr__(name: str) -> Any:
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'flakekit.plugin' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
