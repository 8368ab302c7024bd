"""SqlMembership: cluster membership in two SQL tables, on the database clock.

``flakekit_members`` holds one row per (cluster, node): the node's lease. A join claims
the row with a new random ``holder`` token and ``incarnation + 1`` -- refused, naming the
live holder, while the row's lease is current on the database clock (``last_seen`` plus
``lease_ms`` is later than the database's now). A row that looks lapsed there is taken,
but the new incarnation claims no key before the old holder's lease plus a margin has
passed on its *own* monotonic clock (``MemberLease.claim_after_ns``): the database's wall
clock may have stepped (NTP, a VM resume), and its age alone proves nothing. A renewal is a fenced
UPDATE (``holder`` and ``incarnation`` in the WHERE) setting ``last_seen`` to the
database's now and ``renewals + 1``, then re-reads the view epoch *after* its COMMIT: a
COMMIT held up on a slow path may land after a peer took a key (it saw the old
``renewals`` long enough), and the epoch read afterwards is that newer view, so the
renewal never extends a deadline past a view change it did not see. The holder's
deadline is on its own monotonic clock: the lease from the *send* time of the renewal
that succeeded, less a safety window (:func:`flakekit.sql.workers.lease_deadline_ns`,
the worker registry's rule), so it stops before another process may take the row.

``flakekit_cluster_view`` holds one row per cluster, never deleted. Its ``epoch`` moves
only by compare-and-set, ``UPDATE ... WHERE cluster = :c AND epoch = :seen`` (the first
view, epoch 1, is an INSERT: the primary key lets exactly one of two racing proposers
in), so of two proposers that saw the same epoch exactly one wins.

Every wait is bounded by the backend's session limits (``lock_timeout``,
``statement_timeout``, ``idle_in_transaction_timeout``; SQLite: the busy timeout): a
peer stuck inside a join holds up that node's row only, and only that long. A join whose
lock wait timed out is retried for at most ``lock_retry_s``; a renewal is tried once
(the keeper retries at the next interval and keeps the old deadline meanwhile).

After a database fail-over (:mod:`flakekit.sql.failover`, scope ``members:CLUSTER``,
checked in every join, renewal and proposal) the promoted replica may lack member rows
and views the old primary wrote: the view epoch jumps by ``VIEW_EPOCH_SKIP`` (an epoch
never names two views), and until the longest member lease plus a margin has passed no
node joins and no view is proposed; a live member whose row is missing or stale there
re-asserts it on its next renewal.

``watch_view`` is a no-op here: SQL has no change notification, and safety never rests
on one (renewals re-read the epoch); nodes poll the view row every ``view_poll_s``
(0.1 s) instead, so a planned hand-off does not wait for a renewal.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from flakekit.cluster.member_records import (
    SAFETY_SHARE,
    check_seen_epoch,
    cluster_of,
    held_by_error,
    holder_token,
    log_view_change,
    no_longer_ours,
    safety_window_ns,
    view_entries,
)
from flakekit.cluster.store_contracts import (
    JoinRequest,
    MemberLease,
    lapse_wait_ns,
    proposed_members,
)
from flakekit.errors import BackendError
from flakekit.sql import failover
from flakekit.sql.backends import describe_engine
from flakekit.sql.dbclock import (
    aware_utc,
    db_message,
    db_now,
    dialect_of,
    lease_deadline_ns,
    ns_of,
    retry_kind,
    retry_pause,
)
from flakekit.sql.schema import CLUSTER_COMPONENT, cluster_view
from flakekit.sql.schema import members as members_table
from flakekit.sql.transactions import write_transaction
from flakekit.sql.workers import LOCK_RETRY_S, SchemaOnce, schema_once
from flakekit.values.clock import Clock
from flakekit.values.cluster import Member, MemberInfo, View
from flakekit.values.events import NO_EVENTS, Events
from flakekit.values.nanoseconds import NS_PER_MS as MS
from flakekit.values.nanoseconds import NS_PER_S as NS

__all__ = ["SqlMembership"]

log = logging.getLogger("flakekit.cluster.sql")
_T = TypeVar("_T")

#: the column sizes of flakekit_members (checked before any SQL runs)
_LIMITS = {"cluster": 64, "node": 128, "advertise": 255}
#: how often a node reads the view row (one primary-key read) between renewals
VIEW_POLL_S = 0.1
#: the largest lease ``lease_ms`` (INTEGER) can hold
MAX_LEASE_MS = 2**31 - 1
#: how far the view epoch jumps when a fail-over is detected: more views than the old
#: primary can have written within any replication lag, and 2^63 has room for billions
VIEW_EPOCH_SKIP = 1_000_000

_m = members_table.c
_v = cluster_view.c
#: what a node reads every view_poll_s, built once (a statement built per call costs
#: more CPU than its round trip)
_VIEW_SELECT = select(_v.epoch, _v.members, _v.changed_at).where(
    _v.cluster == bindparam("cluster"))
_MEMBERS_SELECTS: dict[str, Any] = {}


def _members_select(dialect: str) -> Any:
    """Every member row of ``:cluster`` with the database's time (per dialect)."""
    query = _MEMBERS_SELECTS.get(dialect)
    if query is None:
        query = _MEMBERS_SELECTS[dialect] = (
            select(_m.node, _m.advertise, _m.weight, _m.holder, _m.incarnation, _m.state,
                   _m.last_seen, _m.lease_ms, _m.renewals, _m.config_digest,
                   db_now(dialect).label("now"))
            .where(_m.cluster == bindparam("cluster")).order_by(_m.node))
    return query


def _check_text(field: str, value: object, empty: bool = False) -> str:
    limit = _LIMITS[field]
    if not isinstance(value, str) or (not value and not empty) or len(value) > limit:
        raise ValueError(f"{field} must be {'a' if empty else 'a non-empty'} string of at "
                         f"most {limit} characters, got {value!r}")
    return value


def _check_digest(value: object) -> str:
    if not isinstance(value, str) or len(value) > 160:
        raise ValueError(f"config_digest must be a string of at most 160 characters, "
                         f"got {value!r}")
    return value


def _encode(view_members: Sequence[Member]) -> str:
    """The view's members as stored: JSON, sorted by node, one entry per node."""
    ordered = proposed_members(view_members, _check_text)
    return json.dumps(view_entries(ordered), separators=(",", ":"))


def _decode(text_: str) -> tuple[Member, ...]:
    return tuple(Member(e["node"], e.get("advertise", ""), int(e.get("weight", 1)))
                 for e in json.loads(text_))


def _ms_between(later: Any, earlier: Any) -> int | None:
    """Milliseconds from ``earlier`` to ``later`` (database values; None if unreadable)."""
    a, b = ns_of(aware_utc(later)), ns_of(aware_utc(earlier))
    return None if a is None or b is None else (a - b) // MS


@attrs.define
class SqlMembership:
    """A :class:`~flakekit.cluster.store_contracts.Membership` in ``flakekit_members`` and
    ``flakekit_cluster_view`` (see the module docstring).

    Args:
        engine: the backend's engine (owned by the backend pool; never disposed here).
        clock: deadlines are on its monotonic timeline.
        safety_window_ns: a lease ends this long before its row lapses on the database
            clock (None, or anything less: a fifth of the lease, which claimers count
            on: ``serve_share``).
        create_schema: create the ``cluster`` tables at the first join if missing.
        lock_retry_s: how long a join retries lock waits that timed out.
    """

    engine: Engine
    clock: Clock
    safety_window_ns: int | None = None
    create_schema: bool = False
    lock_retry_s: float = LOCK_RETRY_S
    events: Events = NO_EVENTS
    _lease_s: float = attrs.field(init=False, default=10.0)
    _schema: SchemaOnce = schema_once(CLUSTER_COMPONENT)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    #: per cluster, the config digest this process joined with (a re-assert writes it)
    _digests: dict[str, str] = attrs.field(init=False, factory=dict)

    #: a lapse on the database's wall clock proves nothing (the clock may step): a
    #: claimer proves it by the ``renewals`` counter on its own clock (MemberInfo.version)
    lapse_means_stopped = False
    #: SQL has no change notification: nodes read the view row this often (seconds), so a
    #: planned hand-off takes about that long instead of up to a renewal interval
    view_poll_s = VIEW_POLL_S
    #: a holder serves at most this share of its lease after the send of the renewal
    #: that wrote its ``renewals`` (the safety window is at least the rest; checked at
    #: the join): a claimer that first read that value waits this share plus a margin
    #: from that read, not the whole lease (:func:`~flakekit.cluster.store_contracts.lapse_wait_ns`)
    serve_share = 1 - SAFETY_SHARE

    # -- naming ----------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return describe_engine(self.engine)

    @property
    def renew_interval(self) -> float:
        """A third of the lease last granted: two renewals may fail before it ends."""
        return self._lease_s / 3

    def _safety_ns(self, lease_ns: int) -> int:
        return safety_window_ns(lease_ns, self.safety_window_ns)

    def _error(self, action: str, exc: BaseException) -> BackendError:
        return BackendError(f"cluster membership in {self.where}: {action} failed: "
                            f"{db_message(exc)}")

    # -- schema ----------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Check (and with ``create_schema``, create) the tables once."""
        self._schema()

    # -- lease source half -----------------------------------------------------------------
    def acquire(self, request: JoinRequest) -> MemberLease:
        """Join: claim the member row (one transaction; lock waits retried, bounded)."""
        cluster = _check_text("cluster", request.cluster)
        member = request.member
        _check_text("node", member.node)
        _check_text("advertise", member.advertise, empty=True)
        _encode([member])  # the weight's range
        lease_ms = round(request.lease_s * 1000)
        if not 1 <= lease_ms <= MAX_LEASE_MS:
            raise ValueError(f"lease_s must be from 0.001 to {MAX_LEASE_MS / 1000:g} s, "
                             f"got {request.lease_s!r}")
        lease_ns = lease_ms * MS
        if lease_deadline_ns(0, lease_ns, self._safety_ns(lease_ns)) <= lease_ns / 3:
            raise ValueError(f"safety_window_ns ({self._safety_ns(lease_ns)}) leaves less "
                             f"than a renewal interval of the {request.lease_s:g} s lease")
        try:
            self.ensure_schema()
        except SQLAlchemyError as exc:
            raise self._error("checking the schema", exc) from None
        token = holder_token()
        digest = _check_digest(request.config_digest)
        detect = self._detect(cluster)
        give_up = time.monotonic() + self.lock_retry_s
        attempt = 0
        while True:
            attempt += 1
            send = self.clock.monotonic_ns()
            try:
                # the quarantine's start is committed even when this join is refused
                with write_transaction(self.engine) as conn:
                    change, ends, quarantine_ns = (
                        self._failover_gate(conn, cluster, lease_ms) if detect
                        else (None, None, 0))
                    if ends is None:
                        incarnation, taken_ms = self._join_in(conn, cluster, member,
                                                              token, lease_ms, digest)
                    view_epoch = self._epoch(conn, cluster)
                break
            except SQLAlchemyError as exc:
                if retry_kind(exc) and time.monotonic() < give_up:
                    time.sleep(retry_pause(attempt - 1))
                    continue
                raise self._error(f"joining cluster {cluster!r} as {member.node!r}",
                                  exc) from None
        self._announce(change, cluster, quarantine_ns)
        if ends is not None:
            raise BackendError(
                f"node {member.node!r} may not join cluster {cluster!r} until "
                f"{ends:%Y-%m-%dT%H:%M:%S}Z (database time): a database fail-over was "
                f"detected in {self.where} and member leases the old primary granted may "
                "still be held (its copy of them may be lost); the quarantine lasts the "
                f"longest member lease plus a margin ({quarantine_ns / NS:g} s). Start "
                "again then, or keep the membership in a consensus store (zookeeper, etcd)")
        with self._lock:
            self._lease_s = lease_ms / 1000
            self._digests[cluster] = digest
        log.info("joined cluster %s as %s (incarnation %d, view epoch %d)", cluster,
                 member.node, incarnation, view_epoch)
        return MemberLease(member=member, cluster=cluster, holder=token, epoch=incarnation,
                           view_epoch=view_epoch, ttl=lease_ms / 1000,
                           deadline_ns=lease_deadline_ns(send, lease_ns,
                                                         self._safety_ns(lease_ns)),
                           claim_after_ns=(send + lapse_wait_ns(taken_ms / 1000)
                                           if taken_ms else 0))

    # -- fail-over ---------------------------------------------------------------------------
    def _detect(self, cluster: str) -> bool:
        """Whether fail-over detection is on (the marker row made before the first use)."""
        if not failover.detection_ready(self.engine):
            return False
        failover.prepare(self.engine, f"members:{cluster}")
        return True

    def _failover_gate(self, conn: Connection, cluster: str, lease_ms: int,
                       ) -> tuple[failover.PrimaryChange | None, Any, int]:
        """In a writing transaction: (the change detected now, when the quarantine after
        the last one ends or None, its length in ns). On a change the view epoch jumps,
        so no epoch the old primary may have used is proposed again."""
        change = failover.check_primary(conn, f"members:{cluster}")
        if change is not None:
            conn.execute(update(cluster_view).where(_v.cluster == cluster)
                         .values(epoch=_v.epoch + VIEW_EPOCH_SKIP))
        longest = conn.execute(select(func.max(_m.lease_ms))
                               .where(_m.cluster == cluster)).scalar()
        quarantine_ns = lapse_wait_ns(max(lease_ms, int(longest or 0)) / 1000)
        return change, failover.quarantine_end(conn, f"members:{cluster}",
                                               quarantine_ns), quarantine_ns

    def _announce(self, change: failover.PrimaryChange | None, cluster: str,
                  quarantine_ns: int) -> None:
        """Tell of the fail-over the gate detected, if it detected one."""
        if change is None:
            return
        failover.announce(change, self.where,
                          f"cluster {cluster!r}: the view epoch jumped by {VIEW_EPOCH_SKIP}; "
                          f"no node joins and no view is proposed for "
                          f"{quarantine_ns / NS:g} s", self.events)

    def _reassert(self, conn: Connection, cluster: str, lease: MemberLease,
                  now: Any) -> str:
        """A live member's row that a promoted replica lacks, or holds an older
        incarnation of, is written back as ours: during the quarantine nobody joined."""
        mine = dict(holder=lease.holder, incarnation=lease.epoch, state="alive",
                    last_seen=db_now(dialect_of(conn)), lease_ms=round(lease.ttl * 1000),
                    advertise=lease.member.advertise, weight=lease.member.weight)
        if now is None:
            conn.execute(insert(members_table).values(
                cluster=cluster, node=lease.member.node, renewals=0,
                config_digest=self._digests.get(cluster, ""), **mine))
            return "re-created its row (the replica never received it)"
        conn.execute(update(members_table).where(
            _m.cluster == cluster, _m.node == lease.member.node,
            _m.incarnation == now[1]).values(renewals=_m.renewals + 1, **mine))
        return (f"re-asserted its row (the replica's copy was stale: incarnation {now[1]}, "
                f"holder {now[0]})")

    def _join_in(self, conn: Connection, cluster: str, member: Member, token: str,
                 lease_ms: int, digest: str) -> tuple[int, int]:
        """The new incarnation, and the lease (ms) of a holder it took the row from
        without that holder having left (0: a new row, or one left cleanly)."""
        now = db_now(dialect_of(conn))
        row = conn.execute(
            select(_m.holder, _m.incarnation, _m.state, _m.last_seen, _m.lease_ms,
                   now.label("now"))
            .where(_m.cluster == cluster, _m.node == member.node).with_for_update()
        ).mappings().first()
        values = dict(holder=token, state="alive", last_seen=now, lease_ms=lease_ms,
                      advertise=member.advertise, weight=member.weight,
                      config_digest=digest, renewals=0)
        if row is None:
            conn.execute(insert(members_table).values(cluster=cluster, node=member.node,
                                                incarnation=1, **values))
            return 1, 0
        age_ms = _ms_between(row["now"], row["last_seen"])
        if row["state"] != "left" and (age_ms is None or age_ms < row["lease_ms"]):
            left = "?" if age_ms is None else f"{(row['lease_ms'] - age_ms) / 1000:.1f}"
            raise held_by_error(cluster, member.node, row["holder"],
                                f"incarnation {row['incarnation']}, lease ends in {left} s "
                                "on the database clock", self.where)
        conn.execute(update(members_table).where(
            _m.cluster == cluster, _m.node == member.node,
            _m.incarnation == row["incarnation"],
        ).values(incarnation=_m.incarnation + 1, **values))
        # lapsed on the database clock only: that clock may have stepped, so the old
        # holder may still serve; this node claims no key until it surely stopped
        return int(row["incarnation"]) + 1, 0 if row["state"] == "left" else int(row["lease_ms"])

    @staticmethod
    def _epoch(conn: Connection, cluster: str) -> int:
        epoch = conn.execute(select(_v.epoch).where(_v.cluster == cluster)).scalar()
        return int(epoch or 0)

    def _ours(self, cluster: str, lease: MemberLease) -> list[Any]:
        return [_m.cluster == cluster, _m.node == lease.member.node,
                _m.holder == lease.holder, _m.incarnation == lease.epoch,
                _m.state != "left"]

    def renew(self, lease: MemberLease, mark: int) -> MemberLease:
        """Fenced UPDATE of ``last_seen`` plus a re-read of the view epoch (one
        transaction); LeaseLostError when the row has another holder or incarnation."""
        cluster = cluster_of(lease)
        send = self.clock.monotonic_ns()
        detect = self._detect(cluster)
        change, ends, quarantine_ns, reasserted = None, None, 0, ""
        try:
            with self.engine.begin() as conn:
                if detect:
                    change, ends, quarantine_ns = self._failover_gate(
                        conn, cluster, round(lease.ttl * 1000))
                done = conn.execute(update(members_table).where(*self._ours(cluster, lease))
                                    .values(last_seen=db_now(dialect_of(conn)),
                                            renewals=_m.renewals + 1)).rowcount
                if not done:
                    now = conn.execute(select(_m.holder, _m.incarnation, _m.state).where(
                        _m.cluster == cluster, _m.node == lease.member.node)).first()
                    if ends is not None and (now is None or now[1] < lease.epoch):
                        reasserted = self._reassert(conn, cluster, lease, now)
                        done = 1
            if done:
                # after the COMMIT: a view changed while it was on its way is seen here
                # (a peer that read the old row long enough may have claimed meanwhile)
                with self.engine.connect() as conn:
                    view_epoch = self._epoch(conn, cluster)
        except SQLAlchemyError as exc:
            raise self._error(f"renewing member {lease.member.node!r}", exc) from None
        self._announce(change, cluster, quarantine_ns)
        if reasserted:
            log.warning("member %s of cluster %s: %s on the new primary after a database "
                        "fail-over; the lease goes on", lease.member.node, cluster,
                        reasserted)
        if not done:
            held = ("the row is gone" if now is None else
                    f"the row is now {now[2]} with holder {now[0]}, incarnation {now[1]}")
            after = " after a database fail-over" if ends is not None else ""
            raise no_longer_ours(lease, f"{held}{after}")
        lease_ns = round(lease.ttl * NS)
        return attrs.evolve(lease, view_epoch=view_epoch, deadline_ns=lease_deadline_ns(
            send, lease_ns, self._safety_ns(lease_ns)))

    def release(self, lease: MemberLease, mark: int) -> None:
        """Leave: state ``left`` (fenced by holder and incarnation); a no-op if the row is
        not ours any more."""
        cluster = cluster_of(lease)
        try:
            with self.engine.begin() as conn:
                done = conn.execute(update(members_table).where(*self._ours(cluster, lease))
                                    .values(state="left", last_seen=db_now(dialect_of(conn))))
        except SQLAlchemyError as exc:
            raise self._error(f"leaving as {lease.member.node!r}", exc) from None
        if not done.rowcount:
            log.warning("member %s of %s was no longer ours when leaving", lease.member.node,
                        cluster)

    def close(self) -> None:
        """Nothing to free: the engine belongs to the backend pool."""

    # -- view half -------------------------------------------------------------------------
    def members(self, cluster: str) -> list[MemberInfo]:
        """Every member row of ``cluster`` with its state on the database clock."""
        return self._reading(f"listing the members of {cluster!r}",
                             lambda conn: self._read_members(conn, cluster))

    def view(self, cluster: str) -> View:
        """The stored view; ``View(cluster, 0, ())`` before the first proposal."""
        return self._reading(f"reading the view of {cluster!r}",
                             lambda conn: self._read_view(conn, cluster))

    def view_and_members(self, cluster: str) -> tuple[View, list[MemberInfo]]:
        """:meth:`view`, then :meth:`members`, on one connection: what a node polls every
        ``view_poll_s`` (one pool check-out, its ping and its reset, not two)."""
        return self._reading(
            f"reading the view and the members of {cluster!r}",
            lambda conn: (self._read_view(conn, cluster), self._read_members(conn, cluster)))

    def _reading(self, what: str, read: Callable[[Connection], _T]) -> _T:
        """``read`` on one pooled connection; a database error as the store's error,
        saying ``what`` failed."""
        try:
            self.ensure_schema()
            with self.engine.connect() as conn:
                return read(conn)
        except SQLAlchemyError as exc:
            raise self._error(what, exc) from None

    @staticmethod
    def _read_members(conn: Connection, cluster: str) -> list[MemberInfo]:
        rows = conn.execute(_members_select(dialect_of(conn)),
                            {"cluster": cluster}).mappings().all()
        out = []
        for r in rows:
            age = _ms_between(r["now"], r["last_seen"])
            expires = r["lease_ms"] - (age if age is not None else r["lease_ms"])
            state = ("left" if r["state"] == "left" else "lapsed" if expires <= 0
                     else "draining" if r["state"] == "draining" else "alive")
            out.append(MemberInfo(Member(r["node"], r["advertise"], r["weight"]), state,
                                  r["holder"], int(r["incarnation"]), int(expires),
                                  int(r["lease_ms"]), int(r["renewals"]),
                                  str(r["config_digest"] or "")))
        return out

    @staticmethod
    def _read_view(conn: Connection, cluster: str) -> View:
        row = conn.execute(_VIEW_SELECT, {"cluster": cluster}).first()
        if row is None:
            return View(cluster, 0, ())
        changed = ns_of(aware_utc(row[2]))
        return View(cluster, int(row[0]), _decode(row[1]),
                    0 if changed is None else changed // MS)

    def propose(self, cluster: str, seen_epoch: int,
                members: Sequence[Member]) -> View | None:
        """Compare-and-set: write ``seen_epoch + 1`` only if the stored epoch is still
        ``seen_epoch``; the new view, or None when someone else moved it first."""
        _check_text("cluster", cluster)
        check_seen_epoch(seen_epoch)
        encoded = _encode(members)
        change, ends, quarantine_ns = None, None, 0
        try:
            self.ensure_schema()
            detect = self._detect(cluster)
            with write_transaction(self.engine) as conn:
                now = db_now(dialect_of(conn))
                if detect:
                    change, ends, quarantine_ns = self._failover_gate(conn, cluster, 0)
                if ends is not None:
                    pass  # committed: the epoch's jump and the quarantine's start
                elif seen_epoch == 0:
                    if conn.execute(select(_v.epoch).where(_v.cluster == cluster)).first():
                        return None
                    conn.execute(insert(cluster_view).values(
                        cluster=cluster, epoch=1, members=encoded, changed_at=now))
                else:
                    done = conn.execute(
                        update(cluster_view)
                        .where(_v.cluster == cluster, _v.epoch == seen_epoch)
                        .values(epoch=seen_epoch + 1, members=encoded, changed_at=now)
                    ).rowcount
                    if done != 1:
                        return None
                view = self._read_view(conn, cluster)
        except IntegrityError:
            return None  # another first proposal got in (primary key)
        except SQLAlchemyError as exc:
            raise self._error(f"proposing epoch {seen_epoch + 1} of {cluster!r}",
                              exc) from None
        self._announce(change, cluster, quarantine_ns)
        if ends is not None:
            log.warning("cluster %s: no view is proposed until %s (database time): a "
                        "database fail-over was detected in %s", cluster,
                        f"{ends:%Y-%m-%dT%H:%M:%S}Z", self.where)
            return None
        log_view_change(log, cluster, seen_epoch, view)
        return view

    def set_draining(self, cluster: str, node: str, draining: bool) -> bool:
        """Mark a live (not left) member as draining, or alive again; False if there is
        no such member."""
        try:
            with self.engine.begin() as conn:
                done = conn.execute(
                    update(members_table)
                    .where(_m.cluster == cluster, _m.node == node, _m.state != "left")
                    .values(state="draining" if draining else "alive")
                ).rowcount
        except SQLAlchemyError as exc:
            raise self._error(f"marking {node!r} as draining", exc) from None
        return bool(done == 1)

    def watch_view(self, cluster: str, callback: Callable[[], None] | None) -> None:
        """No-op: SQL has no change notification; renewals re-read the epoch."""

