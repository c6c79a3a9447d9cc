"""Worker threads for driver calls that may hang.

A small fixed set of workers runs the reads. When a read runs past its deadline, the poller
writes it off: the pool starts a replacement worker so the other reads are not starved, and the
stuck thread leaves the pool once its call finally returns. A hung driver call therefore costs
one thread for as long as it hangs, and the pool shrinks back afterwards.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class ReadPool:
    def __init__(self, workers: int, name: str = "gpu-read") -> None:
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._target = workers
        self._alive = 0
        self._written_off: set[Future[Any]] = set()
        self._name = name
        self._closed = False
        for _ in range(workers):
            self._spawn()

    @property
    def threads(self) -> int:
        with self._lock:
            return self._alive

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((future, fn, args))
        return future

    def write_off(self, future: Future[Any]) -> None:
        """`future` is stuck in a call: let another thread take its place until it returns."""
        with self._lock:
            if self._closed or future.done() or future in self._written_off:
                return
            self._written_off.add(future)
            self._target += 1
        self._spawn()

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
        while True:
            task = self._queue.get()
            if task is None:
                break
            future, fn, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # delivered to whoever waits on the future
                future.set_exception(e)
            with self._lock:
                if future in self._written_off:
                    self._written_off.discard(future)
                    self._target -= 1
                if self._alive > self._target:
                    break  # surplus after a hang ended: leave the pool
        with self._lock:
            self._alive -= 1
