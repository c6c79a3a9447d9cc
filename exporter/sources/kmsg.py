"""Following the kernel log: /dev/kmsg, or a file given with --kmsg.path.

/dev/kmsg hands out one record per read(), each with a sequence number that only grows within a
boot, so the daemon can say exactly which records it has already counted. The ring buffer is read
from its start, records at or below the cursor are skipped. When the kernel overwrites records
before we read them, read() fails with EPIPE: counted, and reading goes on with the next record.

A regular file is followed like `tail -F`, its lines numbered from 1 (the cursor); the file that
replaces a rotated one, and a file truncated in place (copytruncate), are read from their start.
Lines in the /dev/kmsg record format (`6,1234,5678901,-;NVRM: Xid ...`) keep their timestamps; other
lines (dmesg, syslog) are stamped when read, which is why a file of them seen for the first time is
followed from its end rather than replayed as if it all happened now.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

_RECORD_BYTES = 16384  # larger than any kmsg record (the kernel caps them near 1 KiB of text)
_FILE_POLL_SECONDS = 0.02  # how soon a line appended to a followed file is seen
_RETRY_SECONDS = 30.0  # how often a missing or unreadable kernel log is tried again
_ROTATION_GRACE_SECONDS = 5.0  # a followed file may be missing this long while logrotate replaces it


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    ts: float  # wall-clock seconds
    text: str


@dataclass
class KmsgStats:
    """For the source's status metrics."""

    up: bool = False
    overruns: int = 0  # EPIPE: records the kernel overwrote before we read them
    malformed: int = 0  # records we could not split into header and text
    error: str | None = None


def parse_record(raw: str, boot_time: float) -> Record | None:
    """'PRI,SEQ,USEC,FLAGS[,...];TEXT' -> Record; None when it is not in that format."""
    header, sep, text = raw.partition(";")
    if not sep:
        return None
    parts = header.split(",")
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2].isdigit()):
        return None
    # Continuation lines (" SUBSYSTEM=pci") follow the first newline; the message is the first line.
    return Record(int(parts[1]), boot_time + int(parts[2]) / 1e6, text.split("\n", 1)[0])


def boot_time() -> float:
    """Wall-clock time of boot, to turn kmsg's microseconds-since-boot into timestamps."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time() - time.monotonic()
    return time.time() - uptime


class KmsgFollower:
    """Reads the records not yet counted and hands them, in batches, to `deliver(origin, records)`.

    `origin` names what the sequence numbers count within: `kmsg:<boot id>` for /dev/kmsg (the ring
    buffer starts over at each boot), `file:<device>:<inode>` for a file (a rotated file is a new one).
    `cursor(origin)` says how far that origin was counted before. Runs in its own thread.
    """

    def __init__(
        self,
        path: Path,
        deliver: Callable[[str, list[Record]], None],
        *,
        cursor: Callable[[str], int | None],
        boot_id: str,
        boot_time: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.stats = KmsgStats()
        self._deliver = deliver
        self._cursor = cursor
        self._boot_id = boot_id
        self._boot_time = boot_time
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # What this run delivered, by origin: ahead of the journal's cursor, which the pipeline moves
        # only once it has journaled the records, so a re-open never delivers a record twice.
        self._delivered: dict[str, int] = {}
        self._missing_since: float | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
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
        if not self._delivered:
            return False  # never found at all: plainly missing
        now = time.monotonic()
        if self._missing_since is None:
            self._missing_since = now
        elif now - self._missing_since > _ROTATION_GRACE_SECONDS:
            return False
        self._stop.wait(_FILE_POLL_SECONDS)
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

    def _up(self) -> None:
        self._missing_since = None
        was_down = self.stats.error is not None
        self.stats.up, self.stats.error = True, None
        if was_down:
            log.info("reading the kernel log again", extra={"path": str(self.path)})

    def _emit(self, origin: str, batch: list[Record], after: int) -> int:
        """Deliver the records past `after`; returns the new `after`."""
        fresh = [r for r in batch if r.seq > after]
        if fresh:
            self._deliver(origin, fresh)
            self._delivered[origin] = fresh[-1].seq
            return fresh[-1].seq
        return after

    def _counted(self, origin: str) -> int | None:
        return self._delivered.get(origin, self._cursor(origin))

    def _follow_device(self) -> None:
        origin = f"kmsg:{self._boot_id}"
        after = self._counted(origin)
        after = -1 if after is None else after
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._up()
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            batch: list[Record] = []
            while not self._stop.is_set():
                try:
                    raw = os.read(fd, _RECORD_BYTES)
                except BlockingIOError:
                    after = self._emit(origin, batch, after)
                    batch = []
                    poller.poll(500)
                    continue
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        self.stats.overruns += 1
                        continue
                    raise
                record = parse_record(raw.decode("utf-8", errors="replace"), self._boot_time)
                if record is None:
                    self.stats.malformed += 1
                    continue
                batch.append(record)
                if len(batch) >= 1000:
                    after = self._emit(origin, batch, after)
                    batch = []
        finally:
            os.close(fd)

    def _follow_file(self) -> None:
        """A file's lines are numbered from 1: that number is the cursor, whatever the lines hold."""
        with self.path.open("rb") as f:
            opened = os.fstat(f.fileno())
            origin = f"file:{opened.st_dev}:{opened.st_ino}"
            self._up()
            counted = self._counted(origin)
            # Not counted before, while this run followed another file: that one's successor, all new.
            first_sight = counted is None and not self._delivered
            line_no = _first_sight(f) if first_sight else _skip_lines(f, counted or 0)
            self._delivered[origin] = line_no
            pending = b""
            while not self._stop.is_set():
                chunk = f.read(1 << 20)
                if not chunk:
                    now = self.path.stat()
                    if now.st_ino != opened.st_ino:
                        return  # rotated: follow the new file from its start
                    if now.st_size < f.tell():  # truncated in place: what it holds now is all new
                        f.seek(0)
                        line_no, pending = 0, b""
                        self._delivered[origin] = 0
                        continue
                    self._stop.wait(_FILE_POLL_SECONDS)
                    continue
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()  # an unfinished last line waits for the rest of it
                batch = []
                for raw in lines:
                    line_no += 1
                    text = raw.decode("utf-8", errors="replace").rstrip("\r")
                    record = parse_record(text, self._boot_time)
                    # A kmsg record keeps its own time; a plain line is stamped when read.
                    batch.append(
                        Record(line_no, record.ts, record.text) if record else Record(line_no, self._clock(), text)
                    )
                if batch:
                    self._deliver(origin, batch)
                    self._delivered[origin] = line_no


def _first_sight(f: BinaryIO) -> int:
    """Where to start in a file seen for the first time: at its start if it holds kmsg records (they
    carry their own time), else after everything already there, since plain lines would be stamped
    'now' and old faults would look new. Returns the lines skipped; leaves the file after them."""
    first = f.readline(_RECORD_BYTES)
    f.seek(0)
    if not first or parse_record(first.decode("utf-8", errors="replace"), 0.0) is not None:
        return 0
    return _skip_lines(f, None)


def _skip_lines(f: BinaryIO, lines: int | None) -> int:
    """Move past the first `lines` whole lines (every whole line when None); returns how many it passed.

    A file holding fewer lines than were counted was truncated since: it is then read from its start."""
    skipped, resume = 0, 0  # resume: just after the last newline passed
    while lines is None or skipped < lines:
        base = f.tell()
        chunk = f.read(1 << 20)
        if not chunk:
            break
        n = chunk.count(b"\n")
        if lines is not None and skipped + n >= lines:
            end = -1
            for _ in range(lines - skipped):
                end = chunk.find(b"\n", end + 1)
            return _at(f, base + end + 1, lines)
        if n:
            skipped, resume = skipped + n, base + chunk.rfind(b"\n") + 1
    if lines is not None and skipped < lines:
        return _at(f, 0, 0)
    return _at(f, resume, skipped)


def _at(f: BinaryIO, offset: int, lines: int) -> int:
    f.seek(offset)
    return lines
