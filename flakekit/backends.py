"""Backends: named database connections shared by allocators and stores.

``[backends.NAME] url = "..."`` in config becomes one SQLAlchemy engine, created on first
use. With no config, the embedded default is a SQLite file in the working directory.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import ConfigError, UnknownNameError
from flakekit.forks import after_fork_in_child

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["DEFAULT_BACKEND_URL", "BackendPool", "BackendSettings", "redact_url"]

DEFAULT_BACKEND_URL = "sqlite:///flakekit.db"
_PASSWORD = re.compile(r"(://[^:/@]+:)([^@]*)(@)")


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and listings)."""
    return _PASSWORD.sub(r"\1***\3", url)


#: libpq (psycopg, psycopg2): give up on a connect after 10 s, and on a connection whose
#: peer stopped answering (packets dropped, not refused) after ~30 s instead of the
#: kernel's ~15 min, so a heartbeat or segment fetch fails and is retried
_LIBPQ = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10,
          "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30_000}
#: PyMySQL / mysqlclient: the same, as socket timeouts
_MYSQL = {"connect_timeout": 10, "read_timeout": 30, "write_timeout": 30}
_CONNECT_DEFAULTS = {"psycopg": _LIBPQ, "psycopg2": _LIBPQ, "pymysql": _MYSQL,
                     "mysqldb": _MYSQL}


def connect_defaults(url: str) -> dict[str, Any]:
    """Driver options flakekit sets unless ``options.connect_args`` says otherwise."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # one writer at a time: wait for the lock instead of failing at once
        return {"timeout": 30, "check_same_thread": False}
    return dict(_CONNECT_DEFAULTS.get(parsed.get_driver_name(), {}))


def _bad_url(name: str, url: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"backends.{name}.url",
        f"cannot use {redact_url(url)!r}: {redact_url(str(exc))}; expected e.g. "
        "'postgresql+psycopg://user@host/db', 'mysql+pymysql://root@host/db' "
        "or 'sqlite:///flakekit.db'",
    )


@attrs.frozen
class BackendSettings:
    """``[backends.NAME]``: ``url`` (SQLAlchemy URL) and engine ``options``."""

    url: str
    options: dict[str, Any] = attrs.field(factory=dict)

    def __repr__(self) -> str:
        return f"BackendSettings(url={redact_url(self.url)!r})"


@attrs.define(eq=False)
class BackendPool:
    """Engines by backend name, created lazily and disposed together."""

    settings: dict[str, BackendSettings] = attrs.Factory(dict)
    _engines: dict[str, Engine] = attrs.Factory(dict)
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def url(self, name: str, path: str = "backend") -> str:
        if name not in self.settings:
            raise UnknownNameError(path, "backend", name, self.settings)
        return self.settings[name].url

    def engine(self, name: str, path: str = "backend") -> Engine:
        """The engine for backend ``name``; ``path`` names the config field for errors."""
        with self._lock:
            if name in self._engines:
                return self._engines[name]
            settings = self.settings.get(name)
            if settings is None:
                raise UnknownNameError(path, "backend", name, self.settings)
            from sqlalchemy import create_engine
            from sqlalchemy.exc import ArgumentError, NoSuchModuleError

            options = dict(settings.options)
            url = settings.url
            if not url.startswith("sqlite"):
                options.setdefault("pool_pre_ping", True)
            try:
                defaults = connect_defaults(url)
            except (ArgumentError, ValueError) as exc:
                raise _bad_url(name, url, exc) from None
            if defaults:
                options["connect_args"] = {**defaults, **options.get("connect_args", {})}
            try:
                engine = create_engine(url, **options)
            except (ArgumentError, NoSuchModuleError, ImportError) as exc:
                raise _bad_url(name, url, exc) from None
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"backends.{name}.options",
                    f"sqlalchemy.create_engine() refused them: {redact_url(str(exc))}; "
                    f"given: {', '.join(sorted(settings.options)) or '(none)'}",
                ) from None
            self._engines[name] = engine
            return engine

    def __attrs_post_init__(self) -> None:
        after_fork_in_child(self, BackendPool.forget_connections)

    def forget_connections(self) -> None:
        """In a forked child: drop inherited connections without closing the parent's."""
        for engine in self._engines.values():
            engine.dispose(close=False)

    def dispose(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
