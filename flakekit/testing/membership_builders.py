"""What a membership plugin's own tests build again and again (ZooKeeper, etcd): a join
request, the key (or znode path) a member's record lives at, and a config whose
``[cluster]`` joins through the plugin's table::

    lease = membership.acquire(join_request(ns, "n2"))
    build_kit(membership_config({"type": "etcd"}, lease="10s"), host)
"""

from __future__ import annotations

from typing import Any

from flakekit.cluster.store_contracts import JoinRequest
from flakekit.testing.configs import cluster_table, strict_config
from flakekit.values.cluster import Member

__all__ = ["join_request", "member_path", "membership_config"]


def join_request(cluster: str, node: str = "n1", lease_s: float = 4.0) -> JoinRequest:
    """Node ``node`` (advertising ``http://{node}.test:8080``) joins ``cluster``."""
    return JoinRequest(cluster, Member(node, f"http://{node}.test:8080"), lease_s)


def member_path(root: str, cluster: str, node: str) -> str:
    """Where a store keeps ``node``'s record under ``root`` (the layout both share)."""
    return f"{root}/clusters/{cluster}/members/{node}"


def membership_config(membership: dict[str, Any], **cluster: Any) -> Any:
    """A strict config whose ``[cluster]`` joins through ``membership`` (a plugin's
    table), with ``cluster``'s other keys."""
    return strict_config(cluster_table(membership=membership, **cluster))
