"""Worker threads for driver calls that may hang.

One worker reads at a time: reads take micro- to milliseconds, and workers reading side by side only
trade the GIL, each driver call letting go of it and another worker taking it (`widen` adds workers
for reads that wait rather than work). A read that runs too long is written off (`write_off_stuck`,
which the poller calls as its deadline nears, and `write_off`): the pool starts a replacement worker
so the reads behind it are not starved, and the stuck thread leaves the pool once its call finally
returns. A hung driver call therefore costs one thread for as long as it hangs, and the pool shrinks
back afterwards.

Reads are grouped in lanes (one per GPU), each running at most LANE_LIMIT reads at once: a GPU
whose calls all hang holds that many workers, not all of them, while the others' reads go on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
LANE_LIMIT = 2
_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], Hashable]


class ReadPool:
    def __init__(self, workers: int = 1, name: str = "gpu-read") -> None:
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._target = workers
        self._alive = 0
        self._written_off: set[Future[Any]] = set()
        self._calls: dict[Future[Any], float] = {}  # reads in a call, and since when (monotonic)
        self._running: dict[Hashable, int] = {}  # per lane
        self._waiting: dict[Hashable, deque[_Task]] = {}  # per lane, beyond LANE_LIMIT
        self._name = name
        self._closed = False
        for _ in range(workers):
            self._spawn()

    def submit(self, fn: Callable[..., T], *args: Any, lane: Hashable = None) -> Future[T]:
        future: Future[T] = Future()
        task: _Task = (future, fn, args, lane)
        with self._lock:
            if self._running.get(lane, 0) >= LANE_LIMIT:
                self._waiting.setdefault(lane, deque()).append(task)
                return future
            self._running[lane] = self._running.get(lane, 0) + 1
        self._queue.put(task)
        return future

    def backlog(self) -> int:
        """Reads submitted and not yet taken by a worker."""
        with self._lock:
            return self._queue.qsize() + sum(len(w) for w in self._waiting.values())

    def widen(self, workers: int) -> None:
        """`workers` more workers, until `narrow`: for reads that may wait rather than work (GPM's paired
        samples), which gain by running side by side."""
        with self._lock:
            self._target += workers
        for _ in range(workers):
            self._spawn()

    def narrow(self, workers: int) -> None:
        """Undo `widen`: workers leave, each once it is idle or done with its read, down to the number wanted
        (a worker only ever leaves the pool with a worker too many: never none left for the queue)."""
        with self._lock:
            self._target -= workers
        for _ in range(workers):
            self._queue.put(None)

    def write_off(self, future: Future[Any]) -> None:
        """`future` is stuck in a call: let another thread take its place until it returns."""
        with self._lock:
            if self._closed or future.done() or future in self._written_off:
                return
            self._written_off.add(future)
            self._target += 1
        self._spawn()

    def write_off_stuck(self, seconds: float) -> None:
        """Write off every read that has been in its call `seconds` or longer, whichever poll it is for (one
        that started after its poll had ended, behind its GPU's stuck reads, has nobody else to look)."""
        since = time.monotonic() - seconds
        with self._lock:
            stuck = [f for f, t in self._calls.items() if t <= since and f not in self._written_off]
        for future in stuck:
            self.write_off(future)

    def shutdown(self) -> None:
        """Stop the idle workers; a worker stuck in a call is a daemon thread and is left behind."""
        with self._lock:
            self._closed = True
            alive = self._alive
        for _ in range(alive):
            self._queue.put(None)

    def _spawn(self) -> None:
        with self._lock:
            self._alive += 1
            n = self._alive
        threading.Thread(target=self._work, name=f"{self._name}-{n}", daemon=True).start()

    def _work(self) -> None:
        calls = self._calls
        while True:
            task = self._queue.get()
            if task is None:  # shutdown or narrow
                with self._lock:
                    if self._surplus(closing=self._closed):
                        return
                continue
            future, fn, args, lane = task
            if future.set_running_or_notify_cancel():
                with self._lock:
                    calls[future] = time.monotonic()
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # delivered to whoever waits on the future
                    future.set_exception(e)
            with self._lock:
                calls.pop(future, None)
                following = self._waiting.get(lane)
                if following:
                    self._queue.put(following.popleft())  # the lane's slot passes to its next read
                else:
                    self._running[lane] -= 1
                if future in self._written_off:
                    self._written_off.discard(future)
                    self._target -= 1
                if self._surplus():  # after a hang ended, or a narrow
                    return

    def _surplus(self, closing: bool = False) -> bool:
        """With the lock held: whether this worker leaves the pool (it is closing, or has a worker too many).
        Counted here, under the same lock, so two workers leaving at once never leave fewer than wanted."""
        if closing or self._alive > self._target:
            self._alive -= 1
            return True
        return False
