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
        self._rows: dict[Hashable, list[tuple[float, float] | None]] = {}  # `rates`' rows: (value, time) per counter
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

    def rates(self, key: Hashable, values: Sequence[float | None]) -> list[float | None]:
        """`rate` of each of a row of counters kept under one key (a GPU's links), all read at one time: one clock
        read, one lock and one entry for the row. A counter that did not answer keeps its last value and time."""
        now = self._clock()
        with self._lock:
            before = self._rows.get(key)
            if before is None or len(before) != len(values):
                before = [None] * len(values)
            self._rows[key] = [(v, now) if v is not None else b for v, b in zip(values, before, strict=True)]
        return [
            None if v is None or b is None or v < b[0] or now <= b[1] else (v - b[0]) / (now - b[1])
            for v, b in zip(values, before, strict=True)
        ]

    def forget(self, gpu: int) -> None:
        """Drop a GPU's counters (keys start with its index): a new handle may count from anywhere."""
        with self._lock:
            for kept in (self._last, self._rows):
                for key in [k for k in kept if isinstance(k, tuple) and k and k[0] == gpu]:
                    del kept[key]
