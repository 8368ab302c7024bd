"""Fault drills against real Redis servers: kill -9 of a holder, and a restart that
loses every key (SHUTDOWN NOSAVE on a throw-away ``redis-server``).

Assertions are about safety (no duplicate ID, no second holder before the first one's
deadline, a clear refusal instead of counting again from zero), never about speed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from flakekit_redis.errors import RedisDataLostError
from redishelpers import RedisServer, seed, store

import flakekit
from flakekit.errors import FlakekitError
from flakekit.testing.drills import parse_ids, read_until, spawn, write_config

pytestmark = pytest.mark.slow

def _config(tmp: Path, url: str, prefix: str) -> Path:
    """``tmp/orders.toml``: generator ``orders`` on the tiny layout and a redis allocator."""
    return write_config(tmp, "orders", f'{{ type = "redis", url = "{url}", prefix = '
                        f'"{prefix}", ttl = "2s", quarantine = "0s" }}', layout="tiny")


def _first(proc: subprocess.Popen[str], tag: str, timeout: float = 30,
           seen: list[str] | None = None) -> list[str]:
    """The fields of the worker's first ``tag`` line (it prints one line per event);
    the lines read on the way are added to ``seen``."""
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    for line in iter(proc.stdout.readline, ""):
        if seen is not None:
            seen.append(line)
        if line.startswith(tag + " "):
            return line.split()
        if time.monotonic() > end:
            break
    raise AssertionError(f"no {tag} line; stderr: "
                         f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")


def _ids(text: str) -> list[int]:
    return [i for i, _ in parse_ids(text)]


def _deadlines(text: str) -> list[int]:
    return [int(line.split()[2]) for line in text.splitlines() if line.startswith("RENEW ")]


def test_kill_9_of_a_holder_no_second_holder_before_its_deadline(tmp_path, redis_url,
                                                                 rprefix):
    """A holder killed with SIGKILL keeps its id until its lease could have ended: the
    next process gets the same id only after the dead one's last deadline, with a later
    epoch, and its IDs are above the dead one's."""
    seed(redis_url, rprefix)
    cfg = _config(tmp_path, redis_url, rprefix)
    kit = flakekit.load(cfg)
    other = kit.get("orders")
    other.start()          # holds worker 0: the two processes must share worker 1
    try:
        a = spawn(cfg, "orders", "--tolerate")
        a_lease = read_until(a, "LEASE ").split()
        assert a_lease[1] == "1"
        time.sleep(1.0)    # a few renewals
        a.kill()
        a_out = a.communicate(timeout=30)[0]
        b = spawn(cfg, "orders", "--retry-exhausted", "--seconds", "0.5")
        b_out = b.communicate(timeout=60)[0]
    finally:
        kit.close()
    b_lease = next(x for x in b_out.splitlines() if x.startswith("LEASE ")).split()
    assert b_lease[1] == "1" and int(b_lease[2]) > int(a_lease[2])   # same id, later epoch
    a_deadline = max([int(a_lease[5]), *_deadlines(a_out)])
    assert int(b_lease[3]) > a_deadline      # never two holders inside a valid lease
    a_ids, b_ids = _ids(a_out), _ids(b_out)
    assert a_ids and b_ids and min(b_ids) > max(a_ids)
    print(f"\nkill -9 drill: worker 1 taken again {(int(b_lease[3]) - a_deadline) / 1e6:.0f} ms "
          f"after the dead holder's deadline; {len(a_ids)} + {len(b_ids)} IDs, no duplicate")


def test_restart_without_data_is_refused_until_reseeded(tmp_path, throwaway_redis):
    """SHUTDOWN NOSAVE and a restart: the running generator stops with the refusal, a
    store that fetched before refuses, a process started afterwards refuses with one
    line; after `flakekit redis reseed` everything continues with no duplicate."""
    url, prefix = throwaway_redis.url, "drill"
    seed(url, prefix)
    cfg = _config(tmp_path, url, prefix)
    segs = store(url, prefix, step=100)
    fetched = [segs.fetch("invoices") for _ in range(3)]
    a = spawn(cfg, "orders", "--tolerate")
    seen: list[str] = []
    _first(a, "LEASE", seen=seen)
    time.sleep(0.5)
    throwaway_redis.restart_without_data()
    err = _first(a, "ERR", timeout=30, seen=seen)   # by the lease's deadline at the latest
    a.terminate()
    a_out = "".join(seen) + a.communicate(timeout=30)[0]
    assert "lost flakekit's data" in " ".join(err), err
    with pytest.raises(RedisDataLostError) as lost:
        segs.fetch("invoices")
    assert "lost flakekit's data" in str(lost.value)
    assert "restarted or was replaced" in str(lost.value)
    fresh = subprocess.run([sys.executable, "-m", "flakekit.cli", "next", "orders", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 1, fresh
    line = fresh.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "no flakekit marker" in line and "flakekit redis reseed" in line, line
    # the operator re-seeds above every ID stored (here: the ranges fetched)
    floor = fetched[-1].max_id
    done = subprocess.run([sys.executable, "-m", "flakekit.cli", "redis", "reseed", "-c", str(cfg),
                           "--floor", str(floor), "--hold", "2500ms", "--yes"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    segs2 = store(url, prefix, step=100)
    segs2.guard.marker_id, segs2.guard.seq = "", 0   # as a process started now
    after = segs2.fetch("invoices")
    assert after.max_id - after.step >= floor
    c = spawn(cfg, "orders", "--retry-exhausted", "--seconds", "0.5")
    c_out, c_err = c.communicate(timeout=60)
    assert c.returncode == 0, c_err[-2000:]
    ids = _ids(a_out) + _ids(c_out)
    assert _ids(a_out) and _ids(c_out) and len(ids) == len(set(ids))
    print(f"\nrestart drill: the generator refused ({' '.join(err[4:])}); a new process refused; "
          f"after reseed --floor {floor} the store went on at {after.max_id - after.step}; "
          f"{len(ids)} IDs, no duplicate")
    assert isinstance(lost.value, FlakekitError)


def test_a_promoted_replica_that_missed_writes_is_refused(tmp_path, throwaway_redis):
    """A replica promoted before it got the last fetches, the address moved to it (a
    proxy, as a VIP or DNS would): the next fetch is refused (the marker's counter went
    back), never a range the old primary handed out."""
    import redis

    from flakekit.testing import TcpProxy

    primary = throwaway_redis
    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1", str(primary.port))
    (tmp_path / "replica").mkdir()
    replica.start()
    to_replica = redis.Redis.from_url(replica.url)
    end = time.monotonic() + 30
    while to_replica.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < end, "the replica did not sync"
        time.sleep(0.05)
    proxy = TcpProxy(primary.port).start()
    try:
        url = f"redis://{proxy.address}/0"
        seed(url, "fo")
        segs = store(url, "fo", step=100)
        before = [segs.fetch("k") for _ in range(2)]
        to_primary = redis.Redis.from_url(primary.url)
        assert to_primary.wait(1, 2000) == 1           # the replica has these
        to_replica.replicaof("NO", "ONE")              # promoted now
        missed = [segs.fetch("k") for _ in range(2)]    # the replica never sees these
        proxy.cut()
        proxy.target_port = replica.port               # the address follows the promotion
        proxy.restore()
        with pytest.raises(RedisDataLostError) as info:
            segs.fetch("k")
        assert "went back" in str(info.value), info.value
        assert "failed over to a replica" in str(info.value), info.value
        got = before + missed
        starts = [a.max_id - a.step for a in got]
        assert len(set(starts)) == len(starts)
        print(f"\nfail-over drill: refused after the promotion: {info.value}")
    finally:
        proxy.stop()
        replica.stop()
