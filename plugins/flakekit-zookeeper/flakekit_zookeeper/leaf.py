"""``mode = "leaf"``: Meituan Leaf's Snowflake-mode worker ids, without its flaws.

Znodes (compatible with Leaf's ``SnowflakeZookeeperHolder``)::

    {root}/{name}/forever/{ip}:{port}-{seq:010d}   persistent sequential
        data: {"ip": "10.0.0.7", "port": "8080", "timestamp": 1767225600000}

The worker id is ``seq``; an ip:port keeps its node (and id) forever. What differs
from Leaf:

- a clock behind the last reported time (ZooKeeper's or the cache's) makes start-up
  fail with :class:`ClockBehindReportError`; Leaf catches that and starts anyway;
- the cache file holds the last reported time and the identity it belongs to, so the
  clock check also works when ZooKeeper is down, and a copied file is ignored;
- the cache is used only when ZooKeeper cannot be reached, not on any error;
- a sequence number beyond the layout's worker range is an error naming the node;
- the generator never stamps an ID below the last reported (or released) time.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from kazoo.exceptions import ConnectionLoss, NoNodeError

from flakekit.clock import Clock
from flakekit.errors import BackendError, WorkerExhaustedError
from flakekit.events import Events
from flakekit.lease import LeaseRequest, WorkerLease, WorkerRecord
from flakekit_zookeeper.cache import CacheEntry, load_cache, machine_identity, save_cache
from flakekit_zookeeper.client import ZK_ERRORS, ZkConnection
from flakekit_zookeeper.errors import ClockBehindReportError

__all__ = ["LeafAllocator", "parse_node_name"]

log = logging.getLogger("flakekit.zookeeper")

_NODE = re.compile(r"^(?P<key>.+)-(?P<seq>\d{10})$")


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

    # -- facts ---------------------------------------------------------------------------
    @property
    def renew_interval(self) -> float:
        return self.settings.report_interval / 1e9

    @property
    def key(self) -> str:
        """Leaf's ``ip:port``; sibling processes on one port (instance N > 0) get
        ``ip:port.N`` so they never share a sequence node (Leaf itself runs one per port)."""
        return f"{self.ip}:{self.port}" + (f".{self.instance}" if self.instance else "")

    @property
    def forever(self) -> str:
        return f"{self.root}/{self.name}/forever"

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "root": self.root, "ip": self.ip, "port": self.port,
                "instance": self.instance, **machine_identity()}

    def now_ms(self) -> int:
        return self.clock.time_ns() // 1_000_000

    def _connect(self) -> ZkConnection:
        if self._conn is None:
            self._conn = ZkConnection(self.hosts, self.settings.session_timeout / 1e9,
                                      self.settings.connect_timeout / 1e9)
        try:
            self._conn.start()
        except BackendError:
            self._conn = None  # kazoo closed it; a new one is needed next time
            raise
        return self._conn

    # -- acquire -------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> WorkerLease:
        with self._lock:
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
        zk = conn.client
        zk.ensure_path(self.forever)
        mine = sorted(seq for child in zk.get_children(self.forever)
                      if (parsed := parse_node_name(child)) and parsed[0] == self.key
                      for seq in [parsed[1]])
        now = self.now_ms()
        if mine:
            if len(mine) > 1:
                log.warning("%s: %d znodes for %s under %s; using the lowest, %d",
                            self.generator, len(mine), self.key, self.forever, mine[0])
            seq = mine[0]
            node = f"{self.forever}/{self.key}-{seq:010d}"
            data, _ = zk.get(node)
            reported = parse_timestamp(data, node)
            source = f"znode {node}"
        else:
            node = zk.create(f"{self.forever}/{self.key}-", node_data(self.ip, self.port, now),
                             sequence=True)
            parsed = parse_node_name(node.rsplit("/", 1)[1])
            assert parsed is not None
            seq, reported, source = parsed[1], 0, f"znode {node}"
            log.info("%s: created %s: worker %d", self.generator, node, seq)
        self._check_range(seq, request, node)
        floor, clean = reported, False
        if cached is not None:
            if cached.worker_id == seq:
                if cached.timestamp_ms > floor:
                    floor, source = cached.timestamp_ms, f"cache file {self.cache_path}"
                clean = cached.clean and cached.timestamp_ms >= reported
                floor = max(floor, cached.issued_until_ms if cached.clean else 0)
            else:
                log.warning("%s: cache file %s names worker %d but ZooKeeper says %d for "
                            "%s; using ZooKeeper's", self.generator, self.cache_path,
                            cached.worker_id, seq, self.key)
        self._check_clock(max(reported, cached.timestamp_ms if cached and
                              cached.worker_id == seq else 0), source, seq)
        self._check_not_live(node, seq, reported, now, clean)
        self.node, self.worker, self.source = node, seq, "zookeeper"
        self._report_now(force=True)
        return self._lease_for(seq, floor, clean)

    def _check_not_live(self, node: str, seq: int, reported: int, now: int,
                        clean: bool) -> None:
        """Leaf keys a worker id by ip:port alone. A report younger than two report
        intervals, with no clean stop in this host's cache, means another live process
        uses this identity (a second process on the same port, a cloned host): sharing
        its worker id would repeat its IDs, so refuse."""
        window = 2 * self.settings.report_interval // 1_000_000 + 1_000
        if reported and not clean and now - reported < window:
            raise WorkerExhaustedError(
                f"{self.generator}: {node} (worker {seq}) was reported {now - reported} ms "
                f"ago and this host's cache shows no clean stop: another live process seems "
                f"to use identity {self.key}. In leaf mode every process needs its own "
                "ip:port: set FLAKEKIT_PORT (or port = ...), or use mode = \"lease\". If "
                f"the previous process crashed, start again after {window / 1000:g} s"
            )

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
        self._lease = WorkerLease(
            worker_id=worker, epoch=1, holder=self.key, ttl=None, deadline_ns=None,
            not_before_ns=not_before_ms * 1_000_000,
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
        while not self._stop.wait(self.renew_interval):
            try:
                self.report()
            except Exception:  # keep reporting; report() logs what it can
                log.exception("%s: time report failed", self.generator)

    def report(self) -> bool:
        """Report the time now (the 3 s loop calls this); True when ZooKeeper got it."""
        with self._lock:
            ok = self._report_now()
        if ok and self._lease is not None:
            self.events.lease_renewed(self.generator, self._lease)
        return ok

    def _report_now(self, force: bool = False) -> bool:
        if self.worker is None:
            return False
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
        if self.source == "cache" and not self._reconnect():
            return False
        try:
            assert self._conn is not None and self.node is not None
            self._set_node(now)
        except (AssertionError, *ZK_ERRORS) as exc:
            self.report_failures += 1
            log.warning("%s: could not report the time to ZooKeeper: %r", self.generator, exc)
            return False
        self.reports += 1
        return True

    def _set_node(self, now_ms: int) -> None:
        """Write the time into our znode, never waiting on an outage: kazoo queues a call
        made while disconnected until it reconnects, which would hold the reporter (and
        the lock, and shutdown) for as long as ZooKeeper is away."""
        assert self._conn is not None and self.node is not None
        if not self._conn.connected:
            raise ConnectionLoss(f"ZooKeeper connection is {self._conn.client.state}")
        self._conn.client.set_async(self.node, node_data(self.ip, self.port, now_ms)).get(
            timeout=self.settings.connect_timeout / 1e9)

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
            zk = conn.client
            mine = sorted(p[1] for c in zk.get_children(self.forever)
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
            reported = parse_timestamp(zk.get(node)[0], node)
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
        self.node = node
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
        self.report()
        return lease

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        """Stop reporting; record a clean stop with the high-water mark (ids are kept)."""
        self._stop_reporter()
        with self._lock:
            if self.worker is None:
                return
            now = max(self.now_ms(), self.last_reported_ms)
            until = -(-issued_until_ns // 1_000_000)
            self._save(now, clean=True, issued_until_ms=until)
            if self.source == "zookeeper" and self._conn is not None and self.node:
                try:
                    self._set_node(now)
                except ZK_ERRORS as exc:
                    log.warning("%s: final report failed: %r", self.generator, exc)
            self._lease = None

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
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def stats(self) -> dict[str, Any]:
        return {"source": self.source, "node": self.node, "reports": self.reports,
                "report_failures": self.report_failures,
                "last_reported_ms": self.last_reported_ms}
