"""Process drills: run a generator in a process of its own (``flakekit.testing.drill_worker``)
and read what it prints, so a test can kill, pause or race real processes.

Used by the core's and the plugins' drills alike: write a config (``write_config``, with the
``tiny`` layout of two worker ids so two processes can be forced onto one), ``spawn`` the
worker, ``read_until`` a line, ``parse_ids`` its ``ID <id> <mono_before>`` lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import attrs

from flakekit.testing.requests import DRILL_HOST, DRILL_PORT
from flakekit.values.layout import BitLayout

__all__ = ["PYTHON", "TINY_LAYOUT", "WORKER", "PausedHolderRun", "parse_ids",
           "pause_past_the_lease", "read_until", "sigstop", "snowflake_over", "spawn", "stop",
           "tiny_layout", "write_config"]

#: the drill process, run with ``python -m``
WORKER = "flakekit.testing.drill_worker"
PYTHON = sys.executable

#: two worker ids (0 and 1), so drills can force two processes onto one id
TINY_LAYOUT = """
[layouts.tiny]
fields = [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]]
unit = "1ms"
epoch = "2024-01-01T00:00:00Z"
"""


def tiny_layout() -> BitLayout:
    """The ``tiny`` layout as a value: two worker ids (0 and 1)."""
    return BitLayout.from_mapping("tiny", {
        "fields": [["time", 41], ["region", 9], ["worker", 1], ["sequence", 12]],
        "unit": "1ms", "epoch": "2024-01-01T00:00:00Z"})


def write_config(tmp: Path, name: str, allocator_table: str, layout: str = "snowflake") -> Path:
    """``tmp/<name>.toml``: the tiny layout and one snowflake generator ``name`` on the
    allocator given as an inline TOML table."""
    path = tmp / f"{name}.toml"
    path.write_text(TINY_LAYOUT + textwrap.dedent(f"""
        [generators.{name}]
        strategy = "snowflake"
        layout = "{layout}"
        allocator = {allocator_table}
    """))
    return path


def spawn(config: Path, name: str, *args: str, env: dict[str, str] | None = None,
          ) -> subprocess.Popen[str]:
    """The drill worker on ``config``'s generator ``name``, with the drill's host and port
    (stdout and stderr piped, text, unbuffered)."""
    full = {**os.environ, "FLAKEKIT_HOST": DRILL_HOST, "FLAKEKIT_PORT": str(DRILL_PORT),
            "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([PYTHON, "-m", WORKER, str(config), name, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
    """Read lines until one starts with ``prefix`` and return it; an AssertionError with the
    worker's stderr if it ends (or ``timeout`` s pass, checked between lines) first."""
    end = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"no {prefix!r} line from the worker; stderr: {err[-2000:]}")


def parse_ids(text: str) -> list[tuple[int, int]]:
    """``ID <id> <mono_before>`` lines -> ``[(id, mono_before)]``; other lines skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith("ID "):
            _, i, t = line.split()
            out.append((int(i), int(t)))
    return out


def stop(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """End a drill process: SIGCONT (it may be paused), SIGTERM, SIGKILL after ``timeout``."""
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def snowflake_over(allocator: Any, name: str, layout: str | BitLayout = "snowflake", *,
                   clock: Any, events: Any, on_lease_lost: str = "stop") -> Any:
    """A SnowflakeGenerator named ``name`` on ``allocator`` (a layout name or value)."""
    import flakekit
    from flakekit.generators.snowflake import SnowflakeGenerator

    lay = layout if isinstance(layout, BitLayout) else flakekit.layout(layout)
    return SnowflakeGenerator(lay, clock, allocator, name=name, events=events,
                              on_lease_lost=on_lease_lost)


@attrs.frozen
class PausedHolderRun:
    """What :func:`pause_past_the_lease` saw: both leases' fields (``LEASE`` lines split),
    both outputs, and the monotonic instants of the pause, the resume and B's claim."""

    a_lease: list[str]
    b_lease: list[str]
    a_out: str
    b_out: str
    stopped_at: int
    resumed_at: int

    @property
    def claimed_at(self) -> int:
        return int(self.b_lease[3])


def sigstop(pid: int, timeout: float = 10.0) -> int:
    """SIGSTOP ``pid`` and return the monotonic ns once it has really stopped (Linux:
    state ``T`` in /proc). A signal takes effect when the kernel next schedules the
    process, so a time read *before* ``kill`` may precede IDs the process still stamped:
    "nothing issued after the pause" is checked against this time, not that one."""
    import signal

    os.kill(pid, signal.SIGSTOP)
    give_up = time.monotonic() + timeout
    stat = Path(f"/proc/{pid}/stat")
    while stat.exists() and time.monotonic() < give_up:
        state = stat.read_text().rpartition(")")[2].split()[0]
        if state in ("T", "t"):
            break
        time.sleep(0.001)
    return time.monotonic_ns()


def pause_past_the_lease(config: Path, name: str) -> PausedHolderRun:
    """The SIGSTOP drill on worker 1 of the tiny layout (the caller holds worker 0): A
    takes worker 1 and is paused; B (``--retry-exhausted``) waits until it can claim worker
    1 and runs 1.5 s; then A is resumed. Checks what every allocator owes: B got worker 1,
    A refused with ``ERR Lease...`` and issued nothing after its pause, no ID repeats."""
    import signal

    a = spawn(config, name)
    a_lease = read_until(a, "LEASE ").split()
    assert a_lease[1] == "1", a_lease
    time.sleep(0.3)   # some IDs before the pause
    stopped_at = sigstop(a.pid)
    b = spawn(config, name, "--retry-exhausted", "--seconds", "1.5")
    try:
        b_lease = read_until(b, "LEASE ", timeout=30).split()
        b_out = b.communicate(timeout=30)[0]
    finally:
        resumed_at = time.monotonic_ns()
        os.kill(a.pid, signal.SIGCONT)
    a_out = a.communicate(timeout=30)[0]
    run = PausedHolderRun(a_lease, b_lease, a_out, b_out, stopped_at, resumed_at)
    a_ids, b_ids = parse_ids(a_out), parse_ids(b_out)
    assert b_lease[1] == "1" and a_ids and b_ids, (b_lease, a_out[-500:])
    assert "ERR Lease" in a_out, a_out[-500:]
    assert max(t for _, t in a_ids) < stopped_at          # nothing after the resume
    assert all(t < run.claimed_at for _, t in a_ids)      # nothing once B held the id
    ids = [i for i, _ in a_ids + b_ids]
    assert len(ids) == len(set(ids)), "an ID was issued twice"
    err_at = int(a_out.split("ERR ")[1].split()[1])
    print(f"\nSIGSTOP drill: B claimed worker 1 {(run.claimed_at - stopped_at) / 1e9:.2f} s "
          f"after the pause; A refused {(err_at - resumed_at) / 1e6:.1f} ms after SIGCONT; "
          f"{len(a_ids)} + {len(b_ids)} IDs, no duplicate")
    return run


def generator_over(make_allocator: Any, name: str, layout: str | BitLayout = "snowflake", *,
                   clock: Any = None, events: Any = None, on_lease_lost: str = "stop",
                   **settings: Any) -> Any:
    """A SnowflakeGenerator named ``name`` on the allocator
    ``make_allocator(name, clock=..., events=..., **settings)`` makes (a plugin's test
    helper), both on one clock (monotonic by default) and one Events."""
    from flakekit.values.clock import MonotonicClock
    from flakekit.values.events import Events

    clock = clock or MonotonicClock()
    events = events or Events()
    return snowflake_over(make_allocator(name, clock=clock, events=events, **settings), name,
                          layout, clock=clock, events=events, on_lease_lost=on_lease_lost)


@attrs.define(eq=False)
class IssuingThread:
    """A daemon thread calling ``gen.next_id()`` every ``pause_s`` until ``stop()``:
    ``ids`` holds ``(id, monotonic ns before the call)``, ``errors`` ``(monotonic ns
    before, the FlakekitError)``; after an error it rests ``error_pause_s``, and after a
    LeaseLostError it calls ``gen.restart()`` when ``restart_on_lost`` (resting 0.05 s
    if that fails too). The drills' way to watch a generator through a fault."""

    gen: Any
    restart_on_lost: bool = attrs.field(default=False, kw_only=True)
    pause_s: float = attrs.field(default=0.001, kw_only=True)
    error_pause_s: float = attrs.field(default=0.0, kw_only=True)
    ids: list[tuple[int, int]] = attrs.field(factory=list, init=False)
    errors: list[tuple[int, BaseException]] = attrs.field(factory=list, init=False)
    _stop: Any = attrs.field(init=False)
    _thread: Any = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="issuing")

    def _run(self) -> None:
        from flakekit.errors import FlakekitError, LeaseLostError

        while not self._stop.is_set():
            before = time.monotonic_ns()
            try:
                self.ids.append((self.gen.next_id(), before))
            except FlakekitError as exc:
                self.errors.append((before, exc))
                if self.restart_on_lost and isinstance(exc, LeaseLostError):
                    try:
                        self.gen.restart()
                    except FlakekitError:
                        time.sleep(0.05)
                elif self.error_pause_s:
                    time.sleep(self.error_pause_s)
            time.sleep(self.pause_s)

    def start(self) -> IssuingThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def pause_beside(holder: Any, config: Path, name: str) -> PausedHolderRun:
    """:func:`pause_past_the_lease` while ``holder`` (a generator in this process on the
    tiny layout) holds worker 0, so the two drill processes must share worker 1; the
    holder is closed afterwards."""
    holder.start()
    try:
        return pause_past_the_lease(config, name)
    finally:
        holder.close()
