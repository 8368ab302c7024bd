"""Issue 10 item 2: leaf mode never lets two live processes share an identity.

Each drill runs real generator processes with one ip:port (FLAKEKIT_HOST/FLAKEKIT_PORT,
the default settings otherwise) against real ZooKeeper, through one of the four ways the
old liveness guess was bypassed, and checks that the second process is refused and that
no ID was issued twice. The host lock (a flock beside the cache file) stops all four on
one host; the ephemeral ``live/`` znode stops a process on another host; the version
check on reports stops a process whose report was overwritten.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from zkhelpers import generator

from flakekit.errors import LeaseLostError
from flakekit.testing import free_port
from flakekit.testing.drills import PYTHON, parse_ids, read_until, sigstop, spawn, write_config
from flakekit.testing.refusals import assert_refused_and_close
from flakekit.testing.termination import ended_on_sigterm

pytestmark = pytest.mark.slow

DOWN = "127.0.0.1:1"

#: the ``flakekit`` command of this interpreter's environment
FLAKEKIT = os.path.join(os.path.dirname(PYTHON), "flakekit")


def _leaf_cfg(tmp_path, ns, hosts, cache, name="cfg"):
    table = (f'{{ type = "zookeeper", mode = "leaf", hosts = "{hosts}", '
             f'cache_dir = "{cache}" }}')
    sub = tmp_path / name
    sub.mkdir(exist_ok=True)
    return write_config(sub, ns, table)


def _serve_cfg(tmp_path: Path, ns: str, hosts: str, extra: str = "") -> Path:
    """``serve.toml``: generator ``ns`` in leaf mode, its cache in ``tmp_path/cache``;
    ``extra`` goes into the allocator table."""
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[generators.{ns}]\nstrategy = "snowflake"\nallocator = {{ type = '
                   f'"zookeeper", mode = "leaf", hosts = "{hosts}", cache_dir = '
                   f'"{tmp_path / "cache"}"{extra} }}\n')
    return cfg


def _refused(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode != 0 and "LEASE " not in out, (out[-500:], err[-2000:])
    return err


def _stop(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    return out


def _no_duplicates(*outs: str) -> int:
    ids = [i for out in outs for i, _ in parse_ids(out)]
    assert len(ids) == len(set(ids)), "an ID was issued twice"
    return len(ids)


def _first_went_on(first: subprocess.Popen[str], refusal: str, says: str) -> int:
    """The second process's refusal ``says`` why; the first stops cleanly with no ID
    issued twice (how many it issued)."""
    assert says in refusal, refusal
    return _no_duplicates(_stop(first))


def test_zookeeper_unreachable_at_the_second_start(tmp_path, zk_hosts, ns):
    """A live process; a second one with the same identity cannot reach ZooKeeper and
    would start from the shared cache file: refused by the host lock."""
    cache = tmp_path / "cache"
    a = spawn(_leaf_cfg(tmp_path, ns, zk_hosts, cache, "up"), ns, "--seconds", "4")
    read_until(a, "LEASE ")
    b = spawn(_leaf_cfg(tmp_path, ns, DOWN, cache, "down"), ns, "--seconds", "1")
    err = _refused(b)
    n = _first_went_on(a, err, "another live process on this host uses identity 10.9.8.7:8080")
    print(f"\nZooKeeper unreachable at the second start: refused; {n} IDs from the first")


def test_first_process_paused_past_two_report_intervals(tmp_path, zk_hosts, ns):
    """The first process is paused for longer than two report intervals (the old check
    took its report's age for death): the second is refused, the first goes on."""
    cfg = _leaf_cfg(tmp_path, ns, zk_hosts, tmp_path / "cache")
    a = spawn(cfg, ns, "--seconds", "10")
    read_until(a, "LEASE ")
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(7.0)   # 2 x the default report interval (3 s) + 1 s
        b = spawn(cfg, ns, "--seconds", "1")
        err = _refused(b)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    n = _first_went_on(a, err, "another live process")
    print(f"\npaused first process: the second refused; {n} IDs from the first")


def test_both_starting_at_once_after_a_clean_stop(tmp_path, zk_hosts, ns):
    """A clean stop (the old check skipped liveness then), then two processes started at
    the same moment, three times: each time exactly one runs, and no ID repeats."""
    cfg = _leaf_cfg(tmp_path, ns, zk_hosts, tmp_path / "cache")
    outs = []
    for _ in range(3):
        outs.append(_stop(spawn(cfg, ns, "--seconds", "0.2")))   # a clean stop
        at = str(time.monotonic_ns() + 3_000_000_000)   # after both have loaded
        pair = [spawn(cfg, ns, "--seconds", "1.5", "--start-at", at) for _ in range(2)]
        results = [p.communicate(timeout=60) for p in pair]
        ran = [out for p, (out, _) in zip(pair, results, strict=True)
               if p.returncode == 0 and "LEASE " in out]
        assert len(ran) == 1, [(p.returncode, err[-800:]) for p, (_, err)
                               in zip(pair, results, strict=True)]
        loser = next(err for p, (_, err) in zip(pair, results, strict=True)
                     if p.returncode != 0)
        assert "another live process" in loser, loser
        outs += ran
    n = _no_duplicates(*outs)
    print(f"\nstarted at once (x3): one ran each time; {n} IDs, no duplicate")


def test_another_host_is_refused_by_the_live_znode(tmp_path, zk_hosts, ns):
    """A process elsewhere with the same ip:port (its own cache directory, so not this
    host's lock) is refused by the first one's ephemeral ``live/`` znode."""
    a = spawn(_leaf_cfg(tmp_path, ns, zk_hosts, tmp_path / "host-a", "a"), ns,
              "--seconds", "4")
    read_until(a, "LEASE ")
    b = spawn(_leaf_cfg(tmp_path, ns, zk_hosts, tmp_path / "host-b", "b"), ns,
              "--seconds", "1")
    err = _refused(b)
    _first_went_on(a, err, f"/snowflake/{ns}/live/10.9.8.7:8080 is held by ZooKeeper session")


def test_an_overwritten_report_stops_the_loser(zk, tmp_path, ns):
    """Someone else reported to our node (the version moved): this process stops issuing
    at its next report, with an alert, instead of overwriting the other one."""
    gen = generator(ns, mode="leaf", cache_dir=str(tmp_path), report_interval="0.2s")
    gen.start()
    alloc = gen.keeper.allocator
    gen.next_id()
    zk.set(alloc.node, json.dumps({"ip": "10.9.8.7", "port": "8080",
                                   "timestamp": int(time.time() * 1000)}).encode())
    deadline = time.monotonic() + 10   # the keeper's loss (not just the allocator's
    while gen.keeper.lost is None and time.monotonic() < deadline:   # finding) revokes
        time.sleep(0.05)
    assert alloc.lost is not None and "written by another process" in alloc.lost
    assert gen.keeper.lost is not None and "written by another process" in gen.keeper.lost
    assert_refused_and_close(gen, LeaseLostError, gen.next_id)


def test_second_server_with_reuseport_is_refused(tmp_path, zk_hosts, ns):
    """``FLAKEKIT_SERVER_REUSEPORT=1`` lets a second ``flakekit serve`` bind the same port;
    its worker processes have the first one's identities (ip:port.N), so the host lock
    refuses them and the second server does not start, even while the first server's
    processes are paused (no fresh report). Reports every 0.5 s (the paused-past-two-
    intervals property keeps its default-settings drill above)."""
    cfg = _serve_cfg(tmp_path, ns, zk_hosts, ', report_interval = "0.5s"')
    port = free_port()
    env = {**os.environ, "FLAKEKIT_SERVER_REUSEPORT": "1"}
    env.pop("FLAKEKIT_PORT", None)
    cmd = [FLAKEKIT, "serve", "--port", str(port), "--workers", "2", "--config", str(cfg)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert first.stdout is not None
        banner = first.stdout.readline()
        assert "listening" in banner, first.stderr.read() if first.poll() is not None else ""
        # the first server's processes paused past two report intervals (the old
        # liveness guess then let the second server's processes take the same ids)
        children = [int(c) for c in Path(f"/proc/{first.pid}/task/{first.pid}/children")
                    .read_text().split()]
        assert len(children) == 2, children
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)   # 4 report intervals: past two, with the default drill's margin
            second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)
            try:
                out, err = second.communicate(timeout=90)
            finally:
                if second.poll() is None:
                    second.send_signal(signal.SIGTERM)
                    second.communicate(timeout=30)
        finally:
            for pid in children:
                os.kill(pid, signal.SIGCONT)
        assert second.returncode != 0 and "listening" not in out, (out, err[-2000:])
        assert "another live process on this host" in err, err[-2000:]
        assert first.poll() is None   # the first server is unharmed
    finally:
        ended_on_sigterm(first, 30, first.communicate)


def test_port_0_is_refused_in_leaf_mode(tmp_path, ns):
    """Identity port 0 (no FLAKEKIT_PORT, no `port`): refused at start with one line
    naming the field, before any znode is written (behind `flakekit serve --port 0` each
    start would otherwise burn a new worker id)."""
    from zkhelpers import allocator

    from flakekit.errors import ConfigError
    from flakekit.leases.lease import LeaseRequest

    alloc = allocator(ns, mode="leaf", port=0, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"generators\.t\.allocator\.port: .*FLAKEKIT_PORT"):
        alloc.acquire(LeaseRequest("t", 1023, "10.9.8.7", 0))
    alloc.close()


def test_serve_port_0_is_refused_in_leaf_mode(tmp_path, zk_hosts, ns):
    """``flakekit serve --port 0`` with a leaf-mode generator: the identity keeps port 0
    (a random port is no identity), so the allocator refuses it in one line instead of
    registering a new ip:port (a new worker id) on every restart."""
    cfg = _serve_cfg(tmp_path, ns, zk_hosts)
    env = {k: v for k, v in os.environ.items() if k != "FLAKEKIT_PORT"}
    proc = subprocess.run([FLAKEKIT, "serve", "--port", "0", "--config", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=90)
    assert proc.returncode != 0 and "listening" not in proc.stdout, (proc.stdout, proc.stderr)
    assert "allocator.port" in proc.stderr and "FLAKEKIT_PORT" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_paused_past_its_session_issues_nothing_on_resume(tmp_path, zk_hosts, ns):
    """A process paused past its session (its live/ znode gone) while one on another
    host takes the identity over: on SIGCONT the paused one issues nothing (its deadline,
    session - safety after its last report, has passed) and stops; no ID repeats."""
    def cfg(name):
        table = (f'{{ type = "zookeeper", mode = "leaf", hosts = "{zk_hosts}", '
                 f'session_timeout = "2s", cache_dir = "{tmp_path / name}" }}')
        (tmp_path / f"cfg-{name}").mkdir()
        return write_config(tmp_path / f"cfg-{name}", ns, table)

    a = spawn(cfg("host-a"), ns, "--seconds", "30")
    read_until(a, "LEASE ")
    time.sleep(0.5)
    stopped_at = sigstop(a.pid)   # once really stopped: IDs before it are before the pause
    try:
        time.sleep(4.0)   # past the 2 s session: the server drops A's live/ node
        b = spawn(cfg("host-b"), ns, "--retry-exhausted", "--seconds", "3")
        read_until(b, "LEASE ", timeout=60)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_out, a_err = a.communicate(timeout=60)
    b_out = _stop(b)
    a_ids = parse_ids(a_out)
    assert a_ids and parse_ids(b_out)
    assert "ERR " in a_out, a_err[-1500:]
    assert max(t for _, t in a_ids) < stopped_at   # nothing after SIGCONT
    n = _no_duplicates(a_out, b_out)
    print(f"\npaused past the session: {a_out.split('ERR ')[1].split()[0]} on resume; "
          f"{n} IDs, no duplicate")
