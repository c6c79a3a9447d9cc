"""The daemon's background threads: one helper that turns a loop body until it is told to stop.

Every long-lived thread (kernel-log reader, driver events, event pipeline, pollers, pod-resources reader,
systemd watchdog, user-name lookups, the dump decoder's reader) is a `Worker`, so starting, stopping and
what happens when a turn fails are written once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Worker:
    """A named daemon thread that calls `turn()` again and again until `stopping` is set.

    A turn does one round of work and blocks where it waits: on `stopping` (so `stop()` wakes it at once),
    or on something that `wake` unblocks (a queue, another event). A turn that is the last one, such as a
    reader at the end of its input, sets `stopping` itself.

    An exception out of a turn is logged and counted in `failures`; the thread then waits `retry` seconds,
    or until stopped, and turns again: a bug costs a retry, never the thread. The owner's own error
    handling stays in its turn; this is the net under it.

    Started once: a second `start()` is a RuntimeError (a second thread on the same state would race it).
    """

    def __init__(
        self,
        name: str,
        turn: Callable[[], None],
        *,
        retry: float = 5.0,
        wake: Callable[[], None] = lambda: None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.stopping = threading.Event() if stopping is None else stopping  # shared when threads stop together
        self.failures = 0
        self._turn = turn
        self._retry = retry
        self._wake = wake
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"background worker {self.name!r} was started already")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Set `stopping`, wake the turn, and wait up to `timeout` s for the thread to end; whether it has."""
        self.stopping.set()
        self._wake()
        return self.join(timeout)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the thread to end; whether it has (True when never started). Called from
        the worker's own thread (a callback that stops it), it returns at once: a thread cannot wait for itself."""
        if self._thread is None:
            return True
        if self._thread is threading.current_thread():
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._turn()
            except Exception:
                self.failures += 1
                log.exception("background worker failed; retrying", extra={"worker": self.name, "retry": self._retry})
                self.stopping.wait(self._retry)
