"""sd_notify without libsystemd: tell systemd that the daemon is ready, still alive, what it sees, and stopping.

The protocol (sd_notify(3)) is one datagram of newline-separated `VAR=value` assignments sent to the
AF_UNIX socket named in `$NOTIFY_SOCKET`; a leading `@` names a socket in Linux's abstract namespace.
Outside systemd (or under `Type=simple`) the variable is unset and everything here does nothing.

Nothing here raises into the daemon. A failed send is logged once and otherwise ignored: a telemetry
daemon that dies because its supervisor's socket hiccupped would be worse than one left unsupervised,
and a real hang is still caught, because the watchdog pings stop and systemd restarts the service.

Man pages: sd_notify(3), sd_watchdog_enabled(3), systemd.service(5) (`Type=notify`, `NotifyAccess=`,
`WatchdogSec=`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from gpu_triage.exporter.worker import Worker

log = logging.getLogger(__name__)
T = TypeVar("T")


def _socket_address(value: str) -> bytes | None:
    """`$NOTIFY_SOCKET` as an AF_UNIX address, or None when there is nothing (usable) to notify."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + os.fsencode(value[1:])  # abstract namespace: a leading NUL byte, no file
    if value.startswith("/"):
        return os.fsencode(value)
    # systemd 254+ may hand out vsock:… addresses (for VMs); a node daemon never runs behind one.
    log.warning("NOTIFY_SOCKET is not an AF_UNIX socket; not notifying systemd", extra={"notify_socket": value})
    return None


def _watchdog_usec(environ: Mapping[str, str], pid: int) -> int | None:
    """WatchdogSec= in microseconds when the watchdog is meant for this process, as sd_watchdog_enabled(3)."""
    usec, owner = environ.get("WATCHDOG_USEC"), environ.get("WATCHDOG_PID")
    if not usec:
        return None
    try:
        timeout = int(usec)
        # WATCHDOG_PID names the process systemd watches; when it is another one (our parent, say, with this
        # process started from a wrapper), the pings would not count, and they are not ours to send.
        if owner and int(owner) != pid:
            return None
    except ValueError:
        log.warning("ignoring a malformed systemd watchdog setting", extra={"usec": usec, "pid": owner})
        return None
    return timeout if timeout > 0 else None


class Notifier:
    """Sends sd_notify messages to the socket in `$NOTIFY_SOCKET`; a no-op when it is unset.

    Safe to call from any thread. Sends never block for long (`timeout` seconds at most, should
    systemd's receive queue be full) and never raise.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *, timeout: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        self.socket_name = env.get("NOTIFY_SOCKET", "")
        self.address = _socket_address(self.socket_name)
        self.watchdog_usec = _watchdog_usec(env, os.getpid()) if self.address is not None else None
        self._timeout = timeout
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._failing = False
        self._stopping = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WatchdogSec=, as sd_watchdog_enabled(3) advises); None: no
        watchdog is asked of this process."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        """Send `VAR=value` assignments in one datagram; True when systemd's socket took it."""
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode()
        with self._lock:
            try:
                if self._socket is None:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._socket.settimeout(self._timeout)
                self._socket.sendto(message, self.address)
            except OSError as e:
                if not self._failing:  # once per outage: a ping every few seconds must not flood the journal
                    log.warning("cannot notify systemd", extra={"socket": self.socket_name, "error": str(e)})
                self._failing = True
                return False
            if self._failing:
                log.info("notifying systemd again", extra={"socket": self.socket_name})
                self._failing = False
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1: systemd considers the unit started (Type=notify) and starts ordering units after it."""
        return self.notify("READY=1", *([f"STATUS={_one_line(status)}"] if status is not None else []))

    def status(self, text: str) -> bool:
        """STATUS=: the line `systemctl status` shows."""
        return self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: still alive; systemd restarts the unit when these stop for WatchdogSec=."""
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        """STOPPING=1, once, however many code paths reach shutdown: the daemon is going away on purpose."""
        with self._lock:
            said, self._stopping = self._stopping, True
        return False if said else self.notify("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


def _one_line(text: str) -> str:
    # A newline would start a new assignment in the datagram.
    return " ".join(text.split())


class Watchdog:
    """A thread that pings WATCHDOG=1 while `alive()` is true and keeps STATUS= current with `status()`.

    The ping is tied to the daemon's own heartbeat rather than to a free-running timer: when the poll
    loop hangs, `alive()` turns false, the pings stop, and systemd restarts the daemon after WatchdogSec=.
    Pings go out every `notifier.watchdog_interval` seconds (none without WatchdogSec=); the status line
    is looked at every `status_interval` seconds and sent when it changes.
    """

    STALLED = "poll loop stalled, withholding watchdog pings"

    def __init__(
        self,
        notifier: Notifier,
        alive: Callable[[], bool],
        status: Callable[[], str],
        *,
        status_interval: float = 5.0,
    ) -> None:
        self.notifier = notifier
        self.interval = notifier.watchdog_interval
        self.status_interval = status_interval
        self._alive = alive
        self._status = status
        self._worker = Worker("sd-watchdog", self._turn)
        self._next_ping = 0.0
        self._last_status: str | None = None
        self._healthy = True
        self._complained: set[str] = set()

    def start(self) -> None:
        """Start the thread; nothing to do when systemd is not listening."""
        if not self.notifier.enabled or self._worker.started:
            return
        self._worker.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._worker.stop(timeout)

    def _turn(self) -> None:
        now = time.monotonic()
        self.tick(now)
        wake = now + self.status_interval
        if self.interval is not None:
            # Sleep until the next ping is due; while the loop is stalled, look again at the ping cadence so
            # that a loop that recovers is pinged for before systemd gives up on it.
            wake = min(wake, self._next_ping if self._healthy else now + self.interval)
        self._worker.stopping.wait(max(wake - time.monotonic(), 0.0))

    def tick(self, now: float | None = None) -> None:
        """One turn: ping if a ping is due and the daemon is alive; send the status line if it changed."""
        now = time.monotonic() if now is None else now
        healthy = self._check("alive", self._alive, False)
        if healthy != self._healthy:
            if healthy:
                log.info("poll loop turning again, watchdog pings resumed")
            else:
                # With WatchdogSec= set, systemd restarts the daemon WatchdogSec= after the last ping.
                watchdog_sec = None if self.interval is None else 2 * self.interval
                log.warning("poll loop stalled: withholding watchdog pings", extra={"watchdog_sec": watchdog_sec})
            self._healthy = healthy
        assignments = []
        if healthy and self.interval is not None and now >= self._next_ping:
            assignments.append("WATCHDOG=1")
            self._next_ping = now + self.interval
        text = self._check("status", self._status, None)
        if text is not None:
            text = _one_line(text if healthy else f"{self.STALLED}; {text}")
            if text != self._last_status:
                assignments.append(f"STATUS={text}")
        if assignments and self.notifier.notify(*assignments) and text is not None:
            self._last_status = text

    def _check(self, what: str, call: Callable[[], T], fallback: T) -> T:
        # The callables are the daemon's; a bug in them must not kill the thread that keeps systemd informed.
        try:
            return call()
        except Exception:
            if what not in self._complained:
                log.exception("sd_notify watchdog: the %s callback failed", what)
                self._complained.add(what)
            return fallback
