"""What every membership store writes and says the same way: the JSON records of the
key-value stores (etcd, ZooKeeper), the checks of a join and a proposal, the holder
token, the safety window, and the messages of a refused join and a lost lease.

The stores differ in how they fence (a row's incarnation, a znode's czxid, an etcd
create revision); what they record about a member and how they word its fate is one
thing, written here once so a message reads the same whichever store a cluster uses.
Plugins reach these names through :mod:`flakekit.plugin`.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from flakekit.cluster.store_contracts import (
    JoinRequest,
    MemberLease,
    check_key_segment,
    proposed_members,
)
from flakekit.errors import BackendError, LeaseLostError
from flakekit.values.cluster import Member, MemberInfo, View

__all__ = [
    "ClusterKeys",
    "SAFETY_SHARE",
    "check_join",
    "check_proposal",
    "check_seen_epoch",
    "cluster_of",
    "decode_record",
    "encode_record",
    "held_by_error",
    "holder_token",
    "live_member_info",
    "log_view_change",
    "member_of",
    "no_longer_ours",
    "roster_member_info",
    "safety_window_ns",
    "stored_view",
    "view_entries",
    "view_members",
]

#: the least share of a lease kept as safety window (and the share when none is
#: configured): a claimer counts on every holder stopping ``(1 - SAFETY_SHARE) * lease``
#: after the send of the renewal it read (``serve_share``)
SAFETY_SHARE = 0.2


def encode_record(**fields: Any) -> bytes:
    """A member, roster or view record as stored: compact JSON with sorted keys."""
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


def decode_record(data: bytes | None) -> dict[str, Any]:
    """A stored record as a dict; ``{}`` for a missing, unreadable or non-object one."""
    try:
        raw = json.loads(data or b"{}")
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}


def as_int(value: Any, default: int = 0) -> int:
    """``int(value)``, or ``default`` for a value a record should not hold."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def member_of(node: str, raw: dict[str, Any]) -> Member:
    """The member a record describes (advertise ``""`` and weight 1 when unreadable)."""
    return Member(node, str(raw.get("advertise", "")), as_int(raw.get("weight"), 1))


def live_member_info(node: str, raw: dict[str, Any], *, incarnation: int, expires_in_ms: int,
                     lease_ms: int, version: int, state: str = "") -> MemberInfo:
    """What a live member record says: alive, or draining when it says so (``state``:
    the store knows better, such as a lease that ended a moment ago)."""
    state = state or ("draining" if raw.get("state") == "draining" else "alive")
    return MemberInfo(member_of(node, raw), state, str(raw.get("holder", "")), incarnation,
                      expires_in_ms, lease_ms, version=version,
                      config_digest=str(raw.get("config_digest", "")))


def roster_member_info(node: str, raw: dict[str, Any], *, incarnation: int, lease_ms: int = 0,
                       version: int | None = None) -> MemberInfo:
    """What a roster entry without a live member says: left after a clean leave, else
    lapsed (its lease ended without one); it expires in 0 ms."""
    state = "left" if raw.get("state") == "left" else "lapsed"
    return MemberInfo(member_of(node, raw), state, str(raw.get("holder", "")), incarnation,
                      0, lease_ms, version=version)


def view_entries(members: Iterable[Member]) -> list[dict[str, Any]]:
    """The members of a view as stored: one ``{node, advertise, weight}`` each."""
    return [{"node": m.node, "advertise": m.advertise, "weight": m.weight} for m in members]


def view_members(entries: Any) -> tuple[Member, ...]:
    """The members of a stored view (entries that name no node are skipped)."""
    return tuple(member_of(str(e["node"]), e) for e in entries or ()
                 if isinstance(e, dict) and "node" in e)


def stored_view(cluster: str, raw: dict[str, Any] | None,
                changed_at_ms: int | None = None) -> View:
    """The view a stored record holds (``View(cluster, 0, ())`` for none);
    ``changed_at_ms``: the store's own time of the write, else the record's."""
    if raw is None:
        return View(cluster, 0, ())
    changed = as_int(raw.get("changed_at_ms")) if changed_at_ms is None else changed_at_ms
    return View(cluster, as_int(raw.get("epoch")), view_members(raw.get("members")), changed)


def check_join(request: JoinRequest) -> str:
    """The cluster of a join to a key-value store, once its cluster and node can be
    path segments, its weight is in range and its advertise address is a string, and
    its lease is a positive number of seconds; ValueError naming the field otherwise."""
    cluster = check_key_segment("cluster", request.cluster)
    member = request.member
    proposed_members([member], check_key_segment)
    if not isinstance(member.advertise, str):
        raise ValueError(f"advertise must be a string, got {member.advertise!r}")
    lease_s = request.lease_s
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    return cluster


def check_proposal(cluster: str, seen_epoch: object,
                   members: Sequence[Member]) -> list[Member]:
    """The members of a proposal to a key-value store in view order, once its cluster
    and nodes can be path segments and ``seen_epoch`` may move on; ValueError otherwise."""
    check_key_segment("cluster", cluster)
    check_seen_epoch(seen_epoch)
    return proposed_members(members, check_key_segment)


def check_seen_epoch(seen_epoch: object) -> int:
    """``seen_epoch`` if a proposal may move the view on from it; ValueError otherwise."""
    if isinstance(seen_epoch, bool) or not isinstance(seen_epoch, int) or not (
            0 <= seen_epoch < 2**63 - 1):
        raise ValueError(f"seen_epoch must be an integer from 0 to 2**63 - 2, got "
                         f"{seen_epoch!r}")
    return seen_epoch


def holder_token() -> str:
    """A new holder token: this host and process, and a random part (a second process
    started with the same node id gets another one)."""
    return f"{os.uname().nodename}/pid{os.getpid()}/{uuid.uuid4().hex[:12]}"


def safety_window_ns(lease_ns: int, configured: int | None) -> int:
    """The safety window of a ``lease_ns`` lease: the one configured, but never less
    than ``SAFETY_SHARE`` of the lease (rounded up), which claimers count on."""
    least = -(-lease_ns * round(SAFETY_SHARE * 100) // 100)
    return least if configured is None else max(configured, least)


def cluster_of(lease: MemberLease) -> str:
    """The cluster a lease was joined to (renew and release get only the lease)."""
    if not lease.cluster:
        raise ValueError(f"member {lease.member.node!r}: the lease names no cluster "
                         "(it was not made by a join)")
    return lease.cluster


def no_longer_ours(lease: MemberLease, why: str) -> LeaseLostError:
    """The renewal's verdict when the member's record has gone to someone else."""
    return LeaseLostError(f"member {lease.member.node!r} of cluster {lease.cluster!r} is "
                          f"no longer ours (we held incarnation {lease.epoch} as "
                          f"{lease.holder}): {why}")


def held_by_error(cluster: str, node: str, holder: object, detail: str, where: str,
                  free: str = "") -> BackendError:
    """A join refused because a live process holds the node: ``detail`` says how the
    store knows (incarnation, lease, session), ``free`` when it would be free."""
    return BackendError(f"node {node!r} of cluster {cluster!r} is held by a live process "
                        f"({holder}, {detail}) in {where}; {free}stop it, or give this "
                        "process another node id")


def log_view_change(log: logging.Logger, cluster: str, seen_epoch: int, view: View) -> None:
    """The one log line of a proposal that moved the view."""
    log.info("cluster %s: view epoch %d -> %d (%s)", cluster, seen_epoch, view.epoch,
             ", ".join(view.nodes()) or "no members")



@attrs.frozen
class ClusterKeys:
    """Where a key-value membership keeps a cluster (etcd keys, ZooKeeper znodes):
    ``{root}/clusters/{cluster}`` holds ``members/{node}`` (the live member, on the
    holder's lease or session), ``nodes/{node}`` (its roster entry, which outlives it)
    and ``view``."""

    root: str

    def base(self, cluster: str) -> str:
        return f"{self.root}/clusters/{cluster}"

    def member(self, cluster: str, node: str) -> str:
        return f"{self.base(cluster)}/members/{node}"

    def roster(self, cluster: str, node: str) -> str:
        return f"{self.base(cluster)}/nodes/{node}"

    def view(self, cluster: str) -> str:
        return f"{self.base(cluster)}/view"
