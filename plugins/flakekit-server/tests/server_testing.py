"""Helpers for the server tests (a unique module name: tests/ has a conftest too): real
`flakekit serve` processes on loopback, real databases (SQLite files; a fresh PostgreSQL database
where a test asks for one)."""

from __future__ import annotations

import contextlib
import html
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakekit.testing.command import FLAKEKIT, run_flakekit
from flakekit.testing.requests import http_get

#: ``run_cli("db", "init", "--config", path)``: `flakekit` in a child process
run_cli = run_flakekit
#: headless Chromium for the monitor-page tests (None: not installed; the plugin's
#: scripts/install-browser.sh installs Debian's package)
CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
NO_CHROMIUM = "chromium is not installed: run plugins/flakekit-server/scripts/install-browser.sh"
#: the mark of a test that needs `CHROMIUM`
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


def fresh_pg() -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards)."""
    from flakekit.testing.databases import fresh_server_database

    with fresh_server_database("postgresql") as url:
        yield url


def create_keys(url: str, keys: dict[str, int], table: str = "leaf_alloc") -> None:
    """Create segment keys (key -> step) the way `flakekit segments create` does."""
    from sqlalchemy import create_engine

    from flakekit.sql.leaf import SqlSegmentStore

    engine = create_engine(url)
    try:
        store = SqlSegmentStore(engine, table)
        for key, step in keys.items():
            store.create(key, step)
    finally:
        engine.dispose()


def write_config(path: Path, url: str, *, heartbeat: str | None = None,
                 segments: dict[str, str] | None = None, extra: str = "") -> Path:
    """A config with snowflake generator 'orders' (sql allocator) and segment generators
    (generator name -> key)."""
    hb = ""
    if heartbeat:
        hb = f', heartbeat = "{heartbeat}", reclaim_after = ["3s"], safety_window = "1s"'
    text = f'[backends.main]\nurl = "{url}"\n\n'
    text += ('[generators.orders]\nstrategy = "snowflake"\n'
             f'allocator = {{ type = "sql", backend = "main"{hb} }}\n\n')
    for name, key in (segments if segments is not None else {"invoices": "invoice"}).items():
        text += (f'[generators.{name}]\nstrategy = "segment"\n'
                 'store = { type = "sql", backend = "main" }\n'
                 f'key = "{key}"\n\n')
    path.write_text(text + extra)
    return path


class Server:
    """A `flakekit serve` subprocess; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, config: Path | None, *args: str, tmp: Path,
                 env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        cmd = [FLAKEKIT, "serve", "--port", "0", *args]
        if config is not None:
            cmd += ["--config", str(config)]
        self.log_path = tmp / f"server-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        full_env = {**os.environ, **(env or {})}
        full_env.pop("FLAKEKIT_CONFIG", None)
        # a process group of its own: stop() ends whatever of it is left (a worker process
        # whose supervisor was killed would hold the port and the member on)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=full_env,
                                     start_new_session=True)
        self.port = 0
        self.host = "127.0.0.1"
        self.banner = ""
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                self.stop()
                raise AssertionError(f"server did not start in {timeout} s:\n{self.log()}")
            chunk = os.read(self.proc.stdout.fileno(), 1)
            if not chunk:
                rc = self.proc.wait()
                raise AssertionError(f"server exited with {rc} during start-up:\n{self.log()}")
            line += chunk
        sel.close()
        self.banner = line.decode().strip()
        url = self.banner.split("http://", 1)[1].split()[0]
        self.host, _, port = url.rpartition(":")
        self.port = int(port)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def conn(self, timeout: float = 10) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        return http_get(self.port, path, 10, self.host, headers=headers, method=method,
                        body=body)

    def json(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, _, body = self.get(path, headers)
        return status, json.loads(body)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._end_group()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode

    def _end_group(self, timeout: float = 5) -> None:
        """SIGKILL what is left of the server's process group once it has exited, and wait
        until it is gone: the next server on these ports starts on free ports."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def start_server(tmp_path) -> Iterator[Any]:
    """``start_server(config, *args)`` starts `flakekit serve`; all are stopped afterwards."""
    from flakekit.testing.pytest_plugin import cleaned_up

    with cleaned_up(lambda config, *args, **kw: Server(config, *args, tmp=tmp_path, **kw),
                    Server.stop) as start:
        yield start


@contextlib.contextmanager
def invoice_server(tmp: Path) -> Iterator[Server]:
    """A `flakekit serve` on SQLite in ``tmp``: snowflake 'orders', segment 'invoices' (key
    invoice, step 100); stopped on exit."""
    with Server(sqlite_config(tmp, {"invoice": 100}, name="flakekit.toml"), tmp=tmp) as server:
        yield server


def chromium(tmp_path: Path, *args: str, budget_ms: int = 3000) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium once (its own profile under ``tmp_path``; the page's scripts
    get ``budget_ms`` of virtual time), e.g. ``chromium(tmp, "--dump-dom", url)``."""
    assert CHROMIUM is not None, NO_CHROMIUM
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
           f"--virtual-time-budget={budget_ms}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def dump_dom(tmp_path: Path, url: str, *args: str) -> str:
    """The DOM of ``url`` after its scripts ran (`chromium` with ``args``, then
    ``--dump-dom``); asserts Chromium exited 0."""
    result = chromium(tmp_path, *args, "--dump-dom", url)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def table_rows(dom: str, table_id: str) -> list[list[str]]:
    """The text of each row of a table's body in a dumped DOM, as a person reads it."""
    body = dom.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    body = body.split("<tbody>", 1)[1]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


@pytest.fixture(scope="module")
def invoice_node(tmp_path_factory) -> Iterator[Server]:
    """One `invoice_server` a test module shares (fixture)."""
    with invoice_server(tmp_path_factory.mktemp("invoices")) as server:
        yield server


def base(server: Server) -> str:
    """The node's base URL, ``http://host:port``."""
    return f"http://{server.host}:{server.port}"


@contextlib.contextmanager
def two_invoice_nodes(tmp: Path) -> Iterator[tuple[Server, Server]]:
    """Two `flakekit serve` nodes on one SQLite database in ``tmp`` (segment 'invoices', key
    invoice, step 50; snowflake 'orders'); both stopped on exit."""
    config = sqlite_config(tmp, {"invoice": 50}, name="flakekit.toml")
    one, two = Server(config, tmp=tmp), Server(config, tmp=tmp)
    try:
        yield one, two
    finally:
        one.stop()
        two.stop()


def start_loaded(tmp: Path, start_server: Any) -> Server:
    """Through the `start_server` fixture: a node on SQLite in ``tmp`` with segment keys
    invoice (step 1000) and payment (step 50), 7 IDs drawn from invoice (Leaf's URL) and
    42 from the snowflake 'orders'."""
    config = sqlite_config(tmp, {"invoice": 1000, "payment": 50},
                           segments={"invoices": "invoice", "payments": "payment"})
    server = start_server(config)
    for _ in range(7):
        assert server.get("/api/segment/get/invoice")[0] == 200
    assert server.get("/api/v1/next/orders?count=42")[0] == 200
    return server


def ok(server: Server, path: str, headers: dict[str, str] | None = None) -> bytes:
    """GET ``path``; asserts the answer is 200 and returns its body."""
    status, _, body = server.get(path, headers)
    assert status == 200, (path, status, body[:500])
    return body


def ok_json(server: Server, path: str, headers: dict[str, str] | None = None) -> Any:
    """GET ``path``; asserts the answer is 200 and returns its JSON body."""
    return json.loads(ok(server, path, headers))


def sqlite_config(tmp: Path, keys: dict[str, int] | None = None, name: str = "c.toml",
                  **kw: Any) -> Path:
    """`write_config` ``tmp / name`` (``kw`` go there) on the SQLite file ``tmp/ids.db``;
    with ``keys`` (key: step), leaf_alloc is created holding them."""
    url = f"sqlite:///{tmp / 'ids.db'}"
    if keys is not None:
        create_keys(url, keys)
    return write_config(tmp / name, url, **kw)


def exchange(server: Server, request: bytes, timeout: float = 10) -> bytes:
    """Send raw ``request`` bytes on one new connection; all the server answers until it
    closes the connection."""
    import socket

    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@contextlib.contextmanager
def sqlite_server(tmp: Path, generators: str,
                  keys: dict[str, int] | None = None) -> Iterator[Server]:
    """A `flakekit serve` of the ``generators`` TOML on backend ``main``, the SQLite file
    ``tmp/ids.db`` (with ``keys``, leaf_alloc is created holding them); ``.url`` and
    ``.config`` say where. Stopped on exit."""
    url = f"sqlite:///{tmp / 'ids.db'}"
    if keys is not None:
        create_keys(url, keys)
    config = tmp / "flakekit.toml"
    config.write_text(f'[backends.main]\nurl = "{url}"\n\n' + generators)
    with Server(config, tmp=tmp) as server:
        server.url = url  # type: ignore[attr-defined]
        server.config = config  # type: ignore[attr-defined]
        yield server
