"""``workers = N``: one generator, several leased worker ids (issue 15 item 1).

Within a tick the ids are used in numeric order, so IDs strictly increase across ids and
ticks; a lost id is dropped for good while the others go on; the generator refuses only
when none is left; batches span ids; every id is checked after the draw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest
from sqlalchemy import create_engine, text

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.builtin.layouts import SNOWFLAKE, SONYFLAKE
from flakekit.builtin.static import StaticAllocator, StaticSettings, parse_worker_ids
from flakekit.errors import (
    ConfigError,
    LeaseExpiredError,
    LeaseLostError,
    NotStartedError,
    WorkerExhaustedError,
)
from flakekit.generators.snowflake import SnowflakeGenerator
from flakekit.leases.lease import LeaseRequest, WorkerLease
from flakekit.pluginhost.markers import hookimpl
from flakekit.sql.workers import SqlWorkerAllocator
from flakekit.testing import ManualClock, in_threads
from flakekit.testing.refusals import assert_issues_nothing
from flakekit.values.layout import BitLayout

MS = 1_000_000
S = 1_000_000_000


def static(ids: object) -> StaticAllocator:
    return StaticAllocator(StaticSettings(worker_id=ids))


def gen_of(layout: BitLayout, ids: object, clock: ManualClock | None = None,
           **kw: object) -> tuple[SnowflakeGenerator, ManualClock]:
    clock = clock or ManualClock()
    alloc = static(ids)
    n = len(parse_worker_ids(ids, "worker_id"))
    return SnowflakeGenerator(layout, clock, alloc, workers=n,
                              **kw).start(), clock  # type: ignore[arg-type]


def increasing(ids: list[int]) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def workers_of(layout: BitLayout, ids: list[int]) -> list[int]:
    return [layout.decompose(i)[layout.worker_field] for i in ids]  # type: ignore[index]


@attrs.define
class Leases:
    """An allocator of expiring leases whose renewals the test controls: ``lose`` holds
    the ids whose next renewal says "someone else has it"."""

    clock: ManualClock
    ids: list[int]
    ttl_ns: int = 1_000 * MS
    renew_interval: float | None = 3600.0  # the test renews by hand
    several_leases = True
    held: set[int] = attrs.Factory(set)
    lose: set[int] = attrs.Factory(set)
    released: list[int] = attrs.Factory(list)
    acquired: list[int] = attrs.Factory(list)
    instances: list[int] = attrs.Factory(list)

    def acquire(self, request: LeaseRequest) -> WorkerLease:
        free = [i for i in self.ids if i not in self.held and i not in self.lose]
        if not free:
            raise WorkerExhaustedError("no id left")
        self.held.add(free[0])
        self.acquired.append(free[0])
        self.instances.append(request.instance)
        return WorkerLease(free[0], 1, "t", 1.0, self.clock.monotonic_ns() + self.ttl_ns)

    def renew(self, lease: WorkerLease, issued_until_ns: int) -> WorkerLease:
        if lease.worker_id in self.lose:
            self.held.discard(lease.worker_id)
            raise LeaseLostError(f"worker {lease.worker_id} is someone else's now")
        return attrs.evolve(lease, deadline_ns=self.clock.monotonic_ns() + self.ttl_ns)

    def release(self, lease: WorkerLease, issued_until_ns: int) -> None:
        self.held.discard(lease.worker_id)
        self.released.append(lease.worker_id)

    def records(self) -> list[object]:
        return []

    def close(self) -> None:
        pass


def keeper_of(gen: SnowflakeGenerator, worker: int):  # test helper
    return next(k for k in gen.keepers if k.lease is not None and k.lease.worker_id == worker)


class TestOrder:
    @pytest.mark.parametrize(("layout", "ids"), [
        (SNOWFLAKE, "3-4"),          # worker above the sequence: one id's sequence, then the next
        (SONYFLAKE, [0, 1, 5]),      # worker below it: one sequence value across the ids
        (SONYFLAKE, "0-63"),
    ])
    def test_strictly_increasing_across_ids_and_ticks(self, layout, ids):
        """Several ticks' worth (the manual clock moves when a tick is used up): every
        ID is larger than the one before, and each tick uses every id, in numeric order
        where the worker field is the higher one."""
        gen, clock = gen_of(layout, ids)
        wanted = parse_worker_ids(ids, "w")
        per_tick = layout.sequence_size * len(wanted)
        got = [gen.next_id() for _ in range(per_tick * 3 + 17)]
        assert increasing(got)
        ticks: dict[int, list[int]] = {}
        for i in got:
            ticks.setdefault(layout.decompose(i)["time"], []).append(i)
        full = [v for v in ticks.values() if len(v) == per_tick]
        assert len(full) >= 2  # whole ticks: every (id, sequence) pair once
        for tick_ids in full:
            assert sorted(set(workers_of(layout, tick_ids))) == list(wanted)
            if layout is SNOWFLAKE:
                assert workers_of(layout, tick_ids) == sorted(workers_of(layout, tick_ids))
        assert gen.worker_ids == wanted
        gen.close()

    def test_decode_shows_the_ids_used(self):
        gen, _ = gen_of(SNOWFLAKE, [2, 7])
        got = [gen.next_id() for _ in range(2 * 4096)]
        parts = [SNOWFLAKE.decompose(i) for i in got]
        assert {p["worker"] for p in parts} == {2, 7}
        assert [p["sequence"] for p in parts[:4096]] == list(range(4096))
        assert parts[0]["worker"] == 2 and parts[4096]["worker"] == 7
        assert repr(gen).endswith("workers=[2, 7]>")
        gen.close()

    def test_batches_span_ids(self):
        """A batch takes the rest of one id's sequence, then the next id's; single IDs
        go on after it, never inside it."""
        gen, _ = gen_of(SNOWFLAKE, [1, 2, 3])
        head = [gen.next_id() for _ in range(100)]
        batch = gen.next_ids(4096 * 2)
        flat = [i for r in batch.ranges for i in r]
        assert len(flat) == 4096 * 2 and increasing(head + flat)
        assert set(workers_of(SNOWFLAKE, flat)) == {1, 2, 3}
        tail = [gen.next_id() for _ in range(5000)]
        assert increasing(head + flat + tail)
        big = [i for r in gen.next_ids(100_000).ranges for i in r]
        assert increasing(tail + big) and len(big) == 100_000
        gen.close()

    def test_batches_span_ids_sonyflake(self):
        gen, _ = gen_of(SONYFLAKE, "0-3")
        head = [gen.next_id() for _ in range(3)]
        flat = [i for r in gen.next_ids(3000).ranges for i in r]
        tail = [gen.next_id() for _ in range(10)]
        assert increasing(head + flat + tail) and len(flat) == 3000
        gen.close()

    def test_threads_never_share_an_id(self):
        gen = SnowflakeGenerator(SONYFLAKE, ManualClock(), static("0-7"), workers=8).start()
        results = in_threads(lambda i: [gen.next_id() for _ in range(3000)], 4)
        flat = [i for chunk in results for i in chunk]
        assert len(set(flat)) == len(flat)
        assert all(increasing(chunk) for chunk in results)
        gen.close()

    def test_one_id_is_the_old_path(self):
        """workers = 1 builds the untouched one-id hot path (no per-run objects)."""
        gen, _ = gen_of(SNOWFLAKE, 5)
        assert gen.workers == 1 and gen.worker_ids == (5,)
        assert type(gen._current()[0]).__name__ == "Tick"
        gen.close()


class TestLosingIds:
    def make(self, ids: list[int], clock: ManualClock | None = None):
        clock = clock or ManualClock()
        alloc = Leases(clock, ids)
        gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc, workers=len(ids)).start()
        return gen, alloc, clock

    def test_one_lost_the_others_go_on_and_it_never_comes_back(self):
        gen, alloc, clock = self.make([1, 2, 3])
        before = [gen.next_id() for _ in range(100)]   # in the middle of worker 1's run
        alloc.lose.add(1)
        assert keeper_of(gen, 1).renew_once() is False   # lost: revoked at once
        after = [gen.next_id() for _ in range(4096 * 6)]
        assert increasing(before + after)
        assert 1 not in workers_of(SNOWFLAKE, after)
        assert set(workers_of(SNOWFLAKE, after)) == {2, 3}
        assert gen.worker_ids == (2, 3)
        for _ in range(3):   # renewals of the others go on; 1 stays gone
            clock.advance(0.5)
            for k in gen.keepers:
                k.renew_once()
        later = [i for r in gen.next_ids(20_000).ranges for i in r]
        assert 1 not in workers_of(SNOWFLAKE, later)
        gen.close()

    def test_a_lost_id_inside_a_sonyflake_run(self):
        """Sonyflake runs span ids: losing one closes the run at once."""
        clock = ManualClock()
        alloc = Leases(clock, [0, 1, 2, 3])
        gen = SnowflakeGenerator(SONYFLAKE, clock, alloc, workers=4).start()
        before = [gen.next_id() for _ in range(2)]   # worker 0 and 1 of sequence 0
        alloc.lose.add(2)
        keeper_of(gen, 2).renew_once()
        after = [gen.next_id() for _ in range(3 * 256 * 2)]
        assert increasing(before + after)
        assert 2 not in workers_of(SONYFLAKE, after)
        gen.close()

    def test_all_lost_refuses(self):
        gen, alloc, _ = self.make([4, 5])
        gen.next_id()
        alloc.lose.update({4, 5})
        for k in list(gen.keepers):
            k.renew_once()
        assert_issues_nothing(gen, LeaseLostError, 3, match=r"^default: all 2 worker ids are lost")
        gen.close()

    def test_an_expired_id_is_skipped_and_comes_back_on_renewal(self):
        """The check after the draw is per id: an id whose deadline passed issues
        nothing (the others do), and resumes once its lease is renewed."""
        gen, alloc, clock = self.make([1, 2])
        gen.next_id()
        clock.advance(0.9)
        keeper_of(gen, 2).renew_once()   # 2 renewed; 1 not
        clock.advance(0.2)               # 1 is past its deadline
        got = [gen.next_id() for _ in range(4096 * 3)]
        assert set(workers_of(SNOWFLAKE, got)) == {2}
        keeper_of(gen, 1).renew_once()
        more = [gen.next_id() for _ in range(4096 * 4)]
        assert increasing(got + more)
        assert set(workers_of(SNOWFLAKE, more)) == {1, 2}
        clock.advance(2.0)               # both past their deadline
        with pytest.raises(LeaseExpiredError, match="expired"):
            gen.next_id()
        gen.close()

    def test_a_batch_refuses_when_its_ids_expire_during_it(self):
        """A batch that waits past the deadlines of its ids (each tick takes 2 s here)
        is refused whole: no range of it is handed out."""

        @attrs.define
        class SlowTicks(ManualClock):
            def sleep(self, seconds: float) -> None:
                self.advance(2.0)

        gen, alloc, clock = self.make([1, 2], SlowTicks())
        gen.next_id()
        with pytest.raises(LeaseExpiredError):
            gen.next_ids(4096 * 3)
        gen.close()

    def test_close_releases_every_id_and_refuses(self):
        gen, alloc, _ = self.make([1, 2, 3])
        gen.next_id()
        gen.close()
        assert sorted(alloc.released) == [1, 2, 3]
        with pytest.raises(NotStartedError):
            gen.next_id()

    def test_each_id_asks_as_its_own_instance(self):
        """Id k of process instance p asks as instance p * N + k: siblings never ask for
        the same slot, and k = 0 of instance 0 keeps the clone check of the one-id case."""
        clock = ManualClock()
        alloc = Leases(clock, list(range(10)))
        gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc, workers=3, instance=2).start()
        assert alloc.instances == [6, 7, 8]
        gen.close()

    def test_an_allocator_that_holds_one_lease_needs_a_list(self):
        @attrs.define
        class One:
            renew_interval = None

            def acquire(self, request: LeaseRequest) -> WorkerLease:
                return WorkerLease(1)

        with pytest.raises(ValueError, match="holds one lease at a time; pass a list"):
            SnowflakeGenerator(SNOWFLAKE, ManualClock(), One(), workers=2)  # type: ignore[arg-type]

    def test_an_allocator_handing_out_one_id_twice_is_refused(self):
        clock = ManualClock()

        @attrs.define
        class Same(Leases):
            def acquire(self, request: LeaseRequest) -> WorkerLease:
                return WorkerLease(1, 1, "t", 1.0, self.clock.monotonic_ns() + S)

        gen = SnowflakeGenerator(SNOWFLAKE, clock, Same(clock, [1]), workers=2)
        with pytest.raises(WorkerExhaustedError, match="handed out worker 1 twice"):
            gen.start()

    def test_bad_workers(self):
        for bad in (0, -1, True, "2", 1025):
            with pytest.raises(ValueError, match="workers must be a whole number from 1 to 1024"):
                SnowflakeGenerator(SNOWFLAKE, ManualClock(), static("0-1"),
                                   workers=bad)  # type: ignore[arg-type]


class TestStatic:
    def test_forms(self):
        assert parse_worker_ids(7, "w") == (7,)
        assert parse_worker_ids("7", "w") == (7,)
        assert parse_worker_ids(" 0 - 3 ", "w") == (0, 1, 2, 3)
        assert parse_worker_ids([5, 0, 1], "w") == (0, 1, 5)

    @pytest.mark.parametrize(("value", "message"), [
        ("9-3", r"range '9-3' runs backwards; write \"3-9\""),
        ("a-b", "expected an integer"),
        ([], "the list is empty"),
        ([1, 1], "worker id 1 is listed twice"),
        ([1, "x"], "list item 'x' is not a whole number"),
        (True, "expected an integer"),
        (-2, "worker id -2 is negative"),
        (1.5, "expected an integer"),
    ])
    def test_bad_values_are_one_line(self, value, message):
        with pytest.raises(ConfigError, match=r"^allocator\.worker_id: " + message) as info:
            parse_worker_ids(value, "allocator.worker_id")
        assert "\n" not in str(info.value)

    def test_environment_variable_range(self, monkeypatch):
        monkeypatch.setenv("FLAKEKIT_WORKER_ID", "4-6")
        alloc = StaticAllocator(StaticSettings())
        assert alloc.worker_count == 3
        gen = SnowflakeGenerator(SNOWFLAKE, ManualClock(), alloc, workers=3).start()
        assert gen.worker_ids == (4, 5, 6)
        gen.close()

    def test_more_workers_than_ids(self):
        gen = SnowflakeGenerator(SNOWFLAKE, ManualClock(), static([1, 2]), workers=3)
        with pytest.raises(ConfigError, match=r"^allocator\.worker_id: all 2 configured"):
            gen.start()

    def config(self, host, **gen):
        table = {"strategy": "snowflake", "clock": "system", **gen}
        return build_kit(parse_config({"generators": {"g": table}}), host)

    def test_config_range_sets_workers(self, host):
        kit = self.config(host, layout="sonyflake",
                          allocator={"type": "static", "worker_id": "0-63"})
        with kit:
            gen = kit["g"]
            assert gen.workers == 64 and gen.worker_ids == tuple(range(64))
            got = [gen.next_id() for _ in range(2000)]
            assert increasing(got)

    def test_config_list_and_matching_workers(self, host):
        with self.config(host, workers=3,
                         allocator={"type": "static", "worker_id": [0, 1, 5]}) as kit:
            assert kit["g"].worker_ids == (0, 1, 5)

    @pytest.mark.parametrize(("table", "message"), [
        ({"workers": 2, "allocator": {"type": "static", "worker_id": "0-3"}},
         r"^generators\.g\.workers: is 2 but generators\.g\.allocator\.worker_id names 4 id"),
        ({"workers": 2, "allocator": {"type": "static", "worker_id": 1}},
         r"^generators\.g\.workers: is 2 but .* names 1 id"),
        ({"workers": 0, "allocator": {"type": "static", "worker_id": 1}},
         r"^generators\.g\.workers: expected a whole number from 1 to 1024 .*got 0"),
        ({"workers": "many", "allocator": {"type": "static", "worker_id": 1}},
         r"^generators\.g\.workers: expected a whole number .*got 'many'"),
        ({"workers": True, "allocator": {"type": "static", "worker_id": 1}},
         r"^generators\.g\.workers: expected a whole number"),
        ({"allocator": {"type": "static", "worker_id": "0-2000"}},
         r"^generators\.g\.allocator\.worker_id: worker id 1024 is outside the worker range"),
        ({"allocator": {"type": "static", "worker_id": "3-1"}},
         r"^generators\.g\.allocator\.worker_id: range '3-1' runs backwards"),
    ])
    def test_config_errors_are_one_line(self, host, table, message):
        with pytest.raises(ConfigError, match=message) as info:
            self.config(host, **table)
        assert "\n" not in str(info.value)


class OneLeasePlugin:
    """An allocator kind that holds one lease per object (like ZooKeeper's): the strategy
    builds one per id, each with its own instance."""

    built: list[int] = []

    @hookimpl
    def flakekit_register_allocators(self, register):
        def build(settings, ctx):
            OneLeasePlugin.built.append(ctx.instance)
            return StaticAllocator(StaticSettings(worker_id=10 + ctx.instance))

        register("one-lease", build, description="one id per allocator object")


def test_strategy_builds_one_allocator_per_id_when_needed(host, monkeypatch):
    """An allocator without ``several_leases`` is built N times, as instances p*N + k,
    and ``flakekit workers`` lists it once (the extra ones are not parts)."""
    monkeypatch.setattr(StaticAllocator, "several_leases", False)
    OneLeasePlugin.built = []
    host.register(OneLeasePlugin(), name="one-lease")
    config = parse_config({"generators": {"g": {
        "strategy": "snowflake", "clock": "system", "workers": 3,
        "allocator": {"type": "one-lease"}}}})
    with build_kit(config, host, ("h", 0, 1)) as kit:
        assert OneLeasePlugin.built == [3, 4, 5]
        assert kit["g"].worker_ids == (13, 14, 15)
        assert len(kit.parts_of("g", "allocator")) == 1


# -- the sql allocator ---------------------------------------------------------------------
def sql_alloc(url: str, clock: ManualClock | None = None) -> SqlWorkerAllocator:
    engine = create_engine(url)
    return SqlWorkerAllocator(engine=engine, service="orders", clock=clock or ManualClock(),
                              host="10.0.0.1", port=8080, create_schema=True)


def holders(url: str) -> dict[int, str | None]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT machine_id, holder FROM system_nodes "
                                     "WHERE service = 'orders'")).all()
    finally:
        engine.dispose()
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("kind",
                         ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def test_sql_allocator_leases_n_distinct_ids_and_releases_them(kind, request, tmp_path):
    url = (f"sqlite:///{tmp_path / 'w.db'}" if kind == "sqlite"
           else request.getfixturevalue("pg_url"))
    alloc = sql_alloc(url)
    gen = SnowflakeGenerator(SNOWFLAKE, ManualClock(), alloc, workers=4, host="10.0.0.1",
                             port=8080).start()
    assert gen.worker_ids == (0, 1, 2, 3)
    tokens = holders(url)
    assert len({tokens[w] for w in range(4)}) == 4 and None not in tokens.values()
    got = [gen.next_id() for _ in range(4096 * 4 + 10)]
    assert increasing(got) and set(workers_of(SNOWFLAKE, got)) == {0, 1, 2, 3}
    for k in gen.keepers:           # heartbeats go per id
        assert k.renew_once()
    gen.close()
    assert set(holders(url).values()) == {None}
    again = SnowflakeGenerator(SNOWFLAKE, ManualClock(), alloc, workers=4, host="10.0.0.1",
                               port=8080).start()
    assert again.worker_ids == (0, 1, 2, 3)   # the same rows, one per slot
    again.close()
    alloc.engine.dispose()


NODE = textwrap.dedent("""
    import json, sys
    from sqlalchemy import create_engine
    from flakekit.builtin.layouts import SNOWFLAKE
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.sql.workers import SqlWorkerAllocator
    from flakekit.values.clock import MonotonicClock

    clock = MonotonicClock()
    alloc = SqlWorkerAllocator(engine=create_engine(sys.argv[1]), service="orders",
                               clock=clock, host="10.0.0.1", port=8080, create_schema=True)
    gen = SnowflakeGenerator(SNOWFLAKE, clock, alloc, workers=int(sys.argv[2]),
                             host="10.0.0.1", port=8080).start()
    sys.stdout.write(json.dumps({"workers": list(gen.worker_ids)}) + "\\n")
    sys.stdout.flush()
    sys.stdin.readline()   # both hold their ids at once
    ids = [gen.next_id() for _ in range(20000)]
    json.dump({"ids": ids}, sys.stdout)
    gen.close()
""")


@pytest.mark.postgresql
def test_two_processes_with_n_each_never_share_an_id(pg_url, tmp_path):
    """Two processes with the same host:port (the clone case) and 4 ids each: 8
    distinct ids, no ID in common."""
    script = tmp_path / "node.py"
    script.write_text(NODE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    procs = [subprocess.Popen([sys.executable, str(script), pg_url, "4"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        held = [json.loads(p.stdout.readline())["workers"] for p in procs]  # type: ignore[union-attr]
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        outs = [json.loads(p.communicate(timeout=60)[0])["ids"] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(held[0]) == len(held[1]) == 4
    assert not set(held[0]) & set(held[1])
    assert not set(outs[0]) & set(outs[1])
    assert set(holders(pg_url).values()) == {None}


# -- ZooKeeper: one allocator (and identity) per id ------------------------------------------
@pytest.mark.services
@pytest.mark.parametrize("mode", ["lease", "leaf"])
def test_zookeeper_gives_each_id_its_own_allocator_and_identity(mode, tmp_path, monkeypatch):
    """ZooKeeper allocators hold one lease each: workers = 3 builds three, as instances
    0, 1, 2 (leaf mode: identities ip:port, ip:port.1, ip:port.2), with distinct ids."""
    pytest.importorskip("flakekit_zookeeper")
    from flakekit.pluginhost.host import PluginHost

    env = Path("/tmp/flakekit-svc/env")
    hosts = os.environ.get("ZK_HOSTS") or next(
        (line.split("=", 1)[1].strip() for line in env.read_text().splitlines()
         if line.startswith("ZK_HOSTS=")), "") if env.exists() else os.environ.get("ZK_HOSTS", "")
    assert hosts, "ZooKeeper is not running (scripts/zookeeper.sh start writes ZK_HOSTS)"
    monkeypatch.setenv("ZK_HOSTS", hosts)
    extra = {"port": 9100, "cache_dir": str(tmp_path)} if mode == "leaf" else {}
    name = f"workers-n-{mode}-{os.getpid()}-{tmp_path.name}"[:60].replace("/", "-")
    config = parse_config({"generators": {"g": {"strategy": "snowflake", "workers": 3,
        "allocator": {"type": "zookeeper", "mode": mode, "name": name, **extra}}}})
    with build_kit(config, PluginHost().load()) as kit:
        gen = kit["g"]
        assert len(gen.worker_ids) == 3
        assert len({id(k.allocator) for k in gen.keepers}) == 3
        if mode == "leaf":
            assert sorted(k.allocator.key.split(":")[1] for k in gen.keepers) == \
                ["9100", "9100.1", "9100.2"]
        got = [gen.next_id() for _ in range(10)]
        # a batch of 3 x 4096 inside one millisecond spans the three ids; on the real clock
        # a tick may turn during a batch (the next tick's id 0 then serves the rest): again
        for _ in range(50):
            got += [i for r in gen.next_ids(3 * 4096).ranges for i in r]
            if set(workers_of(SNOWFLAKE, got)) == set(gen.worker_ids):
                break
        assert increasing(got) and set(workers_of(SNOWFLAKE, got)) == set(gen.worker_ids)
