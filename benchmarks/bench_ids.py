"""IDs per second: flakekit against its PyPI peers, measured in one run.

    .venv/bin/python benchmarks/bench_ids.py            # best of 5 x ~1 s per generator
    .venv/bin/python benchmarks/bench_ids.py --quick    # best of 3 x ~0.3 s
    .venv/bin/python benchmarks/bench_ids.py --json     # machine-readable
    .venv/bin/python benchmarks/bench_ids.py --compare-ref main   # this tree's snowflake
        # generator against the one at a git ref: 30 rounds of ~0.2 s windows, alternating

Every generator is timed the same way: a list comprehension over ``itertools.repeat``
calling its "next ID" function, in chunks sized so one chunk takes about 0.1 s, until the
repeat has run for the target time. IDs/s is (IDs made) / (wall time); best and median are
over the repeats. flakekit's IDs from the timed runs are checked for duplicates (and for
order: one thread, so they must strictly increase).

The peers come from the ``benchmarks`` extra: ``pip install -e ".[benchmarks]"``
(flakeid, snowflake-id, sonyflake, sonyflake-turbo, uuid-utils, python-ulid); one that is
missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from typing import Any

import attrs
from _common import add_switches, fmt_rate, md_table, print_results, python_label

CHUNK_SECONDS = 0.1


@attrs.define
class Result:
    name: str
    cap: float | None          # the layout's IDs/s per worker, None for "no cap"
    rates: list[float]
    note: str = ""
    checked: str = ""
    cpu_rates: list[float] = attrs.Factory(list)   # IDs per second of this process's CPU

    @property
    def best(self) -> float:
        return max(self.rates)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


class Check:
    """Uniqueness and order of the IDs one single-threaded generator produced."""

    def __init__(self) -> None:
        self.last = -1
        self.total = 0
        self.errors: list[str] = []

    def ids(self, chunk: list[int]) -> None:
        if len(set(chunk)) != len(chunk):
            self.errors.append(f"{len(chunk) - len(set(chunk))} duplicates in a chunk")
        if chunk and (chunk[0] <= self.last or any(a >= b for a, b in zip(chunk, chunk[1:]))):
            self.errors.append("IDs not strictly increasing")
        if chunk:
            self.last = chunk[-1]
        self.total += len(chunk)

    def batches(self, chunk: list[Any]) -> None:
        for batch in chunk:
            for r in batch.ranges:
                if r[0] <= self.last:
                    self.errors.append("batch overlaps or goes back")
                self.last = r[-1]
                self.total += len(r)

    def summary(self) -> str:
        if self.errors:
            return "FAILED: " + "; ".join(sorted(set(self.errors)))
        return f"{self.total:,} IDs unique and increasing"


def run(
    name: str, call: Callable[..., Any], *, per_call: int = 1, arg: Any = None,
    cap: float | None, repeats: int, seconds: float,
    check: Callable[[list[Any]], None] | None = None,
    note: str = "",
) -> Result:
    """Time ``call()`` (or ``call(arg)``) ``repeats`` times for about ``seconds`` each."""
    cpu = [0.0]   # the CPU time of the last chunk

    def chunk_of(size: int) -> tuple[float, list[Any]]:
        if arg is None:
            start, cpu0 = time.perf_counter(), time.process_time()
            out = [call() for _ in repeat(None, size)]
        else:
            start, cpu0 = time.perf_counter(), time.process_time()
            out = [call(arg) for _ in repeat(None, size)]
        cpu[0] = time.process_time() - cpu0
        return time.perf_counter() - start, out

    size = 1
    while True:  # calibrate: a chunk of about CHUNK_SECONDS
        elapsed, out = chunk_of(size)
        if check is not None:
            check(out)
        if elapsed >= CHUNK_SECONDS / 4 or size >= 1 << 24:
            break
        size *= 2
    size = max(1, int(size * CHUNK_SECONDS / max(elapsed, 1e-9)))
    rates, cpu_rates = [], []
    for _ in range(repeats):
        made, spent, spent_cpu = 0, 0.0, 0.0
        while spent < seconds:
            elapsed, out = chunk_of(size)
            spent += elapsed
            spent_cpu += cpu[0]
            made += len(out) * per_call
            if check is not None:
                check(out)
        rates.append(made / spent)
        cpu_rates.append(made / max(spent_cpu, 1e-9))
    return Result(name, cap, rates, note, cpu_rates=cpu_rates)


def bench(repeats: int, seconds: float) -> list[Result]:
    from flakekit.builtin.layouts import SNOWFLAKE
    from flakekit.builtin.static import StaticAllocator, StaticSettings
    from flakekit.generators.snowflake import SnowflakeGenerator
    from flakekit.values.clock import MonotonicClock

    results = []
    opts = {"repeats": repeats, "seconds": seconds}
    snowflake_cap = SNOWFLAKE.capacity().ids_per_second_per_worker

    def flakekit_gen() -> SnowflakeGenerator:
        return SnowflakeGenerator(
            SNOWFLAKE, MonotonicClock(), StaticAllocator(StaticSettings(worker_id=1)),
            name="bench",
        ).start()

    # -- flakekit ------------------------------------------------------------------------
    for label, arg in (("flakekit next_id() (snowflake, monotonic, static)", None),
                       ("flakekit next_ids(1000)", 1000),
                       ("flakekit next_ids(1_000_000)", 1_000_000)):
        gen = flakekit_gen()
        check = Check()
        res = run(label, gen.next_id if arg is None else gen.next_ids, arg=arg,
                  per_call=arg or 1, cap=snowflake_cap,
                  check=check.ids if arg is None else check.batches, **opts)
        res.checked = check.summary()
        results.append(res)
        gen.close()

    # -- flakeid -------------------------------------------------------------------------
    try:
        import flakeid
    except ImportError:
        skipped("flakeid")
    else:
        fgen = flakeid.make_generator(flakeid.PRESET_TWITTER)
        results.append(run("flakeid make_generator(PRESET_TWITTER).next_id", fgen.next_id,
                           cap=snowflake_cap, **opts))
        if hasattr(fgen, "next_ids"):
            results.append(run("flakeid next_ids(1000)", fgen.next_ids, arg=1000,
                               per_call=1000, cap=snowflake_cap,
                               note="returns a list of ints", **opts))

    # -- snowflake-id --------------------------------------------------------------------
    try:
        from snowflake import SnowflakeGenerator as SnowflakeIdGenerator
    except ImportError:
        skipped("snowflake-id")
    else:
        sgen = SnowflakeIdGenerator(1)
        counted = {"none": 0}

        def count_nones(chunk: list[Any]) -> None:
            counted["none"] += chunk.count(None)

        res = run("snowflake-id next(gen)", sgen.__next__, cap=snowflake_cap,
                  check=count_nones, **opts)
        res.note = (f"not thread-safe (no lock); returned None {counted['none']:,} times "
                    "when a ms was used up")
        results.append(res)

    # -- sonyflake -----------------------------------------------------------------------
    try:
        from sonyflake import Sonyflake
    except ImportError:
        skipped("sonyflake")
    else:
        sony = Sonyflake(start_time=dt.datetime(2014, 9, 1, tzinfo=dt.UTC),
                         machine_id=1)
        results.append(run(
            "sonyflake Sonyflake(...).next_id (default 39/8/16, 10 ms)", sony.next_id,
            cap=25_600, note="cap-bound: 256 IDs per 10 ms, then it sleeps", **opts,
        ))

    # -- sonyflake-turbo (C) -------------------------------------------------------------
    try:
        from sonyflake_turbo import SonyFlake as TurboSonyFlake
    except ImportError:
        skipped("sonyflake-turbo")
    else:
        turbo = TurboSonyFlake(*range(64), start_time=1409529600)  # 2014-09-01, Sony's epoch
        results.append(run(
            "sonyflake-turbo SonyFlake(64 machine ids) next()", turbo.__next__,
            cap=64 * 25_600, note="C extension; moves to the next machine id when a tick's "
            "256 are used, so its cap is 64 x 25,600", **opts,
        ))
        results.append(run("sonyflake-turbo sf(1000)", turbo, arg=1000, per_call=1000,
                           cap=64 * 25_600, note="a list of 1,000 ints per call", **opts))

    # -- uuid-utils (Rust) ---------------------------------------------------------------
    try:
        import uuid_utils
    except ImportError:
        skipped("uuid-utils")
    else:
        results.append(run("uuid-utils uuid7()", uuid_utils.uuid7, cap=None,
                           note="Rust; 128-bit UUIDv7 objects, no worker id to coordinate",
                           **opts))

    # -- python-ulid ---------------------------------------------------------------------
    try:
        from ulid import ULID
    except ImportError:
        skipped("python-ulid")
    else:
        results.append(run("python-ulid ULID()", ULID, cap=None,
                           note="128-bit ULID objects (48-bit ms + 80 random bits)", **opts))
    return results


def load_ref_generators(ref: str, name: str = "_flakekit_ref_generators") -> Any:
    """``flakekit.generators.snowflake`` as it is at git ``ref``: the ref's
    ``flakekit/generators`` package, unpacked to a temporary folder and imported as
    ``name`` beside this tree's (the rest of flakekit is this tree's)."""
    root = Path(__file__).resolve().parents[1]
    tar = subprocess.run(["git", "-C", str(root), "archive", ref, "flakekit/generators"],
                         check=True, capture_output=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="flakekit-ref-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder, filter="data")
    package = folder / "flakekit" / "generators"
    spec = importlib.util.spec_from_file_location(
        name, package / "__init__.py", submodule_search_locations=[str(package)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.snowflake")


#: the sides of a comparison: the ref, the ref again (its own copy: the noise floor of
#: this run), this tree
SIDES = ("ref", "ref again", "this")


def compare(ref: str, repeats: int, seconds: float) -> list[tuple[str, dict[str, Result]]]:
    """This tree's snowflake generator against the one at ``ref``, in one process: each
    case runs ``repeats`` rounds of one ~``seconds`` window per side, the sides taking
    turns (in a rotating order) so the load of a shared machine falls on all alike. A
    second copy of the ref runs as a control: ref again / ref shows the noise."""
    from flakekit.builtin.layouts import SNOWFLAKE
    from flakekit.builtin.static import StaticAllocator, StaticSettings
    from flakekit.generators import snowflake as this
    from flakekit.values.clock import MonotonicClock

    modules = {"ref": load_ref_generators(ref),
               "ref again": load_ref_generators(ref, "_flakekit_ref_generators_again"),
               "this": this}
    cap = SNOWFLAKE.capacity().ids_per_second_per_worker
    cases: list[tuple[str, str, int | None, Callable[[Check], Callable[[list[Any]], None]]]] = [
        ("next_id()", "next_id", None, lambda c: c.ids),
        ("next_ids(1000)", "next_ids", 1000, lambda c: c.batches),
        ("next_ids(1_000_000)", "next_ids", 1_000_000, lambda c: c.batches),
    ]
    out = []
    for label, method, arg, checker in cases:
        gens = {side: module.SnowflakeGenerator(
            SNOWFLAKE, MonotonicClock(), StaticAllocator(StaticSettings(worker_id=1)),
            name="bench").start() for side, module in modules.items()}
        checks = {side: Check() for side in SIDES}
        results = {side: Result(f"{side} {label}", cap, []) for side in SIDES}
        for k in range(repeats):
            for side in SIDES[k % 3:] + SIDES[:k % 3]:
                res = run(label, getattr(gens[side], method), arg=arg, per_call=arg or 1,
                          cap=cap, repeats=1, seconds=seconds, check=checker(checks[side]))
                results[side].rates += res.rates
                results[side].cpu_rates += res.cpu_rates
        for side in SIDES:
            results[side].checked = checks[side].summary()
            gens[side].close()
        out.append((label, results))
    return out


def paired(new: list[float], old: list[float]) -> str:
    """The median of the rounds' own ratios: a round's windows ran back to back, so a
    load change between rounds cancels out."""
    return f"{statistics.median(n / o for o, n in zip(old, new)):.3f}"


def compare_table(ref: str, rows: list[tuple[str, dict[str, Result]]]) -> str:
    """Medians per side (wall clock), and paired medians of this/ref and of the control
    ref again/ref, by wall clock and by this process's CPU time (which a busy machine
    disturbs far less)."""
    header = ("snowflake, monotonic, static", f"{ref} median", "this median",
              "this/ref wall", "this/ref CPU", "control wall", "control CPU")
    body = [(label, fmt_rate(r["ref"].median), fmt_rate(r["this"].median),
             paired(r["this"].rates, r["ref"].rates),
             paired(r["this"].cpu_rates, r["ref"].cpu_rates),
             paired(r["ref again"].rates, r["ref"].rates),
             paired(r["ref again"].cpu_rates, r["ref"].cpu_rates)) for label, r in rows]
    lines = md_table(header, body)
    notes = [f"* {res.name}: {res.checked}" for _, r in rows for res in r.values()]
    notes.append("* control: a second copy of the ref against the ref (the noise of this "
                 "run); this/ref and control are medians of per-round ratios")
    return "\n".join(lines + [""] + notes)


def skipped(peer: str) -> None:
    """A missing peer is left out of the table with a note (``pip install -e '.[benchmarks]'``)."""
    print(f"{peer} not installed (pip install -e '.[benchmarks]'); skipped", file=sys.stderr)
    SKIPPED.append(peer)


#: peers that were not installed in this run (the report says so)
SKIPPED: list[str] = []


def table(results: list[Result]) -> str:
    by_name = {r.name: r for r in results}
    base_flakeid = by_name.get("flakeid make_generator(PRESET_TWITTER).next_id")
    base_flakekit = by_name["flakekit next_id() (snowflake, monotonic, static)"]
    header = ("generator", "IDs/s best", "median", "ns/ID", "vs flakeid", "vs flakekit",
              "layout cap")
    rows = []
    for r in results:
        rows.append((
            r.name, fmt_rate(r.best), fmt_rate(r.median), f"{1e9 / r.best:,.0f}",
            f"{r.best / base_flakeid.best:.2f}x" if base_flakeid else "-",
            f"{r.best / base_flakekit.best:.2f}x",
            fmt_rate(r.cap),
        ))
    lines = md_table(header, rows)
    notes = [f"* {r.name}: {r.checked or r.note}" + (f"; {r.note}" if r.checked and r.note else "")
             for r in results if r.checked or r.note]
    return "\n".join(lines + [""] + notes)


def add_timing_switches(parser: argparse.ArgumentParser) -> None:
    """--quick, --json, --repeats and --seconds (this script's and bench_workers_n.py's)."""
    add_switches(parser, quick="3 repeats of ~0.3 s instead of 5 of ~1 s")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)


def run_rows(args: argparse.Namespace, bench: Callable[[int, float], list[Result]],
             to_json: Callable[[Result], dict[str, Any]], unit: str,
             table: Callable[[list[Result]], str], **extra: Any) -> int:
    """Time ``bench``'s rows (best of ``--repeats`` x ``--seconds``) and print them; 1 if
    a check of the IDs failed."""
    repeats = args.repeats or (3 if args.quick else 5)
    seconds = args.seconds or (0.3 if args.quick else 1.0)
    results = bench(repeats, seconds)
    print_results(args.json, {"repeats": repeats, "seconds": seconds, **extra,
                              "results": [to_json(r) for r in results]},
                  f"best of {repeats} x ~{seconds:g} s per {unit}", table(results))
    return 1 if any(r.checked.startswith("FAILED") for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_switches(parser)
    parser.add_argument("--compare-ref", metavar="REF", default=None,
                        help="time this tree's snowflake generator against the one at git "
                             "REF (e.g. main), alternating; no peers")
    args = parser.parse_args(argv)
    if args.compare_ref:   # many short alternating windows: load noise cancels in pairs
        repeats = args.repeats or (10 if args.quick else 30)
        seconds = args.seconds or 0.2
        rows = compare(args.compare_ref, repeats, seconds)
        load = os.getloadavg()
        print(f"{python_label()}, {repeats} repeats "
              f"x ~{seconds:g} s per side, alternating; load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
        print(compare_table(args.compare_ref, rows))
        return 1 if any(res.checked.startswith("FAILED")
                        for _, r in rows for res in r.values()) else 0
    return run_rows(args, bench, lambda r: {
        "name": r.name, "best": r.best, "median": r.median, "ns_per_id": 1e9 / r.best,
        "rates": r.rates, "cap": r.cap, "checked": r.checked, "note": r.note},
        "generator", table, skipped=SKIPPED)


if __name__ == "__main__":
    sys.exit(main())
