"""A driver answer that several reads of one poll need, asked for once per poll.

Some answers serve several reads: a GPU's MIG devices (its memory, process and profiling reads), DCGM's
NVLink states (one call answers for every GPU). Asking once per poll rather than once per read saves
driver calls; but an answer must not outlive its poll, since a MIG device destroyed and created again
gets its old handle back, and a listing kept longer would name the wrong instance.

The backend contract has no poll in it: a poll is each (GPU, collector) read once. So each reader (a
collector, a GPU) takes a given answer at most once, and the first reader that comes back for it is in
the next poll and asks the driver afresh. An answer is therefore never more than a poll old, and a
reader whose reads stopped (a hung call) costs only a fresh answer for the others. An answer that came
with errors is not shared (the next reader asks again), and the owner `forget`s a key on any failure
around it (a lost GPU, a new handle).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class _Answer(Generic[T]):
    value: T
    takers: set[Hashable] = field(default_factory=set)


class PerPoll(Generic[K, T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asking: dict[K, threading.Lock] = {}
        self._answers: dict[K, _Answer[T]] = {}
        self._forgotten: dict[K, int] = {}  # per key, how often: an answer asked for across a forget is dropped

    def get(self, key: K, reader: Hashable, ask: Callable[[], tuple[T, bool]]) -> T:
        """The answer for `key` that `reader` has not taken yet, else a new one from `ask`, which
        returns it and whether it may be shared (False: part of it failed)."""
        with self._lock:
            asking = self._asking.setdefault(key, threading.Lock())
        # Readers of one key wait for the one asking: a second call would only hang where the first
        # hangs, and sharing is the point.
        with asking:
            with self._lock:
                kept = self._answers.get(key)
                if kept is not None and reader not in kept.takers:
                    kept.takers.add(reader)
                    return kept.value
                self._answers.pop(key, None)
                forgotten = self._forgotten.get(key, 0)
            value, shared = ask()
            with self._lock:
                if shared and self._forgotten.get(key, 0) == forgotten:
                    self._answers[key] = _Answer(value, {reader})
            return value

    def forget(self, key: K) -> None:
        """Drop the answer for `key`, and any being asked for now: the next reader asks afresh."""
        with self._lock:
            self._answers.pop(key, None)
            self._forgotten[key] = self._forgotten.get(key, 0) + 1
