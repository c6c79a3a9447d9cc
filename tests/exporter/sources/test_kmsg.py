"""Following the kernel log: the /dev/kmsg record format, files like `tail -F`, the real device."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.exporter.sources import kmsg
from gpu_triage.exporter.sources.file_changes import FileChanges
from gpu_triage.exporter.sources.journal import Cursor
from gpu_triage.exporter.sources.kmsg import KmsgFollower
from gpu_triage.exporter.sources.logfile import FileFollower
from gpu_triage.exporter.sources.records import Record, parse_record
from tests.daemon_proc import wait_for


def test_parse_record() -> None:
    record = parse_record("4,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x\n SUBSYSTEM=pci\n", 100.0)
    assert record == Record(1234, 105.0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x", kernel=True)
    assert parse_record("6,7,8,c,extra;text;with;semicolons", 0.0) == Record(7, 8e-6, "text;with;semicolons", True)
    for bad in ("no header here", "6,x,8,-;text", "6,7;text", ""):
        assert parse_record(bad, 0.0) is None
    # What a corrupt or hostile record may hold: a number too long for the kernel to have written (one
    # that overflows a float or the journal's integer), digits that are not ASCII.
    for bad in (
        f"6,1,{'9' * 400},-;NVRM: Xid",
        f"6,{'9' * 400},1,-;NVRM: Xid",
        "6,1,٣,-;x",
        "6,1,²,-;x",
        "6,99999999999999999999,1,-;x",
    ):
        assert parse_record(bad, 0.0) is None, bad


class Collect:
    """Stands in for the event pipeline: keeps what it is given, and a cursor per origin like the journal."""

    def __init__(self, cursors: dict[str, Cursor] | None = None) -> None:
        self.records: list[Record] = []
        self.origins: list[str] = []
        self.cursors = dict(cursors or {})
        self.arrived = threading.Condition()

    def __call__(self, origin: str, batch: list[Record], mark: str, seq: int | None) -> None:
        with self.arrived:
            self.records.extend(batch)
            self.origins.extend([origin] * len(batch))
            last = batch[-1].seq if batch else seq
            assert last is not None
            self.cursors[origin] = Cursor(origin, last, mark)
            self.arrived.notify_all()

    def cursor(self, origin: str) -> Cursor | None:
        with self.arrived:
            return self.cursors.get(origin)

    def wait_cursor(self, origin: str, timeout: float = 5.0) -> None:
        """Until the reader has noted where it starts in `origin`."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: origin in self.cursors, timeout), origin

    def wait_for(self, n: int, timeout: float = 5.0) -> list[Record]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.records) >= n, timeout), self.records
            return list(self.records)


class Reads:
    """Counts the bytes a followed file's reader has read (every chunk it reads passes through
    FileFollower._lines), so a test waits until what it wrote was read, even a line that must not be
    delivered yet, instead of sleeping and hoping it was."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        self._read = threading.Condition()
        real = FileFollower._lines

        def counting(follower: FileFollower, chunk: bytes, line: Any) -> tuple[list[Record], int]:
            out = real(follower, chunk, line)
            with self._read:
                self.bytes += len(chunk)
                self._read.notify_all()
            return out

        monkeypatch.setattr(FileFollower, "_lines", counting)

    def wait_until(self, path: Path, timeout: float = 5.0) -> None:
        """Until as many bytes were read as `path` holds (read from its start)."""
        size = path.stat().st_size
        with self._read:
            assert self._read.wait_for(lambda: self.bytes >= size, timeout), (self.bytes, size)


class Looks:
    """Counts the follower's looks at a followed file that found nothing new (each ends in FileChanges.wait)
    and makes them quick, so a test waits for looks instead of for time: a look that finds nothing leaves no
    other trace. `paused()` holds the follower between two looks while the test changes the file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._looked = threading.Condition()
        self._hold = threading.Lock()

        def wait(changes: FileChanges) -> None:
            with self._looked:
                self.count += 1
                self._looked.notify_all()
            with self._hold:
                pass
            changes._stop.wait(0.001)

        monkeypatch.setattr(FileChanges, "wait", wait)

    def wait_for(self, more: int, timeout: float = 5.0) -> None:
        """Until `more` looks after this call have found nothing new."""
        with self._looked:
            target = self.count + more
            assert self._looked.wait_for(lambda: self.count >= target, timeout), (self.count, target)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The follower done with one look and not yet at the next, for the whole block."""
        with self._hold:
            self.wait_for(1)
            yield


def follow(path: Path, got: Collect | None = None, boot_id: str = "b1") -> tuple[KmsgFollower, Collect]:
    got = got or Collect()
    follower = KmsgFollower(path, got, cursor=got.cursor, boot_id=boot_id, boot_time=1000.0, clock=lambda: 5.0)
    follower.start()
    return follower, got


def file_origin(path: Path) -> str:
    return f"file:{path.absolute()}"


def test_follows_a_file_of_kmsg_records_and_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "kern.log"
    log.write_text("6,10,2000000,-;first record\n[ 12.3] a plain dmesg line\n")
    reads = Reads(monkeypatch)
    follower, got = follow(log)
    try:
        # Lines are numbered by line; a kmsg record keeps its own time, a plain line is stamped when read.
        assert got.wait_for(2) == [
            Record(1, 1002.0, "first record", kernel=True),
            Record(2, 5.0, "[ 12.3] a plain dmesg line"),
        ]
        with log.open("a") as f:
            f.write("6,11,3000000,-;appended")  # no newline yet: not a whole line
            f.flush()
            reads.wait_until(log)  # the unfinished line was read, and held back
            assert len(got.records) == 2
            f.write("\n")
        assert got.wait_for(3)[-1] == Record(3, 1003.0, "appended", kernel=True)
        assert follower.stats.up
        assert set(got.origins) == {file_origin(log)}
    finally:
        follower.stop()


def test_an_older_versions_line_count_cursor_is_honoured(tmp_path: Path) -> None:
    """Before byte offsets, a file's cursor counted its lines, under file:<device>:<inode>."""
    log = tmp_path / "kern.log"
    log.write_text("".join(f"6,{seq},0,-;line {seq}\n" for seq in range(1, 11)))
    legacy = f"file:{log.stat().st_dev}:{log.stat().st_ino}"
    follower, got = follow(log, Collect({legacy: Cursor(legacy, 7)}))
    try:
        assert [r.seq for r in got.wait_for(3)] == [8, 9, 10]
    finally:
        follower.stop()


def test_a_plain_text_file_seen_for_the_first_time_is_followed_from_its_end(tmp_path: Path) -> None:
    """Its old lines carry no time we trust: replayed, yesterday's XID would page as if it were now."""
    log = tmp_path / "kern.log"
    log.write_text("Nov 29 03:00:00 node kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, yesterday\n")
    follower, got = follow(log)
    try:
        got.wait_cursor(file_origin(log))  # it has noted its place: with nothing read, if it keeps to the end
        assert got.records == []
        with log.open("a") as f:
            f.write("Nov 30 03:00:00 node kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, now\n")
        assert [(r.seq, r.text.endswith("now")) for r in got.wait_for(1)] == [(2, True)]  # its line number
    finally:
        follower.stop()


def test_a_rotated_file_is_followed_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(f"6,{i},0,-;old {i}\n" for i in range(1, 101)))
    follower, got = follow(log)
    try:
        got.wait_for(100)
        log.rename(tmp_path / "kern.log.1")
        log.write_text("6,1,0,-;new file, line 1\n")
        # Numbered on: one path, one count.
        assert got.wait_for(101)[-1] == Record(101, 1000.0, "new file, line 1", kernel=True)
        assert set(got.origins) == {file_origin(log)}
    finally:
        follower.stop()


def test_a_reboot_does_not_replay_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cursor of a file belongs to the file, not to the boot: a new boot id changes nothing."""
    looks = Looks(monkeypatch)
    log = tmp_path / "kern.log"
    log.write_text("6,1,0,-;before the reboot\n")
    follower, got = follow(log, boot_id="b1")
    got.wait_for(1)
    follower.stop()
    with log.open("a") as f:
        f.write("6,2,0,-;after the reboot\n")
    again, _ = follow(log, got, boot_id="b2")
    try:
        assert [r.text for r in got.wait_for(2)] == ["before the reboot", "after the reboot"]
        looks.wait_for(5)  # five looks and no replay
        assert len(got.records) == 2
    finally:
        again.stop()


def test_missing_log_is_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmsg, "_RETRY_SECONDS", 0.05)
    log = tmp_path / "not-yet.log"
    follower, got = follow(log)
    try:
        wait_for(
            lambda: "No such file" in (follower.stats.error or ""), interval=0.01, what="the missing file reported"
        )
        assert not follower.stats.up
        log.write_text("6,1,0,-;there now\n")
        assert got.wait_for(1)[0].text == "there now"
        assert follower.stats.up and follower.stats.error is None
    finally:
        follower.stop()


def test_unreadable_log_names_the_capability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tries = 0

    def denied(self: KmsgFollower) -> None:  # what reading /dev/kmsg without CAP_SYSLOG gives
        nonlocal tries
        tries += 1
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(KmsgFollower, "_follow_file", denied)
    monkeypatch.setattr(kmsg, "_RETRY_SECONDS", 0.05)
    log = tmp_path / "kern.log"
    log.write_text("x\n")
    follower, _ = follow(log)
    try:
        wait_for(lambda: tries >= 4, interval=0.01, what="four tries")  # said once, however often it is tried
        assert not follower.stats.up and "not permitted" in (follower.stats.error or "")
    finally:
        follower.stop()
    errors = [r.getMessage() for r in caplog.records if r.name == "gpu_triage.exporter.sources.kmsg"]
    assert errors == [
        "cannot read the kernel log; the daemon needs CAP_SYSLOG (kernel.dmesg_restrict=1) or root to read it"
    ]


def test_the_real_dev_kmsg() -> None:
    """The kernel's own ring buffer on this machine: records with growing sequence numbers."""
    device = Path("/dev/kmsg")
    if not os.access(device, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    follower, got = follow(device)
    try:
        records = got.wait_for(1)
        seqs = [r.seq for r in records]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert follower.stats.up and set(got.origins) == {"kmsg:b1"}
    finally:
        follower.stop()


def _last_seq(device: Path) -> int:
    """The sequence number of the newest record in the ring buffer now, read as the follower reads it."""
    fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
    last = -1
    try:
        while True:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                return last
            except BrokenPipeError:  # overwritten under us: read on
                continue
            record = parse_record(raw.decode("utf-8", errors="replace"), 0.0)
            last = record.seq if record is not None else last
    finally:
        os.close(fd)


def test_dev_kmsg_is_counted_per_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring buffer starts over at each boot: a known boot resumes after its cursor, a new one reads
    from the start."""
    device = Path("/dev/kmsg")
    if not os.access(device, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    read = [-1]  # the newest record any follower has read, delivered or not

    def reading(raw: str, boot_time: float) -> Record | None:
        record = parse_record(raw, boot_time)
        read[0] = max(read[0], record.seq if record is not None else -1)
        return record

    monkeypatch.setattr(kmsg, "parse_record", reading)
    end = _last_seq(device)
    first, got = follow(device, boot_id="this-boot")
    try:
        wait_for(lambda: (c := got.cursor("kmsg:this-boot")) and c.seq >= end, interval=0.01, what="the ring buffer")
    finally:
        first.stop()
    counted = got.cursors["kmsg:this-boot"].seq
    end, read[0] = _last_seq(device), -1
    resumed, again = follow(device, Collect({"kmsg:this-boot": Cursor("kmsg:this-boot", counted)}), boot_id="this-boot")
    try:
        wait_for(lambda: read[0] >= end, interval=0.01, what="the ring buffer read again")
    finally:
        resumed.stop()
    assert all(r.seq > counted for r in again.records), "nothing counted twice"
    fresh, anew = follow(device, Collect({"kmsg:this-boot": Cursor("kmsg:this-boot", counted)}), boot_id="next-boot")
    try:
        assert anew.wait_for(1)[0].seq == got.records[0].seq, "a new boot reads from the start"
    finally:
        fresh.stop()


def test_an_unexpected_failure_costs_a_retry_not_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmsg, "_RETRY_SECONDS", 0.05)
    log = tmp_path / "kern.log"
    log.write_text("6,1,0,-;a record\n")
    got = Collect()
    answers = iter([RuntimeError("the journal fell over")])

    def cursor(origin: str) -> Cursor | None:
        error = next(answers, None)
        if error is not None:
            raise error
        return got.cursor(origin)

    follower = KmsgFollower(log, got, cursor=cursor, boot_id="b1", boot_time=0.0, clock=lambda: 5.0)
    follower.start()
    try:
        assert got.wait_for(1)[0].text == "a record"
        assert follower.stats.up
    finally:
        follower.stop()


def plain(text: str) -> str:
    return f"Nov 30 03:00:00 node kernel: {text}\n"


def test_the_file_that_replaces_a_rotated_one_is_read_whole_even_after_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logrotate renames the file, and a moment later creates the new one: nothing in it is skipped."""
    log = tmp_path / "kern.log"
    log.write_text(plain("old, before the daemon started"))
    gap = 0
    real = KmsgFollower._rotating

    def rotating(self: KmsgFollower) -> bool:
        nonlocal gap
        gap += 1
        return real(self)

    monkeypatch.setattr(KmsgFollower, "_rotating", rotating)
    follower, got = follow(log)
    try:
        got.wait_cursor(file_origin(log))
        log.rename(tmp_path / "kern.log.1")
        wait_for(lambda: gap >= 3, interval=0.01, what="three looks that find no file")
        log.write_text(plain("first in the new file") + plain("second in the new file"))
        assert [r.text.split(": ")[1] for r in got.wait_for(2)] == ["first in the new file", "second in the new file"]
        assert follower.stats.up and follower.stats.error is None, "a rotation is not an outage"
    finally:
        follower.stop()


def test_a_file_truncated_in_place_is_read_from_its_start(tmp_path: Path) -> None:
    """copytruncate keeps the inode: the lines written after the truncation are new, not counted ones."""
    log = tmp_path / "kern.log"
    log.write_text("".join(f"6,{i},0,-;old {i}\n" for i in range(1, 6)))
    follower, got = follow(log)
    try:
        got.wait_for(5)
        with log.open("w") as f:
            f.write("6,9,0,-;after the truncation\n")
        assert got.wait_for(6)[-1] == Record(6, 1000.0, "after the truncation", kernel=True)
    finally:
        follower.stop()


def test_a_file_truncated_while_the_daemon_was_down_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(f"6,{i},0,-;old {i}\n" for i in range(1, 11)))
    follower, got = follow(log)
    got.wait_for(10)
    follower.stop()
    log.write_text("6,1,0,-;new line 1\n6,2,0,-;new line 2\n")  # fewer bytes than were read
    again, _ = follow(log, got)
    try:
        assert [r.text for r in got.wait_for(12)[10:]] == ["new line 1", "new line 2"]
    finally:
        again.stop()
