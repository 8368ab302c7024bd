"""Running the server: one process, or a supervisor and one worker process per core.

Each worker process binds its own ``SO_REUSEPORT`` socket (the kernel spreads new
connections over them), builds its own :class:`~flakekit.assembly.kit.Kit` *after* the fork and
so acquires its own worker lease; nothing lease-related is inherited. The supervisor
only checks the config, forks, waits for every worker to report that it is serving,
restarts a worker that dies (with back-off), and on SIGTERM/SIGINT asks every worker to
shut down gracefully: stop accepting, close connections, release leases, give back
segment tails.

Workers publish their numbers to a private run directory once a second, so ``/metrics``,
``/ready`` and the monitor page of any process cover all of them; the supervisor publishes
there which processes it expects, which are serving and how often each was restarted
(``supervisor.json``), so a worker that keeps failing to start turns every ``/ready`` 503.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from flakekit.plugin import ConfigError, FlakekitError
from flakekit_server.app import IdService, ServerOptions

__all__ = ["ServeError", "check_config", "run_worker", "serve"]

log = logging.getLogger("flakekit.server")

#: workers accept from one inherited socket (True) or SO_REUSEPORT sockets (False)
SHARE_SOCKET = os.environ.get("FLAKEKIT_SERVER_REUSEPORT", "") != "1"


class ServeError(FlakekitError):
    """The server could not start (a worker failed, the port is taken...)."""


def check_config(config: Any, options: ServerOptions) -> Any:
    """Refuse what cannot be served safely, before any process starts; returns this
    node's resolved cluster settings (None without ``[cluster]``)."""
    from flakekit.embed import build_kit, get_host

    # built, not started: nothing is leased or fetched; this node's cluster identity is
    # resolved with the flags (--node/--advertise > $FLAKEKIT_NODE/$FLAKEKIT_ADVERTISE > file)
    kit = build_kit(config, get_host(), as_member=False)
    try:
        infos = {name: kit.describe(name) for name in kit}
        settings = None
        if config.cluster is not None:
            settings = kit.cluster_settings(node=options.node, advertise=options.advertise)
    finally:
        kit.close()  # never started: releases nothing, closes the engines
    if settings is not None and options.workers > 1:
        check_member_ports(settings, options)
    elif options.member_port is not None:
        raise ConfigError("--member-port", "--member-port is the first private port of a "
                          "cluster node's processes: it needs [cluster] and --workers 2 or more")
    if options.node is not None or options.advertise is not None:
        if config.cluster is None:
            flag = "--node" if options.node is not None else "--advertise"
            raise ConfigError(flag, "the config has no [cluster] section: --node and "
                              "--advertise name this node in a cluster (docs/cluster.md)")
    if options.workers > 1:
        for name, info in infos.items():
            if info.fixed_worker:  # the allocator says so (FixedWorker), whatever its name
                raise ConfigError(
                    f"generators.{name}.allocator",
                    f"a {info.allocator!r} allocator gives every process the same worker id, "
                    f"so --workers {options.workers} would issue duplicate IDs; use --workers "
                    "1, or lease worker ids (allocator = {type = \"sql\", backend = ...})",
                )
    if options.snowflake_default is not None:
        chosen = infos.get(options.snowflake_default)
        if chosen is None or chosen.layout is None:
            known = [n for n, i in infos.items() if i.layout is not None]
            from flakekit.plugin import UnknownNameError

            raise UnknownNameError("--snowflake-default", "snowflake generator",
                                   options.snowflake_default, known)
    return settings


def member_port(options: ServerOptions, process: int) -> int:
    """The private port of process ``process`` of a cluster node (``--member-port``,
    default ``--port`` + 1, plus the process index)."""
    first = options.member_port if options.member_port is not None else options.port + 1
    return first + process


def check_member_ports(settings: Any, options: ServerOptions) -> None:
    """A cluster node on N processes: every process is a member advertising a port of
    its own (:mod:`flakekit.cluster.processes`), so the node needs an advertise URL and
    N fixed ports beside the public one."""
    if not settings.advertise:
        raise ConfigError("--advertise", f"--workers {options.workers} in cluster mode: each "
                          "process advertises a port of its own on the node's host, so the "
                          "node needs --advertise (or $FLAKEKIT_ADVERTISE, [cluster] advertise), "
                          "e.g. http://10.0.0.5:8080")
    if options.member_port is None and options.port == 0:
        raise ConfigError("--member-port", f"--workers {options.workers} in cluster mode with "
                          "--port 0: the processes' private ports must stay the same across "
                          "restarts; pass --port N or --member-port N")
    first, last = member_port(options, 0), member_port(options, options.workers - 1)
    if first < 1 or last > 65535 or first <= options.port <= last:
        raise ConfigError("--member-port", f"the private ports of {options.workers} processes "
                          f"({first}-{last}) must lie within 1-65535 and leave out the public "
                          f"--port {options.port}; pass another --member-port")


def make_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc.strerror} (--host/--port)") from None
    sock.setblocking(False)
    return sock


def new_loop(kind: str) -> tuple[asyncio.AbstractEventLoop, str]:
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise ConfigError("--loop",
                                  "uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.new_event_loop(), "uvloop"
    return asyncio.new_event_loop(), "asyncio"


def _identity(port: int, process: int) -> Any:
    """This process's identity for allocators: $FLAKEKIT_HOST / $FLAKEKIT_PORT, else the
    host name and the requested port; the worker process index is the instance, so
    allocators know the processes sharing the port are siblings, each with its own id.

    ``--port 0`` stays port 0 here: a random port is no stable identity, and an allocator
    that keys worker ids by ip:port (ZooKeeper leaf mode) must see it to refuse it instead
    of burning a new worker id on every restart."""
    import attrs

    from flakekit.embed import default_identity

    me = default_identity()
    return attrs.evolve(me, port=me.port or port, instance=process)


def run_worker(
    config: Any, options: ServerOptions, sock: socket.socket, *, process: int = 0,
    run_dir: str | None = None, on_ready: Callable[[IdService], None] | None = None,
    member_sock: socket.socket | None = None, parent: int | None = None,
) -> int:
    """Build and start the kit, serve on ``sock`` until SIGTERM/SIGINT, then clean up.
    ``member_sock``: this process's private listener (a cluster node on several
    processes: the port its member advertises, where forwarded requests arrive).
    ``parent``: the supervisor's pid; once it is gone (killed with SIGKILL, say) this
    process stops as on SIGTERM rather than serve on, unsupervised and unstoppable by the
    service manager that stops the supervisor."""
    from flakekit.embed import build_kit, get_host
    from flakekit_server.http import HttpProtocol, ServerState, sweeper

    # background threads (lease renewal, segment fetches) hand the GIL back within 1 ms
    sys.setswitchinterval(0.001)
    loop, loop_name = new_loop(options.loop)
    asyncio.set_event_loop(loop)
    kit = build_kit(config, get_host(), identity=_identity(
        options.port if options.requested_port is None else options.requested_port, process),
        as_member=False)
    # before the join: a SIGTERM at any moment of the start-up ends in a clean exit (the
    # node never joins, or leaves), never in a kill that leaves its row alive. Plain
    # handlers until the loop serves (uvloop drops a signal that comes while it is not
    # running): one cuts kit.start() short (a store that does not answer may hold it for
    # its connect timeout); from the join on, a signal is only noted, never raised into it
    stop = asyncio.Event()
    requested: list[int] = []
    starting = [True]

    def on_signal(signum: int, _frame: object) -> None:
        requested.append(signum)
        if starting[0]:
            raise _StoppedStarting

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    service: IdService | None = None
    try:
        try:
            kit.start()
        finally:
            starting[0] = False
        node = None
        if config.cluster is not None and not requested:
            # joins the membership; the strict generators are served through it from now on
            node = kit.cluster_node(node=options.node, advertise=options.advertise)
            node.start()
        if requested:   # stopped during the start-up: serve nothing (kit.close() leaves)
            log.info("process %d: signal %d during the start-up; not serving", process,
                     requested[0])
            return 0
        service = IdService(kit, options, process=process, run_dir=run_dir,
                            stack=f"httptools + {loop_name}", cluster=node)
        from flakekit_server import otel_available

        if otel_available():   # the /metrics numbers as OpenTelemetry instruments too
            from flakekit_server.otel import export_metrics

            export_metrics(service.snapshot)
        # everything built so far lives as long as the process: keep it out of the
        # collector's full passes, which otherwise show up as request tail latency
        gc.collect()
        gc.freeze()
        state = ServerState(options)
        servers = [loop.run_until_complete(loop.create_server(
            lambda: HttpProtocol(service, state), sock=s, backlog=2048))
            for s in ([sock] if member_sock is None else [sock, member_sock])]
        sweep = loop.create_task(sweeper(state))
        publisher = loop.create_task(_publish(service))
        orphaned = None if parent is None else loop.create_task(
            _watch_parent(parent, stop, process))
        if on_ready is not None:
            on_ready(service)
        loop.run_until_complete(_until_stopped(stop, requested))
        # graceful: no longer ready, stop accepting, close connections, then release
        service.stopping = True
        if orphaned is not None:
            orphaned.cancel()
        if publisher:
            publisher.cancel()
            try:
                service.write_snapshot()   # the last one says "shutting down"
            except OSError:
                pass
        for server in servers:
            server.close()
        state.close_idle()
        sweep.cancel()
        loop.run_until_complete(state.finish(options.grace))
        loop.run_until_complete(asyncio.sleep(0.05))
        log.info("process %d: stopped serving; releasing leases", process)
    except _StoppedStarting:
        log.info("process %d: signal %d during the start-up; not serving", process,
                 requested[0])
    finally:
        try:
            if service is not None:
                service.close()
        finally:
            kit.close()
            loop.close()
    return 0


#: how long the supervisor waits for a process to start (or, stopped meanwhile, to exit)
START_TIMEOUT_S = 120.0


class _StoppedStarting(BaseException):
    """SIGTERM/SIGINT while the kit starts: the start-up ends there (then kit.close())."""


async def _until_stopped(stop: asyncio.Event, requested: list[int]) -> None:
    """Serve until SIGTERM/SIGINT: the loop's own handlers from now on, installed while
    it runs (uvloop drops a signal that comes while it is not); one that came before
    them, during the start-up's last steps, counts too."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if requested:
        stop.set()
    await stop.wait()


#: how often a supervised process checks that its supervisor is still there (seconds)
PARENT_CHECK_S = 0.5


async def _watch_parent(parent: int, stop: asyncio.Event, process: int) -> None:
    """Stop (gracefully: leases released) once the supervisor ``parent`` is gone: a
    process whose parent died is re-parented, so ``os.getppid()`` changes."""
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("process %d: the supervisor (pid %d) is gone; stopping", process, parent)
    stop.set()


async def _publish(service: IdService, interval: float = 1.0) -> None:
    """Sample the IDs counters and write the process's snapshot to the run directory (if
    any) every second. In the event loop (a fraction of a millisecond), so no thread
    competes with requests for the GIL."""
    while True:
        try:
            service.sample_rates()
            service.write_snapshot()
        except Exception:
            log.exception("could not publish the process snapshot")
        await asyncio.sleep(interval)


def _announce(options: ServerOptions, port: int, processes: int, stack: str,
              members: str = "") -> None:
    host = f"[{options.host}]" if ":" in options.host else options.host
    print(f"flakekit serve: listening on http://{host}:{port} ({processes} "
          f"process{'es' if processes > 1 else ''}, {stack}{members})", flush=True)


def serve(config: Any, options: ServerOptions) -> int:
    """Serve ``config`` until SIGTERM/SIGINT; returns the exit status."""
    settings = check_config(config, options)
    if options.workers == 1:
        sock = make_socket(options.host, options.port, reuse_port=False)
        port = sock.getsockname()[1]
        options = _with_port(options, port)
        return run_worker(config, options, sock, on_ready=lambda s: _announce(
            options, port, 1, s.stack))
    return Supervisor(config, options, settings).run()


def _kill(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` unless it has gone already."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _with_port(options: ServerOptions, port: int) -> ServerOptions:
    import attrs

    requested = options.port if options.requested_port is None else options.requested_port
    return attrs.evolve(options, port=port, requested_port=requested)


class Supervisor:
    """Forks the worker processes, restarts dead ones, stops them all on a signal."""

    def __init__(self, config: Any, options: ServerOptions, cluster: Any = None) -> None:
        self.config = config
        #: the node's ClusterSettings (cluster mode): every process joins as a member of
        #: its own, ``<node>.<i>`` at ``member_port(i)`` (flakekit.cluster.processes)
        self.cluster = cluster
        # SHARE_SOCKET: one listening socket, inherited by every worker; a busy worker
        # accepts less, so load evens out even with few client connections. Otherwise
        # SO_REUSEPORT: the kernel hashes connections onto per-process sockets (the
        # parent's socket is bound but never listens, so it keeps the port and gets none).
        self.anchor = make_socket(options.host, options.port, reuse_port=not SHARE_SOCKET)
        if SHARE_SOCKET:
            self.anchor.listen(2048)
        self.port = self.anchor.getsockname()[1]
        self.options = _with_port(options, self.port)
        self.run_dir = tempfile.mkdtemp(prefix="flakekit-serve-")
        self.children: dict[int, int] = {}     # pid -> process index
        self.stopping = False
        self.restarts: dict[int, float] = {}
        self.serving: set[int] = set()           # process indexes that reported ready
        self.restart_count: dict[int, int] = {}
        self.last_error: dict[int, str] = {}
        #: set by SIGTERM/SIGINT; every wait of the supervisor (start-up included) ends on it
        self.stop = threading.Event()

    def _fork(self, index: int) -> tuple[int, int]:
        """Start worker ``index``; returns (pid, read end of its status pipe)."""
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            status = 1
            pipe_open = [True]
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                if SHARE_SOCKET:
                    sock = self.anchor
                else:
                    self.anchor.close()
                    sock = make_socket(self.options.host, self.port, reuse_port=True)
                options, member_sock = self.options, None
                if self.cluster is not None:
                    options, member_sock = self._member(index)

                def ready(service: IdService) -> None:
                    service.write_snapshot()
                    os.write(w, json.dumps({"ok": True, "stack": service.stack}).encode())
                    os.close(w)
                    pipe_open[0] = False

                status = run_worker(self.config, options, sock, process=index,
                                    run_dir=self.run_dir, on_ready=ready,
                                    member_sock=member_sock, parent=parent)
            except BaseException as exc:  # report to the parent, then exit
                from flakekit.embed import USAGE_ERRORS

                usage = isinstance(exc, USAGE_ERRORS)
                message = (str(exc) if isinstance(exc, FlakekitError)
                           else f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, FlakekitError):
                    log.exception("process %d failed", index)
                if pipe_open[0]:
                    try:
                        os.write(w,
                                 json.dumps({"ok": False, "error": message,
                                             "usage": usage}).encode())
                    except OSError:
                        pass
                status = 2 if usage else 1
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(w)
        self.children[pid] = index
        return pid, r

    def _member(self, index: int) -> tuple[ServerOptions, socket.socket]:
        """Process ``index``'s member identity and private listener (in the child)."""
        import attrs

        from flakekit.embed import process_advertise, process_node

        port = member_port(self.options, index)
        sock = make_socket(self.options.host, port, reuse_port=False)
        return attrs.evolve(
            self.options, node=process_node(self.cluster.node, index),
            advertise=process_advertise(self.cluster.advertise, port)), sock

    def _members(self) -> str:
        """The banner's list of this node's members (cluster mode)."""
        if self.cluster is None:
            return ""
        from flakekit.embed import process_node

        last = self.options.workers - 1
        return (f"; cluster members {process_node(self.cluster.node, 0)} .. "
                f"{process_node(self.cluster.node, last)} on ports "
                f"{member_port(self.options, 0)}-{member_port(self.options, last)}")

    def _read_status(self, r: int, timeout: float) -> dict[str, Any]:
        import select

        chunks = b""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if self.stop.is_set():
                os.close(r)
                return {"ok": False, "error": "stopped by a signal during start-up",
                        "stopped": True}
            if left <= 0:
                os.close(r)
                return {"ok": False, "error": f"did not start within {timeout:g} s"}
            ready, _, _ = select.select([r], [], [], min(left, 0.1))
            if not ready:
                continue
            data = os.read(r, 65536)
            if not data:
                break
            chunks += data
        os.close(r)
        try:
            return json.loads(chunks or b'{"ok": false, "error": "exited during start-up"}')
        except ValueError:
            return {"ok": False, "error": "exited during start-up"}

    def run(self) -> int:
        stop = self.stop

        def on_signal(signum: int, frame: Any) -> None:
            stop.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            pipes = [self._fork(i) for i in range(self.options.workers)]
            stack = ""
            failure: dict[str, Any] | None = None
            for index, (_pid, r) in enumerate(pipes):
                status = self._read_status(r, timeout=START_TIMEOUT_S)
                if not status.get("ok"):
                    failure = failure or status
                else:
                    self.serving.add(index)
                stack = status.get("stack", stack)
            if stop.is_set():  # SIGTERM/SIGINT during start-up: stop, it is no failure
                # a process that joined the cluster leaves once its bounded start-up step
                # ends: wait for that as long as for a start, not only --grace (a kill
                # would leave its member alive until the lease lapses)
                self._stop_all(max(self.options.grace, START_TIMEOUT_S))
                return 0
            if failure is not None:
                self._stop_all()
                if failure.get("usage"):
                    raise ConfigError("", failure["error"])
                raise ServeError(f"a worker process failed to start: {failure['error']}")
            self._publish()
            _announce(self.options, self.port, self.options.workers, stack, self._members())
            while not stop.is_set():
                self._reap(restart=True)
                self._publish()
                stop.wait(0.2)
            self._stop_all()
            return 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            self.anchor.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _reap(self, restart: bool) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            index = self.children.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.serving.discard(index)
            try:
                os.unlink(os.path.join(self.run_dir, f"process-{index}.json"))
            except OSError:
                pass
            if not restart or self.stopping:
                continue
            self.last_error.setdefault(index, f"exited with status {code}")
            delay = self._backoff(index)
            log.error("process %d (pid %d) exited with status %s; restarting in %.1f s",
                      index, pid, code, delay)
            self._publish()
            if self.stop.wait(delay):
                return
            self.restart_count[index] = self.restart_count.get(index, 0) + 1
            _pid, r = self._fork(index)
            self._publish()
            status_ = self._read_status(r, timeout=START_TIMEOUT_S)
            if status_.get("ok"):
                self.serving.add(index)
                self.last_error.pop(index, None)
            else:
                self.last_error[index] = str(status_.get("error"))
                log.error("process %d did not restart: %s", index, status_.get("error"))
            self._publish()

    def _publish(self) -> None:
        """Write what the workers' /ready, /metrics and monitor page report about the
        processes: expected, serving, restarts and the last failure of each."""
        pids = {index: pid for pid, index in self.children.items()}
        data = {
            "expected": self.options.workers, "time": time.time(),
            "processes": [
                {"process": i, "pid": pids.get(i), "serving": i in self.serving,
                 "restarts": self.restart_count.get(i, 0), "last_error": self.last_error.get(i)}
                for i in range(self.options.workers)
            ],
        }
        tmp = os.path.join(self.run_dir, ".supervisor.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, os.path.join(self.run_dir, "supervisor.json"))
        except OSError as exc:
            log.warning("could not publish the supervisor's status: %s", exc)

    def _backoff(self, index: int) -> float:
        now = time.monotonic()
        last = self.restarts.get(index)
        self.restarts[index] = now
        # a cluster process restarted after a crash is refused until its own lease lapses
        # (the membership fences one identity to one process): try again soon, not later
        cap = 2.0 if self.cluster is not None else 30.0
        return 0.5 if last is None or now - last > 60 else min(cap, max(1.0, (now - last) * 2))

    def _stop_all(self, grace: float | None = None) -> None:
        """SIGTERM every process, SIGKILL those still there after ``grace`` (--grace)."""
        grace = self.options.grace if grace is None else grace
        self.stopping = True
        for pid in list(self.children):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.children and time.monotonic() < deadline:
            self._reap(restart=False)
            time.sleep(0.05)
        for pid in list(self.children):
            log.error("process %d (pid %d) did not stop within %g s; killing it",
                      self.children[pid], pid, grace)
            _kill(pid, signal.SIGKILL)
        while self.children:
            self._reap(restart=False)
            time.sleep(0.01)
