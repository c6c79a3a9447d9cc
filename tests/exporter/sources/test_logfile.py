"""A followed kernel-log file: every line exactly once across restarts, rotation and truncation, bounded lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_triage.exporter.sources.kmsg import KmsgFollower
from gpu_triage.exporter.sources.logfile import MAX_LINE_BYTES, FileMark
from tests.exporter.sources.test_kmsg import Collect, Looks, Reads, file_origin, follow


def plain(n: int, what: str = "x") -> str:
    return f"Nov 30 03:00:{n % 60:02d} node kernel: NVRM: Xid (PCI:0000:18:00): 13, {what} {n}\n"


def texts(got: Collect) -> list[str]:
    return [r.text.rsplit(", ", 1)[1] for r in got.records]


def started(log: Path, got: Collect | None = None) -> tuple[KmsgFollower, Collect]:
    """Follow `log` and wait until the follower has looked at it (so what is written next is new to it)."""
    follower, got = follow(log, got)
    got.wait_cursor(file_origin(log))
    return follower, got


def stop(follower: KmsgFollower) -> None:
    """Stop it and make sure its thread is gone: from then on nothing more can arrive, no need to wait and see."""
    follower.stop()
    assert not follower.running


def run_until(log: Path, got: Collect, n: int) -> None:
    """A daemon run: follow until `n` records in all have arrived, then stop."""
    follower, _ = follow(log, got)
    try:
        got.wait_for(n)
    finally:
        stop(follower)


def test_lines_written_while_down_are_read_even_without_a_cursor_before(tmp_path: Path) -> None:
    """The first run saw no XID at all; the place it started from was still committed."""
    log = tmp_path / "kern.log"
    log.write_text(plain(0, "before the daemon"))
    follower, got = started(log)
    follower.stop()
    assert got.records == []
    with log.open("a") as f:
        f.writelines(plain(i, "down") for i in range(100))
    run_until(log, got, 100)
    assert texts(got) == [f"down {i}" for i in range(100)]


def test_rotated_while_down_the_old_file_is_finished_then_the_new_one_read(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(plain(i, "first") for i in range(10)))
    follower, got = started(log)  # a plain file met at start: from its end
    with log.open("a") as f:
        f.writelines(plain(i, "seen") for i in range(5))
    got.wait_for(5)
    follower.stop()
    with log.open("a") as f:  # written before the rotation, while the daemon was down
        f.writelines(plain(i, "late") for i in range(20))
    log.rename(tmp_path / "kern.log.1")
    log.write_text("".join(plain(i, "rotated") for i in range(20)))
    run_until(log, got, 45)
    assert texts(got) == (
        [f"seen {i}" for i in range(5)] + [f"late {i}" for i in range(20)] + [f"rotated {i}" for i in range(20)]
    )


def test_copytruncate_while_down_with_longer_new_content_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    follower, got = started(log)
    with log.open("a") as f:
        f.writelines(plain(i, "old") for i in range(12))
    got.wait_for(12)
    follower.stop()
    log.write_text("".join(plain(i, "new") for i in range(20)))  # same inode, more bytes than were read
    run_until(log, got, 32)
    assert texts(got)[12:] == [f"new {i}" for i in range(20)]


def test_copytruncate_while_down_reads_the_lines_the_copy_took_first(tmp_path: Path) -> None:
    """logrotate's copytruncate: `cp kern.log kern.log.1; : > kern.log`. The lines written after the daemon's place
    and before the copy are only in the copy: found beside the path by the same marks, and read first."""
    log = tmp_path / "kern.log"
    log.write_text("")
    follower, got = started(log)
    with log.open("a") as f:
        f.writelines(plain(i, "seen") for i in range(5))
    got.wait_for(5)
    follower.stop()
    with log.open("a") as f:
        f.writelines(plain(i, "down") for i in range(7))
    (tmp_path / "kern.log.1").write_bytes(log.read_bytes())
    (tmp_path / "kern.log.2.gz").write_bytes(b"\x1f\x8b an older, compressed one")
    log.write_text("".join(plain(i, "after") for i in range(3)))  # same inode, truncated, then written again
    run_until(log, got, 15)
    assert texts(got) == [f"seen {i}" for i in range(5)] + [f"down {i}" for i in range(7)] + [
        f"after {i}" for i in range(3)
    ]


def test_copytruncate_while_running_reads_what_the_copy_took_before_the_truncation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    looks = Looks(monkeypatch)
    follower, got = started(log)
    try:
        with log.open("a") as f:
            f.writelines(plain(i, "seen") for i in range(5))
        got.wait_for(5)
        # Between two looks of the follower: more lines, the copy, the truncation, new lines.
        with looks.paused(), log.open("r+") as f:
            f.seek(0, 2)
            f.writelines(plain(i, "late") for i in range(4))
            f.flush()
            (tmp_path / "kern.log.1").write_bytes(log.read_bytes())
            f.truncate(0)
            f.seek(0)
            f.writelines(plain(i, "after") for i in range(30))  # past the old size: a plain size check misses it
        got.wait_for(39)
        looks.wait_for(10)  # ten looks of the follower, and none reads a line twice
        assert texts(got)[5:] == [f"late {i}" for i in range(4)] + [f"after {i}" for i in range(30)]
    finally:
        follower.stop()


def test_truncate_and_regrow_while_running_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    follower, got = started(log)
    try:
        with log.open("a") as f:
            f.writelines(plain(i, "old") for i in range(40))
        got.wait_for(40)
        # Faster than the follower looks: truncated, then past the old size again, in one go.
        with log.open("r+") as f:
            f.truncate(0)
            f.writelines(plain(i, "regrown") for i in range(40))
            f.write(plain(99, "and then some") * 3)
        got.wait_for(83)
        assert texts(got)[40:80] == [f"regrown {i}" for i in range(40)]
    finally:
        follower.stop()


def test_restarts_resume_exactly(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    got = Collect()
    for run in range(5):
        follower, _ = started(log, got)
        with log.open("a") as f:
            f.writelines(plain(i, f"run{run}") for i in range(7))
        got.wait_for(7 * (run + 1))
        stop(follower)
    assert len(got.records) == 35 and len(set(texts(got))) == 35


def test_an_endless_line_is_skipped_without_being_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line with no newline for megabytes (a runaway writer) costs no memory."""
    log = tmp_path / "kern.log"
    log.write_text("")
    reads = Reads(monkeypatch)
    follower, got = started(log)
    try:
        with log.open("ab") as f:
            f.write(b"x" * (8 * MAX_LINE_BYTES))
            f.flush()
            reads.wait_until(log)  # read up to here with no newline: skipping
            f.write(b"x" * (8 * MAX_LINE_BYTES) + b"\n")
            f.write(plain(1, "after").encode())
        got.wait_for(1)
        assert texts(got) == ["after 1"]
        assert follower.stats.malformed == 1
    finally:
        follower.stop()


def test_nul_padding_after_a_power_loss_ends_a_line_and_the_next_one_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power loss a log file holds NULs where its last blocks were never written, after a line cut short,
    and then the first lines written after the reboot, often the XID that explains the crash. However much padding
    there is, what follows it is a line."""
    log = tmp_path / "kern.log"
    log.write_text("")
    reads = Reads(monkeypatch)
    follower, got = started(log)
    try:
        with log.open("ab") as f:
            f.write(plain(1, "before").encode())
            f.write(b"Dec  1 13:59:59 node1 kernel: [ 1.2] a line cut sh" + b"\0" * (8 * MAX_LINE_BYTES))
            f.flush()
            reads.wait_until(log)  # the padding read before the rest is written
            f.write(b"\0" * 4000 + plain(2, "after").encode() + plain(3, "next").encode())
        got.wait_for(3)
        assert texts(got) == ["before 1", "after 2", "next 3"]
        assert follower.stats.malformed == 0
    finally:
        follower.stop()


def test_a_corrupt_record_is_a_plain_line_and_the_reader_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    follower, got = started(log)
    try:
        with log.open("a") as f:
            f.write(f"6,1,{'9' * 400},-;NVRM: Xid (PCI:0000:18:00): 79, bad time\n")
            f.write("6,2,٣,-;non-ASCII digits\n")
            f.write("6,3,3000000,-;NVRM: Xid (PCI:0000:18:00): 48, good\n")
        records = got.wait_for(3)
        assert records[2].text.endswith("good") and records[2].ts == 1003.0
        assert records[0].ts == 5.0  # not a kmsg record: stamped when read
    finally:
        follower.stop()


def test_the_mark_round_trips_and_rejects_garbage() -> None:
    mark = FileMark(1, 2, 3, "ab", 40, "cd")
    assert FileMark.decode(mark.encode()) == mark
    for bad in ("", "v1:1:2", "v2:1:2:3:ab:40:cd", "v1:x:2:3:ab:40:cd"):
        assert FileMark.decode(bad) is None
