"""Rates from cumulative counters: how much a counter moved since the last read, over the time between.

NVML has byte counters for PCIe (which "can be wrapped") and NVLink. A rate over the whole poll
interval says more than a 20 ms sample, and needs no guess about what a "KB" is. A counter that went
down (it wrapped, or the driver was reloaded) gives no rate for that interval rather than a wrong one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence


class CounterRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def rate(self, key: Hashable, value: float | None, per_unit: float = 1.0) -> float | None:
        """`value` per second since the last read under `key` (scaled by `per_unit`); None the first time."""
        if value is None:
            return None
        now = self._clock()
        with self._lock:
            before = self._last.get(key)
            self._last[key] = (value, now)
        if before is None or value < before[0] or now <= before[1]:
            return None
        return (value - before[0]) * per_unit / (now - before[1])

    def rates(self, keys: Sequence[Hashable], values: Sequence[float | None]) -> list[float | None]:
        """`rate` of each counter, all read at one time: one clock read and one lock for a GPU's links."""
        now = self._clock()
        out: list[float | None] = []
        with self._lock:
            last = self._last
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    out.append(None)
                    continue
                before = last.get(key)
                last[key] = (value, now)
                if before is None or value < before[0] or now <= before[1]:
                    out.append(None)
                else:
                    out.append((value - before[0]) / (now - before[1]))
        return out

    def forget(self, gpu: int) -> None:
        """Drop a GPU's counters (keys start with its index): a new handle may count from anywhere."""
        with self._lock:
            for key in [k for k in self._last if isinstance(k, tuple) and k and k[0] == gpu]:
                del self._last[key]
