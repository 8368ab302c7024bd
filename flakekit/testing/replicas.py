"""Throw-away servers for fail-over drills: a PostgreSQL primary and a streaming standby
(:class:`PgReplicaSet`), a MariaDB primary and a GTID replica (:class:`MariaReplicaSet`).

Replication runs through a :class:`~flakekit.testing.proxy.TcpProxy` the test can cut,
and clients connect through a second proxy that ``fail_over`` moves to the promoted
standby (as a VIP or a DNS switch would). Both sets answer the same calls (``start``,
``url``, ``standby.url``, ``cut_replication``, ``fail_over``, ``new_standby``,
``stop``), so one drill runs on either. Servers run as the ``postgres`` user
when started by root (PostgreSQL refuses root), in a directory of their own under /tmp.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

from flakekit.testing.databases import free_port
from flakekit.testing.proxy import TcpProxy

__all__ = ["PG_BIN", "MariaReplicaSet", "MariaServer", "PgReplicaSet", "PgServer",
           "mariadb_binaries_missing", "pg_binaries_missing", "private_base"]

class _Server(Protocol):
    """A server of a replica set (PgServer and MariaServer extend it) on a loopback port;
    ``url_via(port)``: the URL of its database at ``port`` (its own, or a proxy's to it)."""

    port: int

    def url_via(self, port: int) -> str: ...
    def kill9(self) -> None: ...
    def promote(self) -> None: ...

    @property
    def url(self) -> str:
        return self.url_via(self.port)


S = TypeVar("S", bound=_Server)

PG_BIN = Path(os.environ.get("FLAKEKIT_PG_BIN", "/usr/lib/postgresql/15/bin"))


def pg_binaries_missing() -> str | None:
    """Why the drills cannot run here (None: they can)."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (PG_BIN / tool).exists():
            return f"PostgreSQL server binaries not found: {PG_BIN / tool}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _run(*args: str) -> None:
    done = subprocess.run([*_as_postgres(), *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")


class PgServer(_Server):
    """One private PostgreSQL cluster on a free loopback port."""

    def __init__(self, base: Path, name: str, settings: tuple[str, ...] = ()) -> None:
        self.base = base
        self.data = base / name
        self.port = free_port()
        self.settings = settings

    def url_via(self, port: int) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def initdb(self) -> PgServer:
        """A new cluster: a copy of one made once per process (initdb takes seconds)."""
        _run("cp", "-a", str(_template()), str(self.data))
        return self

    def start(self) -> PgServer:
        opts = " ".join([f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base}",
                         "-c fsync=off -c full_page_writes=off",
                         *(f"-c {s}" for s in self.settings)])
        _run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l",
             str(self.base / f"{self.data.name}.log"), "-w", "-o", opts, "start")
        return self

    def kill9(self) -> None:
        """kill -9 of the postmaster (its children exit when they notice)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        _run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "promote")

    def stop(self) -> subprocess.Popen[bytes] | None:
        """Stop it at once (started, not waited for: see :meth:`PgReplicaSet.stop`)."""
        if not (self.data / "postmaster.pid").exists():
            return None
        return subprocess.Popen([*_as_postgres(), str(PG_BIN / "pg_ctl"), "-D",
                                 str(self.data), "-m", "immediate", "-w", "stop"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_TEMPLATE: list[Path] = []


def _template() -> Path:
    if not _TEMPLATE:
        base = private_base("flakekit-pg-template-")
        atexit.register(shutil.rmtree, base, True)
        _run(str(PG_BIN / "initdb"), "-D", str(base / "data"), "--auth=trust", "-U",
             "postgres", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        _TEMPLATE.append(base / "data")
    return _TEMPLATE[0]


def private_base(prefix: str) -> Path:
    """A directory under /tmp the ``postgres`` user owns (pytest's tmp is mode 700)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    return base


class _ReplicaSet(Generic[S]):
    """What both replica sets share: the proxies, the cut, the fail-over's promotion and
    re-pointing, a fresh standby after it."""

    primary: S
    standby: S

    def __init__(self) -> None:
        self.replication: TcpProxy | None = None
        self.clients: TcpProxy | None = None
        self._retired: list[S] = []

    def _start_primary(self) -> None:
        raise NotImplementedError

    def _new_standby(self) -> S:
        raise NotImplementedError

    def _stream_to(self, standby: S) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._start_primary()
        self._stream_to(self.standby)
        self.clients = TcpProxy(self.primary.port).start()
        return self

    def _new_replication(self) -> int:
        """A new proxy to the primary for a standby to stream through (the old one
        stopped); its port."""
        if self.replication is not None:
            self.replication.stop()
        self.replication = TcpProxy(self.primary.port).start()
        return self.replication.port

    @property
    def url(self) -> str:
        """Where clients connect: through ``clients`` to the primary."""
        assert self.clients is not None
        return self.primary.url_via(self.clients.port)

    def new_standby(self) -> None:
        """After :meth:`fail_over`: a fresh standby of the new primary (for a second)."""
        self._retired.append(self.standby)
        self.standby = self._new_standby()
        self._stream_to(self.standby)

    def cut_replication(self) -> None:
        assert self.replication is not None
        self.replication.cut()

    def fail_over(self) -> None:
        """kill -9 the primary, promote the standby, re-point the clients at it."""
        self.primary.kill9()
        self._promote()

    def _promote(self) -> None:
        assert self.clients is not None
        self.standby.promote()
        self.clients.target_port = self.standby.port
        self.clients.cut()
        self.clients.restore()
        self._retired.append(self.primary)
        self.primary, self.standby = self.standby, self.primary  # the dead one stays down

    def _servers(self) -> list[S]:
        """Every server, once each (after the proxies are stopped)."""
        for proxy in (self.clients, self.replication):
            if proxy is not None:
                proxy.stop()
        everyone: list[S] = [self.standby, self.primary, *self._retired]
        return list({id(s): s for s in everyone}.values())


class PgReplicaSet(_ReplicaSet[PgServer]):
    """A primary, a standby streaming from it through ``replication`` (a proxy), and
    ``clients``, the proxy clients connect to (:attr:`url`)."""

    def __init__(self, primary_settings: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.base = private_base("flakekit-replicas-")
        self.primary = PgServer(self.base, "primary", primary_settings)
        self.standby = PgServer(self.base, "standby")

    def _start_primary(self) -> None:
        self.primary.initdb().start()

    def _stream_to(self, standby: PgServer) -> None:
        """Make ``standby`` a streaming copy of the primary, through a new proxy."""
        port = self._new_replication()
        _run(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(port),
             "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast")
        standby.start()

    def _new_standby(self) -> PgServer:
        return PgServer(self.base, f"standby{len(self._retired)}")

    def switch_over(self) -> None:
        """A planned switch-over with no loss: stop the primary cleanly (its shutdown
        checkpoint waits until the standby has every commit), promote, re-point."""
        _run(str(PG_BIN / "pg_ctl"), "-D", str(self.primary.data), "-m", "fast", "-w",
             "stop")
        self._promote()

    def stop(self) -> None:
        for stopping in [s.stop() for s in self._servers()]:
            if stopping is not None:
                stopping.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def mariadb_binaries_missing() -> str | None:
    """Why a private MariaDB cannot run here (None: it can)."""
    for tool in ("mariadbd", "mariadb-install-db"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"MariaDB server binaries not found: {tool}"
    return None


class MariaServer(_Server):
    """One private MariaDB server (binary log on, ``server_id``, extra ``options``) on a
    free loopback port; root with an empty password."""

    def __init__(self, server_id: int = 1, options: tuple[str, ...] = (),
                 database: str = "mysql") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="flakekit-mariadb-"))
        self.database = database
        if os.geteuid() == 0:
            shutil.chown(self.base, "mysql", "mysql")
        self.port = free_port()
        self.server_id = server_id
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    def url_via(self, port: int) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{port}/{self.database}"

    def start(self) -> MariaServer:
        data = self.base / "data"
        subprocess.run(["mariadb-install-db", "--user=mysql", f"--datadir={data}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True)
        self.process = subprocess.Popen(
            ["mariadbd", "--no-defaults", "--user=mysql", f"--datadir={data}",
             f"--socket={self.base / 'sock'}", f"--pid-file={self.base / 'pid'}",
             "--bind-address=127.0.0.1", f"--port={self.port}",
             f"--log-bin={data / 'bin'}", f"--server-id={self.server_id}", *self.options],
            stdout=subprocess.DEVNULL, stderr=open(self.base / "err.log", "wb"))  # noqa: SIM115
        from flakekit.testing.databases import listening

        deadline = time.monotonic() + 30
        while not listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mariadbd did not start: "
                                   + (self.base / "err.log").read_text()[-500:])
            time.sleep(0.05)
        return self

    def kill9(self) -> None:
        """kill -9 of mariadbd (its files stay)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def promote(self) -> None:
        """Make this replica a primary."""
        self.sql("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")

    def sql(self, *statements: str) -> None:
        """Run ``statements`` as root on this server (no database selected)."""
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root",
                               autocommit=True)
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            conn.close()

    def stop(self) -> None:
        self.kill9()
        shutil.rmtree(self.base, ignore_errors=True)


#: every server of a MariaDB set: GTIDs strict, replicated events logged again (so a
#: promoted replica's binary log serves a fresh replica from the start)
_MARIA_OPTIONS = ("--gtid-strict-mode=ON", "--log-slave-updates=ON",
                  "--binlog-format=ROW")


class MariaReplicaSet(_ReplicaSet[MariaServer]):
    """A MariaDB primary and a GTID replica of it (``MASTER_USE_GTID=slave_pos``)
    through ``replication`` (a proxy), and ``clients``, the proxy clients connect to
    (:attr:`url`). The drills' tables live in database ``drill``; ``options`` go to every
    server (semi-sync settings, for example)."""

    DATABASE = "drill"

    def __init__(self, options: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.options = (*_MARIA_OPTIONS, *options)
        self._ids = 0
        self.primary = MariaServer(self._next_id(), self.options, self.DATABASE)
        self.standby = self._new_standby()

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _new_standby(self) -> MariaServer:
        return MariaServer(self._next_id(), (*self.options, "--read-only=ON"),
                           self.DATABASE)

    def _start_primary(self) -> None:
        self.primary.start()
        self.primary.sql(f"CREATE DATABASE {self.DATABASE}")

    def _stream_to(self, standby: MariaServer) -> None:
        """Start ``standby`` (empty) replicating everything from the primary, through
        a new proxy (its GTID position is empty: it asks for the whole binary log)."""
        port = self._new_replication()
        standby.start()
        standby.sql(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', "
                    f"MASTER_PORT={port}, MASTER_USER='root', "
                    "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, "
                    "MASTER_CONNECT_RETRY=1", "START SLAVE")

    def stop(self) -> None:
        for server in self._servers():
            server.stop()


def main(env_file: str, kind: str = "postgresql") -> None:
    """``python -m flakekit.testing.replicas ENV_FILE [postgresql|mariadb]``
    (scripts/replicas.sh): start a replica set, write its URLs to ENV_FILE, then on
    SIGUSR1 cut the replication, on SIGUSR2 fail over (kill -9, promote, re-point), on
    SIGTERM stop everything."""
    import threading

    sets: dict[str, type[PgReplicaSet] | type[MariaReplicaSet]] = {
        "postgresql": PgReplicaSet, "mariadb": MariaReplicaSet}
    if kind not in sets:
        raise SystemExit(f"replicas: unknown kind {kind!r}; use postgresql or mariadb")
    rs = sets[kind]().start()
    Path(env_file).write_text(
        f"FLAKEKIT_REPLICAS_URL={rs.url}\nFLAKEKIT_REPLICAS_PRIMARY_URL={rs.primary.url}\n"
        f"FLAKEKIT_REPLICAS_STANDBY_URL={rs.standby.url}\n")
    done = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: rs.cut_replication())
    signal.signal(signal.SIGUSR2, lambda *_: rs.fail_over())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            pass
    finally:
        rs.stop()


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:3])
