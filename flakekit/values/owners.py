"""Which node owns a key: weighted rendezvous hashing (HRW) over a cluster view.

The function is part of the wire contract ("hrw-xxh64-v1"): every node, router and client,
in any language, must compute the same owner from the same members, so it uses only XXH64
and unsigned 64-bit integer comparisons (no floats, no ``hash()``, no list positions).
For each member and each replica ``r in range(weight)``::

    seed  = XXH64(f"{node}#{r}".encode("utf-8"), seed=0)
    score = XXH64(key.encode("utf-8"), seed=seed)

The owner is the member with the highest score; a tie goes to the larger node name
(compared as UTF-8 bytes). Golden vectors: docs/cluster-hrw-vectors.json
(scripts/hrw_vectors.py), the algorithm explained in docs/cluster-routing.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

from flakekit.errors import FieldError
from flakekit.values.cluster import Member, View

__all__ = ["HASH_NAME", "MAX_WEIGHT", "OwnerMap", "owner_of"]

#: the name of this function on the wire (``GET /api/v1/cluster`` answers it as ``hash``)
HASH_NAME = "hrw-xxh64-v1"
#: weights are replicas: small integers, so a lookup costs at most sum(weights) hashes
MAX_WEIGHT = 64
#: keys remembered by one OwnerMap before it starts over (bounds memory for open key sets)
CACHE_SIZE = 65_536

_xxh64 = xxhash.xxh64_intdigest
#: one replica point: (seed, node as UTF-8 bytes, member)
_Point = tuple[int, bytes, Member]


def _points(members: Iterable[Member]) -> tuple[_Point, ...]:
    """Every member's replica seeds, after checking the members can be routed to."""
    points: list[_Point] = []
    seen: set[str] = set()
    for member in members:
        if not isinstance(member, Member):
            raise FieldError("members", f"members must be Member objects, got {member!r}")
        node, weight = member.node, member.weight
        if not isinstance(node, str) or not node:
            raise FieldError("members", f"a member's node must be a non-empty string, got {node!r}")
        if node in seen:
            raise FieldError("members", f"node {node!r} is listed twice; each node once")
        seen.add(node)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise FieldError("weight", f"node {node!r}: weight must be an integer from 1 to "
                             f"{MAX_WEIGHT}, got {weight!r}")
        raw = node.encode("utf-8")
        for r in range(weight):
            points.append((_xxh64(raw + b"#" + str(r).encode("ascii"), 0), raw, member))
    return tuple(points)


def _key_bytes(key: object) -> bytes:
    if not isinstance(key, str):
        raise FieldError("key", f"a key must be a str, got {type(key).__name__} {key!r:.40}")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError("key", f"key {key!r:.40} is not valid Unicode (a lone surrogate); "
                         "pass the text the key was created with") from None


def _best(data: bytes, points: tuple[_Point, ...]) -> Member:
    best_score = -1
    best_node = b""
    best: Member | None = None
    for seed, node, member in points:
        score = _xxh64(data, seed)
        if score > best_score or (score == best_score and node > best_node):
            best_score, best_node, best = score, node, member
    if best is None:
        raise FieldError("members", "no member to own the key: the view is empty (no node has "
                         "joined yet, or all left); start a node or wait for the view")
    return best


def owner_of(key: str, members: Iterable[Member]) -> Member:
    """The member that owns ``key`` (uncached: hashes every replica seed again)."""
    return _best(_key_bytes(key), _points(members))


class OwnerMap:
    """The owners of one view, cached per key.

    A map is bound to its view's epoch for life: when the view changes, build a new map
    (the old one keeps answering for the old epoch, so nobody can read a stale owner
    from a cache that outlived its view).
    """

    __slots__ = ("_cache", "_points", "epoch", "view")

    def __init__(self, view: View) -> None:
        self.view = view
        self.epoch = view.epoch
        self._points = _points(view.members)
        self._cache: dict[str, Member] = {}

    def owner(self, key: str) -> Member:
        """The owner of ``key`` in this map's view."""
        try:
            return self._cache[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key, refused below
            pass
        member = _best(_key_bytes(key), self._points)
        cache = self._cache
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[key] = member
        return member

    def owners(self, keys: Iterable[str]) -> dict[str, Member]:
        """``{key: owner}`` for every key."""
        return {key: self.owner(key) for key in keys}

    def __repr__(self) -> str:
        return (f"OwnerMap(cluster={self.view.cluster!r}, epoch={self.epoch}, "
                f"nodes={list(self.view.nodes())})")
