"""Shared fixtures: a fresh plugin host, fresh databases on the real servers, a TCP proxy."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from proxy import TcpProxy  # noqa: E402

PG_ADMIN_URL = os.environ.get("FLAKEKIT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MARIADB_ADMIN_URL = os.environ.get("FLAKEKIT_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def host():
    """A freshly loaded plugin host without entry points (only built-ins)."""
    from flakekit.host import PluginHost

    return PluginHost().load(entrypoints=False)


def _fresh(admin_url: str, port: int, server: str) -> Iterator[str]:
    from flakekit.testing import fresh_database

    if not _listening(port):
        pytest.fail(f"{server} is not listening on 127.0.0.1:{port} (see docs/operations.md)")
    with fresh_database(admin_url) as url:
        yield url


def _fresh_pg() -> Iterator[str]:
    return _fresh(PG_ADMIN_URL, 5432, "PostgreSQL")


def _fresh_mariadb() -> Iterator[str]:
    return _fresh(MARIADB_ADMIN_URL, 3306, "MariaDB")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a new, empty PostgreSQL database, dropped afterwards."""
    yield from _fresh_pg()


@pytest.fixture
def mariadb_url() -> Iterator[str]:
    """URL of a new, empty MariaDB database, dropped afterwards."""
    yield from _fresh_mariadb()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a SQLite file in a temporary directory."""
    return f"sqlite:///{tmp_path / 'flakekit.db'}"


@pytest.fixture(
    params=[
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        "sqlite",
    ]
)
def db_url(request, tmp_path) -> Iterator[str]:
    """The same test on a fresh PostgreSQL, MariaDB and SQLite database."""
    if request.param == "postgresql":
        yield from _fresh_pg()
    elif request.param == "mariadb":
        yield from _fresh_mariadb()
    else:
        yield f"sqlite:///{tmp_path / 'flakekit.db'}"


def proxied(url: str, proxy: TcpProxy) -> str:
    """The same database URL, but through ``proxy``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


@pytest.fixture
def tcp_proxy():
    """Start a loopback TCP proxy: ``tcp_proxy(target_port)`` returns a started proxy."""
    started: list[TcpProxy] = []

    def start(target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_port)
        proxy.start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
