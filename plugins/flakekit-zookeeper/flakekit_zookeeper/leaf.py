"""``mode = "leaf"``: Meituan Leaf's Snowflake-mode worker ids, without its flaws.

Znodes (compatible with Leaf's ``SnowflakeZookeeperHolder``)::

    {root}/{name}/forever/{ip}:{port}-{seq:010d}   persistent sequential
        data: {"ip": "10.0.0.7", "port": "8080", "timestamp": 1767225600000}
    {root}/{name}/live/{ip}:{port}                 ephemeral (flakekit only)
        data: {"host": ..., "pid": ...}: the live process of this identity

The worker id is ``seq``; an ip:port keeps its node (and id) forever. What differs
from Leaf:

- a clock behind the last reported time (ZooKeeper's or the cache's) makes start-up
  fail with :class:`ClockBehindReportError`; Leaf catches that and starts anyway;
- the cache file holds the last reported time and the identity it belongs to, so the
  clock check also works when ZooKeeper is down, and a copied file is ignored;
- the cache is used only when ZooKeeper cannot be reached, not on any error;
- a sequence number beyond the layout's worker range is an error naming the node;
- the generator never stamps an ID below the last reported (or released) time;
- one live process per identity: an exclusive file lock on this host (see hostlock) and
  the ephemeral ``live/`` znode across hosts; reports are written with a version check,
  so a process whose report was overwritten by another one stops issuing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from flakekit.plugin import (
    BackendError,
    Clock,
    ConfigError,
    Events,
    LeaseLostError,
    LeaseRequest,
    WorkerExhaustedError,
    WorkerLease,
    WorkerRecord,
)
from flakekit_zookeeper.cache import (
    CacheEntry,
    any_cache_time_ms,
    load_cache,
    machine_identity,
    save_cache,
)
from flakekit_zookeeper.client import ZK_ERRORS, ZkConnection, start_held
from flakekit_zookeeper.errors import ClockBehindReportError
from flakekit_zookeeper.hostlock import HostLock, HostLockTaken

__all__ = ["LeafAllocator", "parse_node_name"]

log = logging.getLogger("flakekit.zookeeper")
#: a failed report (the asserts guard a connection that went away meanwhile), the last one
_REPORT_ERRORS: tuple[type[BaseException], ...] = (AssertionError, *ZK_ERRORS)
_FINAL_ERRORS: tuple[type[BaseException], ...] = (LeaseLostError, *ZK_ERRORS)

_NODE = re.compile(r"^(?P<key>.+)-(?P<seq>\d{10})$")

#: how far the clock may lag ZooKeeper's reckoning of the time since the last report
#: (without a cache file) before start-up refuses: scheduling and network latency only
ZK_CLOCK_TOLERANCE_MS = 1_000


def parse_node_name(child: str) -> tuple[str, int] | None:
    """``"10.0.0.7:8080-0000000005"`` → ``("10.0.0.7:8080", 5)``; None if not Leaf's."""
    match = _NODE.match(child)
    if match is None:
        return None
    return match.group("key"), int(match.group("seq"))


def node_data(ip: str, port: int, timestamp_ms: int) -> bytes:
    # Leaf's Endpoint has String ip, String port, long timestamp (Jackson/fastjson)
    return json.dumps({"ip": ip, "port": str(port), "timestamp": timestamp_ms},
                      separators=(",", ":")).encode()


def parse_timestamp(data: bytes, where: str) -> int:
    try:
        return int(json.loads(data.decode())["timestamp"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise BackendError(
            f"znode {where} does not hold Leaf's JSON {{ip, port, timestamp}} ({exc!r}): "
            f"{data[:200]!r}"
        ) from None


@attrs.define(eq=False)
class LeafAllocator:
    """Leaf-compatible worker ids with a local cache (weak dependency on ZooKeeper)."""

    settings: Any
    hosts: str
    name: str
    root: str
    ip: str
    port: int
    cache_path: Path
    clock: Clock
    events: Events
    generator: str = "default"
    path: str = "allocator"
    #: which of several processes sharing ip:port (a server's workers); 0 for most
    instance: int = 0
    #: where the current lease came from: "zookeeper" or "cache"
    source: str | None = None
    node: str | None = None
    worker: int | None = None
    last_reported_ms: int = 0
    reports: int = 0
    report_failures: int = 0
    _conn: ZkConnection | None = None
    _lease: WorkerLease | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = attrs.Factory(threading.Event)
    _watch: Callable[[str, str], None] | None = None
    _lock: threading.RLock = attrs.Factory(threading.RLock)
    _issued_until_ms: int = 0
    #: set when another process took this identity over: no more IDs, no more reports
    lost: str | None = None
    _host_lock: HostLock | None = None
    _node_version: int = -1     # the forever node's version after our last write
    #: timestamps written since the last confirmed write (one that lands late is ours)
    _attempted: set[int] = attrs.Factory(set)
    _live_session: int | None = None   # the session owning our live/ node
    _zk_now_ms: int = 0         # ZooKeeper's clock when our live/ node was made
    # monotonic ns: the last report attempt, and the start of the last one that proved
    # this process live (ZooKeeper took it; or, ZooKeeper away, it ran on schedule)
    _tick_ns: int = 0
    _confirmed_ns: int = 0
    #: a report came late (the process was paused): only ZooKeeper can confirm again
    _need_zk: bool = False

    # -- facts ---------------------------------------------------------------------------
    @property
    def lease_ns(self) -> int:
        """IDs flow this long after the last proof of life: the session minus the safety
        window, so a process paused past its session (whose live/ node another process
        may then have taken) issues nothing when it resumes, until a report confirms."""
        return int(self.settings.session_timeout - self.settings.safety_window)

    @property
    def report_every(self) -> float:
        """Seconds between reports: ``report_interval`` (Leaf's 3 s), or half the lease if
        that is shorter (so a report is always confirmed well before the deadline)."""
        return min(self.settings.report_interval, self.lease_ns / 2) / 1e9

    @property
    def renew_interval(self) -> float:
        """How often the keeper takes the deadline the reports keep (no network)."""
        return min(1.0, self.report_every / 2)

    @property
    def key(self) -> str:
        """Leaf's ``ip:port``; sibling processes on one port (instance N > 0) get
        ``ip:port.N`` so they never share a sequence node (Leaf itself runs one per port)."""
        return f"{self.ip}:{self.port}" + (f".{self.instance}" if self.instance else "")

    @property
    def forever(self) -> str:
        return f"{self.root}/{self.name}/forever"

    @property
    def live(self) -> str:
        """The ephemeral znode held by the one live process of this identity."""
        return f"{self.root}/{self.name}/live/{self.key}"

    @property
    def lock_path(self) -> Path:
        """The host lock, beside the cache file and named after the identity."""
        return self.cache_path.parent / f"{self.name}.{self.key.replace(':', '_')}.lock"

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "root": self.root, "ip": self.ip, "port": self.port,
                "instance": self.instance, **machine_identity()}

    def now_ms(self) -> int:
        return self.clock.time_ns() // 1_000_000

    def _connect(self) -> ZkConnection:
        return start_held(self, "_conn", lambda: ZkConnection(
            self.hosts, self.settings.session_timeout / 1e9, self.settings.connect_timeout / 1e9))

    def _lock_host(self) -> None:
        """The first thing a start does: refuse if a live process here has our identity
        (whether ZooKeeper answers or not, clean stop or not)."""
        lock = self._host_lock or HostLock(self.lock_path)
        try:
            lock.acquire()
        except HostLockTaken as exc:
            raise WorkerExhaustedError(
                f"{self.generator}: another live process on this host uses identity "
                f"{self.key} ({exc.holder or 'its lock'}: {exc.path}), so it would share "
                "worker id and IDs with it. In leaf mode every process needs its own "
                "ip:port: set FLAKEKIT_PORT (or port = ...), or use mode = \"lease\""
            ) from None
        except OSError as exc:
            raise BackendError(f"{self.generator}: cannot take the host lock "
                               f"{self.lock_path}: {exc}") from None
        self._host_lock = lock

    def _unlock_host(self) -> None:
        if self._host_lock is not None:
            self._host_lock.release()

    def _claim_live(self, conn: ZkConnection) -> str | None:
        """Own ``live/{ip}:{port}`` with this session; the reason if another holds it."""
        session = conn.session_id
        if session is not None and session == self._live_session:
            return None
        data = json.dumps({"host": self.identity()["hostname"], "pid": os.getpid()}).encode()
        try:
            conn.call("create", self.live, data, ephemeral=True, makepath=True)
            made = conn.call("exists", self.live)
            self._zk_now_ms = made.ctime if made is not None else 0
        except NodeExistsError:
            stat = conn.call("exists", self.live)
            if stat is not None and stat.ephemeralOwner != session:
                try:
                    holder = conn.call("get", self.live)[0].decode(errors="replace")
                except NoNodeError:
                    holder = "?"
                return (f"{self.live} is held by ZooKeeper session 0x{stat.ephemeralOwner:x} "
                        f"({holder})")
            if stat is None:   # gone meanwhile: try again at the next report
                raise ConnectionLoss("live node vanished while claiming it") from None
        self._live_session = session
        return None

    def _drop_live(self) -> None:
        conn, self._live_session = self._conn, None
        if conn is None or not conn.connected:
            return
        try:
            stat = conn.call("exists", self.live)
            if stat is not None and stat.ephemeralOwner == conn.session_id:
                conn.call("delete", self.live, version=stat.version)
        except (NoNodeError, *ZK_ERRORS) as exc:
            log.debug("%s: dropping %s: %r", self.generator, self.live, exc)

    # -- acquire -------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        if self.port == 0:   # checked here, not at build: a server builds before it binds
            from flakekit_zookeeper import PORT_0

            raise ConfigError(f"{self.path}.port", PORT_0)
        with self._lock:
            self._lock_host()
            self.lost = None
            try:
                return self._acquire(request)
            except BaseException:
                self._unlock_host()
                raise

    def _acquire(self, request: LeaseRequest) -> WorkerLease:
        cached, why = load_cache(self.cache_path, self.identity())
        if cached is None:
            log.info("%s: %s", self.generator, why)
        try:
            conn = self._connect()
        except BackendError as exc:
            return self._from_cache(request, cached, why, str(exc))
        try:
            lease = self._from_zookeeper(conn, request, cached)
        except ZK_ERRORS as exc:
            if conn.connected:
                self.close()   # nothing is held: no kazoo threads left behind
                raise BackendError(f"ZooKeeper at {self.hosts}: {exc!r}") from None
            self.close()
            return self._from_cache(request, cached, why, f"ZooKeeper connection lost ({exc!r})")
        except BaseException:
            self.close()
            raise
        self._start_reporter()
        return lease

    def _from_zookeeper(self, conn: ZkConnection, request: LeaseRequest,
                        cached: CacheEntry | None) -> WorkerLease:
        taken = self._claim_live(conn)
        if taken is not None:
            raise WorkerExhaustedError(
                f"{self.generator}: another live process uses identity {self.key}: {taken}. "
                "In leaf mode every process needs its own ip:port: set FLAKEKIT_PORT (or "
                "port = ...), or use mode = \"lease\". If that process was killed, its "
                f"node goes within the session timeout "
                f"({self.settings.session_timeout / 1e9:g} s): start again then"
            )
        conn.call("ensure_path", self.forever)
        mine = sorted(seq for child in conn.call("get_children", self.forever)
                      if (parsed := parse_node_name(child)) and parsed[0] == self.key
                      for seq in [parsed[1]])
        now = self.now_ms()
        if mine:
            if len(mine) > 1:
                log.warning("%s: %d znodes for %s under %s; using the lowest, %d",
                            self.generator, len(mine), self.key, self.forever, mine[0])
            seq = mine[0]
            node = f"{self.forever}/{self.key}-{seq:010d}"
            data, stat = conn.call("get", node)
            reported = parse_timestamp(data, node)
            self._node_version = stat.version
            source = f"znode {node}"
            # ZooKeeper's reckoning: the report's time plus what ZooKeeper's clock says
            # has passed since it (the outage a missing cache would have recorded)
            reckoned = reported + max(0, self._zk_now_ms - stat.mtime) if self._zk_now_ms \
                else 0
        else:
            node = conn.call("create", f"{self.forever}/{self.key}-",
                             node_data(self.ip, self.port, now), sequence=True)
            parsed = parse_node_name(node.rsplit("/", 1)[1])
            assert parsed is not None
            seq, reported, source = parsed[1], 0, f"znode {node}"
            self._node_version, reckoned = 0, 0
            log.info("%s: created %s: worker %d", self.generator, node, seq)
        self._check_range(seq, request, node)
        # every time this identity is known to have reached counts for the clock check
        known = [(reported, source)]
        floor, clean = reported, False
        own = cached if cached is not None and cached.worker_id == seq else None
        if cached is not None and own is None:
            log.warning("%s: cache file %s names worker %d but ZooKeeper says %d for "
                        "%s; using ZooKeeper's", self.generator, self.cache_path,
                        cached.worker_id, seq, self.key)
        if own is not None:
            known.append((own.timestamp_ms, f"cache file {self.cache_path}"))
            clean = own.clean and own.timestamp_ms >= reported
            floor = max(floor, own.timestamp_ms, own.issued_until_ms if own.clean else 0)
        else:
            # no own cache: a foreign one's time (or its worker's) still counts, and
            # ZooKeeper's clock tells how long ago the last report was: a process cut off
            # from ZooKeeper may have issued IDs all that time
            other = any_cache_time_ms(self.cache_path)
            known.append((other, f"cache file {self.cache_path} (not this identity's or "
                                 "this worker's, but its time counts)"))
            floor = max(floor, other)
            if reckoned:
                known.append((reckoned - ZK_CLOCK_TOLERANCE_MS, (
                    f"ZooKeeper's clock: {node} was reported "
                    f"{(reckoned - reported) / 1000:.1f} s ago and there is no cache file "
                    "to say the process stopped then; it may have issued IDs since")))
        latest, source = max(known)
        self._check_clock(latest, source, seq)
        self.node, self.worker, self.source = node, seq, "zookeeper"
        self._report_now(force=True)
        return self._lease_for(seq, floor, clean)

    def _from_cache(self, request: LeaseRequest, cached: CacheEntry | None, why: str,
                    error: str) -> WorkerLease:
        if cached is None:
            raise BackendError(
                f"{self.generator}: cannot get a worker id: {error}; and {why}. Leaf mode "
                "starts without ZooKeeper only from this identity's own cache file, "
                "written by an earlier start"
            )
        log.warning("%s: %s; starting from the cache file %s (worker %d)",
                    self.generator, error, self.cache_path, cached.worker_id)
        self._check_range(cached.worker_id, request, cached.node or str(self.cache_path))
        self._check_clock(cached.timestamp_ms, f"cache file {self.cache_path}", cached.worker_id)
        self.node, self.worker, self.source = cached.node or None, cached.worker_id, "cache"
        self.events.alert("zookeeper-unreachable", f"{self.generator}: started worker "
                          f"{cached.worker_id} from the cache file: {error}",
                          {"cache_file": str(self.cache_path), "hosts": self.hosts})
        floor = max(cached.timestamp_ms, cached.issued_until_ms if cached.clean else 0)
        lease = self._lease_for(cached.worker_id, floor, cached.clean)
        now = max(self.now_ms(), self.last_reported_ms)
        self._save(now, clean=False)   # the restart is recorded even without ZooKeeper
        self.last_reported_ms = now
        self._start_reporter()
        return lease

    def _check_range(self, seq: int, request: LeaseRequest, node: str) -> None:
        if seq > request.max_worker_id:
            raise WorkerExhaustedError(
                f"{self.generator}: worker id {seq} (the sequence number of {node}) is "
                f"outside the layout's worker range 0..{request.max_worker_id}; Leaf mode "
                "never recycles ids: use mode = \"lease\", a new name, or delete unused "
                f"nodes under {self.forever}"
            )

    def _check_clock(self, reported_ms: int, source: str, worker: int) -> None:
        behind_ns = (reported_ms - self.now_ms()) * 1_000_000
        if behind_ns > 0:
            self.events.clock_moved_backwards(self.generator, self.clock.name, behind_ns, False)
            raise ClockBehindReportError(self.clock.name, behind_ns, source, worker)

    def _lease_for(self, worker: int, floor_ms: int, clean: bool) -> WorkerLease:
        now = self.now_ms()
        not_before_ms = floor_ms
        if not clean and now - floor_ms < self.settings.report_interval // 1_000_000:
            # a crash within the last report interval: the old process may have issued
            # IDs up to one interval after its last report; wait past that
            not_before_ms = floor_ms + self.settings.report_interval // 1_000_000
        self.last_reported_ms = max(self.last_reported_ms, floor_ms)
        t0 = self.clock.monotonic_ns()
        self._confirmed_ns = self._tick_ns = t0
        self._need_zk = False
        self._lease = WorkerLease(
            worker_id=worker, epoch=1, holder=self.key, ttl=self.lease_ns / 1e9,
            deadline_ns=t0 + self.lease_ns, not_before_ns=not_before_ms * 1_000_000,
            extra={},
        )
        return self._lease

    # -- reporting -------------------------------------------------------------------------
    def _start_reporter(self) -> None:
        self._stop.clear()
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"flakekit-zk-report-{self.generator}")
        self._thread.start()

    def _run(self) -> None:
        wait = self.report_every
        while not self._stop.wait(wait):
            ok = False
            try:
                ok = self.report()
            except Exception:  # keep reporting; report() logs what it can
                log.exception("%s: time report failed", self.generator)
            # after a failure retry sooner: after a pause only ZooKeeper lets IDs resume
            wait = self.report_every if ok else min(self.report_every, 0.5)

    def report(self) -> bool:
        """Report the time now (the loop calls this every ``report_every``); True when
        ZooKeeper got it. The keeper's renewal then moves the deadline on."""
        with self._lock:
            return self._report_now()

    def _report_now(self, force: bool = False) -> bool:
        if self.worker is None or self.lost is not None:
            return False
        t0 = self.clock.monotonic_ns()
        late = bool(self._tick_ns) and t0 - self._tick_ns > 2 * self.report_every * 1e9
        self._tick_ns = t0
        if late and not self._need_zk:
            self._need_zk = True
            log.warning("%s: the time report ran %.1f s late (was the process paused?); "
                        "IDs stop at the lease deadline until ZooKeeper confirms",
                        self.generator, (t0 - self._confirmed_ns) / 1e9)
        ok = self._report(force)
        if ok:
            self._confirmed_ns, self._need_zk = t0, False
        elif not self._need_zk and self.lost is None:
            self._confirmed_ns = t0   # ZooKeeper away, on schedule: Leaf's weak dependency
        return ok

    def _report(self, force: bool) -> bool:
        now = self.now_ms()
        if now < self.last_reported_ms and not force:
            behind = (self.last_reported_ms - now) * 1_000_000
            self.events.clock_moved_backwards(self.generator, self.clock.name, behind, True)
            log.warning("%s: clock is %.3f ms behind the last report; not reporting",
                        self.generator, behind / 1e6)
            return False
        now = max(now, self.last_reported_ms)
        self._save(now, clean=False)
        self.last_reported_ms = now
        try:
            if self.source == "cache" and not self._reconnect():
                return False
            assert self._conn is not None and self.node is not None
            self._set_node(now)
        except LeaseLostError:
            self._stop.set()
            return False
        except _REPORT_ERRORS as exc:
            self.report_failures += 1
            log.warning("%s: could not report the time to ZooKeeper: %r", self.generator, exc)
            return False
        self.reports += 1
        return True

    def _set_node(self, now_ms: int) -> None:
        """Write the time into our znode, never waiting on an outage (ZkConnection.call),
        with a version check: a write by another process with our identity means two
        live processes share this worker id, and this one stops (LeaseLostError)."""
        conn = self._conn
        assert conn is not None and self.node is not None
        taken = self._claim_live(conn)   # again after a lost session (a long outage)
        if taken is not None:
            self._lose(f"another live process uses identity {self.key}: {taken}")
        data = node_data(self.ip, self.port, now_ms)
        self._attempted.add(now_ms)
        try:
            stat = conn.call("set", self.node, data, version=self._node_version)
        except BadVersionError:
            raw, stat = conn.call("get", self.node)
            if parse_timestamp(raw, self.node) not in self._attempted:
                self._lose(f"{self.node} was written by another process (version "
                           f"{stat.version}, ours {self._node_version}): it uses identity "
                           f"{self.key} too")
            stat = conn.call("set", self.node, data, version=stat.version)  # a late write
        self._attempted.clear()
        self._node_version = stat.version

    def _lose(self, reason: str) -> None:
        """Another live process has this identity: stop issuing and reporting."""
        self.lost = f"{self.generator}: worker {self.worker}: {reason}"
        log.error("%s; this process stops issuing IDs", self.lost)
        self.events.alert("zookeeper-leaf-duplicate", self.lost,
                          {"worker_id": self.worker, "identity": self.key})
        if self._watch is not None:
            self._watch("lost", self.lost)
        raise LeaseLostError(self.lost)

    def watch(self, callback: Callable[[str, str], None] | None) -> None:
        """The keeper's push channel: ``callback("lost", reason)`` stops IDs at once."""
        self._watch = callback

    def _reconnect(self) -> bool:
        """Started from the cache: once ZooKeeper answers, find our znode again, and
        check the time it holds. Later than this host's clock means another process with
        our identity reported meanwhile (a clone), or our clock stepped back while
        ZooKeeper was away: either way this worker id may repeat timestamps, so stop."""
        try:
            conn = self._connect()
            mine = sorted(p[1] for c in conn.call("get_children", self.forever)
                          if (p := parse_node_name(c)) and p[0] == self.key)
        except (BackendError, NoNodeError, *ZK_ERRORS) as exc:
            log.info("%s: ZooKeeper still unreachable (%s)", self.generator, exc)
            return False
        if self.worker not in mine:
            self.events.alert(
                "zookeeper-leaf-mismatch",
                f"{self.generator}: running as worker {self.worker} from the cache file, but "
                f"ZooKeeper has {mine or 'no node'} for {self.key} under {self.forever}",
                {"worker_id": self.worker, "zookeeper": mine},
            )
            return False
        node = f"{self.forever}/{self.key}-{self.worker:010d}"
        try:
            raw, stat = conn.call("get", node)
            reported = parse_timestamp(raw, node)
        except (NoNodeError, BackendError, *ZK_ERRORS) as exc:
            log.info("%s: cannot read %s yet (%r)", self.generator, node, exc)
            return False
        now = self.now_ms()
        if reported > now:
            behind_ns = (reported - now) * 1_000_000
            reason = (f"{node} reports {reported} ms, {behind_ns / 1e6:.0f} ms after this "
                      "host's clock: another process with this identity (a cloned host?) "
                      f"used worker {self.worker} meanwhile, or the clock stepped back")
            self.events.clock_moved_backwards(self.generator, self.clock.name, behind_ns, False)
            self.events.alert("zookeeper-leaf-clock", f"{self.generator}: {reason}",
                              {"worker_id": self.worker, "reported_ms": reported, "now_ms": now})
            if self._watch is not None:
                self._watch("lost", reason)
            return False
        self.node, self._node_version = node, stat.version
        self.source = "zookeeper"
        log.info("%s: ZooKeeper is back; reporting to %s", self.generator, self.node)
        return True

    def _save(self, now_ms: int, *, clean: bool, issued_until_ms: int = 0) -> None:
        assert self.worker is not None
        try:
            save_cache(self.cache_path, CacheEntry(
                worker_id=self.worker, identity=self.identity(), timestamp_ms=now_ms,
                node=self.node or "", issued_until_ms=issued_until_ms, clean=clean))
        except OSError as exc:
            log.warning("%s: could not write the cache file %s: %s", self.generator,
                        self.cache_path, exc)

    # -- the WorkerAllocator protocol ------------------------------------------------------
    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        """The deadline the reports keep (no network, no lock: the reporter does the
        talking); LeaseLostError once another process took this identity over."""
        if self.lost is not None:
            raise LeaseLostError(self.lost)
        deadline = self._confirmed_ns + self.lease_ns
        if deadline == lease.deadline_ns:
            return lease
        return attrs.evolve(lease, deadline_ns=deadline)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        """Stop reporting; record a clean stop with the high-water mark (ids are kept)."""
        self._stop_reporter()
        with self._lock:
            if self.worker is None:
                return
            now = max(self.now_ms(), self.last_reported_ms)
            until = -(-issued_until_ns // 1_000_000)
            self._save(now, clean=True, issued_until_ms=until)
            if self.source == "zookeeper" and self._conn is not None and self.node \
                    and self.lost is None:
                try:
                    self._set_node(now)
                except _FINAL_ERRORS as exc:
                    log.warning("%s: final report failed: %r", self.generator, exc)
            self._lease = None
            self._drop_live()
            self._unlock_host()

    def records(self) -> list[WorkerRecord]:
        """Every Leaf node under ``{root}/{name}/forever`` (connects if needed)."""
        try:
            zk = self._connect().client
            children = zk.get_children(self.forever)
        except NoNodeError:
            return []
        except ZK_ERRORS as exc:
            raise BackendError(f"ZooKeeper at {self.hosts}: {exc!r}") from None
        out = []
        now = self.now_ms()
        stale = 3 * self.settings.report_interval // 1_000_000
        for child in children:
            parsed = parse_node_name(child)
            if parsed is None:
                continue
            key, seq = parsed
            node = f"{self.forever}/{child}"
            try:
                data, _ = zk.get(node)
                ts = parse_timestamp(data, node)
            except (NoNodeError, BackendError):
                ts = 0
            seen = dt.datetime.fromtimestamp(ts / 1000, dt.UTC) if ts else None
            out.append(WorkerRecord(
                worker_id=seq, holder=key, epoch=1, last_seen=seen,
                state="reporting" if ts and now - ts <= stale else "silent",
                mine=key == self.key and seq == self.worker,
                extra={"node": node, "mode": "leaf"},
            ))
        return sorted(out, key=lambda r: r.worker_id)

    def _stop_reporter(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._thread = None

    def close(self) -> None:
        self._stop_reporter()
        with self._lock:
            self._live_session = None
            if self._conn is not None:
                self._conn.close()   # the session ends: so does our live/ node
                self._conn = None
            self._unlock_host()

    def stats(self) -> dict[str, Any]:
        return {"source": self.source, "node": self.node, "reports": self.reports,
                "report_failures": self.report_failures,
                "last_reported_ms": self.last_reported_ms}
