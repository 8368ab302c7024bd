"""A worker process that keeps failing to start is visible (issue 9 item 4, issue 10 item 6).

`flakekit serve --workers 2` on a layout with one worker bit (two worker ids, both leased
by the two processes). Process 1 is killed with SIGKILL, so its lease stays held until the
reclaim tiers free it (1 h by default): every restart fails with "all 2 worker ids are
held". Meanwhile process 0 serves, and its /ready must be 503, its /metrics and the
monitor's status must show 2 expected, 1 running and the restarts.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from server_testing import CHROMIUM, Server, chromium, ok, ok_json, run_cli

CONFIG = """\
[backends.main]
url = "sqlite:///{db}"

[layouts.two-workers]
fields = [["time", 41], ["worker", 1], ["sequence", 21]]
epoch = "2024-01-01T00:00:00Z"

[generators.orders]
strategy = "snowflake"
layout = "two-workers"
allocator = {{ type = "sql", backend = "main" }}
"""


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def _two_processes(tmp_path) -> Server:
    """`serve --workers 2` on the two-worker-id layout (SQLite), once both processes have
    published their first snapshot and the server is ready."""
    config = tmp_path / "flakekit.toml"
    config.write_text(CONFIG.format(db=tmp_path / "ids.db"))
    assert run_cli("db", "init", "--config", str(config)).returncode == 0
    server = Server(config, "--workers", "2", tmp=tmp_path)
    deadline = time.monotonic() + 30
    while True:
        status, data = server.json("/api/v1/status")
        if status == 200 and len(data["processes"]) == 2 and data["ready"]:
            return server
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise AssertionError(data)
        time.sleep(0.2)


def _pids(server: Server) -> dict[int, int]:
    """process index -> pid"""
    return {p["process"]: p["pid"] for p in ok_json(server, "/api/v1/status")["processes"]}


def test_failing_worker_turns_ready_503_and_shows_in_metrics(tmp_path):
    server = _two_processes(tmp_path)
    try:
        pids = _pids(server)
        data = ok_json(server, "/api/v1/status")
        assert data["supervision"]["expected"] == 2 and data["supervision"]["running"] == 2
        assert _metric(ok(server, "/metrics").decode(), "flakekit_server_processes_running") == 2

        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            status, ready = server.json("/ready")
            text = " ".join(ready["problems"])
            if status == 503 and "process 1 is not running" in text and "worker ids" in text:
                break
            assert time.monotonic() < deadline, ready
            time.sleep(0.3)
        assert ready["expected"] == 2 and ready["running"] == 1
        status, _, body = server.get("/api/snowflake/get/orders")
        assert status == 200 and body.isdigit()  # process 0 keeps serving

        metrics = ok(server, "/metrics").decode()
        assert _metric(metrics, "flakekit_server_processes_expected") == 2
        assert _metric(metrics, "flakekit_server_processes_running") == 1
        assert _metric(metrics, "flakekit_server_process_running", '{process="1"}') == 0
        assert _metric(metrics, "flakekit_server_process_restarts_total", '{process="1"}') >= 1
        assert _metric(metrics, "flakekit_server_ready", '{process="0"}') == 1

        data = ok_json(server, "/api/v1/status")  # what the monitor page shows
        sup = data["supervision"]
        assert not data["ready"] and sup["running"] == 1 and sup["restarts"] >= 1
        proc1 = sup["processes"][1]
        assert not proc1["running"] and "worker ids" in proc1["last_error"]
        if CHROMIUM is not None:  # what a person sees (chromium: scripts/install-browser.sh)
            result = chromium(tmp_path, "--dump-dom", f"http://127.0.0.1:{server.port}/")
            assert result.returncode == 0, result.stderr[-2000:]
            dom = result.stdout
            assert 'class="badge bad">not ready<' in dom
            assert re.search(r"1 of 2 process\(es\) running, [1-9]\d* restart\(s\)",
                             dom), dom[:3000]
            assert "process 1 is not running" in dom
    finally:
        assert server.stop() == 0, server.log()


def test_workers_stop_and_release_when_the_supervisor_is_killed(tmp_path):
    """SIGKILL to the supervisor (an OOM kill, a `kill -9` by hand): its processes stop as on
    SIGTERM (runner._watch_parent) and give their worker ids back, instead of serving on
    unsupervised and out of the service manager's reach."""
    import sqlite3

    server = _two_processes(tmp_path)
    try:
        pids = list(_pids(server).values())
        assert int(ok(server, "/api/snowflake/get/orders")) > 0
        server.proc.kill()
        server.proc.wait(10)
        for pid in pids:
            deadline = time.monotonic() + 20
            while _alive(pid):
                assert time.monotonic() < deadline, f"process {pid} outlived its supervisor"
                time.sleep(0.1)
        with sqlite3.connect(tmp_path / "ids.db") as conn:
            held = conn.execute("SELECT machine_id, holder FROM system_nodes").fetchall()
        assert len(held) == 2 and all(holder is None for _, holder in held), held
    finally:
        server.stop(signal.SIGKILL)


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a reaped orphan's zombie is gone soon after)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
