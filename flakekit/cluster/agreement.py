"""Config agreement: every member publishes a digest of its strict keys in its membership
record, and a node whose digest differs from the serving members' is refused at its join.

Why: a node whose config has a strict key as ``order = "node"`` serves that key from
unfenced segments beside the key's owner (order broken), and a node that lacks a strict
key the owner map gives it leaves that key unavailable (issue 20). Nothing else compares
the nodes' configs, so the membership record carries what matters for routing: the
owner map's hash and the sorted strict keys.

The digest is ``v1:<hash>:<count>:<sha256 of the sorted keys, 24 hex>``: equal digests
mean the same keys and the same owner map on both nodes. A record with no digest (a node
of an older flakekit, a store that keeps none) is not compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from flakekit.values.cluster import MemberInfo
from flakekit.values.owners import HASH_NAME

__all__ = ["DIGEST_VERSION", "config_digest", "disagreement"]

DIGEST_VERSION = "v1"
#: keys named in a refusal (the line stays one line)
_NAMED = 8


def config_digest(strict_keys: Iterable[str], hash_name: str = HASH_NAME) -> str:
    """The digest of a node's strict keys and owner-map hash (see the module)."""
    keys = sorted(set(strict_keys))
    body = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:24]
    return f"{DIGEST_VERSION}:{hash_name}:{len(keys)}:{body}"


def _few(keys: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_NAMED])
    return shown + (f" and {len(keys) - _NAMED} more" if len(keys) > _NAMED else "")


def disagreement(cluster: str, node: str, digest: str, infos: Iterable[MemberInfo],
                 mine: Iterable[str], claimed: Iterable[str]) -> str | None:
    """One line refusing ``node`` when a serving (alive or draining) other member
    published a digest other than ``digest``; None when all agree. ``mine`` are this
    node's strict keys, ``claimed`` the keys other nodes hold claims on (the key-owner
    table): the line names the keys in dispute that it can tell."""
    others = [i for i in infos if i.node != node and i.state in ("alive", "draining")
              and i.config_digest]
    differ = [i for i in others if i.config_digest != digest]
    if not differ:
        return None
    theirs = sorted({i.config_digest for i in differ})
    names = ", ".join(sorted(i.node for i in differ))
    mine_set, claimed_set = set(mine), set(claimed)
    lacking = sorted(claimed_set - mine_set)
    extra = sorted(mine_set - claimed_set)
    detail = []
    if lacking:
        detail.append(f"strict on the cluster but not here: {_few(lacking)}")
    if extra:
        detail.append(f"strict here, not claimed by the cluster: {_few(extra)}")
    if not detail:
        detail.append("the owner-map hash or the key set differs")
    return (f"cluster {cluster!r}: node {node!r} refused: its strict keys (digest "
            f"{digest}) differ from those of node(s) {names} (digest "
            f"{', '.join(theirs)}); {'; '.join(detail)}; give every node the same "
            "order = \"strict\" generators (docs/cluster.md, \"Changing the strict keys\")")
