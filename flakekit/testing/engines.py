"""An SQLAlchemy engine that a test's threads may share, on any of the test databases."""

from __future__ import annotations

from typing import Any

__all__ = ["threaded_engine"]


def threaded_engine(url: str, **options: Any) -> Any:
    """``create_engine(url, **options)``; on SQLite with a 60 s busy timeout and no
    same-thread check instead (threads of one test share the file, and a writer waits for
    another rather than failing with "database is locked")."""
    from sqlalchemy import create_engine

    if url.startswith("sqlite"):
        options = {"connect_args": {"timeout": 60, "check_same_thread": False}}
    return create_engine(url, **options)
