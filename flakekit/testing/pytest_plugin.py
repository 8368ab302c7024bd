"""The ``flakekit`` pytest plugin: fixtures for plugin authors, opt-in.

Not registered through a ``pytest11`` entry point (an application that installs flakekit
must not get fixtures such as ``db_url`` in its own test run): load it with
``pytest -p flakekit.testing.pytest_plugin``, ``addopts = "-p flakekit.testing.pytest_plugin"``
in ``[tool.pytest.ini_options]`` (the ``plugin new`` template does), or
``pytest_plugins = ["flakekit.testing.pytest_plugin"]`` in the root ``conftest.py``.

Fixtures: ``manual_clock``, ``event_recorder``, ``tcp_proxy``, ``closing``, ``pg_url``,
``mariadb_url``, ``sqlite_url`` and ``db_url`` (the same test on all three). The servers
come from ``FLAKEKIT_TEST_PG`` / ``FLAKEKIT_TEST_MARIADB`` (default: loopback, see
docs/operations.md); a server that is down fails the test naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flakekit.testing.clock import ManualClock
from flakekit.testing.databases import fresh_server_database
from flakekit.testing.events import EventRecorder
from flakekit.testing.proxy import TcpProxy

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgresql: needs PostgreSQL on 127.0.0.1:5432")
    config.addinivalue_line("markers", "mariadb: needs MariaDB on 127.0.0.1:3306")


@pytest.fixture
def manual_clock() -> ManualClock:
    """A :class:`ManualClock` at 2026-01-01T00:00:00Z."""
    return ManualClock()


@pytest.fixture
def event_recorder() -> EventRecorder:
    """An :class:`EventRecorder`; ``event_recorder.events`` goes where ``Events`` does."""
    return EventRecorder()


@contextlib.contextmanager
def cleaned_up(make: Callable[..., T],
               cleanup: Callable[[T], object]) -> Iterator[Callable[..., T]]:
    """The body of a fixture that hands out a factory: yields a function that calls
    ``make`` and keeps what it made; on exit calls ``cleanup`` on each, newest first.

    ``with cleaned_up(Thing, Thing.stop) as make: yield make``
    """
    made: list[T] = []

    def factory(*args: Any, **kw: Any) -> T:
        obj = make(*args, **kw)
        made.append(obj)
        return obj

    try:
        yield factory
    finally:
        for obj in reversed(made):
            cleanup(obj)


def _started_proxy(target_port: int) -> TcpProxy:
    proxy = TcpProxy(target_port)
    proxy.start()
    return proxy


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[int], TcpProxy]]:
    """Start a loopback TCP proxy: ``tcp_proxy(target_port)`` returns a started proxy;
    all are stopped afterwards."""
    with cleaned_up(_started_proxy, TcpProxy.stop) as start:
        yield start


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """``closing(obj)`` returns ``obj`` and calls its ``close()`` after the test (in
    reverse order): for the allocators and stores a contract binding makes."""
    with cleaned_up(lambda obj: obj, lambda obj: obj.close()) as register:
        yield register


def _database_url(kind: str, tmp_path: Path) -> Iterator[str]:
    """The body of the database fixtures: a fresh ``kind`` database's URL (``sqlite``: a
    file in ``tmp_path``), a server database dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'flakekit.db'}"
        return
    with fresh_server_database(kind) as url:
        yield url


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    """URL of a new, empty PostgreSQL database, dropped afterwards."""
    yield from _database_url("postgresql", tmp_path)


@pytest.fixture
def mariadb_url(tmp_path: Path) -> Iterator[str]:
    """URL of a new, empty MariaDB database, dropped afterwards."""
    yield from _database_url("mariadb", tmp_path)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """URL of a SQLite file in a temporary directory."""
    yield from _database_url("sqlite", tmp_path)


@pytest.fixture(
    params=[
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
        "sqlite",
    ]
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on a fresh PostgreSQL, MariaDB and SQLite database."""
    yield from _database_url(request.param, tmp_path)
