"""The key-owner table: who may advance a strict key's ``leaf_alloc`` row, at which epoch.

``flakekit_key_owner(biz_tag, owner_node, owner_epoch, released, claimed_at)`` sits
beside ``leaf_alloc`` (same database), so the fence is checked in the very transaction
that advances ``max_id``: lock the owner row (``SELECT ... FOR UPDATE``; SQLite: the
write lock of ``BEGIN IMMEDIATE``), compare (node, epoch, not released), and only then
update ``leaf_alloc``. A deposed owner -- paused, partitioned, or shutting down with a
stale cache (pingcap/tidb #46444) -- finds another node or a newer epoch there and
changes nothing. A claim never goes back to an older epoch, so the epochs a key is
served under only grow.

After a database fail-over (:mod:`flakekit.sql.failover`, scope ``key-owners``: one per
database, made at the first claim ever, so a key first claimed within the replication lag
is covered too; checked in every claim and fenced fetch) the promoted replica may lack
claims the old primary took: until the longest member lease plus a margin has passed (the leases in
``flakekit_members`` of this database; ``FALLBACK_LEASE_S`` when the membership lives
elsewhere) no new owner claims the key, and an owner whose claim the replica lacks or
holds an older copy of re-asserts it in its next fetch.

:class:`~flakekit.sql.leaf.SqlSegmentStore` implements
:class:`~flakekit.cluster.store_contracts.KeyFence` with these functions.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from flakekit.cluster.store_contracts import KeyClaim, KeyOwnerRecord, lapse_wait_ns
from flakekit.sql import failover
from flakekit.sql.backends import describe_engine
from flakekit.sql.dbclock import aware_utc, db_now, dialect_of, ns_of, retry_kind, retry_pause
from flakekit.sql.schema import key_owner, members
from flakekit.sql.transactions import write_transaction
from flakekit.values.events import NO_EVENTS, Events

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["MAX_EPOCH", "check_claim", "claim_key", "key_owner_of", "key_owners", "release_key"]

#: ``owner_epoch`` is a signed 64-bit column
MAX_EPOCH = 2**63 - 1
#: tries of one claim that lost a race (unique conflict, deadlock) before it raises
CLAIM_ATTEMPTS = 5
#: the member lease a key-owner quarantine assumes when ``flakekit_members`` of this
#: database holds no row (the membership is in ZooKeeper or etcd): longer than any
#: usual cluster lease
FALLBACK_LEASE_S = 60.0

#: the fail-over marker's scope: the table is one per database, and so is its row
SCOPE = "key-owners"

log = logging.getLogger("flakekit.cluster.sql")

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


def _failover_gate(conn: Connection, key: str, events: Events) -> dt.datetime | None:
    """In a claim or fenced fetch: detect a fail-over for ``key`` and say when the
    quarantine after it ends (None: none running)."""
    if not failover.detection_ready(conn.engine):
        return None
    scope = SCOPE
    change = failover.check_primary(conn, scope)
    longest = conn.execute(select(func.max(members.c.lease_ms))).scalar()
    quarantine_ns = lapse_wait_ns(int(longest) / 1000 if longest else FALLBACK_LEASE_S)
    if change is not None:
        failover.announce(change, describe_engine(conn.engine),
                          f"key {key!r}: no new owner claims it for "
                          f"{quarantine_ns / 1e9:g} s", events)
    return failover.quarantine_end(conn, scope, quarantine_ns)


def _lost_on_replica(row: Any, claim: KeyClaim) -> bool:
    """Whether ``row`` may be a promoted replica's stale copy of ``claim``'s row."""
    if row is None:
        return True
    node, epoch, released = row
    return bool(epoch < claim.epoch or (node == claim.node and epoch == claim.epoch
                                        and released))


def check_claim(conn: Connection, claim: KeyClaim, events: Events = NO_EVENTS) -> str | None:
    """Inside the caller's write transaction: lock ``claim.key``'s owner row and say why
    the claim does not hold it (None: it does, and keeps holding it until commit).

    During a fail-over quarantine a claim the replica lacks is written back (nobody
    else was let in meanwhile)."""
    ends = _failover_gate(conn, claim.key, events)
    row = _locked_row(conn, claim.key)
    if ends is not None and _lost_on_replica(row, claim):
        _write_claim(conn, claim, row)
        log.warning("key %r: node %r re-asserted its claim at epoch %d on the new primary "
                    "after a database fail-over (the replica had %s)", claim.key,
                    claim.node, claim.epoch, "no row" if row is None else
                    f"node {row[0]!r} at epoch {row[1]}{' released' if row[2] else ''}")
        return None
    if row is None:
        return "the key has no owner row (never claimed)"
    node, epoch, released = row
    if node != claim.node or epoch != claim.epoch:
        return f"it is owned by node {node!r} at epoch {epoch}"
    if released:
        return f"node {node!r} released it at epoch {epoch}"
    return None


def claim_key(engine: Engine, claim: KeyClaim, waited: bool,
              events: Events = NO_EVENTS) -> bool:
    """Take ``claim.key`` for ``claim.node`` at ``claim.epoch`` (see
    :meth:`~flakekit.cluster.store_contracts.KeyFence.claim_key`). One transaction; a missing
    row is inserted (two first claims race on the primary key, or on MariaDB deadlock
    on the gap they both locked: one wins, the other retries and sees the winner's
    row). During a fail-over quarantine only a claim the row already holds succeeds."""
    valid_claim(claim)
    if failover.detection_ready(engine):
        failover.prepare(engine, SCOPE)
    for attempt in itertools.count():
        try:
            with write_transaction(engine) as conn:
                return _claim_in(conn, claim, waited, events)
        except SQLAlchemyError as exc:
            if attempt >= CLAIM_ATTEMPTS - 1 or retry_kind(exc) != "conflict":
                raise
            time.sleep(retry_pause(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _claim_in(conn: Connection, claim: KeyClaim, waited: bool,
              events: Events = NO_EVENTS) -> bool:
    quarantined = _failover_gate(conn, claim.key, events) is not None
    row = _locked_row(conn, claim.key)
    if quarantined:  # the row may lack the old primary's last claim: admit no new owner
        return row is not None and tuple(row) == (claim.node, claim.epoch, False)
    if row is None:
        _write_claim(conn, claim, row)
        return True
    node, epoch, released = row
    if epoch > claim.epoch:
        return False  # a newer claim: an older epoch never overrides it
    if node == claim.node:
        if epoch == claim.epoch and not released:
            return True  # already ours
    elif epoch == claim.epoch or not (released or waited):
        return False  # another node's claim at this epoch, or a live older one
    _write_claim(conn, claim, row)
    return True


def _write_claim(conn: Connection, claim: KeyClaim, row: Any) -> None:
    """Make ``claim`` the key's row (``row``: what the locked read found, None: no row)."""
    mine = dict(owner_node=claim.node, owner_epoch=claim.epoch, released=False,
                claimed_at=db_now(dialect_of(conn)))
    if row is None:
        conn.execute(insert(key_owner).values(biz_tag=claim.key, **mine))
        return
    conn.execute(update(key_owner).where(
        _k.biz_tag == claim.key, _k.owner_node == row[0], _k.owner_epoch == row[1],
    ).values(**mine))


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
    return KeyOwnerRecord(key, node, epoch, bool(released),
                          (ns_of(aware_utc(at)) or 0) // 1_000_000)
