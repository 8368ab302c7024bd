"""Helpers for tests, for flakekit's own and for plugin authors."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

import attrs

__all__ = ["ManualClock", "fresh_database"]

_START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


@attrs.define
class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instead of waiting.

    ``advance()`` moves wall and monotonic time together; ``set()`` and ``step()`` move
    the wall clock alone, the way NTP or an operator steps a real one.
    """

    wall_ns: int = _START_NS
    mono_ns: int = 1_000_000_000
    name: str = "manual"
    max_backward_ns: int = 5_000_000
    offset_ns: None = None
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def time_ns(self) -> int:
        return self.wall_ns

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        delta = round(seconds * 1e9) + ns
        if delta < 0:
            raise ValueError("advance() goes forward only; use step() to move the wall clock back")
        with self._lock:
            self.wall_ns += delta
            self.mono_ns += delta

    def set(self, wall_ns: int) -> None:
        """Set the wall clock (monotonic time does not move)."""
        self.wall_ns = wall_ns

    def step(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        """Step the wall clock by a signed amount (monotonic time does not move)."""
        self.wall_ns += round(seconds * 1e9) + ns

    def sleep(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0) or 1e-6)


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
