"""Letting go of NVML for a GPU reset: `gpu-triage release` asks, the NVML backend lets go, then takes it back.

`nvidia-smi -r` refuses to reset a GPU that a process holds open, monitoring ones included, and while
NVML is initialised gpu-triage holds every GPU of the node (NVML has no way to let go of one). So the
reset that GpuResetRequired asks for could not happen with the daemon running. `gpu-triage release`
writes a request into the daemon's state directory, readable and writable only by whoever may manage
the daemon; the backend frees its event set and GPM samples, shuts NVML down, says so in an answer file
beside it, and reads nothing until the hold ends, at the latest after MAX_HOLD_SECONDS, or when the
request is withdrawn (`gpu-triage release --resume`). Then it initialises NVML again and finds its GPUs
by UUID. While the hold lasts the backend reports itself down: the daemon says it cannot see, rather
than calling the GPUs lost or healthy.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST = "nvml-release.json"  # written by `gpu-triage release`
ANSWER = "nvml-released.json"  # written by the daemon once NVML is shut down
MAX_HOLD_SECONDS = 900.0
_CHECK_EVERY = 1.0  # seconds between looks at the request file: a stat, not a read, in between


@dataclass(frozen=True, slots=True)
class Hold:
    until: float  # wall-clock time the daemon takes NVML back, at the latest
    requested_at: float
    by: str


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # the daemon may run as its own user; who may write is the directory's to say
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def read_hold(path: Path, now: float) -> Hold | None:
    """The hold the file asks for, bounded; None when there is none, it is over, or the file is not one."""
    try:
        doc = json.loads(path.read_text())
        until, requested_at, by = float(doc["until"]), float(doc["requested_at"]), str(doc.get("by", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    until = min(until, requested_at + MAX_HOLD_SECONDS)
    return Hold(until, requested_at, by) if requested_at <= now < until else None


class ReleaseRequests:
    """The daemon's side: is a release asked for now? Checked at most once a second."""

    def __init__(self, directory: Path | None, clock: Callable[[], float] = time.time) -> None:
        self._dir = directory
        self._clock = clock
        self._checked = -_CHECK_EVERY
        self._hold: Hold | None = None

    def wanted(self) -> Hold | None:
        if self._dir is None:
            return None
        now = self._clock()
        if now - self._checked >= _CHECK_EVERY:
            self._checked = now
            self._hold = read_hold(self._dir / REQUEST, now)
        return self._hold if self._hold is not None and now < self._hold.until else None

    def answer(self, hold: Hold | None) -> None:
        """Say NVML is let go (or, with None, taken back): what `gpu-triage release` waits for."""
        if self._dir is None:
            return
        path = self._dir / ANSWER
        with contextlib.suppress(OSError):  # the daemon keeps working whatever happens to the answer
            if hold is None:
                path.unlink(missing_ok=True)
            else:
                write_json(path, {"released_at": self._clock(), "until": hold.until, "pid": os.getpid()})
