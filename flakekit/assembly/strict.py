"""The generator a ``order = "strict"`` segment table builds: a handle on a key that only
its owner in the cluster may serve.

Why it holds no segments of its own: a strict key's IDs must come from the node that owns
the key at the current view epoch, fenced by a claim in the store (I2/I3 of cluster
mode). A plain segment generator would fetch without a claim and break the per-key order
across nodes, so this one refuses until a :class:`~flakekit.cluster.node.ClusterNode`
is bound to it (``kit.cluster_node()``, what ``flakekit serve`` does), then asks the node
(which draws, then checks its lease and the claim's epoch, and raises
:class:`~flakekit.errors.NotOwnerError` on a node that does not own the key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import ClusterError

if TYPE_CHECKING:
    from flakekit.cluster.node import ClusterNode
    from flakekit.cluster.store_contracts import KeyFence
    from flakekit.generators.segment import SegmentSettings

__all__ = ["StrictSegment"]


@attrs.define(eq=False)
class StrictSegment:
    """Attributes:
        name: the generator's name in config.
        key: the segment key (``biz_tag``).
        store: its segment store, which fences keys.
        settings: the generator's segment settings (the node builds a new
            SegmentGenerator from them on every claim).
        store_type: the store's registered name (for descriptions).
    """

    name: str
    key: str
    store: KeyFence
    settings: SegmentSettings
    store_type: str = "sql"
    order: str = "strict"
    _node: ClusterNode | None = None

    def bind(self, node: ClusterNode | None) -> None:
        """Serve through ``node`` from now on (None: unbind)."""
        self._node = node

    @property
    def node(self) -> ClusterNode | None:
        return self._node

    def _serving(self) -> ClusterNode:
        node = self._node
        if node is None:
            raise ClusterError(
                f"generators.{self.name}: order = \"strict\": key {self.key!r} is served only "
                "by its owner in the cluster (run `flakekit serve` with this config, or ask "
                "a node over HTTP); set order = \"node\" to serve it from every process"
            )
        return node

    def start(self) -> StrictSegment:
        """Nothing to acquire here: the cluster node claims the key and fetches."""
        return self

    def next_id(self) -> int:
        return self._serving().next_id(self.key)[0]

    def next_ids(self, n: int) -> Any:
        return self._serving().next_ids(self.key, n)[0]

    def close(self) -> None:
        """The node releases its claims and segments (``ClusterNode.close()``)."""
        self._node = None
