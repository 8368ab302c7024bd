"""The key-owner table: who may advance a strict key's ``leaf_alloc`` row, at which epoch.

``flakekit_key_owner(biz_tag, owner_node, owner_epoch, released, claimed_at)`` sits
beside ``leaf_alloc`` (same database), so the fence is checked in the very transaction
that advances ``max_id``: lock the owner row (``SELECT ... FOR UPDATE``; SQLite: the
write lock of ``BEGIN IMMEDIATE``), compare (node, epoch, not released), and only then
update ``leaf_alloc``. A deposed owner -- paused, partitioned, or shutting down with a
stale cache (pingcap/tidb #46444) -- finds another node or a newer epoch there and
changes nothing. A claim never goes back to an older epoch, so the epochs a key is
served under only grow.

:class:`~flakekit.sql.leaf.SqlSegmentStore` implements
:class:`~flakekit.cluster.membership.KeyFence` with these functions.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from flakekit.cluster.membership import KeyClaim, KeyOwnerRecord
from flakekit.sql.dbclock import aware_utc, db_now, dialect_of, ns_of, retry_kind, retry_pause
from flakekit.sql.schema import key_owner
from flakekit.sql.transactions import write_transaction

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["MAX_EPOCH", "check_claim", "claim_key", "key_owner_of", "key_owners", "release_key"]

#: ``owner_epoch`` is a signed 64-bit column
MAX_EPOCH = 2**63 - 1
#: tries of one claim that lost a race (unique conflict, deadlock) before it raises
CLAIM_ATTEMPTS = 5

_k = key_owner.c


def valid_claim(claim: KeyClaim) -> KeyClaim:
    """``claim`` if its fields fit the table; ValueError naming the field otherwise."""
    if not isinstance(claim, KeyClaim):
        raise ValueError(f"claim must be a KeyClaim, got {claim!r}")
    if not isinstance(claim.key, str) or not 1 <= len(claim.key) <= 128:
        raise ValueError(f"claim.key must be 1 to 128 characters, got {claim.key!r}")
    if not isinstance(claim.node, str) or not 1 <= len(claim.node) <= 128:
        raise ValueError(f"claim.node must be 1 to 128 characters, got {claim.node!r}")
    if isinstance(claim.epoch, bool) or not isinstance(claim.epoch, int) or not (
            1 <= claim.epoch <= MAX_EPOCH):
        raise ValueError(f"claim.epoch must be an integer from 1 to {MAX_EPOCH}, "
                         f"got {claim.epoch!r}")
    return claim


def _locked_row(conn: Connection, key: str) -> Any:
    """(owner_node, owner_epoch, released) of ``key``, locked until the transaction ends
    (FOR UPDATE; on SQLite the transaction already holds the write lock)."""
    return conn.execute(
        select(_k.owner_node, _k.owner_epoch, _k.released)
        .where(_k.biz_tag == key).with_for_update()
    ).first()


def check_claim(conn: Connection, claim: KeyClaim) -> str | None:
    """Inside the caller's write transaction: lock ``claim.key``'s owner row and say why
    the claim does not hold it (None: it does, and keeps holding it until commit)."""
    row = _locked_row(conn, claim.key)
    if row is None:
        return "the key has no owner row (never claimed)"
    node, epoch, released = row
    if node != claim.node or epoch != claim.epoch:
        return f"it is owned by node {node!r} at epoch {epoch}"
    if released:
        return f"node {node!r} released it at epoch {epoch}"
    return None


def claim_key(engine: Engine, claim: KeyClaim, waited: bool) -> bool:
    """Take ``claim.key`` for ``claim.node`` at ``claim.epoch`` (see
    :meth:`~flakekit.cluster.membership.KeyFence.claim_key`). One transaction; a missing
    row is inserted (two first claims race on the primary key, or on MariaDB deadlock
    on the gap they both locked: one wins, the other retries and sees the winner's
    row)."""
    valid_claim(claim)
    for attempt in itertools.count():
        try:
            with write_transaction(engine) as conn:
                return _claim_in(conn, claim, waited)
        except SQLAlchemyError as exc:
            if attempt >= CLAIM_ATTEMPTS - 1 or retry_kind(exc) != "conflict":
                raise
            time.sleep(retry_pause(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _claim_in(conn: Connection, claim: KeyClaim, waited: bool) -> bool:
    now = db_now(dialect_of(conn))
    row = _locked_row(conn, claim.key)
    mine = dict(owner_node=claim.node, owner_epoch=claim.epoch, released=False,
                claimed_at=now)
    if row is None:
        conn.execute(insert(key_owner).values(biz_tag=claim.key, **mine))
        return True
    node, epoch, released = row
    if epoch > claim.epoch:
        return False  # a newer claim: an older epoch never overrides it
    if node == claim.node:
        if epoch == claim.epoch and not released:
            return True  # already ours
    elif epoch == claim.epoch or not (released or waited):
        return False  # another node's claim at this epoch, or a live older one
    conn.execute(update(key_owner).where(
        _k.biz_tag == claim.key, _k.owner_node == node, _k.owner_epoch == epoch,
    ).values(**mine))
    return True


def release_key(engine: Engine, claim: KeyClaim) -> bool:
    """Mark the key released, fenced by (node, epoch) in the WHERE; False when the row is
    not this claim's any more (True again for a claim already released)."""
    valid_claim(claim)
    with write_transaction(engine) as conn:
        done = conn.execute(update(key_owner).where(
            _k.biz_tag == claim.key, _k.owner_node == claim.node,
            _k.owner_epoch == claim.epoch,
        ).values(released=True)).rowcount
    return bool(done == 1)


def key_owners(engine: Engine) -> list[KeyOwnerRecord]:
    """Every row of the table, by key."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(_k.biz_tag, _k.owner_node, _k.owner_epoch, _k.released, _k.claimed_at)
            .order_by(_k.biz_tag)
        ).all()
    return [KeyOwnerRecord(key, node, epoch, bool(released),
                           (ns_of(aware_utc(at)) or 0) // 1_000_000)
            for key, node, epoch, released, at in rows]


def key_owner_of(engine: Engine, key: str) -> KeyOwnerRecord | None:
    """``key``'s row (None: never claimed)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(_k.owner_node, _k.owner_epoch, _k.released, _k.claimed_at)
            .where(_k.biz_tag == key)
        ).first()
    if row is None:
        return None
    node, epoch, released, at = row
    return KeyOwnerRecord(key, node, epoch, bool(released), (ns_of(aware_utc(at)) or 0) // 1_000_000)
