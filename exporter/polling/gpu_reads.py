"""One poll's reads: each GPU's taken in turn by one read-pool task, the GPUs' tasks one after another.

A task per (GPU, collector) cost more Python than many of the reads themselves (a future, a queue
round trip and a wake-up each, ten a GPU a second), so a poll hands each GPU's due collectors to one
task that reads them one after another. And workers reading side by side cost more than they save:
every driver call lets go of the GIL, and with another worker waiting for it each call becomes a
thread switch. So each GPU's task starts the next GPU's when it ends, and one worker is busy at a time.

What the reads promise is kept read by read: each has its outcome and its time, the poll's deadline is
each one's, and the read that misses it is the one marked hung and not started again while it is stuck.
A slow or hung read must not hold up the others either: a poll not done part-way to its deadline
`spread`s, starting a second task on the reads of each GPU whose task is still busy (the GPU's lane
has room for two; the two take turns off one queue) and every GPU not started yet at once, side by
side as the pool's workers allow. Reads still waiting when the deadline passes are not started late:
they are read at the next poll.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.polling.readpool import ReadPool

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

    __slots__ = ("_poll", "_waiting", "gpu", "task")

    def __init__(self, gpu: GpuIdentity, reads: Iterable[Read[T]], poll: PollReads) -> None:
        self.gpu = gpu
        self.task: Future[None] | None = None  # the first task on them, once started
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


class Turns(Generic[T]):
    """A poll's GPUs, read one after another (see above); `tasks` are every task started on them."""

    def __init__(self, pool: ReadPool, read: Callable[[GpuIdentity, Collector], T], poll: PollReads) -> None:
        self._pool = pool
        self._read = read
        self._poll = poll
        self._gpus: list[GpuReads[T]] = []
        self._next: deque[GpuReads[T]] = deque()
        self.tasks: list[Future[None]] = []

    def start(self, gpus: list[GpuReads[T]], *, alone: Iterable[GpuReads[T]] = ()) -> None:
        """Read `gpus` one after another, and `alone` (GPUs with a call still stuck) each on its own: a GPU
        whose lane is taken must not stop the ones behind it."""
        self._gpus = [*gpus, *alone]
        for batch in alone:
            self._start(batch, self._one)
        self._next.extend(gpus)
        self._start_next()

    def spread(self) -> None:
        """The poll is slow: a second task on each busy GPU's waiting reads, and the GPUs not started yet at once."""
        for batch in self._gpus:
            if batch.waiting() and batch.task is not None and batch.task.running():
                self.tasks.append(self._pool.submit(self._one, batch, lane=batch.gpu.index))
        while True:
            try:
                batch = self._next.popleft()  # atomic: a GPU is started by the one that takes it
            except IndexError:
                return
            self._start(batch, self._one)

    def _start(self, batch: GpuReads[T], task: Callable[[GpuReads[T]], None]) -> None:
        batch.task = self._pool.submit(task, batch, lane=batch.gpu.index)
        self.tasks.append(batch.task)

    def _start_next(self) -> None:
        try:
            batch = self._next.popleft()
        except IndexError:
            return
        self._start(batch, self._then_next)

    def _one(self, batch: GpuReads[T]) -> None:
        batch.take_turns(self._read)

    def _then_next(self, batch: GpuReads[T]) -> None:
        batch.take_turns(self._read)
        if not self._poll.closed:
            self._start_next()
