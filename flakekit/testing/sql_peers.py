"""SQL helpers for tests of what one node's transaction does to another: engines with
flakekit's session limits (the ``pool`` fixture) and a peer stuck inside a transaction
that holds rows (``peer_holding``). Needs pytest for the fixture; a test module uses it
with ``from flakekit.testing.sql_peers import pool_fixture  # noqa: F401``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from flakekit.sql.backends import BackendPool, BackendSettings
from flakekit.sql.transactions import write_transaction

__all__ = ["peer_holding", "pool_fixture"]


@pytest.fixture(name="pool")
def pool_fixture(db_url: str) -> Iterator[Callable[..., Engine]]:
    """``pool(url=None, **limits)``: an engine on ``url`` (the test database by default)
    through BackendPool, with the session limits flakekit sets on every connection;
    disposed after the test."""
    made: list[BackendPool] = []

    def engine(url: str | None = None, **limits: Any) -> Engine:
        made.append(BackendPool({"b": BackendSettings(url or db_url, **limits)}))
        return made[-1].engine("b")

    yield engine
    for p in made:
        p.dispose()


@contextmanager
def peer_holding(engine: Engine, select: str, **params: Any) -> Iterator[None]:
    """A peer stuck inside a write transaction that ran ``select`` (``SELECT ... FROM ...
    WHERE ...``) with ``FOR UPDATE`` (SQLite: holding the database's write lock), from the
    moment it holds the rows until the block ends."""
    lock = "" if engine.dialect.name == "sqlite" else " FOR UPDATE"
    ready, done = threading.Event(), threading.Event()

    def run() -> None:
        with write_transaction(engine) as conn:
            conn.execute(text(select + lock), params)
            ready.set()
            done.wait(60)

    thread = threading.Thread(target=run, daemon=True, name="stuck-peer")
    thread.start()
    try:
        assert ready.wait(30), "the peer never got its rows"
        yield
    finally:
        done.set()
        thread.join(30)
