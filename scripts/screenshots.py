"""Regenerate the pictures in docs/images/ (not part of the test suite).

Starts a real ``flakekit serve`` on a SQLite file with four segment keys, puts a varying
load on it for a while (so the sparklines have a shape), then screenshots the monitor page
with headless Chromium at desktop (1280x900) and phone (390x844) sizes; then takes the
lease of generator ``users`` from under it (as another process would) and, once ``/ready``
says 503, screenshots the page again (``monitor-lost-lease.png``: the red lease bar and
what to do). It also renders ``flakekit layout show snowflake`` to a PNG (as a page in the
same browser).

    .venv/bin/python scripts/screenshots.py [--seconds 75]

Needs Debian's ``chromium`` (plugins/flakekit-server/scripts/install-browser.sh).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
FLAKEKIT = str(Path(sys.executable).with_name("flakekit"))
CONFIG = """\
[backends.main]
url = "sqlite:///{db}"

[generators.orders]
strategy = "snowflake"
allocator = {{ type = "sql", backend = "main" }}

[generators.users]   # a short heartbeat: its stolen lease is noticed within a second
strategy = "snowflake"
allocator = {{ type = "sql", backend = "main", heartbeat = "300ms", reclaim_after = ["3s"], safety_window = "1s" }}

""" + "".join(f"""
[generators.{key}s]
strategy = "segment"
store = {{{{ type = "sql", backend = "main" }}}}
key = "{key}"
""" for key in ("invoice", "payment", "refund", "shipment"))
KEYS = {"invoice": 2000, "payment": 500, "refund": 100, "shipment": 1000}


def chromium(profile: Path, *args: str) -> None:
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--hide-scrollbars", f"--user-data-dir={profile}",
                    "--virtual-time-budget=4000", *args],
                   check=True, capture_output=True, timeout=120)


def get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read()
    except urllib.error.HTTPError as err:   # /ready answers 503 when not ready
        return err.read()


def steal_lease(base: str, db: Path, generator: str) -> None:
    """Take ``generator``'s worker row as another process would, and wait for /ready to
    say so (its next renewal finds the row taken: the lease is lost)."""
    import sqlite3

    status = json.loads(get(f"{base}/api/v1/status"))
    worker = next(g["worker_id"] for g in status["processes"][0]["generators"]
                  if g["name"] == generator)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT service FROM system_nodes WHERE machine_id = ?",
                            (worker,)).fetchall()
        services = [r[0] for r in rows if generator in r[0]] or [r[0] for r in rows]
        conn.execute("UPDATE system_nodes SET version = version + 1, holder = 'thief' "
                     "WHERE machine_id = ? AND service = ?", (worker, services[0]))
    deadline = time.monotonic() + 30
    while json.loads(get(f"{base}/ready"))["ready"]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the stolen lease of {generator!r} was not noticed in 30 s")
        time.sleep(0.2)


def load(base: str, stop: threading.Event) -> None:
    """A wavy load: a few hundred IDs a second, in batches, plus segment draws (not of
    'shipment', drawn from only at the end)."""
    t0 = time.monotonic()
    while not stop.is_set():
        t = time.monotonic() - t0
        wave = 1 + math.sin(t / 9)
        get(f"{base}/api/v1/next/orders?count={int(40 + 60 * wave)}")
        get(f"{base}/api/v1/next/users?count={int(10 + 30 * (1 + math.cos(t / 5)))}")
        for key in ("invoice", "payment", "refund"):
            get(f"{base}/api/segment/get/{key}")
        time.sleep(0.1)


def monitor(seconds: float, tmp: Path) -> None:
    from sqlalchemy import create_engine

    from flakekit.sql.leaf import SqlSegmentStore

    db = tmp / "ids.db"
    engine = create_engine(f"sqlite:///{db}")
    store = SqlSegmentStore(engine, "leaf_alloc")
    for key, step in KEYS.items():
        store.create(key, step)
    engine.dispose()
    config = tmp / "flakekit.toml"
    config.write_text(CONFIG.format(db=db))
    proc = subprocess.Popen([FLAKEKIT, "serve", "--port", "0", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        base = f"http://127.0.0.1:{port}"
        stop = threading.Event()
        loader = threading.Thread(target=load, args=(base, stop), daemon=True)
        loader.start()
        time.sleep(seconds)
        stop.set()
        loader.join()
        for _ in range(10):   # a key just started: its next buffer is not loaded yet (grey)
            get(f"{base}/api/segment/get/shipment")
        for name, size in (("monitor.png", "1280,900"), ("monitor-narrow.png", "390,844")):
            chromium(tmp / "profile", f"--screenshot={IMAGES / name}", f"--window-size={size}",
                     base + "/")
            print("wrote", IMAGES / name)
        steal_lease(base, db, "users")
        shot = IMAGES / "monitor-lost-lease.png"
        chromium(tmp / "profile", f"--screenshot={shot}", "--window-size=1280,900", base + "/")
        print("wrote", shot)
    finally:
        proc.terminate()
        proc.wait(30)


def layout_show(tmp: Path) -> None:
    """The terminal output as a dark terminal would show it (a <pre> page, screenshotted)."""
    text = subprocess.run([FLAKEKIT, "layout", "show", "snowflake"], check=True,
                          capture_output=True, text=True).stdout.rstrip("\n")
    lines = ["$ flakekit layout show snowflake", *text.splitlines()]
    page = tmp / "layout.html"
    page.write_text(
        "<!doctype html><meta charset=utf-8><style>html,body{margin:0;background:#1e1f22}"
        "pre{margin:0;padding:16px 20px;color:#e6e6e6;font:15px/1.45 'DejaVu Sans Mono',"
        "monospace}b{color:#7fc97f;font-weight:normal}i{color:#e5c07b;font-style:normal}</style>"
        "<pre>" + "\n".join(_term_line(line) for line in lines) + "</pre>")
    width = 40 + 9.1 * max(len(line) for line in lines)
    height = 32 + 21.75 * len(lines)
    out = IMAGES / "layout-show.png"
    chromium(tmp / "profile", f"--screenshot={out}",
             f"--window-size={math.ceil(width)},{math.ceil(height)}", page.as_uri())
    print("wrote", out)


def _term_line(line: str) -> str:
    escaped = html.escape(line)
    if line.startswith("$ "):
        return "<b>$</b>" + escaped[1:]
    if line.lstrip().startswith("warning:"):
        return "<i>" + escaped + "</i>"
    return escaped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=75.0, help="load time before shots")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flakekit-shots-") as tmp:
        layout_show(Path(tmp))
        monitor(args.seconds, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
