"""`gpu-triage serve`: open the backend, bind the listen addresses, run the daemon and the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import gc
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.exporter.backends.base import BackendError
from gpu_triage.exporter.backends.select import open_configured
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.http.connections import (
    LISTEN_BACKLOG,
    Guard,
    OutOfFilesFilter,
    connection_cap,
    protocol_class,
    raise_fd_limit,
)
from gpu_triage.exporter.http.web_config import WebConfig, WebConfigError, load_web_config
from gpu_triage.exporter.sd_notify import Notifier, Watchdog
from gpu_triage.exporter.settings import Settings, parse_listen_address, state_dir_origin
from gpu_triage.exporter.sources.journal import JournalError

log = logging.getLogger(__name__)


def _nothing() -> None:
    pass


class _Server(uvicorn.Server):
    """uvicorn, except that after a graceful stop on SIGTERM/SIGINT it returns instead of re-raising
    the signal, so the daemon's own cleanup runs and the exit status is 0; it says when it starts
    serving and when it starts shutting down (for systemd's READY=1 and STOPPING=1); and its main loop
    wakes once a second, not ten times."""

    tick_seconds = 1.0  # how often the main loop wakes when nothing signals it

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_serving: Callable[[], None] = _nothing,
        on_stopping: Callable[[], None] = _nothing,
    ) -> None:
        super().__init__(config)
        self._on_serving = on_serving
        self._on_stopping = on_stopping
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Future[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_serving()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_stopping()
        await super().shutdown(sockets)

    async def main_loop(self) -> None:
        # uvicorn's sleeps 0.1 s between ticks to refresh the Date header each tenth and see should_exit: an idle
        # daemon's main thread woke ten times a second for it. This one ticks as the wall clock's second turns
        # (the Date header stays right to the second) and at once on SIGTERM/SIGINT (handle_exit wakes it).
        self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):  # a counter of 0: the Date header is refreshed on every tick
            self._tick = self._loop.create_future()
            # Just past the turn of the next second on the wall clock (a timer early by the loop's resolution
            # would refresh to the second that is ending).
            period = self.tick_seconds
            timer = self._loop.call_later(period - time.time() % period + 0.001, self._wake)
            try:
                await self._tick
            finally:
                timer.cancel()

    def _wake(self) -> None:
        if self._tick is not None and not self._tick.done():
            self._tick.set_result(None)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("stopping", extra={"signal": signal.Signals(sig).name})
        super().handle_exit(sig, frame)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits to be woken
                self._loop.call_soon_threadsafe(self._wake)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class StartupError(Exception):
    """The daemon cannot start; the message tells the user why and what to do."""


def bind(address: str) -> socket.socket:
    """A listening socket for `address`; ':port' is every address, IPv6 and IPv4 where the host has both."""
    host, port = parse_listen_address(address)
    sock: socket.socket | None = None
    try:
        if host:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, kind, proto)
        else:
            try:
                sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sockaddr = ("::", port)
            except OSError:  # no IPv6 on this host
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockaddr = ("0.0.0.0", port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        if sock is not None:
            sock.close()
        hint = " (is another gpu-triage already running?)" if e.errno == errno.EADDRINUSE else ""
        raise StartupError(f"cannot listen on {address}: {e.strerror or e}{hint}") from e
    return sock


def _status_line(daemon: Daemon) -> str:
    """One line for `systemctl status`: "8 GPUs, 8 up; node healthy", and why it is not ready when it is not."""
    reason = daemon.readiness()
    return daemon.status_line() + ("" if reason is None else f"; not ready: {reason}")


def _server_config(daemon: Daemon, web: WebConfig) -> tuple[uvicorn.Config, Guard]:
    settings, tls = daemon.settings, web.tls
    guard = Guard(connection_cap(settings.web_max_connections, raise_fd_limit()), settings.web_read_header_timeout)
    for name in ("asyncio", "uvicorn.error"):  # where accept() and uvicorn report running out of files
        logging.getLogger(name).addFilter(OutOfFilesFilter())
    config = uvicorn.Config(
        create_app(daemon, web),
        http=protocol_class(guard),
        backlog=LISTEN_BACKLOG,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        ssl_context_factory=None if tls is None else lambda _config, _default: tls.context(),
    )
    return config, guard


def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT. Raises StartupError when it cannot start.

    Under systemd (Type=notify) it says READY=1 once the backend is open, the first snapshot taken and
    the listen sockets served; then pings the watchdog while the poll loop turns and keeps STATUS=
    current; and says STOPPING=1 when shutdown begins.

    However it ends, the log says why: a signal, an error (with its traceback), or a fatal signal in native
    code (a driver library's SIGSEGV or SIGBUS), which faulthandler reports on stderr with every thread's
    stack before the process dies.
    """
    faulthandler.enable(sys.stderr)
    _refuse_pydantic_v1()
    try:
        _serve(settings)
    except StartupError:
        raise  # the caller says why, in one line
    except Exception:
        log.critical("stopping on an unexpected error", exc_info=True)
        raise


def _refuse_pydantic_v1() -> None:
    """FastAPI imports pydantic.v1 (1.7 MiB, held for the life of the process) only to ask of each route's
    models whether they are pydantic 1 models, which ours never are; refused the import, it answers no, as
    under a pydantic that has no v1. (A model of ours with a pydantic 1 type in it would fail to build.)"""
    sys.modules.setdefault("pydantic.v1", None)  # type: ignore[arg-type]  # None: "import refused"


def _serve(settings: Settings) -> None:
    log.info("state directory", extra={"path": str(settings.state_dir), "why": state_dir_origin(settings)})
    web = WebConfig()
    if settings.web_config_file is not None:
        try:
            web = load_web_config(settings.web_config_file)
        except WebConfigError as e:
            raise StartupError(str(e)) from e
    notifier = Notifier()
    notifier.status("starting: opening the GPU backend")
    try:
        backend = open_configured(settings)
    except BackendError as e:
        notifier.close()
        raise StartupError(str(e)) from e
    sockets: list[socket.socket] = []
    daemon: Daemon | None = None
    try:
        sockets = [bind(address) for address in settings.web_listen_address]
        try:
            daemon = Daemon(backend, settings)
            daemon.start()
        except (JournalError, BackendError, DataError) as e:
            raise StartupError(str(e)) from e
        watchdog = Watchdog(
            notifier, daemon.alive, lambda: _status_line(daemon), status_interval=settings.collector_interval
        )

        def serving() -> None:
            # What start-up loaded (modules, the app, the checked data) lives as long as the process: out of the
            # collector's sight, so that its full collections, which a render's garbage sets off, walk only what
            # came since.
            gc.collect()
            gc.freeze()
            notifier.ready(_status_line(daemon))
            watchdog.start()

        def stopping() -> None:
            notifier.stopping()
            watchdog.stop()

        try:
            config, guard = _server_config(daemon, web)
            for sock in sockets:
                host, port = sock.getsockname()[:2]
                address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                log.info("listening", extra={"address": address, "max_connections": guard.max_connections})
            _Server(config, on_serving=serving, on_stopping=stopping).run(sockets=sockets)
        finally:
            stopping()  # again (a no-op) in case uvicorn ended without a graceful shutdown
            log.info("stopped")
    finally:
        if daemon is not None:
            daemon.stop()  # lets go of the backend too, also when start() failed half-way
        else:
            backend.close()
        for sock in sockets:
            sock.close()
        notifier.close()
