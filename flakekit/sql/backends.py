"""Backends: named database connections shared by allocators and stores.

``[backends.NAME] url = "..."`` in config becomes one SQLAlchemy engine, created on first
use. With no config, the embedded default is a SQLite file in the user's state directory
(:func:`flakekit.assembly.config.embedded_default`).

Every session flakekit opens carries time limits (``connect_timeout``, ``lock_timeout``,
``idle_in_transaction_timeout``, ``statement_timeout``; see :class:`BackendSettings`), so a
peer whose connection died inside a transaction -- the server keeps its session and its
row locks, as after a partition -- costs the others a bounded wait: the server ends that
session after ``idle_in_transaction_timeout``, and a lock wait gives up after
``lock_timeout`` instead of hours.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flakekit.errors import ConfigError, UnknownNameError
from flakekit.values.forks import after_fork_in_child
from flakekit.values.timeunits import format_unit, parse_duration_ns

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = [
    "DEFAULT_BACKEND_URL",
    "TIMEOUT_KEYS",
    "BackendPool",
    "BackendSettings",
    "describe_engine",
    "redact_url",
    "session_statements",
    "timeouts_from_table",
]

DEFAULT_BACKEND_URL = "sqlite:///flakekit.db"
_PASSWORD = re.compile(r"(://[^:/@]+:)([^@]*)(@)")


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and listings)."""
    return _PASSWORD.sub(r"\1***\3", url)


NS = 1_000_000_000


def describe_engine(engine: Engine) -> str:
    """The engine's database for messages: its URL with the password hidden."""
    return redact_url(engine.url.render_as_string(hide_password=True))


#: libpq (psycopg, psycopg2): on a connection whose peer stopped answering (packets
#: dropped, not refused) give up after ~30 s instead of the kernel's ~15 min, so a
#: heartbeat or segment fetch fails and is retried
_LIBPQ = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
          "keepalives_count": 3, "tcp_user_timeout": 30_000}
_MYSQL_DRIVERS = ("pymysql", "mysqldb")
#: "no limit" where a driver or server needs a number (MariaDB's largest lock wait)
_FOREVER_S = 1_073_741_824


def _seconds(ns: int) -> int:
    """Whole seconds, rounded up (drivers and MariaDB take integers)."""
    return max(1, -(-ns // NS))


def connect_defaults(url: str, settings: BackendSettings | None = None) -> dict[str, Any]:
    """Driver options flakekit sets unless ``options.connect_args`` says otherwise."""
    from sqlalchemy.engine import make_url

    s = settings or BackendSettings(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # one writer at a time: wait for the lock (bounded) instead of failing at once
        return {"timeout": s.lock_timeout / NS if s.lock_timeout else _FOREVER_S,
                "check_same_thread": False}
    driver = parsed.get_driver_name()
    if driver in ("psycopg", "psycopg2"):
        return {"connect_timeout": max(2, _seconds(s.connect_timeout)), **_LIBPQ}
    if driver in _MYSQL_DRIVERS:
        io = reply_timeout_s(s)
        return {"connect_timeout": _seconds(s.connect_timeout), "read_timeout": io,
                "write_timeout": io}
    return {}


def reply_timeout_s(settings: BackendSettings) -> int:
    """How long a request waits for the server's answer before its connection is given up:
    as long as the server lets a statement run, plus a margin (PyMySQL's ``read_timeout``;
    on psycopg, :func:`reply_limited_connection_class`)."""
    return _seconds((settings.statement_timeout or 60 * NS) + 5 * NS)


_REPLY_LIMITED: list[Any] = []


def reply_limited_connection_class() -> Any:
    """A psycopg ``Connection`` whose every request fails once no answer came for
    ``reply_timeout_s`` seconds, and closes the connection.

    A middlebox that acknowledges a request and never forwards it (or a server that hung)
    leaves libpq waiting for ever: keepalives and ``tcp_user_timeout`` see a healthy
    socket. A heartbeat blocked so would never fail, so the lease keeper could never
    retry on a new connection: safe (IDs stop at the lease deadline) but stalled until
    a restart. psycopg runs every request (statements, COMMIT, ROLLBACK) through
    ``Connection.wait``, which takes a timeout since psycopg 3.3.
    """
    if _REPLY_LIMITED:
        return _REPLY_LIMITED[0]
    import inspect

    import psycopg
    from psycopg import errors

    timed_out: type[BaseException] | None = getattr(errors, "_WaitTimeout", None)
    durable = _durable_commit_class(psycopg)
    if timed_out is None or "timeout" not in inspect.signature(psycopg.Connection.wait).parameters:
        _REPLY_LIMITED.append(durable)  # an older psycopg: no limit to add
        return durable

    class ReplyLimitedConnection(durable):  # type: ignore[valid-type,misc]
        reply_timeout_s: float = 35.0

        def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) > 1 or kwargs.get("timeout") is not None:  # psycopg's own limit
                return super().wait(gen, *args, **kwargs)
            try:
                return super().wait(gen, *args, **{**kwargs, "timeout": self.reply_timeout_s})
            except timed_out:  # type: ignore[misc]  # not None: checked above
                self.close()  # its state is unknown: SQLAlchemy sees it closed, drops it
                raise psycopg.OperationalError(
                    f"no answer from the server in {self.reply_timeout_s:g} s (a network "
                    "black hole or a hung server); the connection is closed, the next "
                    "request opens another") from None

    _REPLY_LIMITED.append(ReplyLimitedConnection)
    return ReplyLimitedConnection


#: the WARNING of a COMMIT whose wait for a synchronous standby was cancelled
#: (``pg_cancel_backend``, a statement killer, a shutdown): committed on the primary only
SYNC_CANCELLED = "wait for synchronous replication"


def _durable_commit_class(psycopg: Any) -> Any:
    """A psycopg ``Connection`` whose ``commit()`` fails when the server reported that it
    stopped waiting for the synchronous standby.

    PostgreSQL then keeps the commit locally and answers success with only a WARNING
    (which psycopg drops unless a notice handler is registered): the range or lease it
    recorded would be lost by a fail-over and handed out again. Raising here makes the
    caller treat it as failed: the range is never used, the lease is not extended.
    """

    class DurableCommitConnection(psycopg.Connection):  # type: ignore[misc,name-defined]
        sync_cancelled: str | None = None

        def commit(self) -> None:
            self.sync_cancelled = None
            super().commit()
            if self.sync_cancelled is not None:
                said, self.sync_cancelled = self.sync_cancelled, None
                raise psycopg.OperationalError(
                    f"the commit was not made durable: PostgreSQL stopped waiting for the "
                    f"synchronous standby ({said}); it is on the primary only, so flakekit "
                    "does not use it (a fail-over would hand it out again)")

    return DurableCommitConnection


def watch_sync_cancellations(raw: Any) -> None:
    """Register the notice handler that :func:`_durable_commit_class` reads."""
    def on_notice(diag: Any) -> None:
        message = str(getattr(diag, "message_primary", "") or "")
        if SYNC_CANCELLED in message:
            raw.sync_cancelled = message

    raw.add_notice_handler(on_notice)


def session_statements(dialect: str, settings: BackendSettings,
                       mariadb: bool = True) -> list[str]:
    """The ``SET`` statements run on every new connection (PostgreSQL, MariaDB/MySQL)."""
    ms = {name: -(-getattr(settings, name) // 1_000_000) for name in  # rounded up: 0 is off
          ("lock_timeout", "idle_in_transaction_timeout", "statement_timeout")}
    if dialect == "postgresql":
        return [f"SET lock_timeout = {ms['lock_timeout']}",
                f"SET idle_in_transaction_session_timeout = {ms['idle_in_transaction_timeout']}",
                f"SET statement_timeout = {ms['statement_timeout']}"]
    if dialect in ("mysql", "mariadb"):
        lock = settings.lock_timeout
        parts = [f"innodb_lock_wait_timeout = {_seconds(lock) if lock else _FOREVER_S}"]
        if mariadb:  # MySQL has neither
            idle = settings.idle_in_transaction_timeout
            parts.append(f"idle_transaction_timeout = {_seconds(idle) if idle else 0}")
            parts.append(f"max_statement_time = {ms['statement_timeout'] / 1000:g}")
        return ["SET SESSION " + ", ".join(parts)]
    return []


def _bad_url(name: str, url: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"backends.{name}.url",
        f"cannot use {redact_url(url)!r}: {redact_url(str(exc))}; expected e.g. "
        "'postgresql+psycopg://user@host/db', 'mysql+pymysql://root@host/db' "
        "or 'sqlite:///flakekit.db'",
    )


#: the longest limit every server takes (PostgreSQL's are int32 milliseconds: ~24 days)
_MAX_LIMIT = (2**31 - 1) * 1_000_000


def _duration(name: str) -> Any:
    minimum = NS if name == "connect_timeout" else 0  # no "off" for a connect
    def check(_instance: Any, _attribute: Any, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not (
                minimum <= value <= _MAX_LIMIT):
            least = f"at least {format_unit(minimum)}" if minimum else "0 (off) or more"
            shown = format_unit(value) if isinstance(value, int) and value else repr(value)
            raise ValueError(f"{name} must be {least} and at most 24d, got {shown}")
    return check


@attrs.frozen
class BackendSettings:
    """``[backends.NAME]``: ``url`` (SQLAlchemy URL), engine ``options`` and time limits.

    Attributes (durations in ns; ``"0s"`` turns a limit off, except ``connect_timeout``):
        connect_timeout: a server that accepts TCP but does not complete the handshake
            fails the connect after this long (default 10 s).
        lock_timeout: the longest one statement waits for a row lock (default 15 s;
            PostgreSQL ``lock_timeout``, MariaDB ``innodb_lock_wait_timeout``, SQLite's
            busy timeout). Longer than ``idle_in_transaction_timeout``, so a stuck
            flakekit peer is waited out in one go.
        idle_in_transaction_timeout: the server ends a flakekit session that sits idle
            inside a transaction this long (default 10 s; PostgreSQL
            ``idle_in_transaction_session_timeout``, MariaDB ``idle_transaction_timeout``):
            a peer cut off mid-transaction releases its locks.
        statement_timeout: the server cancels one statement after this long (default
            30 s; PostgreSQL ``statement_timeout``, MariaDB ``max_statement_time``).
        replication: ``"any"`` (default) reports what a commit survives
            (:mod:`flakekit.sql.durability`); ``"synchronous"`` refuses every fetch and
            grant while the database does not replicate commits synchronously.
    """

    url: str
    options: dict[str, Any] = attrs.field(factory=dict)
    connect_timeout: int = attrs.field(default=10 * NS,
                                       validator=_duration("connect_timeout"))
    lock_timeout: int = attrs.field(default=15 * NS, validator=_duration("lock_timeout"))
    idle_in_transaction_timeout: int = attrs.field(
        default=10 * NS, validator=_duration("idle_in_transaction_timeout"))
    statement_timeout: int = attrs.field(default=30 * NS,
                                         validator=_duration("statement_timeout"))
    replication: str = attrs.field(default="any", validator=attrs.validators.in_(
        ("any", "synchronous")))

    def __repr__(self) -> str:
        return f"BackendSettings(url={redact_url(self.url)!r})"


#: the time limits a ``[backends.NAME]`` table may set
TIMEOUT_KEYS = ("connect_timeout", "lock_timeout", "idle_in_transaction_timeout",
                "statement_timeout")


def timeouts_from_table(table: Mapping[str, Any], path: str) -> dict[str, int]:
    """The time limits of a ``[backends.NAME]`` table (``path``) as ns, for
    :class:`BackendSettings`; a bad value is a :class:`ConfigError` at its key."""
    out = {}
    for key in TIMEOUT_KEYS:
        if key not in table:
            continue
        try:
            out[key] = parse_duration_ns(table[key])
            _duration(key)(None, None, out[key])
        except ValueError as exc:
            raise ConfigError(f"{path}.{key}", f"{exc}; e.g. {key} = \"10s\"") from None
    return out


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
            if url.startswith(("mysql", "mariadb")):
                # as on PostgreSQL: no gap locks, so a stuck acquirer of one service
                # cannot block another service's insert into the next index gap
                options.setdefault("isolation_level", "READ COMMITTED")
            try:
                defaults = connect_defaults(url, settings)
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
            _limit_sessions(engine, settings)
            from flakekit.sql.durability import watch_for

            watch_for(engine, name, settings.replication)
            self._engines[name] = engine
            return engine

    def engines(self) -> dict[str, Engine]:
        """The engines made so far, by backend name (none is created here)."""
        with self._lock:
            return dict(self._engines)

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


def _limit_sessions(engine: Engine, settings: BackendSettings) -> None:
    """Apply the time limits to every new connection of ``engine``."""
    from sqlalchemy import event

    dialect = engine.dialect.name
    if engine.dialect.driver == "pymysql":  # libmysqlclient keeps to connect_timeout
        @event.listens_for(engine, "do_connect")
        def handshake_within_connect_timeout(dialect_: Any, _rec: Any, cargs: Any,
                                             cparams: dict[str, Any]) -> Any:
            # The driver reads the server's greeting with read_timeout (35 s), not
            # connect_timeout: a server that accepts TCP and never answers would hold a
            # command that long. Connect with connect_timeout for every read and write,
            # then restore the session's own socket timeouts.
            limit = cparams.get("connect_timeout")
            io = {k: cparams.get(k) for k in ("read_timeout", "write_timeout")}
            raw = dialect_.loaded_dbapi.connect(
                *cargs, **{**cparams, "read_timeout": limit, "write_timeout": limit})
            for key, value in io.items():  # PyMySQL applies them before each read/write
                setattr(raw, f"_{key}", value)
            return raw

    if engine.dialect.driver == "psycopg":  # libpq has no read timeout of its own
        reply_s = float(reply_timeout_s(settings))

        @event.listens_for(engine, "do_connect")
        def connect_with_a_reply_limit(dialect_: Any, _rec: Any, cargs: Any,
                                       cparams: dict[str, Any]) -> Any:
            raw = reply_limited_connection_class().connect(*cargs, **cparams)
            raw.reply_timeout_s = reply_s
            watch_sync_cancellations(raw)
            return raw

    if dialect not in ("postgresql", "mysql", "mariadb"):
        return

    @event.listens_for(engine, "connect")
    def set_session_limits(raw: Any, _rec: Any) -> None:
        mariadb = "mariadb" in str(getattr(raw, "get_server_info", lambda: "")()).lower()
        cursor = raw.cursor()
        try:
            for statement in session_statements(dialect, settings, mariadb=mariadb):
                cursor.execute(statement)
        finally:
            cursor.close()
        raw.commit()  # PostgreSQL's SET is transactional: keep it past the first rollback
