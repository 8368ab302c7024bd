"""A fresh database per test on the real servers, and the port probes that go with it."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flakekit.testing.proxy import TcpProxy

__all__ = [
    "MARIADB_ADMIN_URL", "PG_ADMIN_URL", "free_port", "fresh_database", "fresh_server_database",
    "listening", "proxied",
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


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new, empty database on the PostgreSQL or MariaDB/MySQL server of ``admin_url``
    (a URL whose user may create databases); yields its URL and drops it afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(admin_url)
    name = f"fk_{uuid.uuid4().hex[:12]}"
    quote = '"' if url.get_backend_name() == "postgresql" else "`"
    drop = f"DROP DATABASE IF EXISTS {quote}{name}{quote}"
    if url.get_backend_name() == "postgresql":
        drop += " WITH (FORCE)"  # connections a test left open must not block the drop
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {quote}{name}{quote}"))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(drop))
    finally:
        admin.dispose()


@contextlib.contextmanager
def fresh_server_database(kind: str) -> Iterator[str]:
    """:func:`fresh_database` on the test server ``kind`` (``"postgresql"`` or
    ``"mariadb"``); fails the test at once, naming the server, when it is not up."""
    import pytest
    from sqlalchemy.engine import make_url

    admin_url, server = {"postgresql": (PG_ADMIN_URL, "PostgreSQL"),
                         "mariadb": (MARIADB_ADMIN_URL, "MariaDB")}[kind]
    url = make_url(admin_url)
    host, port = url.host or "127.0.0.1", url.port or (5432 if kind == "postgresql" else 3306)
    if not listening(port, host):
        pytest.fail(f"{server} is not listening on {host}:{port} (see docs/operations.md)")
    with fresh_database(admin_url) as fresh:
        yield fresh


def proxied(url: str, proxy: TcpProxy) -> str:
    """The same database URL, but through ``proxy``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
