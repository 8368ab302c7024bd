"""EtcdMembership: cluster membership in etcd; an etcd lease per join is the member's lease.

Keys under ``{root}/clusters/{cluster}`` (default root ``/flakekit``)::

    members/{node}   attached to the join's etcd lease, created by a transaction
                     ``create_revision == 0``: JSON {advertise, weight, holder, lease,
                     lease_ms, state (alive | draining)}; its create revision (the join
                     transaction's ``header.revision``) is the incarnation
    nodes/{node}     no lease (it outlives the member): the roster entry, written in the
                     same transaction as every join and leave: JSON {advertise, weight,
                     holder, incarnation, lease_ms, state (joined | left)}; it tells a clean
                     leave (``left``) from a lease that ran out (``lapsed``)
    view             no lease, never deleted: JSON {epoch, members, changed_at_ms}; moved
                     only by a transaction on the key's ``mod_revision`` (the first view:
                     ``create_revision == 0``) whose JSON epoch was read equal to the seen
                     one, so of two proposers that saw the same epoch exactly one wins

Join = grant a lease (the TTL asked: ``ttl``, else the join's lease rounded up to whole
seconds, at least 2 s; the TTL etcd grants is the one used), then one transaction that
creates the member key with it, writes the roster entry and reads the view. The key
existing means another live lease holds the node: the join is refused with one line
naming that holder (and our lease is revoked). The deadline counts from the *send* time
of the grant.

Renew = one ``lease keepalive`` (TTL <= 0 in the answer: LeaseLostError at once), then,
right after, a transaction that checks the member key is still ours (create revision =
the incarnation, lease = ours) and reads it, and one that writes it back unchanged
(fenced on its mod revision; its ``version`` moves: a claimer that reads it unchanged
for the share of the TTL a holder serves after a renewal, plus a margin, on its own
clock, knows the holder stopped; issue 24) and reads the view in the same
transaction, so a member whose watch died learns of a new view within one renewal
interval (a third of the TTL). The new
deadline is the keep-alive's send time + the TTL the server answered - the safety window,
on the monotonic clock: an etcd lease can outlive its TTL (a new leader re-arms it,
etcd #9395) or vanish early, so nothing here computes another member's fate from local
time; a member stops on its own deadline, and hand-offs wait on the new owner's clock.

Release = a transaction conditioned on the member key's create revision (and lease)
deleting the key and marking the roster ``left``, then the lease is revoked.

etcd keeps no time: ``changed_at_ms`` of a view is the proposer's wall clock at write time
(never earlier than the previous view's; the runtime only shows it in status), and
``expires_in_ms`` of a live member is etcd's time-to-live of its lease (whole seconds,
rounded down), approximated by its TTL if that query fails; a lapsed member shows 0.

``watch_view`` starts an etcd watch on the view key whose events call the callback: a
hint only (etcd3gw's watch ignores cancel and compaction answers and swallows errors);
safety comes from the renewals re-reading the epoch.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs

import flakekit.plugin as fk
from flakekit.plugin import NS_PER_MS as MS
from flakekit.plugin import NS_PER_S as NS
from flakekit_etcd import wire
from flakekit_etcd.session import EtcdSession

__all__ = ["EtcdMembership"]

log = logging.getLogger("flakekit.cluster.etcd")

#: etcd raises a smaller TTL to about 1.5 x its election timeout (2 s by default)
MIN_TTL_S = 2
#: the TTL planned with before any join says which lease it wants
DEFAULT_TTL_S = 10
#: a revoke on the way out waits at most this long (the lease lapses by itself anyway)
_REVOKE_TIMEOUT_S = 1.0


def _load(kv: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON record of a key read from etcd (``{}``: none, or unreadable)."""
    return {} if kv is None else fk.decode_record(wire.unb64(kv.get("value")))


@attrs.define
class _Held:
    """A lease this membership granted for a join it still holds."""

    lease_id: int
    ttl_s: int


@attrs.define(eq=False)
class EtcdMembership(fk.KvMembershipBase):
    """A :class:`~flakekit.plugin.Membership` in etcd (see the module docstring).

    Args:
        endpoints: the etcd cluster's client URLs, ``"host:port,host:port"``.
        clock: deadlines are on its monotonic timeline; ``changed_at`` on its wall time.
        root: the key prefix above ``clusters/``.
        ttl_s: the lease TTL to ask for, whole seconds (None: the join's lease rounded up,
            at least 2 s); etcd may grant more, and the lease says what was granted.
        connect_timeout_s: the longest any call waits (renewals: a sixth of the TTL, at
            least 0.5 s, so keep-alive and read fit in a renewal interval).
        safety_window_ns: a member stops this long before its lease could end (None, or
            anything less: a fifth of the TTL, which claimers count on: ``serve_share``;
            less than half of it).
        username, password: etcd's auth, both or neither.
        watch: whether ``watch_view`` starts an etcd watch (a hint only).
    """

    store_and_address = ("etcd", "endpoints")

    #: etcd grants leases in whole seconds: ``[cluster] lease`` must span three of them
    lease_granularity: ClassVar[float] = 1.0
    #: a lapsed record proves nothing: etcd leases can vanish early under a stuck leader
    lapse_means_stopped: ClassVar[bool] = False
    #: a holder serves at most this share of its TTL after the send of the keep-alive
    #: before the renewal that wrote its key's version (the safety window is at least the
    #: rest): a claimer that first read that version waits this share plus a margin from
    #: that read, whatever etcd does with the lease (re-armed by a new leader, or gone
    #: early under a stuck one; issue 24)
    serve_share: ClassVar[float] = 0.8

    endpoints: str
    clock: fk.Clock
    ttl_s: int | None = None
    username: str | None = None
    password: str | None = None
    watch: bool = True
    _session: EtcdSession | None = attrs.field(init=False, default=None)
    _held: dict[str, _Held] = attrs.field(init=False, factory=dict)
    _granted_s: float = attrs.field(init=False, default=float(DEFAULT_TTL_S))
    _watches: dict[str, tuple[int, Callable[[], None] | None]] = attrs.field(
        init=False, factory=dict)
    _watch_gen: int = attrs.field(init=False, default=0)

    # -- timing ----------------------------------------------------------------------------
    @property
    def renew_interval(self) -> float:
        """A third of the TTL last granted: two renewals may fail before it ends."""
        return self._granted_s / 3

    def _op_timeout(self, ttl_s: float) -> float:
        return min(self.connect_timeout_s, max(0.5, ttl_s / 6))

    def lease_of(self, lease: fk.MemberLease) -> int | None:
        """The etcd lease id this membership holds for ``lease`` (None: none any more)."""
        held = self._held.get(lease.holder)
        return None if held is None else held.lease_id

    # -- transport -------------------------------------------------------------------------
    def _call(self, path: str, payload: dict[str, Any],
              timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            self._check_open()
            session = self._session
            if session is None:
                session = self._session = EtcdSession(
                    self.endpoints, self.ttl_s or DEFAULT_TTL_S, self.connect_timeout_s,
                    username=self.username, password=self.password)
        return session.request(path, payload, timeout)

    def _txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
             failure: list[dict[str, Any]] | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        return self._call("kv/txn", {"compare": compare, "success": success,
                                     "failure": failure or []}, timeout)

    def _range(self, key: str, end: bytes | None = None,
               timeout: float | None = None) -> list[dict[str, Any]]:
        return list(self._call("kv/range", wire.range_payload(key, end),
                               timeout).get("kvs") or [])

    def _error(self, action: str, exc: BaseException) -> fk.BackendError:
        text = " ".join(str(exc).split()) or type(exc).__name__
        made = fk.BackendError(f"cluster membership in {self.where}: {action} failed: {text}")
        if isinstance(exc, fk.BackendError) and type(exc) is not fk.BackendError:
            try:   # keep EtcdAuthError / EtcdVersionError: callers may tell them apart
                made = type(exc)(str(made))
            except TypeError:  # pragma: no cover - a subclass with another signature
                pass
        return made

    def _revoke(self, lease_id: int) -> bool:
        """Best effort (the lease lapses by itself): True when etcd revoked it or it was
        gone already."""
        try:
            self._call("lease/revoke", {"ID": lease_id},
                       timeout=min(_REVOKE_TIMEOUT_S, self.connect_timeout_s))
            return True
        except fk.LeaseLostError:
            return True
        except fk.BackendError as exc:
            log.debug("revoking etcd lease 0x%x: %s (it expires by itself)", lease_id, exc)
            return False

    # -- lease source half -----------------------------------------------------------------
    def acquire(self, request: fk.JoinRequest) -> fk.MemberLease:
        """Join: grant a lease, create the member key with it (``create_revision == 0``)
        and write the roster entry in one transaction that also reads the view; refused
        (one line naming the live holder) while the member key exists."""
        cluster = fk.check_join(request)
        member = request.member
        ask = self.ttl_s or max(MIN_TTL_S, math.ceil(round(request.lease_s, 6)))
        action = f"joining cluster {cluster!r} as {member.node!r}"
        send = self.clock.monotonic_ns()   # the lease runs from (after) the grant's send
        try:
            grant = self._call("lease/grant", {"TTL": ask, "ID": 0})
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(action, exc) from None
        lease_id = fk.as_int(grant.get("ID"))
        granted = fk.as_int(grant.get("TTL"), ask)
        if not lease_id or granted <= 0:
            raise fk.BackendError(f"cluster membership in {self.where}: {action} failed: the "
                                  f"lease grant answered {grant!r}")
        ttl_ns = granted * NS
        safety = self._safety_ns(ttl_ns)
        if safety * 2 >= ttl_ns:
            self._revoke(lease_id)
            raise ValueError(f"safety_window ({safety / NS:g} s) must be less than half the "
                             f"granted etcd lease ({granted} s)")
        token = fk.holder_token()
        mkey = self.keys.member(cluster, member.node)
        record = fk.encode_record(advertise=member.advertise, weight=member.weight,
                                  holder=token, lease=f"0x{lease_id:x}",
                                  lease_ms=granted * 1000, state="alive",
                                  config_digest=request.config_digest)
        roster = fk.encode_record(advertise=member.advertise, weight=member.weight,
                                  holder=token, lease_ms=granted * 1000, state="joined")
        try:
            body = self._txn([wire.created(mkey, 0)],
                             [wire.put(mkey, record, lease=lease_id),
                              wire.put(self.keys.roster(cluster, member.node), roster),
                              wire.get(self.keys.view(cluster))],
                             [wire.get(mkey)])
        except (fk.BackendError, fk.LeaseLostError) as exc:
            self._revoke(lease_id)   # the join may have gone through: undo it
            raise self._error(action, exc) from None
        if not body.get("succeeded"):
            self._revoke(lease_id)
            raise self._refusal(cluster, member.node, wire.kv_at(body, 0))
        epoch = fk.as_int(body.get("header", {}).get("revision"))
        view_epoch = fk.as_int(_load(wire.kv_at(body, 2)).get("epoch"))
        with self._lock:
            self._held[token] = _Held(lease_id, granted)
            self._granted_s = float(granted)
        log.info("joined cluster %s as %s (incarnation %d, etcd lease 0x%x, TTL %d s, view "
                 "epoch %d)", cluster, member.node, epoch, lease_id, granted, view_epoch)
        return fk.MemberLease(member=member, cluster=cluster, holder=token, epoch=epoch,
                              view_epoch=view_epoch, ttl=float(granted),
                              deadline_ns=send + ttl_ns - safety)

    def _refusal(self, cluster: str, node: str, kv: dict[str, Any] | None) -> fk.BackendError:
        raw = _load(kv)
        lease = fk.as_int((kv or {}).get("lease"))
        ttl = self._ttl_left(lease)
        left = f", lease ends in {ttl} s unless renewed" if ttl is not None and ttl >= 0 else ""
        return fk.held_by_error(
            cluster, node, raw.get("holder", "?"),
            f"incarnation {fk.as_int((kv or {}).get('create_revision'))}, etcd lease "
            f"0x{lease:x}{left}", self.where)

    def renew(self, lease: fk.MemberLease, mark: int) -> fk.MemberLease:
        """One keep-alive, then a read that the member key is still ours plus the view
        epoch; LeaseLostError when the lease is gone (TTL <= 0) or the key is not ours."""
        cluster = fk.cluster_of(lease)
        node = lease.member.node
        held = self._held.get(lease.holder)
        if held is None:
            raise fk.LeaseLostError(f"member {node!r} of cluster {cluster!r}: this membership "
                                    f"holds no lease for {lease.holder} (released, lost or closed)")
        timeout = self._op_timeout(held.ttl_s)
        send = self.clock.monotonic_ns()
        try:
            body = self._call("lease/keepalive", {"ID": held.lease_id}, timeout)
        except fk.LeaseLostError:
            body = {}
        except fk.BackendError as exc:
            raise self._error(f"renewing member {node!r}", exc) from None
        ttl = fk.as_int((body.get("result") or {}).get("TTL"), -1)
        if ttl <= 0:
            self._forget(lease.holder)
            raise fk.LeaseLostError(
                f"member {node!r} of cluster {cluster!r}: the etcd lease 0x{held.lease_id:x} "
                "expired or was revoked (keepalive answered TTL <= 0)")
        mkey = self.keys.member(cluster, node)
        ours = [wire.created(mkey, lease.epoch), wire.leased(mkey, held.lease_id)]
        try:
            body = self._txn(ours, [wire.get(mkey)], [wire.get(mkey)], timeout)
            kv = wire.kv_at(body, 0)
            if body.get("succeeded") and kv is not None:
                # the renewal is written (the key's version moves: what a claimer times,
                # on its own clock, from its first read of it); the view is read in the
                # same transaction, so a write that lands late never extends past a view
                # it did not read. Fenced on the value read (set_draining may write too)
                wrote = self._txn([*ours, wire.modified(mkey, fk.as_int(kv.get("mod_revision")))],
                                  [wire.put(mkey, wire.unb64(kv.get("value")),
                                            lease=held.lease_id),
                                   wire.get(self.keys.view(cluster))], [], timeout)
                if not wrote.get("succeeded"):
                    raise fk.BackendError("the member key changed under the renewal (a drain "
                                          "mark?); renewed at the next interval")
                body = {"succeeded": True, "responses": wrote.get("responses", [])[1:]}
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(f"renewing member {node!r}", exc) from None
        if not body.get("succeeded"):
            self._forget(lease.holder)
            self._revoke(held.lease_id)
            kv = wire.kv_at(body, 0)
            now = ("its key is gone" if kv is None else
                   f"the node is now held by {_load(kv).get('holder', '?')} (incarnation "
                   f"{fk.as_int(kv.get('create_revision'))})")
            raise fk.no_longer_ours(lease, now)
        view_epoch = fk.as_int(_load(wire.kv_at(body, 0)).get("epoch"))
        ttl_ns = min(ttl, held.ttl_s) * NS
        return attrs.evolve(lease, view_epoch=view_epoch,
                            deadline_ns=send + ttl_ns - self._safety_ns(held.ttl_s * NS))

    def _forget(self, holder: str) -> _Held | None:
        with self._lock:
            return self._held.pop(holder, None)

    def release(self, lease: fk.MemberLease, mark: int) -> None:
        """Leave: delete the member key and mark the roster ``left`` in one transaction
        fenced on the key's create revision (and our lease), then revoke the lease; a
        no-op on the store if the key is not ours any more."""
        cluster = fk.cluster_of(lease)
        node = lease.member.node
        held = self._forget(lease.holder)
        mkey = self.keys.member(cluster, node)
        compare = [wire.created(mkey, lease.epoch)]
        if held is not None:
            compare.append(wire.leased(mkey, held.lease_id))
        left = fk.encode_record(advertise=lease.member.advertise, weight=lease.member.weight,
                                holder=lease.holder, incarnation=lease.epoch,
                                lease_ms=round(lease.ttl * 1000), state="left")
        problem: fk.BackendError | None = None
        try:
            body = self._txn(compare, [wire.delete(mkey),
                                       wire.put(self.keys.roster(cluster, node), left)])
            if body.get("succeeded"):
                log.info("left cluster %s as %s (incarnation %d)", cluster, node, lease.epoch)
            else:
                log.info("member %s of %s was no longer ours when leaving", node, cluster)
        except (fk.BackendError, fk.LeaseLostError) as exc:
            problem = self._error(f"leaving as {node!r}", exc)
        revoked = held is not None and self._revoke(held.lease_id)
        if problem is not None and not revoked:
            raise problem

    def close(self) -> None:
        """Stop the watches, revoke the leases still held (their member keys go at once;
        the roster shows them ``lapsed``), close the HTTP sessions; idempotent."""
        with self._lock:
            if self._closed:
                return
            held, self._held = list(self._held.values()), {}
            watches, self._watches = list(self._watches.values()), {}
        for _, cancel in watches:
            if cancel is not None:
                _cancel(cancel)
        for h in held:
            self._revoke(h.lease_id)
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            session.close_clients()

    # -- view half -------------------------------------------------------------------------
    def members(self, cluster: str) -> list[fk.MemberInfo]:
        """Every roster entry and live member key of ``cluster`` (one range read, plus a
        time-to-live query per live lease): alive / draining (a live key), left (a clean
        leave), lapsed (the lease ended without one)."""
        base = self.keys.base(fk.check_key_segment("cluster", cluster))
        try:
            kvs = self._range(f"{base}/", wire.range_end(f"{base}/"))
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(f"listing the members of {cluster!r}", exc) from None
        live: dict[str, dict[str, Any]] = {}
        roster: dict[str, dict[str, Any]] = {}
        for item in kvs:
            rest = wire.unb64(item.get("key")).decode()[len(base) + 1:]
            kind, _, node = rest.partition("/")
            if kind == "members" and node:
                live[node] = item
            elif kind == "nodes" and node:
                roster[node] = item
        ttls: dict[int, int | None] = {}
        out = []
        for node in sorted(set(live) | set(roster)):
            kv = live.get(node)
            if kv is not None:
                raw = _load(kv)
                lease_ms = fk.as_int(raw.get("lease_ms"))
                lease = fk.as_int(kv.get("lease"))
                if lease not in ttls:
                    ttls[lease] = self._ttl_left(lease)
                ttl = ttls[lease]
                lapsed = ttl is not None and ttl < 0   # gone a moment ago: its key goes too
                out.append(fk.live_member_info(
                    node, raw, incarnation=fk.as_int(kv.get("create_revision")),
                    expires_in_ms=0 if lapsed else lease_ms if ttl is None else ttl * 1000,
                    lease_ms=lease_ms, version=fk.as_int(kv.get("version")),
                    state="lapsed" if lapsed else ""))
                continue
            entry = roster[node]
            raw = _load(entry)
            incarnation = fk.as_int(raw.get("incarnation")) or fk.as_int(entry.get("mod_revision"))
            # version 0: no renewal can follow (its member key is gone, and every renewal
            # is conditioned on it), and each one wrote that key before it was deleted,
            # so the holder's deadline is at most serve_share after a first read of this
            # (a claimer's fallback when etcd deleted the key before its proof completed)
            out.append(fk.roster_member_info(node, raw, incarnation=incarnation,
                                             lease_ms=fk.as_int(raw.get("lease_ms")), version=0))
        return out

    def _ttl_left(self, lease: int) -> int | None:
        """Seconds left on ``lease`` (-1: gone; None: unknown, the query failed)."""
        if not lease:
            return None
        try:
            body = self._call("lease/timetolive", {"ID": lease},
                              timeout=min(1.0, self.connect_timeout_s))
        except fk.LeaseLostError:
            return -1
        except fk.BackendError as exc:
            log.debug("time-to-live of etcd lease 0x%x: %s", lease, exc)
            return None
        return fk.as_int(body.get("TTL"), -1)

    def view(self, cluster: str) -> fk.View:
        """The stored view; ``View(cluster, 0, ())`` before the first proposal."""
        key = self.keys.view(fk.check_key_segment("cluster", cluster))
        try:
            kvs = self._range(key)
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(f"reading the view of {cluster!r}", exc) from None
        return fk.stored_view(cluster, _load(kvs[0]) if kvs else None)

    def propose(self, cluster: str, seen_epoch: int,
                members: Sequence[fk.Member]) -> fk.View | None:
        """Compare-and-set: write ``seen_epoch + 1`` only if the view key still holds
        ``seen_epoch`` at the ``mod_revision`` read (the first view: only while the key
        does not exist); the new view, or None when someone else moved it first."""
        ordered = fk.check_proposal(cluster, seen_epoch, members)
        key = self.keys.view(cluster)
        action = f"proposing epoch {seen_epoch + 1} of {cluster!r}"
        try:
            kvs = self._range(key)
            current = kvs[0] if kvs else None
            if seen_epoch == 0:
                if current is not None:
                    return None
                compare, before_ms = [wire.created(key, 0)], 0
            else:
                raw = _load(current)
                if current is None or fk.as_int(raw.get("epoch")) != seen_epoch:
                    return None
                compare = [wire.modified(key, fk.as_int(current.get("mod_revision")))]
                before_ms = fk.as_int(raw.get("changed_at_ms"))
            # etcd keeps no time: the proposer's wall clock, never before the last view's
            changed = max(self.clock.time_ns() // MS, before_ms)
            data = fk.encode_record(epoch=seen_epoch + 1, changed_at_ms=changed,
                                    members=fk.view_entries(ordered))
            body = self._txn(compare, [wire.put(key, data)])
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(action, exc) from None
        if not body.get("succeeded"):
            return None
        view = fk.View(cluster, seen_epoch + 1, tuple(ordered), changed)
        fk.log_view_change(log, cluster, seen_epoch, view)
        return view

    def set_draining(self, cluster: str, node: str, draining: bool) -> bool:
        """Mark a live member as draining (or alive again) in its key's value, by a
        transaction on the key's ``mod_revision`` that keeps its lease; False if no live
        member has that node id."""
        key = self.keys.member(fk.check_key_segment("cluster", cluster),
                              fk.check_key_segment("node", node))
        try:
            for _ in range(self.races):
                kvs = self._range(key)
                if not kvs:
                    return False
                kv = kvs[0]
                raw = _load(kv)
                raw["state"] = "draining" if draining else "alive"
                body = self._txn([wire.modified(key, fk.as_int(kv.get("mod_revision"))),
                                  wire.created(key, fk.as_int(kv.get("create_revision")))],
                                 [wire.put(key, fk.encode_record(**raw), keep_lease=True)])
                if body.get("succeeded"):
                    return True
        except (fk.BackendError, fk.LeaseLostError) as exc:
            raise self._error(f"marking {node!r} as draining", exc) from None
        raise fk.BackendError(f"cluster membership in {self.where}: marking {node!r} as "
                              f"draining lost {self.races} races; retry")

    def watch_view(self, cluster: str, callback: Callable[[], None] | None) -> None:
        """An etcd watch on the view key (a thread of its own): every event calls
        ``callback()``; None stops it. A hint only: etcd3gw's watch may die quietly, and
        renewals re-read the epoch anyway."""
        key = self.keys.view(fk.check_key_segment("cluster", cluster))
        with self._lock:
            old = self._watches.pop(cluster, None)
            self._watch_gen += 1
            gen = self._watch_gen
            if callback is not None and self.watch and not self._closed:
                self._watches[cluster] = (gen, None)
        if old is not None and old[1] is not None:
            _cancel(old[1])
        if callback is None or not self.watch or self._closed:
            return
        threading.Thread(target=self._watch_loop, args=(cluster, key, gen, callback),
                         daemon=True, name=f"flakekit-etcd-view-{cluster}").start()

    def _watch_loop(self, cluster: str, key: str, gen: int,
                    callback: Callable[[], None]) -> None:
        def current() -> bool:
            entry = self._watches.get(cluster)
            return entry is not None and entry[0] == gen

        try:
            self._call("maintenance/status", {})   # checked and authenticated first
            session = self._session
            if session is None:
                return
            events, cancel = session.client_for_watch().watch(key)
        except Exception as exc:  # noqa: BLE001 - a hint only: renewals keep safety
            log.debug("cluster %s: view watch not started: %s", cluster, exc)
            return
        with self._lock:
            if not current():
                _cancel(cancel)
                return
            self._watches[cluster] = (gen, cancel)
        try:
            for _event in events:
                if not current():
                    return
                try:
                    callback()
                except Exception:  # a hint's callback must not end the watch
                    log.exception("cluster %s: view watch callback failed", cluster)
        except Exception as exc:  # noqa: BLE001 - etcd3gw ends watches quietly
            log.debug("cluster %s: view watch ended: %s", cluster, exc)


def _cancel(cancel: Callable[[], None]) -> None:
    try:
        cancel()
    except Exception:  # closing a socket only
        log.debug("cancelling an etcd watch failed", exc_info=True)
