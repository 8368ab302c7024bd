"""ZkMembership: cluster membership in ZooKeeper; the session is the member's lease.

Znodes under ``{root}/clusters/{cluster}`` (default root ``/flakekit``)::

    members/{node}   ephemeral, created by the holder's session: JSON {advertise, weight,
                     holder, state (alive | draining), session_ms}; its czxid is the
                     incarnation (the fencing token of this join)
    nodes/{node}     persistent roster entry, written in the same transaction as every
                     join and leave: JSON {advertise, weight, holder, incarnation, state
                     (joined | left)}; it tells a clean leave (``left``) from a session
                     that ended without one (``lapsed``), and its version fences a leave
    view             persistent: JSON {epoch, members}; the epoch is a counter in the
                     data, moved only by ``set(version=stat.version)`` (compare-and-set);
                     its mtime (ZooKeeper's clock) is ``changed_at``

Join = one transaction: create ``members/{node}`` (ephemeral) and write the roster entry
(conditioned on the version read). The member znode existing means another live
session holds the node: the join is refused with one line naming that holder. The
deadline is the core's lease-mode rule (:class:`flakekit.plugin.KvLeaseAllocator`):
``t0 + session - safety_window``, ``t0`` read *before* the request that proved the
session alive, so the holder stops before ZooKeeper could hand the node to anyone else.

Renew = a ``sync`` then reads of the member znode and the view, pipelined on our
session: the znode must still be the one we created (czxid = the lease's epoch) and
belong to our current session (``ephemeralOwner``), else LeaseLostError; then the znode
is written back unchanged by version (its version moves: a claimer that reads it
unchanged for the share of the session a holder serves after a renewal, plus a margin,
on its own clock, knows the holder stopped -- before ZooKeeper expires the session;
issue 24) and the view epoch is read again after that write (after the sync, so not
from a lagging follower), so a member whose watch died learns of a new view within one
renewal interval. A renewal while the
connection is SUSPENDED raises BackendError (the keeper keeps the old deadline: the
same session may come back); a session that expired (kazoo LOST, then a new session)
shows as another owner: LeaseLostError.

Every call is bounded (``connect_timeout``; renewals a third of the session at most):
kazoo would queue a request made while disconnected until it reconnects, maybe never.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from kazoo.client import KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import WatchedEvent, ZnodeStat

import flakekit.plugin as fk
from flakekit.plugin import NS_PER_MS as MS
from flakekit.plugin import NS_PER_S as NS
from flakekit_zookeeper.client import ZK_ERRORS, ZkConnection

__all__ = ["ZkMembership"]

log = logging.getLogger("flakekit.cluster.zookeeper")

#: the session a view-only membership opens when no join says which lease it wants
DEFAULT_SESSION_S = 10.0
#: a view watch: (generation, the caller's callback, the function kazoo calls)
_Watch = tuple[int, Callable[[], None], Callable[[WatchedEvent], None]]


def _write_roster(tx: Any, path: str, entry: tuple[bytes, ZnodeStat] | None,
                  data: bytes) -> None:
    """Add the roster entry's write to ``tx``: created, or set at the version read."""
    if entry is None:
        tx.create(path, data)
    else:
        tx.set_data(path, data, version=entry[1].version)


def _one_line(exc: BaseException) -> str:
    return " ".join((repr(exc) if str(exc) else type(exc).__name__).split())


@attrs.define(eq=False)
class ZkMembership(fk.KvMembershipBase):
    """A :class:`~flakekit.plugin.Membership` in ZooKeeper (see the module docstring).

    Args:
        hosts: the ensemble, ``"host:port,host:port"``.
        clock: deadlines are on its monotonic timeline.
        root: the znode under which ``clusters/`` lives.
        session_timeout_s: the session to request (None: the lease the first join asks
            for, so the node's ``[cluster] lease`` is the session); ZooKeeper may grant
            less, and the lease says what was granted.
        connect_timeout_s: the longest any call (and a connect) waits.
        safety_window_ns: a lease ends this long before the session could have expired
            (None, or anything less: a fifth of the session, which claimers count on:
            ``serve_share``).
    """

    store_and_address = ("ZooKeeper", "hosts")

    #: a lapsed member proves its holder stopped: the leader expires a session only its
    #: timeout after the last packet, timed on its elapsed-time clock (never a wall clock:
    #: an NTP step moves nothing), rounded *up* to the next tick; the holder's deadline is
    #: its last contact's send + session - safety. A renewal writes the member znode
    #: (its version moves) and reads the view *after* that write on the same session, so
    #: no late write can extend a deadline past a view it did not read (issue 20)
    lapse_means_stopped = True
    #: a holder serves at most this share of its session after the send of the renewal
    #: that wrote its znode's version (the safety window is at least the rest): a claimer
    #: that first read that version waits this share plus a margin from that read,
    #: before ZooKeeper expires the session (issue 24)
    serve_share = 1 - fk.SAFETY_SHARE

    hosts: str
    clock: fk.Clock
    session_timeout_s: float | None = None
    _conn: ZkConnection | None = attrs.field(init=False, default=None)
    _held: set[tuple[str, str]] = attrs.field(init=False, factory=set)
    _ensured: set[str] = attrs.field(init=False, factory=set)
    _watches: dict[str, _Watch] = attrs.field(init=False, factory=dict)
    _watch_gen: int = attrs.field(init=False, default=0)
    _watch_seen: dict[str, int] = attrs.field(init=False, factory=dict)

    # -- timing and messages ---------------------------------------------------------------
    @property
    def session_ms(self) -> int:
        """The session to plan with (the smaller of requested and granted)."""
        conn = self._conn
        if conn is not None:
            return conn.session_ms()
        return int((self.session_timeout_s or DEFAULT_SESSION_S) * 1000)

    @property
    def renew_interval(self) -> float:
        """A third of the session: two renewals may fail before it ends."""
        return self.session_ms / 3000

    def _op_timeout(self) -> float:
        """What a renewal waits for one reply: a third of the session (the interval), at
        least 0.5 s, at most the connect timeout (as lease mode)."""
        return min(self.connect_timeout_s, max(0.5, self.session_ms / 3000))

    def _error(self, action: str, exc: BaseException) -> fk.BackendError:
        return fk.BackendError(f"cluster membership in {self.where}: {action} failed: "
                               f"{_one_line(exc)}")

    def _raced(self, action: str, then: str) -> fk.BackendError:
        """``action`` lost every one of its ``races`` compare-and-set tries."""
        return fk.BackendError(f"cluster membership in {self.where}: {action} lost "
                               f"{self.races} version races; {then}")

    # -- the connection --------------------------------------------------------------------
    def _connect(self, session_s: float | None = None) -> ZkConnection:
        """The started connection (made on first use; a reconnecting one is waited for,
        at most ``connect_timeout``). BackendError, one line, when ZooKeeper does not
        answer."""
        with self._lock:
            self._check_open()
            conn = self._conn
            want = self.session_timeout_s or session_s or DEFAULT_SESSION_S
            if conn is not None and session_s is not None and self.session_timeout_s is None \
                    and not self._held and conn.requested_ms != int(want * 1000):
                # no member rides on this session: open one with the lease the join wants
                self._conn = None
                self._ensured.clear()
                conn.close()
                conn = None
            if conn is None:
                conn = ZkConnection(self.hosts, want, self.connect_timeout_s)
                conn.add_listener(self._on_state)
                self._conn = conn
            try:
                conn.start()
            except fk.BackendError:
                if not conn._started:     # never connected: nothing to keep
                    self._conn = None
                    conn.close()
                raise
            return conn

    def _on_state(self, state: str) -> None:
        # kazoo's event thread: no blocking calls; re-arm view watches once connected
        if state == KazooState.CONNECTED:
            for cluster in list(self._watches):
                self._arm(cluster)

    def _ensure(self, conn: ZkConnection, cluster: str) -> None:
        if cluster in self._ensured:
            return
        for sub in ("members", "nodes"):
            conn.call("ensure_path", f"{self.keys.base(cluster)}/{sub}")
        self._ensured.add(cluster)

    def _gets(self, conn: ZkConnection, paths: Sequence[str], timeout: float | None = None,
              sync: str | None = None) -> list[tuple[bytes, ZnodeStat] | None]:
        """Pipelined reads on our session (answered in order); None for a missing znode.
        ``sync``: a sync of that path first, so the reads see every write the leader had
        committed when it was sent."""
        if not conn.connected:   # kazoo would queue the reads until it reconnects
            raise ConnectionLoss(f"ZooKeeper connection is {conn.client.state}")
        wait = self.connect_timeout_s if timeout is None else timeout
        client = conn.client
        synced = client.sync_async(sync) if sync is not None else None
        pending = [client.get_async(p) for p in paths]
        if synced is not None:
            synced.get(timeout=wait)
        out: list[tuple[bytes, ZnodeStat] | None] = []
        for res in pending:
            try:
                out.append(res.get(timeout=wait))
            except NoNodeError:
                out.append(None)
        return out

    def _session_expired(self, exc: SessionExpiredError,
                         lease: fk.MemberLease) -> fk.LeaseLostError:
        return fk.LeaseLostError(f"member {lease.member.node!r} of cluster {lease.cluster!r}: "
                                 f"the ZooKeeper session expired ({_one_line(exc)})")

    # -- lease source half -----------------------------------------------------------------
    def acquire(self, request: fk.JoinRequest) -> fk.MemberLease:
        """Join: create the ephemeral member znode and write the roster entry in one
        transaction; refused (one line naming the live holder) while the znode exists."""
        cluster = fk.check_join(request)
        member = request.member
        token = fk.holder_token()
        action = f"joining cluster {cluster!r} as {member.node!r}"
        try:
            conn = self._connect(request.lease_s)
            session_ns = conn.session_ms() * MS
            safety = fk.safety_window_ns(session_ns, self.safety_window_ns)
            if safety * 2 >= session_ns:
                raise ValueError(f"safety_window ({safety / NS:g} s) must be less than half "
                                 f"the ZooKeeper session ({session_ns / NS:g} s)")
            self._ensure(conn, cluster)
            lease = self._join(conn, cluster, member, token, session_ns, safety,
                               request.config_digest)
        except (fk.BackendError, ValueError):
            raise
        except ZK_ERRORS as exc:   # SessionExpired too: nothing was handed out
            raise self._error(action, exc) from None
        with self._lock:
            self._held.add((cluster, member.node))
        log.info("joined cluster %s as %s (incarnation %d, session 0x%x, view epoch %d)",
                 cluster, member.node, lease.epoch, conn.session_id or 0, lease.view_epoch)
        return lease

    def _join(self, conn: ZkConnection, cluster: str, member: fk.Member, token: str,
              session_ns: int, safety_ns: int, digest: str = "") -> fk.MemberLease:
        mpath = self.keys.member(cluster, member.node)
        rpath = self.keys.roster(cluster, member.node)
        data = fk.encode_record(advertise=member.advertise, weight=member.weight,
                                holder=token, state="alive", session_ms=session_ns // MS,
                                config_digest=digest)
        roster = fk.encode_record(advertise=member.advertise, weight=member.weight,
                                  holder=token, incarnation=0, state="joined")
        for _ in range(self.races):
            live, entry = self._gets(conn, [mpath, rpath])
            if live is not None and live[1].ephemeralOwner == conn.session_id \
                    and (cluster, member.node) not in self._held:
                # left by a join of ours that failed after its commit (a read timed out):
                # no lease was handed out for it, so nobody serves under it
                log.warning("cluster %s: removing node %s's znode left by a failed join",
                            cluster, member.node)
                try:
                    conn.call("delete", mpath, version=live[1].version)
                except (BadVersionError, NoNodeError):
                    pass
                continue
            if live is not None:
                raise self._held_by(conn, cluster, member.node, live)
            session = conn.session_id
            tx = conn.client.transaction()
            tx.create(mpath, data, ephemeral=True)
            _write_roster(tx, rpath, entry, roster)
            t0 = self.clock.monotonic_ns()   # before the contact that proves the session
            results = conn.commit(tx)
            if any(isinstance(r, Exception) for r in results):
                continue   # the node was taken, or the roster moved: read again
            got = self._gets(conn, [mpath, self.keys.view(cluster)])
            if got[0] is None or got[0][1].ephemeralOwner != session \
                    or conn.session_id != session \
                    or fk.decode_record(got[0][0]).get("holder") != token:
                continue   # the session changed under the join: it is gone with it
            view_epoch = int(fk.decode_record(got[1][0]).get("epoch", 0)) if got[1] else 0
            return fk.MemberLease(member=member, cluster=cluster, holder=token,
                                  epoch=int(got[0][1].czxid), view_epoch=view_epoch,
                                  ttl=session_ns / NS, deadline_ns=t0 + session_ns - safety_ns)
        raise fk.BackendError(f"cluster membership in {self.where}: lost the race for node "
                              f"{member.node!r} of cluster {cluster!r} {self.races} times; retry")

    def _held_by(self, conn: ZkConnection, cluster: str, node: str,
                 live: tuple[bytes, ZnodeStat]) -> fk.BackendError:
        raw, stat = fk.decode_record(live[0]), live[1]
        ours = (" (this process's own session: it holds this node already)"
                if stat.ephemeralOwner == conn.session_id else "")
        return fk.held_by_error(
            cluster, node, raw.get("holder", "?"),
            f"incarnation {stat.czxid}, session 0x{stat.ephemeralOwner:x}{ours}", self.where,
            f"it is free once that process leaves or its session expires (at most "
            f"{int(raw.get('session_ms', 0)) / 1000:g} s after its last contact): ")

    def renew(self, lease: fk.MemberLease, mark: int) -> fk.MemberLease:
        """Prove the session alive and the member znode ours, re-read the view epoch."""
        cluster = fk.cluster_of(lease)
        mpath = self.keys.member(cluster, lease.member.node)
        conn = self._conn
        if self._closed or conn is None:
            raise fk.LeaseLostError(f"member {lease.member.node!r} of cluster {cluster!r}: the "
                                    "membership was closed")
        if not conn.connected:   # SUSPENDED is not LOST: the same session may come back
            raise fk.BackendError(f"ZooKeeper connection is {str(conn.client.state).upper()}; "
                                  f"member {lease.member.node!r} waits for its session to come "
                                  "back (it stops at its deadline)")
        session = conn.session_id
        t0 = self.clock.monotonic_ns()   # before the contact that proves the session
        try:
            for attempt in range(2):
                live, view = self._gets(conn, [mpath, self.keys.view(cluster)],
                                        timeout=self._op_timeout(),
                                        sync=self.keys.view(cluster))
                if live is None or live[1].czxid != lease.epoch \
                        or live[1].ephemeralOwner != session:
                    break   # not ours: said below
                # the renewal is written (the znode's version moves: what a claimer
                # times, on its own clock, from its first read of it), then the view is
                # read again *after* that write on our session (answered in order), so
                # a write that lands late never extends past a view it did not read
                wrote = conn.client.set_async(mpath, live[0], version=live[1].version)
                reread = conn.client.get_async(self.keys.view(cluster))
                try:
                    wrote.get(timeout=self._op_timeout())
                except BadVersionError:   # set_draining wrote meanwhile: read again
                    if attempt:
                        raise
                    continue
                except NoNodeError:
                    live = None
                    break
                try:
                    view = reread.get(timeout=self._op_timeout())
                except NoNodeError:
                    view = None
                break
        except SessionExpiredError as exc:
            self._drop(lease)
            raise self._session_expired(exc, lease) from None
        except ZK_ERRORS as exc:
            raise self._error(f"renewing member {lease.member.node!r}", exc) from None
        lost = None
        if live is None:
            lost = "its znode is gone (released, or its session expired)"
        elif live[1].czxid != lease.epoch:
            raw = fk.decode_record(live[0])
            lost = (f"the node is now held by {raw.get('holder', '?')} (incarnation "
                    f"{live[1].czxid})")
        elif live[1].ephemeralOwner != session or conn.session_id != session:
            lost = (f"its znode belongs to session 0x{live[1].ephemeralOwner:x}, ours is now "
                    f"0x{conn.session_id or 0:x}: the old session expired")
        if lost is not None:
            self._drop(lease)
            raise fk.no_longer_ours(lease, lost)
        view_epoch = int(fk.decode_record(view[0]).get("epoch", 0)) if view else 0
        session_ns = round(lease.ttl * NS)
        safety = fk.safety_window_ns(session_ns, self.safety_window_ns)
        return attrs.evolve(lease, view_epoch=view_epoch, deadline_ns=t0 + session_ns - safety)

    def _drop(self, lease: fk.MemberLease) -> None:
        with self._lock:
            self._held.discard((lease.cluster, lease.member.node))

    def release(self, lease: fk.MemberLease, mark: int) -> None:
        """Leave: delete our member znode (by version) and mark the roster entry ``left``
        in one transaction, fenced by the znode's czxid and the roster's version; a no-op
        if the node is not ours any more."""
        cluster = fk.cluster_of(lease)
        node = lease.member.node
        mpath, rpath = self.keys.member(cluster, node), self.keys.roster(cluster, node)
        self._drop(lease)
        try:
            conn = self._connect()
            for _ in range(self.races):
                live, entry = self._gets(conn, [mpath, rpath])
                if live is None or live[1].czxid != lease.epoch \
                        or fk.decode_record(live[0]).get("holder") != lease.holder:
                    log.info("member %s of %s was no longer ours when leaving", node, cluster)
                    return
                left = fk.encode_record(advertise=lease.member.advertise,
                                        weight=lease.member.weight, holder=lease.holder,
                                        incarnation=lease.epoch, state="left")
                tx = conn.client.transaction()
                tx.delete(mpath, version=live[1].version)
                _write_roster(tx, rpath, entry, left)
                if not any(isinstance(r, Exception) for r in conn.commit(tx)):
                    log.info("left cluster %s as %s (incarnation %d)", cluster, node,
                             lease.epoch)
                    return
        except ZK_ERRORS as exc:
            raise self._error(f"leaving as {node!r}", exc) from None
        raise self._raced(f"leaving as {node!r}", "its session ends it anyway")

    def close(self) -> None:
        """End the session (its member znodes go with it); idempotent."""
        with self._lock:
            conn, self._conn, self._closed = self._conn, None, True
            self._watches.clear()
            self._held.clear()
        if conn is not None:
            conn.close()

    # -- view half -------------------------------------------------------------------------
    def members(self, cluster: str) -> list[fk.MemberInfo]:
        """Every roster entry and live member znode of ``cluster``: alive / draining (a
        live znode), left (a clean leave), lapsed (the session ended without one)."""
        fk.check_key_segment("cluster", cluster)
        base = self.keys.base(cluster)
        try:
            conn = self._connect()
            names = set()
            for sub in ("members", "nodes"):
                try:
                    names.update(conn.call("get_children", f"{base}/{sub}"))
                except NoNodeError:
                    pass
            nodes = sorted(names)
            got = self._gets(conn, [p for n in nodes for p in
                                    (f"{base}/members/{n}", f"{base}/nodes/{n}")])
        except ZK_ERRORS as exc:
            raise self._error(f"listing the members of {cluster!r}", exc) from None
        out = []
        for i, node in enumerate(nodes):
            live, entry = got[2 * i], got[2 * i + 1]
            if live is not None:
                raw = fk.decode_record(live[0])
                # ZooKeeper does not say how long a live session has left: at most its
                # timeout after the holder's last contact
                session_ms = int(raw.get("session_ms", 0))
                out.append(fk.live_member_info(node, raw, incarnation=int(live[1].czxid),
                                               expires_in_ms=session_ms, lease_ms=session_ms,
                                               version=int(live[1].version)))
            elif entry is not None:
                raw = fk.decode_record(entry[0])
                left = raw.get("state") == "left"
                incarnation = int(raw.get("incarnation") or 0) if left else int(entry[1].mzxid)
                out.append(fk.roster_member_info(node, raw, incarnation=incarnation))
        return out

    def view(self, cluster: str) -> fk.View:
        """The stored view; ``View(cluster, 0, ())`` before the first proposal."""
        fk.check_key_segment("cluster", cluster)
        try:
            got = self._gets(self._connect(), [self.keys.view(cluster)])[0]
        except ZK_ERRORS as exc:
            raise self._error(f"reading the view of {cluster!r}", exc) from None
        if got is None:
            return fk.stored_view(cluster, None)
        return fk.stored_view(cluster, fk.decode_record(got[0]), int(got[1].mtime))

    def propose(self, cluster: str, seen_epoch: int,
                members: Sequence[fk.Member]) -> fk.View | None:
        """Compare-and-set: write ``seen_epoch + 1`` only if the view znode still holds
        ``seen_epoch`` at the version read (the first view: create, one of two racing
        creates wins); the new view, or None when someone else moved it first."""
        ordered = fk.check_proposal(cluster, seen_epoch, members)
        data = fk.encode_record(epoch=seen_epoch + 1, members=fk.view_entries(ordered))
        path = self.keys.view(cluster)
        try:
            conn = self._connect()
            if seen_epoch == 0:
                try:
                    _, stat = conn.call("create", path, data, makepath=True, include_data=True)
                except NodeExistsError:
                    return None
            else:
                got = self._gets(conn, [path])[0]
                if got is None or int(fk.decode_record(got[0]).get("epoch", 0)) != seen_epoch:
                    return None
                try:
                    stat = conn.call("set", path, data, version=got[1].version)
                except (BadVersionError, NoNodeError):
                    return None
        except ZK_ERRORS as exc:
            raise self._error(f"proposing epoch {seen_epoch + 1} of {cluster!r}",
                              exc) from None
        view = fk.View(cluster, seen_epoch + 1, tuple(ordered), int(stat.mtime))
        fk.log_view_change(log, cluster, seen_epoch, view)
        return view

    def set_draining(self, cluster: str, node: str, draining: bool) -> bool:
        """Mark a live member as draining (or alive again) in its znode's data, by
        version; False if no live member has that node id."""
        fk.check_key_segment("cluster", cluster)
        fk.check_key_segment("node", node)
        path = self.keys.member(cluster, node)
        try:
            conn = self._connect()
            for _ in range(self.races):
                got = self._gets(conn, [path])[0]
                if got is None:
                    return False
                raw = fk.decode_record(got[0])
                raw["state"] = "draining" if draining else "alive"
                try:
                    conn.call("set", path, fk.encode_record(**raw), version=got[1].version)
                    return True
                except BadVersionError:
                    continue
                except NoNodeError:
                    return False
        except ZK_ERRORS as exc:
            raise self._error(f"marking {node!r} as draining", exc) from None
        raise self._raced(f"marking {node!r} as draining", "retry")

    def watch_view(self, cluster: str, callback: Callable[[], None] | None) -> None:
        """A data watch on the view znode as a hint: ``callback()`` (from kazoo's thread)
        whenever the view changed since the watch was last armed -- the watch fired, or
        the view moved while it was not armed (between an event and its re-arming, or
        while the connection was down: it is armed again once connected). None stops it.
        Safety never rests on it: renewals re-read the epoch."""
        fk.check_key_segment("cluster", cluster)
        with self._lock:
            if callback is None:
                self._watches.pop(cluster, None)
                return
            self._watch_gen += 1
            gen = self._watch_gen

            def fired(event: WatchedEvent) -> None:
                # one function per watch: kazoo keeps watchers in a set, so re-arming
                # (after an event, on reconnection) never doubles the callbacks; the
                # re-arming read says whether the view changed (see _armed)
                current = self._watches.get(cluster)
                if current is not None and current[0] == gen:
                    self._arm(cluster)

            self._watches[cluster] = (gen, callback, fired)
            self._watch_seen.pop(cluster, None)
        try:
            self._connect()
        except fk.BackendError as exc:   # armed once connected (the state listener)
            log.warning("cluster %s: view watch not armed yet: %s", cluster, exc)
            return
        self._arm(cluster)

    def _arm(self, cluster: str) -> None:
        """Set the one-shot exists-watch on the view (it fires on create, change and
        delete; kazoo fires it with a NONE event when the connection drops)."""
        entry = self._watches.get(cluster)
        conn = self._conn
        if entry is None or conn is None or not conn.connected:
            return
        gen = entry[0]
        try:
            result = conn.client.exists_async(self.keys.view(cluster), watch=entry[2])
        except ZK_ERRORS as exc:  # pragma: no cover - re-armed on the next CONNECTED
            log.warning("cluster %s: arming the view watch failed: %s", cluster, exc)
            return
        result.rawlink(lambda res: self._armed(cluster, gen, res))

    def _armed(self, cluster: str, gen: int, result: Any) -> None:
        """The re-arming read: call back if the view's mzxid moved since the last one."""
        try:
            stat = result.get_nowait()
        except Exception:  # noqa: BLE001 - not armed (disconnected): armed once connected
            return
        with self._lock:
            entry = self._watches.get(cluster)
            if entry is None or entry[0] != gen:
                return
            version = int(stat.mzxid) if stat is not None else 0
            before = self._watch_seen.get(cluster)
            self._watch_seen[cluster] = version
        if before is not None and before != version:
            try:
                entry[1]()
            except Exception:  # a hint's callback must not break kazoo's thread
                log.exception("cluster %s: view watch callback failed", cluster)

    # -- for tests and drills --------------------------------------------------------------
    @property
    def connection(self) -> ZkConnection | None:
        """The kazoo connection (None before first use and after close)."""
        return self._conn

    def wait_connected(self, timeout: float) -> bool:
        """True once the connection is CONNECTED (drills wait for a reconnect)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            conn = self._conn
            if conn is not None and conn.connected:
                return True
            time.sleep(0.01)
        return False
