"""The marker guard on the real Redis: no marker, a lost marker, a write counter that
went back and a re-seed are refused with one line; ``flakekit redis reseed`` puts every
counter above the floor; ``flakekit redis check`` gives the durability verdict."""

from __future__ import annotations

import textwrap
import time

import pytest
import redis
from flakekit_redis import RedisSettings, RedisStoreSettings
from flakekit_redis.durability import durability
from flakekit_redis.errors import RedisDataLostError
from flakekit_redis.guard import guard_for
from redishelpers import allocator, seed, store

from flakekit.errors import LeaseLostError, UnknownKeyError, WorkerExhaustedError
from flakekit.leases.lease import LeaseRequest
from flakekit.plugin import FieldError
from flakekit.testing.cli import run_cli
from flakekit.testing.configs import assert_field_error
from flakekit.testing.drills import write_config

REQ = LeaseRequest("t", 1023, "", 0)


def first_id(allocation) -> int:
    return allocation.max_id - allocation.step


def _keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match="{" + prefix + "}*"))
    finally:
        client.close()


def _flush(url: str, prefix: str) -> None:
    """What FLUSHDB or a restart without persistence does to the namespace."""
    client = redis.Redis.from_url(url)
    try:
        keys = _keys(url, prefix)
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.mark.parametrize(("table", "field"), [
    ({"url": "http://x"}, "url"),
    ({"url": "redis://127.0.0.1:6379/zero"}, "url"),
    ({"prefix": "a{b"}, "prefix"),
    ({"ttl": "500ms"}, "ttl"),
    ({"ttl": "4s", "safety_window": "2s"}, "safety_window"),
    ({"service": "a/b"}, "service"),
    ({"replicas": -1}, "replicas"),
], ids=["scheme", "db", "prefix", "ttl-floor", "safety", "service", "replicas"])
def test_settings_checks_raise_field_error(table, field):
    assert_field_error(RedisSettings, table, field, starts="")


def test_store_step_is_checked():
    with pytest.raises(FieldError) as info:
        RedisStoreSettings(step=0)
    assert info.value.field == "step"


def test_no_marker_refuses_with_one_line(redis_url, rprefix):
    """A namespace nobody seeded: no worker id, no segment, one line naming the fix;
    nothing is written."""
    alloc = allocator(redis_url, rprefix)
    with pytest.raises(RedisDataLostError) as info:
        alloc.acquire(REQ)
    msg = str(info.value)
    assert "\n" not in msg and "no flakekit marker" in msg
    assert "flakekit redis reseed --floor N" in msg, msg
    with pytest.raises(RedisDataLostError):
        store(redis_url, rprefix, step=10).fetch("k")
    assert _keys(redis_url, rprefix) == []
    alloc.close()


def test_first_use_writes_the_marker_and_a_flush_is_refused(redis_url, rprefix):
    """init = "first-use": the first allocation writes the marker; after the namespace
    is emptied, the live holder's renewal is LeaseLostError naming the loss and the live
    store refuses to fetch again from the start."""
    alloc = allocator(redis_url, rprefix, init="first-use")
    lease = alloc.acquire(REQ)
    segs = store(redis_url, rprefix, init="first-use", step=10)
    first = segs.fetch("k")
    assert first.max_id - first.step == 1
    _flush(redis_url, rprefix)
    with pytest.raises(LeaseLostError) as info:
        alloc.renew(lease, time.time_ns())
    assert "lost flakekit's data" in str(info.value) and "marker" in str(info.value)
    with pytest.raises(RedisDataLostError) as lost:
        segs.fetch("k")
    assert "reseed" in str(lost.value) and "\n" not in str(lost.value)
    assert _keys(redis_url, rprefix) == []   # nothing was counted again
    alloc.close()


def test_a_counter_that_went_back_is_refused(redis_url, rprefix):
    """The marker's write counter below what this process saw (an older snapshot, a
    replica that missed writes): refused, and the key is not advanced."""
    seed(redis_url, rprefix)
    segs = store(redis_url, rprefix, step=10)
    for _ in range(3):
        segs.fetch("k")
    client = redis.Redis.from_url(redis_url)
    marker = "{" + rprefix + "}/marker"
    client.hset(marker, "seq", 1)
    client.hset("{" + rprefix + "}/segments/k", "max_id", 11)   # the old value
    with pytest.raises(RedisDataLostError) as info:
        segs.fetch("k")
    assert "went back" in str(info.value)
    assert int(client.hget("{" + rprefix + "}/segments/k", "max_id")) == 11
    client.close()


def test_a_vanished_key_is_refused_not_created_again(redis_url, rprefix):
    seed(redis_url, rprefix)
    segs = store(redis_url, rprefix, step=10)
    segs.fetch("k")
    redis.Redis.from_url(redis_url).delete("{" + rprefix + "}/segments/k")
    with pytest.raises(RedisDataLostError) as info:
        segs.fetch("k")
    assert "is gone" in str(info.value)


def test_unknown_key_without_step(redis_url, rprefix):
    seed(redis_url, rprefix)
    with pytest.raises(UnknownKeyError):
        store(redis_url, rprefix).fetch("nope")


def test_reseed_continues_above_the_floor_and_stops_old_processes(redis_url, rprefix,
                                                                  capsys):
    """After a loss, `flakekit redis reseed --floor N`: keys old and new continue above
    N; a process that saw the old marker stops (RESEEDED); worker ids wait out the hold."""
    seed(redis_url, rprefix)
    old = store(redis_url, rprefix, step=10)
    old.fetch("a")
    _flush(redis_url, rprefix)
    code, out, err = run_cli(capsys, "redis", "reseed", "--url", redis_url, "--prefix",
                             rprefix, "--floor", "5000", "--hold", "30s", "--yes")
    assert code == 0, err
    assert "floor 5000" in out and "held for 30 s" in out, out
    # the guard is the process's: a "new process" is a guard that forgot what it saw
    guard = guard_for(redis_url, rprefix, 5.0)
    guard.marker_id, guard.seq = "", 0
    fresh = store(redis_url, rprefix, step=10)
    assert first_id(fresh.fetch("a")) >= 5000
    assert first_id(fresh.fetch("b")) >= 5000
    with pytest.raises(WorkerExhaustedError) as held:
        allocator(redis_url, rprefix).acquire(REQ)
    assert "re-seeded" in str(held.value) and "\n" not in str(held.value)
    # an old process (it remembers the marker it started with) is told, not served
    guard.marker_id = "0123456789abcdef"
    with pytest.raises(RedisDataLostError) as info:
        old.fetch("a")
    assert "re-seeded" in str(info.value)


def test_reseed_raises_existing_keys(redis_url, rprefix, capsys):
    seed(redis_url, rprefix)
    segs = store(redis_url, rprefix)
    segs.create("k", 10)
    code, out, err = run_cli(capsys, "redis", "reseed", "--url", redis_url, "--prefix",
                             rprefix, "--floor", "700", "--hold", "0s", "--yes")
    assert code == 0 and "1 segment keys raised" in out, (out, err)
    guard_for(redis_url, rprefix, 5.0).marker_id = ""
    assert first_id(store(redis_url, rprefix).fetch("k")) == 700


def test_check_gives_one_line_per_namespace(redis_url, rprefix, capsys):
    """This machine's Redis keeps nothing on disk: the verdict says so, and names the
    marker (missing first, then the seeded one)."""
    code, out, err = run_cli(capsys, "redis", "check", "--url", redis_url, "--prefix", rprefix)
    assert code == 0, err
    line = out.strip()
    assert "\n" not in line and f"prefix '{rprefix}'" in line
    assert "no marker" in line
    seed(redis_url, rprefix)
    verdict = durability(guard_for(redis_url, rprefix, 5.0))
    assert verdict.level in ("unsafe", "at risk", "durable")
    assert "marker" in verdict.line and verdict.facts["marker"]


def _two_generators(tmp_path, url: str, prefix: str, step: int):
    """A config with a snowflake (redis allocator) and a segment (redis store) generator."""
    cfg = tmp_path / "flakekit.toml"
    cfg.write_text(textwrap.dedent(f"""
        [generators.orders]
        strategy = "snowflake"
        allocator = {{ type = "redis", url = "{url}", prefix = "{prefix}" }}

        [generators.invoices]
        strategy = "segment"
        store = {{ type = "redis", url = "{url}", prefix = "{prefix}", step = {step} }}
    """))
    return cfg


def test_check_from_the_config(redis_url, rprefix, tmp_path, capsys):
    cfg = _two_generators(tmp_path, redis_url, rprefix, 100)
    code, out, err = run_cli(capsys, "redis", "check", "--config", str(cfg))
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1 and rprefix in out
    code, out, err = run_cli(capsys, "redis", "reseed", "--config", str(cfg), "--floor", "0",
                             "--yes")
    assert code == 0 and "held for 40 s" in out, (out, err)


def test_cli_errors_are_one_line(tmp_path, capsys, redis_url):
    cfg = tmp_path / "flakekit.toml"
    cfg.write_text(textwrap.dedent("""
        [generators.orders]
        strategy = "snowflake"
        allocator = { type = "redis", ttl = "10ms" }
    """))
    code, _, err = run_cli(capsys, "redis", "check", "--config", str(cfg))
    assert code == 2 and "\n" not in err.strip() and "allocator.ttl" in err, err
    code, _, err = run_cli(capsys, "redis", "check", "--url", "redis://127.0.0.1:1/0")
    assert code == 1 and "\n" not in err.strip() and "did not answer" in err, err


def test_a_used_up_key_is_refused_and_not_moved(redis_url, rprefix):
    """max_id + step past 2^63 - 1 (the BIGINT bound): SegmentRowError, max_id unchanged."""
    from flakekit.errors import SegmentRowError

    seed(redis_url, rprefix)
    segs = store(redis_url, rprefix)
    segs.create("k", 10)
    client = redis.Redis.from_url(redis_url)
    top = str(2**63 - 5)
    client.hset("{" + rprefix + "}/segments/k", "max_id", top)
    with pytest.raises(SegmentRowError) as info:
        segs.fetch("k")
    assert "used up" in str(info.value)
    assert client.hget("{" + rprefix + "}/segments/k", "max_id").decode() == top
    client.close()


def test_a_write_wait_could_not_confirm_is_not_used(redis_url, rprefix):
    """replicas = 1 on a Redis without replicas: WAIT times out, the fetch fails with one
    line and its range is dropped (the next fetch starts after it, never inside)."""
    from flakekit.errors import BackendError

    seed(redis_url, rprefix)
    waiting = store(redis_url, rprefix, step=10, replicas=1, wait_timeout="50ms")
    with pytest.raises(BackendError) as info:
        waiting.fetch("k")
    assert "only 0 of 1 replicas confirmed" in str(info.value)
    assert "\n" not in str(info.value)
    assert first_id(store(redis_url, rprefix, step=10).fetch("k")) == 11
    assert "too few" in durability(waiting.guard).line


def test_workers_lists_a_redis_lease(redis_url, rprefix, tmp_path, capsys):
    seed(redis_url, rprefix)
    cfg = write_config(tmp_path, "orders",
                       f'{{ type = "redis", url = "{redis_url}", prefix = "{rprefix}" }}')
    holder = allocator(redis_url, rprefix, service="orders")
    lease = holder.acquire(REQ)
    code, out, err = run_cli(capsys, "workers", "--config", str(cfg), "--json")
    assert code == 0, err
    assert f'"worker_id": {lease.worker_id}' in out and '"state": "held"' in out, out
    holder.close()


def test_a_redis_that_evicts_keys_is_refused(throwaway_redis):
    """maxmemory with an eviction policy could drop the marker, a counter or a session:
    nothing is allocated, one line names the settings to change; the verdict is unsafe."""
    from flakekit.errors import BackendError

    url = throwaway_redis.url
    seed(url, "ev")
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory", "100mb")
    client.config_set("maxmemory-policy", "volatile-lru")
    segs = store(url, "ev", step=10)
    with pytest.raises(BackendError) as info:
        segs.fetch("k")
    assert "maxmemory-policy volatile-lru" in str(info.value) and "noeviction" in str(info.value)
    assert durability(segs.guard).level == "unsafe"
    client.config_set("maxmemory-policy", "noeviction")
    assert first_id(segs.fetch("k")) == 1
    client.close()


def test_generators_from_a_config(redis_url, rprefix, tmp_path):
    """A segment generator and a snowflake generator built from a config, on Redis: IDs
    unique and increasing; closing gives the segment's tail back."""
    import flakekit

    seed(redis_url, rprefix)
    kit = flakekit.load(_two_generators(tmp_path, redis_url, rprefix, 10))
    with kit:
        invoices = [kit["invoices"].next_id() for _ in range(35)]
        orders = [kit["orders"].next_id() for _ in range(100)]
    assert invoices == sorted(set(invoices)) and invoices[0] == 1
    assert orders == sorted(set(orders))
