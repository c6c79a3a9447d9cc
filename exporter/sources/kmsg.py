"""Following the kernel log: /dev/kmsg, or a file given with --kmsg.path.

/dev/kmsg hands out one record per read(), each with a sequence number that only grows within a
boot, so the daemon can say exactly which records it has already counted. The ring buffer is read
from its start, records at or below the cursor are skipped. When the kernel overwrites records
before we read them, read() fails with EPIPE: counted, and reading goes on with the next record.

A regular file is followed like `tail -F` (logfile.py), with a cursor that survives restarts,
rotation and truncation. Lines in the /dev/kmsg record format (`6,1234,5678901,-;NVRM: Xid ...`) keep
their timestamps; other lines (dmesg, syslog) are stamped when read.

Every batch is handed to `deliver`, and the next one is read only once it is journaled: the cursor
never moves past what is stored, and a journal that cannot be written holds the reader, not the lines.
A record that does not parse is counted and skipped; nothing in the input stops the reader.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_triage.exporter.sources.logfile import Deliver, FileFollower, booted, committed
from gpu_triage.exporter.sources.records import KmsgStats, Record, parse_record
from gpu_triage.exporter.sources.stop_signal import StopSignal, wait_readable
from gpu_triage.exporter.worker import Worker

if TYPE_CHECKING:
    from gpu_triage.exporter.sources.journal import Cursor

log = logging.getLogger(__name__)

_RECORD_BYTES = 16384  # larger than any kmsg record (the kernel caps them near 1 KiB of text)
_POLL_SECONDS = 0.02  # how often a missing followed file is looked for again while it is being rotated
_RETRY_SECONDS = 30.0  # how often a missing or unreadable kernel log is tried again
_ROTATION_GRACE_SECONDS = 5.0  # a followed file may be missing this long while logrotate replaces it


def boot_time() -> float:
    """Wall-clock time of boot as seen now, to turn kmsg's microseconds-since-boot into timestamps.

    The kernel stamps records with its scheduler clock, which NTP does not adjust; the wall clock it is
    compared with is. Against the raw monotonic clock (the same undisciplined time source) the offset
    stays right however long the node has been up, where an offset taken once at start drifts by tens of
    seconds a month and would keep the kernel's and the driver's report of one XID from being merged."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC_RAW)


class KmsgFollower:
    """Reads the records not yet counted and hands them, in batches, to `deliver(origin, records, mark, seq)`.

    `origin` names what the sequence numbers count within: `kmsg:<boot id>` for /dev/kmsg (the ring
    buffer starts over at each boot), `file:<path>` for a file. `cursor(origin)` says how far that
    origin was counted before. Runs in its own thread.
    """

    def __init__(
        self,
        path: Path,
        deliver: Deliver,
        *,
        cursor: Callable[[str], Cursor | None],
        boot_id: str,
        boot_time: float | Callable[[], float],
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self.stats = KmsgStats()
        self._on_change = on_change  # called when the log starts or stops being readable
        self._deliver = deliver
        self._cursor = cursor
        self._boot_id = boot_id
        self._boot_time = boot_time  # a number, or how to find it now (the daemon re-reads it per batch)
        self._clock = clock
        # A quiet kernel log is read by sleeping in poll(2) until a record comes or stop() is called; no timer.
        self._stop = StopSignal()
        self._worker = Worker("kmsg", self._turn, stopping=self._stop)
        # /dev/kmsg: what this run has had journaled, by origin, so a re-open never delivers a record twice.
        self._committed: dict[str, int] = {}
        self._file: FileFollower | None = None
        self._missing_since: float | None = None

    @property
    def running(self) -> bool:
        return self._worker.alive

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        if self._worker.stop(timeout=2):
            self._stop.close()  # else the thread may still poll it: left to the garbage collector

    def _turn(self) -> None:
        try:
            if stat.S_ISCHR(self.path.stat().st_mode):
                self._follow_device()
            else:
                self._follow_file()
        except FileNotFoundError as e:
            if not self._rotating():
                self._down(e)
                self._stop.wait(_RETRY_SECONDS)
        except OSError as e:
            self._down(e)
            self._stop.wait(_RETRY_SECONDS)
        except Exception as e:  # a bug here must cost a retry, never the kernel-log source for good
            log.exception("kernel-log reader failed; retrying")
            self._down(OSError(f"{type(e).__name__}: {e}"))
            self._stop.wait(_RETRY_SECONDS)

    def _rotating(self) -> bool:
        """A file this run was following is missing: give logrotate a moment to put the new one there."""
        if self._file is None or not self._file.opened:
            return False  # never found at all: plainly missing
        now = time.monotonic()
        if self._missing_since is None:
            self._missing_since = now
        elif now - self._missing_since > _ROTATION_GRACE_SECONDS:
            return False
        self._stop.wait(_POLL_SECONDS)
        return True

    def _down(self, e: OSError) -> None:
        error = f"{e.strerror or e} ({self.path})"
        first = self.stats.error != error
        self.stats.up, self.stats.error = False, error
        if first:
            hint = ""
            if e.errno in (errno.EACCES, errno.EPERM):
                hint = "; the daemon needs CAP_SYSLOG (kernel.dmesg_restrict=1) or root to read it"
            log.error(f"cannot read the kernel log{hint}", extra={"error": error})
            self._on_change()

    def _up(self) -> None:
        self._missing_since = None
        was_down, was_up = self.stats.error is not None, self.stats.up
        self.stats.up, self.stats.error = True, None
        if was_down:
            log.info("reading the kernel log again", extra={"path": str(self.path)})
        if not was_up:
            self._on_change()

    def _commit(self, origin: str, batch: list[Record], after: int) -> int:
        """Deliver the records past `after` and wait until they are journaled; returns the new `after`."""
        fresh = [r for r in batch if r.seq > after]
        if not fresh:
            return after
        if not committed(self._deliver(origin, fresh, "", None), self._stop):
            return after
        self._committed[origin] = fresh[-1].seq
        return fresh[-1].seq

    def _follow_device(self) -> None:
        origin = f"kmsg:{self._boot_id}"
        after = self._committed.get(origin)
        if after is None:
            cursor = self._cursor(origin)
            after = -1 if cursor is None else cursor.seq
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._up()
        try:
            batch: list[Record] = []
            while not self._stop.is_set():
                try:
                    raw = os.read(fd, _RECORD_BYTES)
                except BlockingIOError:
                    after = self._commit(origin, batch, after)
                    batch = []
                    wait_readable(fd, self._stop, None)  # until the next record (or an overrun), or stop()
                    continue
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        self.stats.overruns += 1
                        continue
                    raise
                record = parse_record(raw.decode("utf-8", errors="replace"), booted(self._boot_time))
                if record is None:
                    self.stats.malformed += 1
                    continue
                batch.append(record)
                if len(batch) >= 1000:
                    after = self._commit(origin, batch, after)
                    batch = []
        finally:
            os.close(fd)

    def _follow_file(self) -> None:
        if self._file is None:
            self._file = FileFollower(
                self.path,
                self._deliver,
                self._cursor,
                stats=self.stats,
                boot_time=self._boot_time,
                clock=self._clock,
                stop=self._stop,
                on_open=self._up,
            )
        self._file.follow()
