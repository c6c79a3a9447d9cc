"""Salvaging the cursors of a damaged journal: a clobbered header is rebuilt from SQLite's file format; what cannot be
read gives nothing, never an error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpu_triage.exporter.sources.journal import Cursor, Event, Journal
from gpu_triage.exporter.sources.salvage import salvage_cursors

CURSORS = [Cursor("kmsg:boot-1", 4821, ""), Cursor("file:/var/log/kern.log", 17, "v1:1:2:3:abc:4096:def")]


def journal(path: Path, checkpoint: bool) -> None:
    j = Journal(path)
    assert j.open()
    for cursor in CURSORS:
        j.record([Event(ts=1.0, boot_id="boot-1", sources="kmsg", kind="xid", code=13, text="x")], cursor)
    if checkpoint:
        j.close()  # SQLite checkpoints the write-ahead log into the file when the last connection closes
    else:
        # A crash: the files as they are while the connection is open, the newest pages only in the write-ahead log.
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{path}{suffix}", f"{path}.crashed{suffix}")
        j.close()
        for suffix in ("", "-wal"):
            Path(f"{path}.crashed{suffix}").replace(f"{path}{suffix}")


def clobber(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(os.urandom(100))


def test_a_clobbered_header_is_rebuilt_and_the_cursors_read(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal(path, checkpoint=True)
    clobber(path)
    assert sorted(salvage_cursors(path)) == sorted((c.origin, c.seq, c.mark) for c in CURSORS)
    assert path.read_bytes()[:16] != b"SQLite format 3\x00", "the damaged file itself is left as it was"


def test_the_write_ahead_log_names_the_page_size_and_still_applies(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal(path, checkpoint=False)
    assert Path(f"{path}-wal").stat().st_size > 0
    clobber(path)
    assert sorted(salvage_cursors(path)) == sorted((c.origin, c.seq, c.mark) for c in CURSORS)


def test_what_cannot_be_read_gives_nothing(tmp_path: Path) -> None:
    garbage = tmp_path / "journal.sqlite3"
    garbage.write_bytes(os.urandom(64 * 1024))
    assert salvage_cursors(garbage) == []
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    assert salvage_cursors(empty) == []
    assert salvage_cursors(tmp_path / "missing.sqlite3") == []
