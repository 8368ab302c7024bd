"""Issue 10 item 1: lease mode (the default) survives a blip shorter than its session.

A real generator process (``flakekit.load`` with the defaults, so ``on_lease_lost`` is
the lease mode's default), real ZooKeeper, and a fault: a TCP proxy cut between kazoo
and ZooKeeper, or a paused ensemble leader. Before the fix, SUSPENDED read as a lost
session and the re-acquire hung in ``KazooClient.start()`` holding the keeper's lock:
503 for good, and SIGTERM hung. Asserted: IDs resume, none after the lease deadline
while cut off, none twice, SIGTERM ends the process and releases the id. Speed is never
asserted; the figures are printed (pytest -s).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from zkhelpers import ensemble_pid, ensemble_roles

from flakekit.testing import TcpProxy
from flakekit.testing.drills import spawn, write_config
from flakekit.testing.termination import ended_on_sigterm

pytestmark = pytest.mark.slow


class Lines:
    """Collects a worker's stdout in a thread, so the test can wait for a line."""

    def __init__(self, proc) -> None:
        self.proc, self.lines = proc, []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, test, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(test(line) for line in list(self.lines)):
                return True
            if self.proc.poll() is not None and not self._thread.is_alive():
                return False
            time.sleep(0.05)
        return False

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _blip(tmp_path, zk, ns, hosts: str, fault, heal, outage_s: float, session: str = "",
          *, cut_off: bool = True):
    """Run the worker through one fault; returns the figures (and asserts safety).
    ``cut_off``: nothing can reach ZooKeeper during the fault (no renewal can succeed)."""
    extra = f', session_timeout = "{session}"' if session else ""
    cfg = write_config(tmp_path, ns, f'{{ type = "zookeeper", hosts = "{hosts}"{extra} }}')
    proc = spawn(cfg, ns, "--tolerate", "--pace", "1")
    out = Lines(proc)
    try:
        assert out.wait_for(lambda x: x.startswith("LEASE "), 30), proc.stderr.read()[-2000:]
        lease = next(x for x in out.lines if x.startswith("LEASE ")).split()
        lease_ns = int(lease[4]) * 1_000_000
        time.sleep(1.0)
        cut_at = time.monotonic_ns()
        fault()
        try:
            time.sleep(outage_s)
        finally:
            heal()
        healed_at = time.monotonic_ns()
        # resumed: a renewal confirmed after the fault (then an ID under it)
        resumed = out.wait_for(lambda x: x.startswith("RENEW ")
                               and int(x.split()[2]) - lease_ns >= healed_at, 60)
        term_at = time.monotonic_ns()
        if not ended_on_sigterm(proc, 30):
            raise AssertionError("SIGTERM did not end the generator process within 30 s "
                                 "(close() blocked)")
        out.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.lines
    ids = [(int(x.split()[1]), int(x.split()[2])) for x in lines if x.startswith("ID ")]
    renewals = [(int(x.split()[1]), int(x.split()[2])) for x in lines
                if x.startswith("RENEW ")]
    errors = [x for x in lines if x.startswith("ERR ")]
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    (tmp_path / "worker.err").write_text(stderr)
    info = f"errors: {errors[:5]}; stderr ({tmp_path / 'worker.err'}): {stderr[-1500:]}"
    assert resumed, f"IDs never resumed after the fault ended; {info}"
    assert any(x.startswith("CLOSED ") for x in lines), info
    # no ID twice
    values = [i for i, _ in ids]
    assert len(values) == len(set(values))
    # no renewal can be confirmed while cut off, and no ID was issued after the
    # deadline the last confirmed contact before the cut gave
    deadlines = [int(lease[5])] + [d for _, d in renewals]
    confirmed = [d - lease_ns for d in deadlines]
    before = max(d for d, t0 in zip(deadlines, confirmed, strict=True) if t0 < cut_at)
    if cut_off:
        assert not [t0 for t0 in confirmed if cut_at <= t0 < healed_at], info
        during = [t for _, t in ids if cut_at <= t < healed_at]
        assert all(t <= before for t in during), info
    # SIGTERM released the id the process held last
    worker = renewals[-1][0] if renewals else int(lease[1])
    node = json.loads(zk.get(f"/flakekit/{ns}/workers/{worker}")[0])
    assert node["state"] == "released", (node, info)
    closed_at = int(next(x for x in lines if x.startswith("CLOSED ")).split()[1])
    after = [t for _, t in ids if t >= healed_at]
    gap = [t for _, t in ids if t >= cut_at]
    stalls = [(b - a) for a, b in zip(gap, gap[1:], strict=False)]
    renewed = min((t0 for t0 in confirmed if t0 >= healed_at), default=None)
    return {
        "worker": (int(lease[1]), worker), "deadline_in_cut": before < healed_at,
        "ids_stopped_s": max(stalls, default=0) / 1e9,
        "first_id_after_heal_ms": (min(after) - healed_at) / 1e6,
        "renewed_after_heal_ms": None if renewed is None else (renewed - healed_at) / 1e6,
        "term_to_closed_ms": (closed_at - term_at) / 1e6,
        "errors": len(errors), "ids": len(ids),
    }


def _proxy(zk_hosts: str) -> TcpProxy:
    return TcpProxy.in_front_of(zk_hosts)


@pytest.mark.parametrize(("outage", "session"), [(1.0, "2s"), (4.0, ""), (2.6, "3s")],
                         ids=["1s-cut-2s-session", "4s-cut-default-session",
                              "cut-past-the-lease"])
def test_cut_shorter_than_the_session_resumes(tmp_path, zk, zk_hosts, ns, outage, session):
    """A cut shorter than the session: IDs resume, SIGTERM closes promptly and releases
    the id. Shorter than the lease, the same session comes back (the same worker id);
    2.6 s with a 3 s session outlasts the lease (2.4 s): IDs stop at its deadline,
    then resume (the session may or may not have survived on the server)."""
    proxy = _proxy(zk_hosts)
    try:
        fig = _blip(tmp_path, zk, ns, f"127.0.0.1:{proxy.port}", proxy.cut, proxy.restore,
                    outage, session)
    finally:
        proxy.stop()
    print(f"\n{outage:g} s cut, session {session or '10s (default)'}: {fig}")
    if session == "3s":
        assert fig["deadline_in_cut"], fig   # the generator did stop during the cut
    else:
        assert fig["worker"][0] == fig["worker"][1]  # the session survived: the same id


def test_paused_leader_resumes(tmp_path, zk, zk_ensemble, ns):
    """SIGSTOP the ensemble's leader under a client on a follower (2 s session, default
    on_lease_lost): IDs resume once a new leader serves; SIGTERM closes promptly."""
    hosts, svc = zk_ensemble
    leader, follower = ensemble_roles(hosts)
    pid = ensemble_pid(svc, leader)
    from kazoo.client import KazooClient

    ens = KazooClient(hosts=f"127.0.0.1:{follower}", timeout=5)

    def pause() -> None:
        os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        os.kill(pid, signal.SIGCONT)

    try:
        ens.start(timeout=20)
        fig = _blip(tmp_path, ens, ns, f"127.0.0.1:{follower}", pause, resume, 5.0, "2s",
                    cut_off=False)
    finally:
        os.kill(pid, signal.SIGCONT)
        ens.stop()
        ens.close()
    print(f"\npaused leader 5 s, session 2s: {fig}")
