"""Start-up time of the commands that need no database, against ``python -c "import click"``,
and of ``flakekit next`` on the embedded default.

    .venv/bin/python benchmarks/bench_startup.py            # 30 runs per command
    .venv/bin/python benchmarks/bench_startup.py --quick    # 10 runs
    .venv/bin/python benchmarks/bench_startup.py --json     # machine-readable
    .venv/bin/python benchmarks/bench_startup.py --cold     # no bytecode cache for flakekit
    .venv/bin/python benchmarks/bench_startup.py --imports 8  # what each command imports

The targets (issue 24): ``flakekit --help``, ``decode`` and ``layout
list|show|compose|decompose`` within 2.5x the click baseline, by the best run, by the
median and by CPU time, all three in the same run; ``flakekit next`` on the embedded
default (a SQLite registry in a fresh ``FLAKEKIT_STATE_DIR``, made by the first run)
within 350 ms. Each command is a fresh process (the installed ``flakekit`` script next to
this interpreter), timed by hyperfine when it is installed (``-N``: no shell; warm-up runs
first), else by N ``subprocess.run`` calls, the commands taking turns (one run of each,
N times over). The machine's load (``os.getloadavg``) is
printed before and after: on a shared machine compare ratios from one run.

``--imports N`` runs each command once under ``python -X importtime`` and prints the N
largest imports (top level and one below) by cumulative time that ``import click`` does
not do itself (one run: indicative, not a measurement).

Bytecode: pip compiles an installed package's ``.pyc`` files, an editable checkout gets
them on first import -- unless ``PYTHONDONTWRITEBYTECODE`` is set (as in some sandboxes),
when every start compiles flakekit from source. By default the runs use a bytecode cache
in a temporary ``PYTHONPYCACHEPREFIX`` (warmed up first; nothing is written into the
tree), which is what an installed flakekit sees; ``--cold`` measures the other case.
Run with the plugins the deployment has installed: their start-up is part of every
command (they may add commands and layouts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 2.5
#: ``flakekit next`` on the embedded default, best and median wall time
NEXT_TARGET_MS = 350.0
ID = "1234567890123456789"
#: (label, flakekit arguments); the baseline is measured first
COMMANDS = [
    ("flakekit --help", ["--help"]),
    ("flakekit decode ID", ["decode", ID]),
    ("flakekit layout list", ["layout", "list"]),
    ("flakekit layout show snowflake", ["layout", "show", "snowflake"]),
    ("flakekit layout compose", ["layout", "compose", "snowflake", "time=5", "worker=3",
                                 "sequence=1"]),
    ("flakekit layout decompose", ["layout", "decompose", "snowflake", ID]),
    ("flakekit next", ["next"]),  # the embedded default: SQLite in FLAKEKIT_STATE_DIR
]
NEXT = "flakekit next"
BASELINE = 'python -c "import click"'


def flakekit_command() -> list[str]:
    """The ``flakekit`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("flakekit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "flakekit.cli"]


def environment(cold: bool, cache: str, state: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLAKEKIT_CONFIG", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE",
                        "FLAKEKIT_TRACE_PLUGINS", "FLAKEKIT_LOAD_PLUGINS",
                        "FLAKEKIT_DISABLE_PLUGINS")}
    env["FLAKEKIT_STATE_DIR"] = state  # `flakekit next`: a registry of its own
    if cold:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def time_subprocess(argv: list[str], runs: int, warmup: int, env: dict[str, str],
                    cwd: str) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds per run of ``argv``: the best-of-N timer when
    hyperfine is missing, and the CPU figure always (on a shared machine a process waits
    for a core, which wall time counts and CPU time does not)."""
    for _ in range(warmup):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                       cwd=cwd, check=True)
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                       cwd=cwd, check=True)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def time_round_robin(argvs: list[list[str]], runs: int, warmup: int, env: dict[str, str],
                     cwd: str) -> tuple[list[list[float]], list[list[float]]]:
    """Wall and CPU seconds of each command, one run of each in turn ``runs`` times: a
    change of the machine's load falls on every command alike, not on a block of one."""
    walls: list[list[float]] = [[] for _ in argvs]
    cpus: list[list[float]] = [[] for _ in argvs]
    for argv in argvs:
        time_subprocess(argv, 0, warmup, env, cwd)
    for _ in range(runs):
        for i, argv in enumerate(argvs):
            wall, cpu = time_subprocess(argv, 1, 0, env, cwd)
            walls[i] += wall
            cpus[i] += cpu
    return walls, cpus


def time_hyperfine(argvs: list[list[str]], runs: int, warmup: int, env: dict[str, str],
                   cwd: str) -> list[list[float]]:
    """hyperfine's per-run times (seconds) of each command, all in one hyperfine run."""
    import shlex

    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            ["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
             "--export-json", out.name, *(shlex.join(a) for a in argvs)],
            env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
        )
        data = json.loads(Path(out.name).read_text())
    return [r["times"] for r in data["results"]]


def measure(runs: int, warmup: int, cold: bool, use_hyperfine: bool) -> dict:
    flakekit = flakekit_command()
    argvs = [[sys.executable, "-c", "import click"]] + [flakekit + a for _, a in COMMANDS]
    cache = tempfile.mkdtemp(prefix="flakekit-pycache-")
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="flakekit-startup-") as cwd:
            env = environment(cold, cache, os.path.join(cwd, "state"))
            for argv in argvs:  # each command works (and, warm, fills the bytecode cache)
                subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                               cwd=cwd, check=True)
            if use_hyperfine:
                times = time_hyperfine(argvs, runs, warmup, env, cwd)
                cpus = [time_subprocess(a, max(3, runs // 2), 0, env, cwd)[1] for a in argvs]
            else:
                times, cpus = time_round_robin(argvs, runs, warmup, env, cwd)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    labels = [BASELINE] + [label for label, _ in COMMANDS]
    base, cpu_base = min(times[0]), min(cpus[0])
    rows = []
    for label, argv, ts, cs in zip(labels, argvs, times, cpus):
        best, median = min(ts), statistics.median(ts)
        row = {"command": label, "argv": argv[1:] if label == BASELINE else argv,
               "best_ms": best * 1e3, "median_ms": median * 1e3,
               "ratio": best / base, "ratio_median": median / statistics.median(times[0]),
               "cpu_ms": min(cs) * 1e3, "cpu_ratio": min(cs) / cpu_base}
        if label == NEXT:
            row["within_target"] = max(row["best_ms"], row["median_ms"]) <= NEXT_TARGET_MS
        else:
            row["within_target"] = label == BASELINE or max(
                row["ratio"], row["ratio_median"], row["cpu_ratio"]) <= TARGET
        rows.append(row)
    return {"python": sys.version.split()[0], "timer": "hyperfine" if use_hyperfine else
            f"{runs} subprocess runs, round robin", "runs": runs, "bytecode": "cold" if cold else
            "cached", "target": TARGET, "next_target_ms": NEXT_TARGET_MS,
            "plugins": plugins(), "load": [load_before, os.getloadavg()], "results": rows}


def plugins() -> list[str]:
    from flakekit.pluginhost.entrypoints import read_entry_points

    return sorted(f"{ep.name} ({ep.dist} {ep.version})" for ep in read_entry_points("flakekit"))


def table(data: dict) -> str:
    lines = ["| command | best ms | median ms | best / click | median / click | CPU ms | "
             f"CPU / click | target: ≤ {data['target']:g}× (best, median, CPU); next ≤ "
             f"{data['next_target_ms']:g} ms |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in data["results"]:
        ok = "" if r["command"] == BASELINE else ("yes" if r["within_target"] else "**no**")
        lines.append(f"| `{r['command']}` | {r['best_ms']:.1f} | {r['median_ms']:.1f} | "
                     f"{r['ratio']:.2f}× | {r['ratio_median']:.2f}× | {r['cpu_ms']:.1f} | "
                     f"{r['cpu_ratio']:.2f}× | {ok} |")
    lines.append("")
    lines.append("CPU = the best user + system time of the process (getrusage): it does not "
                 "count waiting for a core, so on a loaded machine it is the steadier ratio.")
    lines.append(f"Timer: {data['timer']}, {data['runs']} runs per command; bytecode "
                 f"{data['bytecode']}; CPython {data['python']}; plugins installed: "
                 f"{', '.join(data['plugins']) or 'none'}.")
    (a1, a5, a15), (b1, b5, b15) = data["load"]
    lines.append(f"Load average before: {a1:.2f} {a5:.2f} {a15:.2f}; after: {b1:.2f} {b5:.2f} "
                 f"{b15:.2f} ({os.cpu_count()} CPUs).")
    return "\n".join(lines)


def top_imports(argv: list[str], env: dict[str, str], cwd: str, skip: set[str],
                count: int) -> tuple[list[tuple[int, str]], str]:
    """The ``count`` largest imports of one run of ``argv`` under ``-X importtime``
    (cumulative microseconds) at the top level or one below it, leaving out the modules
    in ``skip``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", _LIST_MODULES, *argv],
                          env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=True)
    rows, names = [], set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2  # depth 0: one space
        if name.strip() not in skip and depth <= 1:
            rows.append((int(cumulative), name.strip()))
    for line in done.stderr.splitlines():
        if line.startswith("MODULES "):
            names = set(json.loads(line[len("MODULES "):])) - skip
    return sorted(rows, reverse=True)[:count], summary(names)


#: run a script (argv[1]) as ``__main__``, then print ``sys.modules`` on stderr: -X
#: importtime does not see modules loaded by importlib.import_module (the plugins)
_LIST_MODULES = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr))
script, sys.argv = sys.argv[1], sys.argv[1:]
with open(script, encoding="utf-8") as fh:
    code = compile(fh.read(), script, "exec")
exec(code, {"__name__": "__main__", "__file__": script})
"""


def summary(names: set[str]) -> str:
    """What was imported, short: flakekit's modules, then other packages, then the
    standard library's (top-level names)."""
    ours = sorted(n.removeprefix("flakekit.") for n in names if n.startswith("flakekit."))
    tops = {n.split(".")[0] for n in names if n != "flakekit" and not n.startswith("flakekit.")}
    stdlib = sorted(t for t in tops if t in sys.stdlib_module_names and not t.startswith("_"))
    other = sorted(t for t in tops if t not in sys.stdlib_module_names)
    return (f"flakekit: {', '.join(ours)}; packages: {', '.join(other) or '-'}; "
            f"stdlib: {', '.join(stdlib) or '-'}")


def imports(count: int) -> str:
    """What each command imports that ``import click`` does not (``--imports N``)."""
    flakekit = flakekit_command()
    if flakekit[0] == sys.executable:  # no console script: a stand-in that runs the CLI
        flakekit = [str(Path(tempfile.mkdtemp()) / "flakekit")]
        Path(flakekit[0]).write_text("from flakekit.cli import main\nmain()\n", encoding="utf-8")
    cache = tempfile.mkdtemp(prefix="flakekit-pycache-")
    out = []
    try:
        with tempfile.TemporaryDirectory(prefix="flakekit-startup-") as cwd:
            env = environment(False, cache, os.path.join(cwd, "state"))
            for argv in [["-c", "import click"]] + [flakekit + a for _, a in COMMANDS]:
                # the command works, and its bytecode is warm
                subprocess.run([sys.executable, *argv], env=env, cwd=cwd, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            click_done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                                         "import click"], env=env, cwd=cwd, text=True,
                                        stderr=subprocess.PIPE, check=True)
            skip = {line.split("|")[2].strip() for line in click_done.stderr.splitlines()
                    if line.startswith("import time:") and "cumulative" not in line}
            click_modules = subprocess.run(
                [sys.executable, "-c", "import click, json, sys; print(json.dumps(sorted("
                 "sys.modules)))"], env=env, cwd=cwd, text=True, capture_output=True,
                check=True)
            skip |= set(json.loads(click_modules.stdout))
            skip |= {"atexit", "__main__"}  # the module lister's own
            for label, args in COMMANDS:
                rows, what = top_imports(flakekit + args, env, cwd, skip, count)
                out.append(f"{label}: " + ", ".join(f"{name} {us / 1000:.1f}"
                                                   for us, name in rows))
                out.append(f"    {what}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return "\n".join(["Largest imports beyond `import click`'s (top level and one below), "
                      "cumulative ms (python -X importtime, one run):"] + out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 runs per command, not 30")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--cold", action="store_true",
                        help="no bytecode cache for flakekit (PYTHONDONTWRITEBYTECODE=1)")
    parser.add_argument("--no-hyperfine", action="store_true", help="use the subprocess timer")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--imports", type=int, default=0, metavar="N",
                        help="print each command's N largest imports (-X importtime) instead")
    args = parser.parse_args(argv)
    if args.imports:
        print(imports(args.imports))
        return 0
    runs = args.runs or (10 if args.quick else 30)
    use_hyperfine = shutil.which("hyperfine") is not None and not args.no_hyperfine
    data = measure(runs, 2 if args.quick else 3, args.cold, use_hyperfine)
    print(json.dumps(data, indent=2) if args.json else table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
