"""Benchmark `flakekit serve` with wrk on loopback, against the same service on uvicorn.

    .venv/bin/python benchmarks/bench_server.py [--workers 2] [--duration 10] \\
        [--stacks flakekit,uvicorn] [--json]

``--json`` prints one JSON document (each stack's numbers, the settings, and the text table
under ``table``) instead of the table; ``run_all.py`` reads issue 24's figures from it.

For each stack it starts the server (N processes, each with its own worker lease from a
SQLite file), then runs wrk (Debian's ``wrk``; ``apt-get install wrk``):

* single IDs at full speed: ``GET /api/snowflake/get/orders`` (Leaf's endpoint), req/s;
* single IDs paced at ``--rate`` (default 25,000 req/s) for p50/p99/p99.9 at that load
  (a Lua ``delay()`` per connection; wrk's own percentiles, so coordinated omission is
  not corrected for);
* batches: ``GET /api/v1/next/batches?count=1000``, req/s x 1000 = IDs/s. ``batches`` is a
  snowflake generator with ``workers = --batch-workers`` (default 4) worker ids per server
  process, so its cap (4,096,000 IDs/s per id, 16.4M per process) is above what the
  transport can carry: the row measures the server, not one worker id's cap. Both stacks
  serve the same config.

The uvicorn stack serves the very same :class:`IdService` through a minimal ASGI app
(uvicorn with httptools and uvloop, ``--workers N``), so the difference is the transport.
Every number printed comes from wrk in this run.

``--mixed`` (no wrk needed) measures what a large batch costs the single-ID requests
beside it: one server process; single IDs paced at ``--mixed-rate`` from threads of this
process on keep-alive connections, while ``--mixed-batchers`` client processes ask for
100,000 IDs at a time; the single-ID p50/p99/p99.9 with the batches made on the event loop
in one piece (``before``, ``--offload-count 0``), drawn in a worker thread and encoded on
the loop in slices (``after``, the default), and alone::

    .venv/bin/python benchmarks/bench_server.py --mixed --duration 10
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

from _common import add_numbers, load_average, percentile_ms

HERE = Path(__file__).resolve().parent
PY = sys.executable
FLAKEKIT = str(Path(PY).with_name("flakekit"))

LUA = textwrap.dedent("""
    local d = tonumber(os.getenv("FK_DELAY_MS") or "0")
    if d > 0 then delay = function() return d end end
    done = function(summary, latency, requests)
      local e = summary.errors
      io.write(string.format("FKSTAT %d %d %d %d %d %d %d %d\\n",
        summary.requests, summary.duration,
        e.connect + e.read + e.write + e.timeout, e.status,
        latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
    end
""")


# -- the uvicorn variant: the same IdService behind a minimal ASGI app ---------------------------
def make_asgi_app():  # uvicorn --factory bench_server:make_asgi_app
    from flakekit_server.app import IdService, ServerOptions

    import flakekit

    state: dict = {}

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    kit = flakekit.load(os.environ["FK_BENCH_CONFIG"]).start()
                    state["service"] = IdService(kit, ServerOptions(max_count=100_000),
                                                 stack="uvicorn")
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    state["service"].kit.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        service = state["service"]
        url = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        auth = dict(scope["headers"]).get(b"authorization")
        status, ctype, body, _headers, _route = service.handle(scope["method"].encode(), url, auth)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    return app


# -- running ---------------------------------------------------------------------------------
def wait_up(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/snowflake/get/orders",
                                        timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"server on port {port} did not come up")


def start(stack: str, config: Path, port: int, workers: int, log) -> subprocess.Popen:
    env = {**os.environ, "FK_BENCH_CONFIG": str(config)}
    if stack == "flakekit":
        cmd = [FLAKEKIT, "serve", "--config", str(config), "--port", str(port),
               "--workers", str(workers)]
    elif stack == "uvicorn":
        cmd = [PY, "-m", "uvicorn", "--factory", "bench_server:make_asgi_app", "--app-dir",
               str(HERE),
               "--port", str(port), "--workers", str(workers), "--http", "httptools",
               "--loop", "uvloop", "--no-access-log", "--log-level", "warning"]
    else:
        raise SystemExit(f"unknown stack {stack!r}")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    wait_up(port)
    return proc


def wrk(url: str, *, threads: int, connections: int, duration: float, script: Path,
        delay_ms: int = 0) -> dict:
    env = {**os.environ, "FK_DELAY_MS": str(delay_ms)}
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "-s", str(script), url],
        capture_output=True, text=True, env=env, timeout=duration + 60,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("FKSTAT")), None)
    if line is None:
        raise SystemExit(f"wrk gave no statistics for {url} (exit status {done.returncode}):\n"
                         f"{done.stdout[-1000:]}{done.stderr[-1000:]}")
    requests, duration_us, errors, non2xx, p50, p99, p999, top = map(int, line.split()[1:])
    return {"requests": requests, "rps": requests / (duration_us / 1e6), "errors": errors,
            "non2xx": non2xx, "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3, "p999_ms": p999 / 1e3,
            "max_ms": top / 1e3}


def best_of(repeats: int, run) -> dict:
    """The run with the most requests per second of ``repeats``: a neighbour on a shared
    machine only ever takes throughput away. (The paced run is one run: its tail is what
    it is.)"""
    return max((run() for _ in range(max(1, repeats))), key=lambda r: r["rps"])


def bench(stack: str, args, config: Path, script: Path, log) -> dict:
    port = args.port
    proc = start(stack, config, port, args.workers, log)
    base = f"http://127.0.0.1:{port}"
    try:
        wrk(base + "/api/snowflake/get/orders", threads=1, connections=16, duration=2,
            script=script)  # warm-up
        full = best_of(args.repeats, lambda: wrk(
            base + "/api/snowflake/get/orders", threads=args.threads,
            connections=args.connections, duration=args.duration, script=script))
        delay = 2
        conns = math.ceil(args.rate * (delay + 0.3) / 1000)
        for _ in range(2):  # calibrate the connection count to reach the rate
            trial = wrk(base + "/api/snowflake/get/orders", threads=args.threads,
                        connections=conns, duration=2, script=script, delay_ms=delay)
            if trial["rps"] >= args.rate:
                break
            conns = min(math.ceil(conns * args.rate * 1.03 / trial["rps"]), 4 * conns)
        paced = wrk(base + "/api/snowflake/get/orders", threads=args.threads, connections=conns,
                    duration=args.duration, script=script, delay_ms=delay)
        batch = best_of(args.repeats, lambda: wrk(
            base + f"/api/v1/next/batches?count={args.batch}", threads=args.threads,
            connections=args.batch_connections, duration=args.duration, script=script))
        batch["ids_per_s"] = batch["rps"] * args.batch
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    return {"stack": stack, "full": full, "paced": paced, "paced_connections": conns,
            "batch": batch}


# -- --mixed: single IDs beside 100k batches, batches on the loop vs in a thread ----------------
def _timed_get(conn: http.client.HTTPConnection, path: str, out: list[float], what: str) -> None:
    """One GET on ``conn``, its seconds appended to ``out``; not 200: exit."""
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    out.append(time.perf_counter() - t0)
    if resp.status != 200:
        raise SystemExit(f"{what} request answered {resp.status}")


def _single_client(port: int, interval: float, stop: threading.Event, out: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    next_at = time.perf_counter()
    while not stop.is_set():
        _timed_get(conn, "/api/snowflake/get/orders", out, "single-ID")
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.perf_counter()


def _batch_client(port: int, count: int, until: float, queue) -> None:
    """In a process of its own (the single-ID clients' GIL is not shared): asks for
    ``count`` IDs at a time until ``until`` (perf_counter), reports the latencies."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out: list[float] = []
    while time.perf_counter() < until:
        _timed_get(conn, f"/api/v1/next/orders?count={count}", out, "batch")
    queue.put(out)


def _pct(values: list[float], q: float) -> float:
    return percentile_ms(values, q, empty=float("nan"))


def mixed_run(config: Path, port: int, offload: int | None, args, log, batchers: int,
              script: Path | None) -> dict:
    env = {**os.environ}
    cmd = [FLAKEKIT, "serve", "--config", str(config), "--port", str(port),
           "--max-count", str(args.mixed_batch)]
    if offload is not None:
        cmd += ["--offload-count", str(offload)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        wait_up(port)
        import multiprocessing

        ctx = multiprocessing.get_context("fork")   # before any client thread starts
        queue = ctx.Queue()
        until = time.perf_counter() + 1.0 + args.duration
        procs = [ctx.Process(target=_batch_client, args=(port, args.mixed_batch, until, queue))
                 for _ in range(batchers)]
        for p in procs:
            p.start()
        interval = args.mixed_clients / args.mixed_rate
        if script is not None:   # wrk: a C client, so the client's own GIL is not measured
            time.sleep(1.0)                   # warm-up, not counted
            got = wrk(f"http://127.0.0.1:{port}/api/snowflake/get/orders", threads=1,
                      connections=args.mixed_clients, duration=args.duration, script=script,
                      delay_ms=round(interval * 1e3))
            single = {"singles": got["requests"], "rps": got["rps"], "p50_ms": got["p50_ms"],
                      "p99_ms": got["p99_ms"], "p999_ms": got["p999_ms"],
                      "max_ms": got["max_ms"]}
        else:
            stop = threading.Event()
            singles: list[list[float]] = [[] for _ in range(args.mixed_clients)]
            threads = [threading.Thread(target=_single_client, args=(port, interval, stop, out),
                                        daemon=True) for out in singles]
            for t in threads:
                t.start()
            time.sleep(1.0)                   # warm-up, not counted
            for out in singles:
                out.clear()
            time.sleep(args.duration)
            stop.set()
            for t in threads:
                t.join(60)
            lat = [x for out in singles for x in out]
            single = {"singles": len(lat), "rps": len(lat) / args.duration,
                      "p50_ms": _pct(lat, 0.50), "p99_ms": _pct(lat, 0.99),
                      "p999_ms": _pct(lat, 0.999),
                      "max_ms": max(lat) * 1e3 if lat else float("nan")}
        blat = [x for _ in procs for x in queue.get(timeout=120)]
        for p in procs:
            p.join(30)
        return {**single, "batches": len(blat), "batch_p50_ms": _pct(blat, 0.50)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def mixed(args, config: Path, log) -> None:
    runs = [("alone", None, 0), ("before", 0, args.mixed_batchers),
            ("after", None, args.mixed_batchers)]
    script = None
    if shutil.which("wrk") is not None:
        script = config.with_name("stats.lua")
        script.write_text(LUA)
    results = [(name, mixed_run(config, args.port, offload, args, log, batchers, script))
               for name, offload, batchers in runs]
    cores = len(os.sched_getaffinity(0))
    client = "wrk with a think time of" if script else "Python threads paced at"
    lines = [
        f"single IDs from {client} {args.mixed_clients / args.mixed_rate * 1e3:g} ms per "
        f"connection (about {args.mixed_rate} req/s over {args.mixed_clients} connections), "
        f"beside {args.mixed_batchers} client(s) asking for {args.mixed_batch:,} IDs at a time; "
        f"1 server process, {cores} cores, {args.duration:g} s per run",
        f"{'run':<8} {'batches':<22} {'singles/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p99.9 ms':>8} {'max ms':>7} | {'batches':>7} {'batch p50 ms':>12}"]
    label = {"alone": "none", "before": "on the loop, whole", "after": "off the loop, sliced"}
    for name, r in results:
        lines.append(f"{name:<8} {label[name]:<22} {r['rps']:>9,.0f} {r['p50_ms']:>7.2f} "
                     f"{r['p99_ms']:>7.2f} {r['p999_ms']:>8.2f} {r['max_ms']:>7.1f} | "
                     f"{r['batches']:>7} {r['batch_p50_ms']:>12.1f}")
    text = "\n".join(lines)
    print(json.dumps({"runs": dict(results), "table": text}, indent=2) if args.json else text)


def server_table(results: list[dict], args, load_before: str) -> str:
    """The text table of a run: one line per stack, then the flakekit/uvicorn ratios."""
    cores = len(os.sched_getaffinity(0))
    cap = args.workers * args.batch_workers * 4_096_000
    lines = [
        f"flakekit-server benchmark: {args.workers} server processes, {cores} cores, "
        f"wrk -t{args.threads}, {args.duration:g} s per run"
        + (f" (full speed and batches: best of {args.repeats})" if args.repeats > 1 else "")
        + ", loopback; load average "
        f"{load_before} before, {load_average()} after; batch generator cap "
        f"{cap / 1e6:.1f}M IDs/s ({args.batch_workers} worker ids per process)",
        f"{'stack':<10} {'single req/s':>13} {'p99.9 ms':>9} | paced {args.rate} req/s: "
        f"{'achieved':>9} {'p50 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} {'max ms':>7} | "
        f"batch x{args.batch}: {'IDs/s':>11} {'p99 ms':>7}"]
    for r in results:
        f, p, b = r["full"], r["paced"], r["batch"]
        lines.append(f"{r['stack']:<10} {f['rps']:>13,.0f} {f['p999_ms']:>9.2f} | "
                     f"{'':>{len(str(args.rate)) + 13}}{p['rps']:>9,.0f} {p['p50_ms']:>7.2f} "
                     f"{p['p99_ms']:>7.2f} {p['p999_ms']:>8.2f} {p['max_ms']:>7.1f} | "
                     f"{'':>9}{b['ids_per_s']:>11,.0f} {b['p99_ms']:>7.2f}")
        bad = sum(x["errors"] + x["non2xx"] for x in (f, p, b))
        if bad:
            lines.append(f"  {r['stack']}: {bad} errors or non-2xx answers")
    if len(results) > 1:
        ratio = results[0]["full"]["rps"] / results[1]["full"]["rps"]
        batches = results[0]["batch"]["ids_per_s"] / results[1]["batch"]["ids_per_s"]
        lines.append(f"{results[0]['stack']} / {results[1]['stack']} single-ID throughput: "
                     f"{ratio:.2f}x; batches: {batches:.2f}x")
    return "\n".join(lines)


def server_json(results: list[dict], args, load_before: str) -> dict:
    """``--json``: the stacks' numbers, the settings and the text table under "table"."""
    return {"stacks": results, "workers": args.workers, "duration": args.duration,
            "repeats": args.repeats,
            "rate": args.rate, "batch": args.batch, "batch_workers": args.batch_workers,
            "connections": args.connections, "load_before": load_before,
            "table": server_table(results, args, load_before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="server processes (default 2)")
    parser.add_argument("--duration", type=float, default=10, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=1,
                        help="full-speed and batch runs per stack, the best kept (the paced "
                             "run is one run)")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections, full speed")
    parser.add_argument("--batch-connections", type=int, default=8)
    parser.add_argument("--rate", type=int, default=25_000, help="paced single-ID load, req/s")
    parser.add_argument("--batch", type=int, default=1000, help="IDs per batch request")
    parser.add_argument("--batch-workers", type=int, default=4,
                        help="worker ids of the batch generator per server process (default 4)")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--stacks", default="flakekit,uvicorn")
    parser.add_argument("--json", action="store_true",
                        help="print JSON instead (the text table under 'table')")
    parser.add_argument("--mixed", action="store_true",
                        help="single-ID latency beside 100k batches, before/after offloading")
    add_numbers(parser, {"mixed_rate": "paced single IDs, req/s"}, mixed_rate=2000,
                mixed_clients=8, mixed_batchers=2, mixed_batch=100_000)
    args = parser.parse_args()
    if args.mixed:
        tmp = Path(tempfile.mkdtemp(prefix="fk-bench-server-"))
        try:
            config = tmp / "flakekit.toml"
            config.write_text(f'[backends.main]\nurl = "sqlite:///{tmp / "ids.db"}"\n\n'
                              '[generators.orders]\nstrategy = "snowflake"\n'
                              'allocator = { type = "sql", backend = "main" }\n')
            with open(tmp / "server.log", "wb") as log:
                mixed(args, config, log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")

    tmp = Path(tempfile.mkdtemp(prefix="fk-bench-server-"))
    try:
        url = f"sqlite:///{tmp / 'ids.db'}"
        config = tmp / "flakekit.toml"
        config.write_text(f'[backends.main]\nurl = "{url}"\n\n[generators.orders]\n'
                          'strategy = "snowflake"\nallocator = { type = "sql", backend = "main" }\n'
                          f'\n[generators.batches]\nstrategy = "snowflake"\n'
                          f'workers = {args.batch_workers}\n'
                          'allocator = { type = "sql", backend = "main" }\n')
        script = tmp / "stats.lua"
        script.write_text(LUA)
        results = []
        load_before = load_average()
        with open(tmp / "server.log", "wb") as log:
            for stack in args.stacks.split(","):
                results.append(bench(stack.strip(), args, config, script, log))
        print(json.dumps(server_json(results, args, load_before), indent=2) if args.json
              else server_table(results, args, load_before))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
