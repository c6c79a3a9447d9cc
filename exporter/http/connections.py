"""Slow and idle clients cannot take the server away from Prometheus.

uvicorn (0.54) has no timeout for a request's head: a connection that trickles header bytes, or sends
nothing at all, stays open for good, and enough of them use up the file descriptors, after which
nothing is accepted and asyncio logs "Too many open files" on every attempt. Here, on top of uvicorn's
h11 protocol:

- a connection must send a whole request head within the header timeout, counted from when it opens
  or from the end of its previous response; otherwise it is closed;
- open connections are capped below the file-descriptor limit; when full, the connection that has
  waited longest without a complete request head is closed to make room, so trickling clients cannot
  keep a scraper out (a scraper sends its request at once and is never the one waiting longest);
- the "Too many open files" lines are logged once a minute, with a count, not thousands of times.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
# Descriptors kept for the daemon itself (journal, kernel log, listening sockets) and for the sockets
# asyncio accepts in one go before any of them reaches the cap (up to the listen backlog).
LISTEN_BACKLOG = 128
RESERVED_FDS = 64 + LISTEN_BACKLOG
MIN_CONNECTIONS = 8


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one (as Go programs do) and return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft


def connection_cap(wanted: int, fd_limit: int) -> int:
    """At most `wanted` connections, and few enough that accepting never runs out of descriptors."""
    return max(MIN_CONNECTIONS, min(wanted, fd_limit - RESERVED_FDS))


class Guard:
    """What the connections of one server share: the cap, the header timeout, who is waiting."""

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.waiting: OrderedDict[GuardedH11Protocol, None] = OrderedDict()  # longest waiting first
        self.closed_slow = 0  # for tests and the soak bench: connections closed for want of a head
        self.evicted = 0

    def make_room(self, newcomer: GuardedH11Protocol, open_connections: int) -> bool:
        """Whether `newcomer` may stay: over the cap, the longest-waiting other connection goes instead."""
        if open_connections <= self.max_connections:
            return True
        for victim in self.waiting:
            if victim is not newcomer:
                self.evicted += 1
                victim.drop()
                return True
        return False


class GuardedH11Protocol(H11Protocol):
    guard: Guard  # set on the subclass protocol_class() makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._cycle_waited_on: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_head()
        if not self.guard.make_room(self, len(self.connections)):
            self.drop()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._cycle_waited_on:
            self._stop_waiting()  # the head is complete: a request is under way

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Unless it is closing, or a pipelined request is already under way, the next head is awaited.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def drop(self) -> None:
        self._stop_waiting()
        self.transport.abort()  # at once: the descriptor is what is short

    def _wait_for_head(self) -> None:
        self._stop_waiting()
        self._cycle_waited_on = self.cycle
        self._head_timer = self.loop.call_later(self.guard.header_timeout, self._head_timed_out)
        self.guard.waiting[self] = None

    def _stop_waiting(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.guard.waiting.pop(self, None)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self.guard.waiting.pop(self, None)
        self.guard.closed_slow += 1
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(guard: Guard) -> type[GuardedH11Protocol]:
    """uvicorn's `http=`: the h11 protocol under `guard` (never httptools, which this does not cover)."""
    return type("ServerH11Protocol", (GuardedH11Protocol,), {"guard": guard})


_FD_ERRNOS = (errno.EMFILE, errno.ENFILE)


class OutOfFilesFilter(logging.Filter):
    """Lets one "Too many open files" record through per `interval` seconds, counting the rest."""

    def __init__(self, interval: float = 60.0, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._next = float("-inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _out_of_files(record):
            return True
        now = self._clock()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.interval
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} more like it not logged)"
            self.suppressed = 0
        return True


def _out_of_files(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, OSError) and exc.errno in _FD_ERRNOS:
        return True
    return "Too many open files" in record.getMessage()
