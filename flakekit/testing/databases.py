"""A fresh database per test on the real servers, and the port probes that go with it."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flakekit.testing.proxy import TcpProxy

__all__ = [
    "MARIADB_ADMIN_URL", "PG_ADMIN_URL", "free_port", "fresh_database", "fresh_server_database",
    "listening", "proxied", "unreachable_url",
]

#: admin URLs of the test servers (a user that may create databases)
PG_ADMIN_URL = os.environ.get("FLAKEKIT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MARIADB_ADMIN_URL = os.environ.get("FLAKEKIT_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable_url(kind: str) -> str:
    """A URL of a ``postgresql`` or ``mariadb`` database on a loopback port nothing listens
    on: connecting is refused at once, for the tests of what a user sees then."""
    template = {"postgresql": "postgresql+psycopg://postgres@127.0.0.1:{port}/test",
                "mariadb": "mysql+pymysql://root@127.0.0.1:{port}/test"}[kind]
    return template.format(port=free_port())


def _new_name() -> str:
    return f"fk_{uuid.uuid4().hex[:12]}"


def _quoted(admin_url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    quote = '"' if make_url(admin_url).get_backend_name() == "postgresql" else "`"
    return f"{quote}{name}{quote}"


def _execute(admin_url: str, *statements: str) -> None:
    """Statements on a connection of their own (AUTOCOMMIT: CREATE/DROP DATABASE)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        admin.dispose()


def _create(admin_url: str, name: str) -> None:
    _execute(admin_url, f"CREATE DATABASE {_quoted(admin_url, name)}")


def _drop(admin_url: str, name: str) -> None:
    from sqlalchemy.engine import make_url

    drop = f"DROP DATABASE IF EXISTS {_quoted(admin_url, name)}"
    if make_url(admin_url).get_backend_name() == "postgresql":
        _execute(admin_url, drop + " WITH (FORCE)")  # a connection a test left open can't block it
    else:  # MariaDB waits for a transaction a test left open: a minute, not its default year
        _execute(admin_url, "SET SESSION lock_wait_timeout = 60", drop)


def _url_of(admin_url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new, empty database on the PostgreSQL or MariaDB/MySQL server of ``admin_url``
    (a URL whose user may create databases); yields its URL and drops it afterwards."""
    name = _new_name()
    _create(admin_url, name)
    try:
        yield _url_of(admin_url, name)
    finally:
        _drop(admin_url, name)


class _Spares:
    """New databases made ahead of the tests that will take them, on one server.

    PostgreSQL spends most of a second on a CREATE DATABASE (it writes the template
    through the WAL and syncs it), and a test suite makes hundreds. Made here, on a
    thread, while earlier tests run (they mostly wait on leases and sockets), it costs a
    test nothing; the drops run on that thread too. Every test still gets a database
    nobody has used. When the thread cannot keep up, or failed, a test makes its own.
    """

    DEPTH = 2  # spares kept ready

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._ready: list[str] = []
        self._drops: list[str] = []
        self._lock = threading.Condition()
        self._closed = False
        self._pid = os.getpid()  # a forked child that exits must not drop the parent's spares
        self._thread = threading.Thread(target=self._run, name="flakekit-test-databases",
                                        daemon=True)
        self._thread.start()

    def take(self) -> str:
        """The name of a new, empty database: a spare if one is ready, else made now."""
        with self._lock:
            name = self._ready.pop(0) if self._ready else None
            self._lock.notify_all()
        if name is None:
            name = _new_name()
            _create(self.admin_url, name)
        return name

    def give_back(self, name: str) -> None:
        """Drop ``name``, on the thread (at once, when the pool is closed)."""
        with self._lock:
            if not self._closed:
                self._drops.append(name)
                self._lock.notify_all()
                return
        _drop(self.admin_url, name)

    def close(self) -> None:
        """Stop the thread; drop the spares and whatever waits to be dropped."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=60)
        with self._lock:
            left, self._ready, self._drops = self._ready + self._drops, [], []
        for name in left:
            with contextlib.suppress(Exception):
                _drop(self.admin_url, name)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._drops and len(self._ready) >= self.DEPTH:
                    self._lock.wait()
                if self._closed:
                    return
                drop = self._drops.pop(0) if self._drops else None
            try:
                if drop is not None:
                    _drop(self.admin_url, drop)
                    continue
                name = _new_name()
                _create(self.admin_url, name)
            except Exception:  # noqa: BLE001 -- the server is down or refuses: tests make their own
                with self._lock:
                    if drop is not None:
                        self._drops.append(drop)  # close() tries it again
                    self._closed = True
                return
            with self._lock:
                self._ready.append(name)


_spares: dict[str, _Spares] = {}
_spares_lock = threading.Lock()


def _spares_for(admin_url: str) -> _Spares:
    with _spares_lock:
        pool = _spares.get(admin_url)
        if pool is None or pool._pid != os.getpid():  # none yet, or a forked parent's
            if not _spares:
                atexit.register(_close_spares)
            pool = _spares[admin_url] = _Spares(admin_url)
        return pool


def _close_spares() -> None:
    with _spares_lock:
        pools = list(_spares.values())
        _spares.clear()
    for pool in pools:
        pool.close()


@contextlib.contextmanager
def fresh_server_database(kind: str) -> Iterator[str]:
    """A new, empty database on the test server ``kind`` (``"postgresql"`` or
    ``"mariadb"``), dropped afterwards, like :func:`fresh_database`; it is made ahead of
    time (see :class:`_Spares`). Fails the test at once, naming the server, when it is
    not up."""
    import pytest
    from sqlalchemy.engine import make_url

    admin_url, server = {"postgresql": (PG_ADMIN_URL, "PostgreSQL"),
                         "mariadb": (MARIADB_ADMIN_URL, "MariaDB")}[kind]
    url = make_url(admin_url)
    host, port = url.host or "127.0.0.1", url.port or (5432 if kind == "postgresql" else 3306)
    if not listening(port, host):
        pytest.fail(f"{server} is not listening on {host}:{port} (see docs/operations.md)")
    spares = _spares_for(admin_url)
    name = spares.take()
    try:
        yield _url_of(admin_url, name)
    finally:
        spares.give_back(name)


def proxied(url: str, proxy: TcpProxy) -> str:
    """The same database URL, but through ``proxy``."""
    from sqlalchemy.engine import make_url

    proxied = make_url(url).set(host="127.0.0.1", port=proxy.port)
    return proxied.render_as_string(hide_password=False)
