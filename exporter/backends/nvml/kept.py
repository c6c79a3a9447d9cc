"""A GPU's answers that are its board's limits, not the moment's: kept between reads, asked again now and then.

nvml.h promises no such answer fixed (it has settable clock offsets, and MIG mode changes that "may" reset the
GPU), so each is kept only while nothing says it may have changed:
- at most KEEP_SECONDS, then asked again: whatever changed it shows within that;
- forgotten when a read of the GPU fails or the GPU gets a new handle (a reset, an unbind and rebind, NVML
  taken back after a release): the owner calls `forget`;
- only an answer without a failed field is kept, and not one asked across a `forget`;
- the reader asks again when what it has just read contradicts the kept answer or does not vouch for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
KEEP_SECONDS = 60.0  # as often as the slow collectors, by default


class Kept(Generic[T]):
    """One answer per GPU, with when it was asked."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._kept: dict[int, tuple[float, T]] = {}
        self._forgotten: dict[int, int] = {}  # per GPU, how often
        self._lock = threading.Lock()

    def get(self, gpu: int) -> T | None:
        """The kept answer, unless it is KEEP_SECONDS old or more."""
        kept = self._kept.get(gpu)
        if kept is None or self._clock() - kept[0] >= KEEP_SECONDS:
            return None
        return kept[1]

    def asking(self, gpu: int) -> int:
        """Say so before asking the driver; hand the number to `keep`."""
        return self._forgotten.get(gpu, 0)

    def keep(self, gpu: int, answer: T, asked: int) -> None:
        with self._lock:
            if self._forgotten.get(gpu, 0) == asked:  # no failure or new handle since the question was asked
                self._kept[gpu] = (self._clock(), answer)

    def forget(self, gpu: int) -> None:
        with self._lock:
            self._kept.pop(gpu, None)
            self._forgotten[gpu] = self._forgotten.get(gpu, 0) + 1

    def answer(self, gpu: int, vouched: Callable[[T], bool], ask: Callable[[], tuple[T, bool]]) -> T:
        """The kept answer while this read `vouched` for it; else the driver's (`ask`: the answer, and whether it is
        whole: every call answered, none failed), kept when whole and forgotten when not, since what was kept is
        then not what the driver says now."""
        kept = self.get(gpu)
        if kept is not None and vouched(kept):
            return kept
        asked = self.asking(gpu)
        answer, whole = ask()
        if whole:
            self.keep(gpu, answer, asked)
        else:
            self.forget(gpu)
        return answer
