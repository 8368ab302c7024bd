"""What the benchmark scripts share: formatting, tables, the load average, plots, output.

Not a benchmark (``run_all.py`` runs ``bench_*.py`` only). The scripts run as
``python benchmarks/bench_x.py``, so this folder is on ``sys.path`` and ``import _common``
finds this file; nothing here changes what a script measures.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``/proc/loadavg`` gives them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def fmt_rate(value: float | None, none: str = "none") -> str:
    """12.35M, 976.7k, 512."""
    if value is None:
        return none
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def fmt_ms(value: float | None) -> str:
    """1,234 ms; None: -."""
    return "-" if value is None else f"{value:,.0f} ms"


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table padded to its columns: the first left-aligned, the others right."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in [list(header), *body]) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(row, widths, strict=True))) + " |"
              for row in body]
    return lines


def add_switches(parser: argparse.ArgumentParser, quick: str) -> None:
    """``--quick`` (``quick`` is its help) and ``--json``, which run_all.py looks for."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_numbers(parser: argparse.ArgumentParser, helps: dict[str, str] | None = None,
                **defaults: float) -> None:
    """An option ``--NAME`` (``_`` as ``-``) per keyword, of its default's type."""
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help=(helps or {}).get(name))


def best_rate(run: Callable[[], object], per_run: int, rounds: int = 3) -> float:
    """The best of ``rounds`` runs of ``run``, as ``per_run`` units per second."""
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        best = max(best, per_run / (time.perf_counter() - t0))
    return best


def percentile_ms(values: Sequence[float], q: float, empty: float = 0.0) -> float:
    """The ``q`` quantile (0..1, nearest rank below) of seconds, in ms."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else empty


def pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend, or None with a note when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[benchmarks]'); no PNG",
              file=sys.stderr)
        return None
    return plt


def emit(data: dict[str, Any], text: str, image: str | None, as_json: bool) -> None:
    """Print ``data`` with ``text`` under "table" (``--json``), or the text and the plot."""
    if as_json:
        print(json.dumps({**data, "image": image, "table": text}, indent=2))
        return
    print(text)
    if image:
        print(f"\nplot: {image}")


def python_label() -> str:
    """``CPython 3.11.7 on x86_64``."""
    return f"CPython {sys.version.split()[0]} on {platform.machine()}"


def print_results(as_json: bool, data: dict[str, Any], heading: str, text: str) -> None:
    """``--json``: ``data`` with the interpreter and machine; else a heading line (after
    the interpreter and machine) and the text."""
    if as_json:
        print(json.dumps({"python": sys.version.split()[0], "machine": platform.machine(),
                          **data}, indent=2))
    else:
        print(f"{python_label()}, {heading}\n")
        print(text)


def save_plot(plt: Any, fig: Any, image: Path) -> str:
    """Lay out ``fig``, write it to ``image`` (a PNG, 90 dpi), close it."""
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=90)
    plt.close(fig)
    return str(image)


def time_acquire(allocator: Any, request: Any, times: list[float]) -> None:
    """One ``acquire`` of ``allocator``, its seconds appended to ``times``, then release."""
    t = time.perf_counter()
    lease = allocator.acquire(request)
    times.append(time.perf_counter() - t)
    allocator.release(lease, 0)


def run_threads(threads: Sequence[threading.Thread], when_started: Callable[[], float]) -> float:
    """Start ``threads``, call ``when_started``, join them; its value (a start time)."""
    for t in threads:
        t.start()
    value = when_started()
    for t in threads:
        t.join()
    return value


def start_together(acquire: Callable[[Any], int], holders: Sequence[Any]
                   ) -> tuple[list[float], list[int], list[str], float]:
    """One thread per holder, released at once, each calling ``acquire(holder)``: (each
    call's seconds sorted, the worker ids got, the errors, the wall seconds until all
    were done)."""
    barrier = threading.Barrier(len(holders) + 1)
    took: list[float] = []
    got: list[int] = []
    errors: list[str] = []

    def run(holder: Any) -> None:
        barrier.wait()
        t = time.perf_counter()
        try:
            got.append(acquire(holder))
        except Exception as exc:  # noqa: BLE001 - counted and shown
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
        took.append(time.perf_counter() - t)

    def released() -> float:
        barrier.wait()
        return time.perf_counter()

    start = run_threads([threading.Thread(target=run, args=(h,)) for h in holders], released)
    wall = time.perf_counter() - start
    took.sort()
    return took, got, errors, wall
