"""Following a kernel log kept in a file (--kmsg.path): every line once, across restarts, rotation, truncation.

The cursor says which file and where in it (`FileMark`): the file by device and inode plus a hash
of its first bytes, the place by a byte offset plus a hash of the bytes just before it. So at start,
and while following, the follower can tell what happened to the file since it last read it:
- the same file, grown: read on from the offset;
- rotated (renamed, a new file in its place): the old one, found by its inode beside the path, is
  read to its end, then the new one from its start;
- truncated or rewritten in place (copytruncate, a truncate and regrow faster than it looked): the
  bytes before the offset are not the ones it read, so everything the file holds now is new; and what was
  written after the offset before the truncation is in the copy, which is found beside the path by the
  same marks (its first bytes and the bytes before the offset) and read from the offset to its end first.
A file first met at start is read from its start if it holds kmsg records (they carry their own
time), else from its end (plain lines are stamped when read: old faults would look new); either way
that place is committed at once, so what is written while the daemon is down is read at the next start.

Only whole lines are delivered. An unfinished last line waits for its newline, up to MAX_LINE_BYTES;
a longer one (a runaway writer) is skipped to its newline and counted as malformed, without being kept.
NUL padding (what a file holds after a power loss, often just before the XID that explains the crash)
ends a line: what follows it is read as a line, however much padding there was.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from gpu_triage.diagnosis.xid.kernel_log import MAX_LINE_CHARS
from gpu_triage.exporter.sources.file_changes import POLL_SECONDS, FileChanges
from gpu_triage.exporter.sources.journal import Cursor
from gpu_triage.exporter.sources.records import KmsgStats, Record, parse_journal_json, parse_record

MAX_LINE_BYTES = MAX_LINE_CHARS  # the kernel-log parser's own limit: a longer line is not worth keeping
_HEAD_BYTES = 4096
_TAIL_BYTES = 256
_CHUNK_BYTES = 1 << 18  # a read, and so a batch journaled at once: a burst's lines alive together stay few MiB
_PACKED = (".gz", ".xz", ".bz2", ".zst", ".lz4")  # rotated copies compressed: what we had not read is lost


class Committed(Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...

    @property
    def stored(self) -> bool: ...


# (origin, records, mark, seq): hands a batch over; the returned handle settles once it is journaled.
Deliver = Callable[[str, list[Record], str, "int | None"], "Committed | None"]


def committed(handle: Committed | None, stop: threading.Event) -> bool:
    """Wait until a delivered batch is journaled (None: delivered to something that stores at once); False when
    stopping first, or when it was not stored. The reader reads on only after this: the cursor never runs ahead."""
    while handle is not None and not handle.wait(0.5):
        if stop.is_set():
            return False
    return handle is None or handle.stored


def booted(boot_time: float | Callable[[], float]) -> float:
    """The wall-clock time of boot: given, or found now (see kmsg.boot_time)."""
    return boot_time() if callable(boot_time) else boot_time


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class FileMark:
    """Which file, and where in it, as stored with the cursor."""

    dev: int
    ino: int
    head_len: int
    head: str  # digest of the file's first head_len bytes
    offset: int  # just after the last line delivered
    tail: str  # digest of the (up to _TAIL_BYTES) bytes before offset

    def encode(self) -> str:
        return f"v1:{self.dev}:{self.ino}:{self.head_len}:{self.head}:{self.offset}:{self.tail}"

    @classmethod
    def decode(cls, text: str) -> FileMark | None:
        parts = text.split(":")
        if len(parts) != 7 or parts[0] != "v1":
            return None
        try:
            return cls(int(parts[1]), int(parts[2]), int(parts[3]), parts[4], int(parts[5]), parts[6])
        except ValueError:
            return None

    def same_file(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)

    def holds(self, f: BinaryIO) -> bool:
        """Whether `f` still holds, unchanged, what was read of it up to `offset`."""
        fd = f.fileno()
        if os.fstat(fd).st_size < self.offset:
            return False
        if _digest(os.pread(fd, self.head_len, 0)) != self.head:
            return False
        start = max(0, self.offset - _TAIL_BYTES)
        return _digest(os.pread(fd, self.offset - start, start)) == self.tail


def legacy_origin(st: os.stat_result) -> str:
    """The origin an older gpu-triage kept a file's cursor under; its seq counted lines, not bytes."""
    return f"file:{st.st_dev}:{st.st_ino}"


class FileFollower:
    """Follows one path until `stop` is set or the file at the path is replaced (then returns)."""

    def __init__(
        self,
        path: Path,
        deliver: Deliver,
        cursor: Callable[[str], Cursor | None],
        *,
        stats: KmsgStats,
        boot_time: float | Callable[[], float],
        clock: Callable[[], float],
        stop: threading.Event,
        on_open: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self.origin = f"file:{path.absolute()}"
        self._deliver = deliver
        self._cursor = cursor
        self._stats = stats
        self._boot_time = boot_time
        self._clock = clock
        self._stop = stop
        self._on_open = on_open
        self.opened = False  # a file was found at the path at least once
        self.line_no = 0  # numbers the lines read, across files: the parser's windows count in lines
        self.at_start = True  # until the first try to open the path: a file that appears later is all new
        self._mark_held = ""  # the place last committed in the file at the path, for a copy to go on from

    def follow(self) -> None:
        """Open the file at the path, catch up with it, and follow it until it is replaced."""
        at_start, self.at_start = self.at_start, False
        # Watched before it is read: what is appended after the last read wakes the wait.
        changes = FileChanges(self.path, self._stop)
        with contextlib.closing(changes), self.path.open("rb") as f:
            self.opened = True
            self._on_open()
            st = os.fstat(f.fileno())
            cursor = self._cursor(self.origin)
            mark = FileMark.decode(cursor.mark) if cursor else None
            if cursor is not None:
                self.line_no = max(self.line_no, cursor.seq)
            if mark is not None and mark.holds(f):
                offset = mark.offset  # grown; or replaced by a copy of itself (an editor, cp)
            elif mark is not None and not mark.same_file(st) and self._finish_rotated(mark):
                offset = 0  # the file now at the path came after the one we read: all of it is new
            elif mark is not None:
                self._finish_copy(mark)  # truncated or rewritten since (copytruncate): the copy holds the rest
                offset = 0
            elif at_start:
                offset = self._first_sight(f, st)
            else:
                offset = 0  # first met while we watched the path: all of it is new
            self._read(f, st, offset, until_replaced=True, changes=changes)

    def _first_sight(self, f: BinaryIO, st: os.stat_result) -> int:
        legacy = self._cursor(legacy_origin(st))
        if legacy is not None:
            offset, self.line_no = _after_lines(f, legacy.seq)
        else:
            first = f.readline(MAX_LINE_BYTES)
            kmsg = not first or parse_record(first.decode("utf-8", "replace"), 0.0) is not None
            offset, self.line_no = (0, 0) if kmsg else _after_lines(f, None)
        self._commit([], self._mark(f, st, offset))
        return offset

    def _finish_copy(self, mark: FileMark) -> bool:
        """Read the copy of the file we were following (copytruncate's `name.1`, any `name*` beside it that still
        holds what we read up to the offset) from where we were to its end; whether there was one."""
        with os.scandir(self.path.parent) as entries:
            siblings = [
                e.path
                for e in entries
                if e.name != self.path.name and e.name.startswith(self.path.name) and not e.name.endswith(_PACKED)
            ]
        for sibling in siblings:
            try:
                with Path(sibling).open("rb") as copy:
                    if os.fstat(copy.fileno()).st_size >= mark.offset and mark.holds(copy):
                        self._read(copy, os.fstat(copy.fileno()), mark.offset, until_replaced=False)
                        return True
            except OSError:
                continue  # gone or unreadable: not the one
        return False

    def _finish_rotated(self, mark: FileMark) -> bool:
        """Read the file we were following, if it is beside the path under another name, from where we were to
        its end; whether it was there."""
        with os.scandir(self.path.parent) as entries:
            found = next((e.path for e in entries if _is(e, mark)), None)
        if found is None:
            return False
        with Path(found).open("rb") as old:
            if mark.holds(old):
                self._read(old, os.fstat(old.fileno()), mark.offset, until_replaced=False)
        return True

    def _read(
        self, f: BinaryIO, st: os.stat_result, offset: int, *, until_replaced: bool, changes: FileChanges | None = None
    ) -> None:
        """Deliver the whole lines from `offset`; then, if `until_replaced`, follow the file while it is the one at
        the path, else stop at its end."""
        fd = f.fileno()
        line = _Line()
        position = offset  # just after the last byte read; `offset`: just after the last whole line
        read_tail = _tail_before(f, offset)  # the bytes before `position`, as read
        while not self._stop.is_set():
            # Truncated in place, or truncated and written again since the last read (even while the last batch
            # was being journaled): what the file holds now is all new.
            rewritten = read_tail and os.pread(fd, len(read_tail), position - len(read_tail)) != read_tail
            if rewritten or os.fstat(fd).st_size < position:
                if until_replaced and (held := FileMark.decode(self._mark_held)) is not None:
                    self._finish_copy(held)  # copytruncate copied it first: the lines we had not read are there
                position = offset = 0
                line, read_tail = _Line(), b""
            chunk = os.pread(fd, _CHUNK_BYTES, position)
            if not chunk:
                if not until_replaced or self._replaced(st):
                    return
                if changes is not None:
                    changes.wait()
                else:
                    self._stop.wait(POLL_SECONDS)
                continue
            position += len(chunk)
            read_tail = chunk[-_TAIL_BYTES:] if len(chunk) >= _TAIL_BYTES else (read_tail + chunk)[-_TAIL_BYTES:]
            records, consumed = self._lines(chunk, line)
            if not consumed:
                continue
            offset += consumed
            mark = self._mark(f, st, offset)
            committed = self._commit(records, mark)
            del records  # journaled (or given up on): not held while waiting for the next lines
            if not committed:
                return
            if until_replaced:
                self._mark_held = mark

    def _lines(self, chunk: bytes, line: _Line) -> tuple[list[Record], int]:
        """The records of the lines `chunk` completes, and how many bytes those lines span from the last one."""
        records: list[Record] = []
        consumed, start = 0, 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line.add(chunk, start, end)
            consumed += line.raw + 1
            self.line_no += 1
            if line.skipping:
                self._stats.malformed += 1
            else:
                records.append(self._record(bytes(line.head)))
            line.reset()
            start = end + 1
        line.add(chunk, start, len(chunk))
        return records, consumed

    def _record(self, raw: bytes) -> Record:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        record = parse_record(text, booted(self._boot_time))
        # A kmsg record and a journal entry keep their own time; a plain line is stamped when read.
        if record is not None:
            return Record(self.line_no, record.ts, record.text, record.kernel)
        if (entry := parse_journal_json(text)) is not None:
            ts, message, kernel = entry
            return Record(self.line_no, self._clock() if ts is None else ts, message, kernel)
        return Record(self.line_no, self._clock(), text)

    def _mark(self, f: BinaryIO, st: os.stat_result, offset: int) -> str:
        head = os.pread(f.fileno(), min(offset, _HEAD_BYTES), 0)  # only what was read: it may still grow
        tail = _tail_before(f, offset)
        return FileMark(st.st_dev, st.st_ino, len(head), _digest(head), offset, _digest(tail)).encode()

    def _commit(self, records: list[Record], mark: str) -> bool:
        """Hand the batch over and wait until it is journaled; False when stopping first."""
        return committed(self._deliver(self.origin, records, mark, None if records else self.line_no), self._stop)

    def _replaced(self, st: os.stat_result) -> bool:
        try:
            now = self.path.stat()
        except FileNotFoundError:
            return True  # rotated away, the new one not there yet: the caller waits for it
        return (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)


class _Line:
    """The unfinished last line: its bytes up to MAX_LINE_BYTES, then only its length. A line is what follows
    its last NUL byte: after a power loss a file holds NUL padding (where the blocks it had allocated were
    never written, often after a line cut short), then the next line written."""

    __slots__ = ("head", "length", "raw", "skipping")

    def __init__(self) -> None:
        self.head = bytearray()
        self.length = 0  # bytes of the line since its last NUL
        self.raw = 0  # bytes of the file it spans
        self.skipping = False

    def add(self, chunk: bytes, start: int, end: int) -> None:
        self.raw += end - start
        if (nul := chunk.rfind(b"\x00", start, end)) >= 0:
            self.head.clear()
            self.length, self.skipping, start = 0, False, nul + 1
        n = end - start
        self.length += n
        if self.skipping or self.length > MAX_LINE_BYTES:
            self.skipping = True
            self.head.clear()
        elif n:
            self.head += chunk[start:end]

    def reset(self) -> None:
        self.head.clear()
        self.length = 0
        self.raw = 0
        self.skipping = False


def _is(entry: os.DirEntry[str], mark: FileMark) -> bool:
    try:
        return entry.is_file(follow_symlinks=False) and mark.same_file(entry.stat(follow_symlinks=False))
    except OSError:
        return False


def _tail_before(f: BinaryIO, offset: int) -> bytes:
    start = max(0, offset - _TAIL_BYTES)
    return os.pread(f.fileno(), offset - start, start)


def _after_lines(f: BinaryIO, lines: int | None) -> tuple[int, int]:
    """(offset, lines passed) after the first `lines` whole lines (every whole line when None); the
    file's start when it holds fewer (it was truncated since those lines were counted)."""
    fd = f.fileno()
    seen, position, last_end = 0, 0, 0
    while lines is None or seen < lines:
        chunk = os.pread(fd, _CHUNK_BYTES, position)
        if not chunk:
            break
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            seen += 1
            last_end = position + end + 1
            if lines is not None and seen == lines:
                return last_end, seen
            start = end + 1
        position += len(chunk)
    return (0, 0) if lines is not None else (last_end, seen)
