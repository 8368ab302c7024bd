"""Issue 10 item 3: leaf mode's clock check cannot be skipped.

A process is cut off from ZooKeeper (its time goes to the cache file only), dies without
a clean stop, and the next start has a clock 5 s behind the last time it reached. Its
cache file is missing, or ignored because the host name changed (a re-created
container): the znode alone is stale. The start must refuse: a foreign cache's time
counts, and without a cache ZooKeeper's own clock says how long ago the last report was.
Clocks are injected (ManualClock); ZooKeeper's clock is real, so the outage is real time.
"""

from __future__ import annotations

import json
import time

import pytest
from flakekit_zookeeper.errors import ClockBehindReportError
from zkhelpers import allocator

from flakekit.testing import EventRecorder, ManualClock, TcpProxy
from flakekit.testing.requests import lease_request as req
from flakekit.values.events import Events

pytestmark = pytest.mark.slow

OUTAGE_S = 9   # real seconds cut off (more than the session, so its live/ node is gone)


def leaf(ns, tmp_path, **kw):
    return allocator(ns, mode="leaf", cache_dir=str(tmp_path / "cache"),
                     session_timeout="4s", report_interval="1s", **kw)


def _cut_off_then_killed(ns, tmp_path, zk_hosts) -> tuple[object, int]:
    """Worker 0 reports once, is cut off for OUTAGE_S (reporting to its cache only),
    then dies without a clean stop. Returns (its cache path, the last time it reached)."""
    proxy = TcpProxy.in_front_of(zk_hosts)
    clock = ManualClock(wall_ns=time.time_ns())
    a = leaf(ns, tmp_path, clock=clock, hosts=f"127.0.0.1:{proxy.port}")
    a.acquire(req())
    a._stop_reporter()           # the test reports by hand, in step with its clock
    proxy.cut()
    for _ in range(OUTAGE_S):
        time.sleep(1.0)
        clock.advance(1.0)
        assert not a.report()    # ZooKeeper unreachable: the cache file only
    last = json.loads(a.cache_path.read_text())["timestamp"]
    assert last == clock.time_ns() // 1_000_000
    getattr(a, "_unlock_host", lambda: None)()   # kill -9: the kernel drops the lock ...
    a.close()                    # ... and the session is gone (it expired while cut off)
    proxy.stop()
    return a.cache_path, last


def test_restart_behind_the_last_time_refuses_without_the_cache(tmp_path, zk_hosts, ns):
    """The cache file is foreign (another host name), then missing: both starts with the
    clock 5 s behind the process's last time refuse; with the clock right, it starts."""
    cache, last = _cut_off_then_killed(ns, tmp_path, zk_hosts)
    raw = json.loads(cache.read_text())
    raw["identity"]["hostname"] = "re-created-container"   # the host name changed
    cache.write_text(json.dumps(raw))
    behind = ManualClock(wall_ns=(last - 5_000) * 1_000_000)
    rec = EventRecorder()
    b = leaf(ns, tmp_path, clock=behind, events=Events(rec))
    with pytest.raises(ClockBehindReportError, match=r"5000\.000 ms behind .*not this "
                       "identity's"):
        b.acquire(req())
    b.close()
    assert "flakekit_clock_moved_backwards" in rec.names()

    cache.unlink()                                          # the cache file is missing
    c = leaf(ns, tmp_path, clock=behind)
    with pytest.raises(ClockBehindReportError, match="ZooKeeper's clock: .* reported") as info:
        c.acquire(req())
    c.close()
    print(f"\nclock 5 s behind, no cache: refused: {info.value}")

    right = ManualClock(wall_ns=(last + 1_000) * 1_000_000)   # NTP fixed it
    d = leaf(ns, tmp_path, clock=right)
    lease = d.acquire(req())
    assert lease.worker_id == 0
    d.release(lease, right.time_ns())
    d.close()


def test_a_foreign_cache_time_never_loosens_the_check(tmp_path, zk, ns):
    """A foreign cache file older than the znode changes nothing: the start goes ahead
    (only a later time can make start-up stricter)."""
    clock = ManualClock(wall_ns=time.time_ns())
    a = leaf(ns, tmp_path, clock=clock)
    a.release(a.acquire(req()), clock.time_ns())
    a.close()
    raw = json.loads(a.cache_path.read_text())
    raw["identity"]["hostname"] = "elsewhere"
    raw["timestamp"] = raw["timestamp"] - 60_000
    raw["issued_until"] = 0
    a.cache_path.write_text(json.dumps(raw))
    clock.advance(1.0)
    b = leaf(ns, tmp_path, clock=clock)
    assert b.acquire(req()).worker_id == 0
    b.close()
