"""One poll's reads of one GPU, taken in turn by one read-pool task rather than a task each.

A task per (GPU, collector) cost more Python than many of the reads themselves (a future, a queue
round trip and a wake-up each, ten a GPU a second), so a poll hands each GPU's due collectors to one
task that reads them one after another. What the reads promise is kept read by read: each has its
outcome and its time, the poll's deadline is each one's, and the read that misses it is the one
marked hung and not started again while it is stuck. A read that hangs must not hold up the GPU's
other collectors either: a poll that finds a GPU's task still busy part-way to its deadline starts a
second task on the same reads (the GPU's lane has room for two), and the two take turns off one queue.
Reads still waiting when the deadline passes are not started late: they are read at the next poll.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from gpu_triage.exporter.backends.base import Collector, GpuIdentity

T = TypeVar("T")


class Read(Generic[T]):
    """One (GPU, collector) read: waiting, then running, then done with its outcome."""

    __slots__ = ("collector", "outcome", "started")

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.started = False
        self.outcome: T | None = None

    def running(self) -> bool:
        """Started and not back: a call in the driver, perhaps hung."""
        return self.started and self.outcome is None

    def done(self) -> bool:
        """Nothing of it is in the driver: back, or never started (the poll it was for had ended)."""
        return not self.running()


class PollReads:
    """How many of a poll's reads are still out; `closed` once its deadline has passed."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()
        self._all_back = threading.Event()
        self.closed = False
        if count == 0:
            self._all_back.set()

    def back(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self._all_back.set()

    def wait(self, seconds: float) -> bool:
        """Until every read is back, at most `seconds`: whether they all are."""
        return self._all_back.wait(max(seconds, 0.0))


class GpuReads(Generic[T]):
    """A GPU's reads for one poll, in order, for one or two read-pool tasks to take in turn."""

    __slots__ = ("_poll", "_waiting", "gpu")

    def __init__(self, gpu: GpuIdentity, reads: Iterable[Read[T]], poll: PollReads) -> None:
        self.gpu = gpu
        self._poll = poll
        self._waiting = deque(reads)

    def waiting(self) -> bool:
        return bool(self._waiting)

    def take_turns(self, read: Callable[[GpuIdentity, Collector], T]) -> None:
        """Read what is waiting, one at a time, until none is or the poll's deadline has passed.
        `read` reports its errors in its outcome; popleft is atomic, so two tasks never take the same."""
        waiting, poll, gpu = self._waiting, self._poll, self.gpu
        while not poll.closed:
            try:
                r = waiting.popleft()
            except IndexError:
                return
            r.started = True
            r.outcome = read(gpu, r.collector)
            poll.back()
