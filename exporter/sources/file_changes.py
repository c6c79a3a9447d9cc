"""Waiting for a followed file to change: inotify on Linux, a short sleep elsewhere.

A quiet kernel log is the normal state of a node for months: looking at the file every 20 ms to see
that nothing was appended would cost the node CPU all day. With inotify the follower sleeps until the
file is written, truncated, moved or deleted, or a file is created or moved into its directory (a
rotation), and still looks now and then (`RECHECK_SECONDS`) in case a change was not reported (a
network file system written from another host). Told to stop through a StopSignal, the sleep ends at once
without waking in between; with a plain Event it looks at the event every 0.1 s. Where inotify cannot be
had (another OS, the instance limit reached) the follower looks every `POLL_SECONDS`, as it did before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
import threading
from pathlib import Path

from gpu_triage.exporter.sources.stop_signal import wait_readable

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02  # without inotify: how soon a line appended to a followed file is seen
RECHECK_SECONDS = 5.0  # with inotify: how long at most between looks at a quiet file (a change inotify missed)

# linux/inotify.h
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_FILE_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF
_DIR_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch  # noqa: B018  (present: glibc and musl have both)
    except (OSError, AttributeError):
        return None
    return libc


class FileChanges:
    """Wakes a follower when the file it follows (or the directory holding it) changes."""

    def __init__(self, path: Path, stop: threading.Event) -> None:
        self._stop = stop
        self._fd: int | None = None
        libc = _libc()
        if libc is None:
            return
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            log.info("inotify unavailable: a followed file is looked at every 20 ms", extra={"errno": errno})
            return
        for target, mask in ((path, _FILE_MASK), (path.absolute().parent, _DIR_MASK)):
            if libc.inotify_add_watch(fd, os.fsencode(target), mask) < 0:
                os.close(fd)
                return  # the file just went (the follower finds out) or no watches left: look on a timer
        self._fd = fd

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def wait(self) -> None:
        """Until the file may have changed, stop is set, or a recheck is due."""
        if self._fd is None:
            self._stop.wait(POLL_SECONDS)
            return
        if wait_readable(self._fd, self._stop, RECHECK_SECONDS):
            self._drain()

    def _drain(self) -> None:
        assert self._fd is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 4096):
                pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
