"""Running the server: one process, or a supervisor and one worker process per core.

Each worker process binds its own ``SO_REUSEPORT`` socket (the kernel spreads new
connections over them), builds its own :class:`~flakekit.kit.Kit` *after* the fork and
so acquires its own worker lease; nothing lease-related is inherited. The supervisor
only checks the config, forks, waits for every worker to report that it is serving,
restarts a worker that dies (with back-off), and on SIGTERM/SIGINT asks every worker to
shut down gracefully: stop accepting, close connections, release leases, give back
segment tails.

Workers publish their numbers to a private run directory once a second, so ``/metrics``,
``/ready`` and the monitor page of any process cover all of them.
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

from flakekit.errors import ConfigError, FlakekitError
from flakekit_server.app import IdService, ServerOptions

__all__ = ["ServeError", "check_config", "run_worker", "serve"]

log = logging.getLogger("flakekit.server")

#: workers accept from one inherited socket (True) or SO_REUSEPORT sockets (False)
SHARE_SOCKET = os.environ.get("FLAKEKIT_SERVER_REUSEPORT", "") != "1"
#: allocator types whose worker id is fixed: two processes would issue the same IDs
FIXED_ALLOCATORS = {"static"}


class ServeError(FlakekitError):
    """The server could not start (a worker failed, the port is taken...)."""


def allocator_type(table: Any) -> str | None:
    alloc = table.get("allocator")
    if isinstance(alloc, str):
        return alloc
    if isinstance(alloc, dict):
        kind = alloc.get("type")
        return kind if isinstance(kind, str) else None
    return None


def check_config(config: Any, options: ServerOptions) -> None:
    """Refuse what cannot be served safely, before any process starts."""
    if options.workers > 1:
        for name, spec in config.generators.items():
            kind = allocator_type(spec.table) if spec.strategy == "snowflake" else None
            if kind in FIXED_ALLOCATORS:
                raise ConfigError(
                    f"generators.{name}.allocator",
                    f"a {kind!r} allocator gives every process the same worker id, so "
                    f"--workers {options.workers} would issue duplicate IDs; use --workers 1, "
                    "or lease worker ids (allocator = {type = \"sql\", backend = ...})",
                )
    if options.snowflake_default is not None:
        spec = config.generators.get(options.snowflake_default)
        if spec is None or spec.strategy != "snowflake":
            known = [n for n, s in config.generators.items() if s.strategy == "snowflake"]
            from flakekit.errors import UnknownNameError

            raise UnknownNameError("--snowflake-default", "snowflake generator",
                                   options.snowflake_default, known)


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
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror} (--host/--port)") from None
    sock.setblocking(False)
    return sock


def new_loop(kind: str) -> tuple[asyncio.AbstractEventLoop, str]:
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise ConfigError("--loop", "uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.new_event_loop(), "uvloop"
    return asyncio.new_event_loop(), "asyncio"


def _identity(port: int, process: int) -> Any:
    """This process's identity for allocators: $FLAKEKIT_HOST / $FLAKEKIT_PORT, else the
    host name and the listening port; the worker process index is the instance, so
    allocators know the processes sharing the port are siblings, each with its own id."""
    import attrs

    from flakekit.kit import default_identity

    me = default_identity()
    return attrs.evolve(me, port=me.port or port, instance=process)


def run_worker(
    config: Any, options: ServerOptions, sock: socket.socket, *, process: int = 0,
    run_dir: str | None = None, on_ready: Callable[[IdService], None] | None = None,
) -> int:
    """Build and start the kit, serve on ``sock`` until SIGTERM/SIGINT, then clean up."""
    from flakekit.host import get_host
    from flakekit.kit import build_kit
    from flakekit_server.http import HttpProtocol, ServerState, sweeper

    # background threads (lease renewal, segment fetches) hand the GIL back within 1 ms
    sys.setswitchinterval(0.001)
    loop, loop_name = new_loop(options.loop)
    asyncio.set_event_loop(loop)
    kit = build_kit(config, get_host(), identity=_identity(sock.getsockname()[1], process))
    try:
        kit.start()
        service = IdService(kit, options, process=process, run_dir=run_dir,
                            stack=f"httptools + {loop_name}")
        # everything built so far lives as long as the process: keep it out of the
        # collector's full passes, which otherwise show up as request tail latency
        gc.collect()
        gc.freeze()
        state = ServerState(options)
        server = loop.run_until_complete(loop.create_server(
            lambda: HttpProtocol(service, state), sock=sock, backlog=2048))
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sweep = loop.create_task(sweeper(state))
        publisher = loop.create_task(_publish(service)) if run_dir else None
        if on_ready is not None:
            on_ready(service)
        loop.run_until_complete(stop.wait())
        # graceful: no longer ready, stop accepting, close connections, then release
        service.stopping = True
        if publisher:
            publisher.cancel()
            try:
                service.write_snapshot()   # the last one says "shutting down"
            except OSError:
                pass
        server.close()
        state.close_idle()
        sweep.cancel()
        loop.run_until_complete(asyncio.sleep(0.05))
        log.info("process %d: stopped serving; releasing leases", process)
    finally:
        kit.close()
        loop.close()
    return 0


async def _publish(service: IdService, interval: float = 1.0) -> None:
    """Write the process's snapshot to the run directory every second. In the event loop
    (a fraction of a millisecond), so no thread competes with requests for the GIL."""
    while True:
        try:
            service.write_snapshot()
        except Exception:  # noqa: BLE001
            log.exception("could not publish the process snapshot")
        await asyncio.sleep(interval)


def _announce(options: ServerOptions, port: int, processes: int, stack: str) -> None:
    host = f"[{options.host}]" if ":" in options.host else options.host
    print(f"flakekit serve: listening on http://{host}:{port} ({processes} "
          f"process{'es' if processes > 1 else ''}, {stack})", flush=True)


def serve(config: Any, options: ServerOptions) -> int:
    """Serve ``config`` until SIGTERM/SIGINT; returns the exit status."""
    check_config(config, options)
    if options.workers == 1:
        sock = make_socket(options.host, options.port, reuse_port=False)
        port = sock.getsockname()[1]
        options = _with_port(options, port)
        return run_worker(config, options, sock, on_ready=lambda s: _announce(
            options, port, 1, s.stack))
    return Supervisor(config, options).run()


def _with_port(options: ServerOptions, port: int) -> ServerOptions:
    import attrs

    return attrs.evolve(options, port=port)


class Supervisor:
    """Forks the worker processes, restarts dead ones, stops them all on a signal."""

    def __init__(self, config: Any, options: ServerOptions) -> None:
        self.config = config
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
        #: set by SIGTERM/SIGINT; every wait of the supervisor (start-up included) ends on it
        self.stop = threading.Event()

    def _fork(self, index: int) -> tuple[int, int]:
        """Start worker ``index``; returns (pid, read end of its status pipe)."""
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
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

                def ready(service: IdService) -> None:
                    service.write_snapshot()
                    os.write(w, json.dumps({"ok": True, "stack": service.stack}).encode())
                    os.close(w)
                    pipe_open[0] = False

                status = run_worker(self.config, self.options, sock, process=index,
                                    run_dir=self.run_dir, on_ready=ready)
            except BaseException as exc:  # noqa: BLE001 - report to the parent, then exit
                from flakekit.cli import USAGE_ERRORS

                usage = isinstance(exc, USAGE_ERRORS)
                message = str(exc) if isinstance(exc, FlakekitError) else f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, FlakekitError):
                    log.exception("process %d failed", index)
                if pipe_open[0]:
                    try:
                        os.write(w, json.dumps({"ok": False, "error": message, "usage": usage}).encode())
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
            for _pid, r in pipes:
                status = self._read_status(r, timeout=120)
                if not status.get("ok"):
                    failure = failure or status
                stack = status.get("stack", stack)
            if stop.is_set():  # SIGTERM/SIGINT during start-up: stop, it is no failure
                self._stop_all()
                return 0
            if failure is not None:
                self._stop_all()
                if failure.get("usage"):
                    raise ConfigError("", failure["error"])
                raise ServeError(f"a worker process failed to start: {failure['error']}")
            _announce(self.options, self.port, self.options.workers, stack)
            while not stop.is_set():
                self._reap(restart=True)
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
            try:
                os.unlink(os.path.join(self.run_dir, f"process-{index}.json"))
            except OSError:
                pass
            if not restart or self.stopping:
                continue
            delay = self._backoff(index)
            log.error("process %d (pid %d) exited with status %s; restarting in %.1f s",
                      index, pid, code, delay)
            if self.stop.wait(delay):
                return
            _pid, r = self._fork(index)
            status_ = self._read_status(r, timeout=120)
            if not status_.get("ok"):
                log.error("process %d did not restart: %s", index, status_.get("error"))

    def _backoff(self, index: int) -> float:
        now = time.monotonic()
        last = self.restarts.get(index)
        self.restarts[index] = now
        return 0.5 if last is None or now - last > 60 else min(30.0, max(1.0, (now - last) * 2))

    def _stop_all(self) -> None:
        self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.options.grace
        while self.children and time.monotonic() < deadline:
            self._reap(restart=False)
            time.sleep(0.05)
        for pid in list(self.children):
            log.error("process %d (pid %d) did not stop within %g s; killing it",
                      self.children[pid], pid, self.options.grace)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.children:
            self._reap(restart=False)
            time.sleep(0.01)
