"""`gpu-triage serve`: open the backend, bind the listen addresses, run the daemon and the HTTP server."""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

from exporter.app import create_app
from exporter.backends.base import BackendError
from exporter.backends.select import open_backend
from exporter.daemon import Daemon
from exporter.settings import Settings, parse_listen_address

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, except that after a graceful stop on SIGTERM/SIGINT it returns instead of re-raising
    the signal, so the daemon's own cleanup runs and the exit status is 0."""

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
    host, port = parse_listen_address(address)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
    except OSError as e:
        hint = " (is another gpu-triage already running?)" if e.errno == errno.EADDRINUSE else ""
        raise StartupError(f"cannot listen on {address}: {e.strerror or e}{hint}") from e
    return sock


def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT. Raises StartupError when it cannot start."""
    try:
        backend = open_backend(settings.backend, scenario=settings.sim_scenario)
    except BackendError as e:
        raise StartupError(str(e)) from e
    sockets = []
    try:
        sockets = [bind(address) for address in settings.web_listen_address]
        daemon = Daemon(backend, settings)
        try:
            daemon.start()
        except BackendError as e:
            raise StartupError(str(e)) from e
        try:
            config = uvicorn.Config(
                create_app(daemon),
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
            for sock in sockets:
                log.info("listening", extra={"address": "{}:{}".format(*sock.getsockname()[:2])})
            _Server(config).run(sockets=sockets)
        finally:
            log.info("stopping")
            daemon.stop()
    finally:
        for sock in sockets:
            sock.close()
        if not sockets:
            backend.close()
