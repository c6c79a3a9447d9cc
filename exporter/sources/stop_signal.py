"""A stop event that poll(2) can wait on beside the file descriptors a reader blocks on.

A reader of a quiet source (the kernel log: quiet for months) should sleep in the kernel until there is
something to read, not wake every few hundred milliseconds to see whether it was told to stop: each wake
costs the node CPU all day. `StopSignal` is a `threading.Event` whose `set()` also makes `fileno()` (the read
end of a pipe) readable, so a reader polls its own descriptor and this one with no timeout and still stops at
once. Waiting on it as an Event works as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time


class StopSignal(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._read_fd, self._write_fd = os.pipe()  # not inherited by children (PEP 446)
        for fd in (self._read_fd, self._write_fd):
            os.set_blocking(fd, False)
        self._closed = False

    def fileno(self) -> int:
        """Readable once `set()` was called (and until `clear()`)."""
        return self._read_fd

    @property
    def closed(self) -> bool:
        return self._closed

    def set(self) -> None:
        super().set()
        with self._lock:
            if not self._closed:
                # A full pipe is readable already: the byte is not needed.
                with contextlib.suppress(BlockingIOError):
                    os.write(self._write_fd, b"\0")

    def clear(self) -> None:
        super().clear()
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._read_fd, 512):
                        pass

    def close(self) -> None:
        """Once no thread waits on `fileno()` any more: a closed descriptor's number is soon another file's."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read_fd)
                os.close(self._write_fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def poll_fd(stop: threading.Event) -> int | None:
    """The descriptor that `stop` makes readable, if it is a StopSignal that is still open."""
    return stop.fileno() if isinstance(stop, StopSignal) and not stop.closed else None


def wait_readable(fd: int, stop: threading.Event, timeout: float | None) -> bool:
    """Sleep until `fd` is readable, `stop` is set, or `timeout` seconds (None: no limit) have passed; whether
    `fd` is readable. With a plain Event for `stop` it looks at `stop` every 0.1 s: a StopSignal wakes it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    stop_fd = poll_fd(stop)
    if stop_fd is not None:
        poller.register(stop_fd, select.POLLIN)
        ready = poller.poll(None if timeout is None else 1000 * timeout)
        return any(f == fd for f, _ in ready)
    # A plain Event (a caller that made its own): look at it now and then.
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stop.is_set():
        left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
        if left <= 0:
            return False
        if poller.poll(1000 * left):
            return True
    return False
