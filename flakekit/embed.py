"""What an application or the server needs to embed flakekit: load a config, build a
:class:`Kit` for it with an identity, and read what it built (layouts, segment stores and
their reports, pool durability) -- the assembly and CLI names a plugin does not implement.

Plugins may import it beside :mod:`flakekit.plugin` (``tests/test_architecture.py``); a
name here changes only with a release note. Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flakekit._lazy import exports, table

if TYPE_CHECKING:  # what mypy reads; the same names as _FROM (a test checks)
    from flakekit.assembly.config import (
        load_config,
    )
    from flakekit.assembly.kit import (
        Identity,
        Kit,
        build_kit,
        default_identity,
        resolve_layout,
        typed_generators,
    )
    from flakekit.builtin.segments import (
        SqlStoreOptions,
        segments_report,
        store_targets,
    )
    from flakekit.cli import (
        USAGE_ERRORS,
    )
    from flakekit.cluster.node import (
        ClusterNode,
    )
    from flakekit.cluster.processes import (
        process_advertise,
        process_node,
        processes_of,
    )
    from flakekit.generators.segment_service import (
        SegmentService,
    )
    from flakekit.pluginhost.host import (
        get_host,
    )
    from flakekit.sql.durability import (
        pool_durability,
    )
    from flakekit.sql.leaf import (
        SqlSegmentStore,
    )

#: module -> the names it gives the embedding API
_FROM = {
    "flakekit.assembly.config": ("load_config",),
    "flakekit.assembly.kit": (
        "Identity", "Kit", "build_kit", "default_identity", "resolve_layout", "typed_generators"
    ),
    "flakekit.builtin.segments": ("SqlStoreOptions", "segments_report", "store_targets"),
    "flakekit.cli": ("USAGE_ERRORS",),
    "flakekit.cluster.node": ("ClusterNode",),
    "flakekit.cluster.processes": ("process_advertise", "process_node", "processes_of"),
    "flakekit.generators.segment_service": ("SegmentService",),
    "flakekit.pluginhost.host": ("get_host",),
    "flakekit.sql.durability": ("pool_durability",),
    "flakekit.sql.leaf": ("SqlSegmentStore",),
}
_WHERE = table(_FROM)

__all__ = sorted(_WHERE)
_getattr, __dir__ = exports(__name__, _WHERE, globals())


def __getattr__(name: str) -> Any:  # a `def`, so that mypy knows the module has one
    return _getattr(name)
