"""The event journal: filters, totals that outlive retention, the kernel-log cursor, crashes, corruption."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_triage.exporter.sources.journal import Cursor, Event, Journal, JournalError, Mark
from tests.small_disk import fill, small_disk


def xid(code: int, ts: float, uuid: str = "GPU-a", gpu: int = 0, **kw: object) -> Event:
    return Event(
        ts=ts, boot_id="b1", sources="kmsg", kind="xid", code=code, text=f"Xid {code}", gpu_index=gpu, uuid=uuid, **kw
    )  # type: ignore[arg-type]


def test_record_and_query(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    stored = j.record(
        [xid(13, 100.0), xid(79, 200.0, uuid="GPU-b", gpu=1, details={"message": "fallen"}), xid(13, 300.0)]
    )
    assert [e.id for e in stored] == [1, 2, 3]
    assert [e.code for e in j.events()] == [13, 79, 13]
    assert [e.code for e in j.events(uuid="GPU-b")] == [79]
    assert [e.ts for e in j.events(code=13, since=150.0)] == [300.0]
    assert [e.ts for e in j.events(until=250.0)] == [100.0, 200.0]
    assert [e.ts for e in j.events(limit=2)] == [200.0, 300.0], "the newest, oldest first"
    assert j.events(gpu_index=1)[0].details == {"message": "fallen"}
    totals = {(t.uuid, t.code): (t.count, t.last_seen) for t in j.totals()}
    assert totals == {("GPU-a", 13): (2, 300.0), ("GPU-b", 79): (1, 200.0)}


def test_cursor_moves_with_the_events_it_covers(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    assert j.cursor("kmsg:b1") is None
    j.record([xid(13, 1.0, kmsg_seq=10)], cursor=Cursor("kmsg:b1", 10))
    j.record([], cursor=Cursor("kmsg:b1", 25))
    assert j.cursor("kmsg:b1") == Cursor("kmsg:b1", 25) and j.cursor("kmsg:b2") is None
    j.record([], cursor=Cursor("file:/var/log/kern.log", 40, "v1:mark"))
    j.record([], cursor=Cursor("file:/var/log/kern.log", 3, "v1:another"))  # the file was truncated
    assert j.cursor("file:/var/log/kern.log") == Cursor("file:/var/log/kern.log", 3, "v1:another")


def test_merge_keeps_the_richer_record_and_counts_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    (first,) = j.record([Event(ts=5.0, boot_id="b1", sources="nvml", kind="xid", code=79, text="Xid 79", uuid="GPU-a")])
    richer = Event(
        5.0,
        "b1",
        "kmsg,nvml",
        "xid",
        79,
        "NVRM: Xid (PCI:0000:18:00): 79, pid=7, name=x",
        uuid="GPU-a",
        pid=7,
        kmsg_seq=44,
        id=first.id,
    )
    j.record([], Cursor("kmsg:b1", 44), merges=[richer])
    (event,) = j.events()
    assert (event.sources, event.pid, event.kmsg_seq) == ("kmsg,nvml", 7, 44)
    assert [t.count for t in j.totals()] == [1] and j.cursor("kmsg:b1") == Cursor("kmsg:b1", 44)


def test_retention_drops_events_but_not_totals(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.record([xid(31, 10.0), xid(31, 20.0), xid(31, 1000.0)])
    j.mark(Mark(15.0, "GPU-a", "acknowledged", "ticket 1"))
    assert j.purge(older_than=500.0) == 2
    assert [e.ts for e in j.events()] == [1000.0] and j.marks() == []
    assert [t.count for t in j.totals()] == [3], "the counter never goes down"


def test_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    j = Journal(path)
    j.record([xid(48, 1.0)], cursor=Cursor("kmsg:b1", 3))
    j.close()
    again = Journal(path)
    assert [e.code for e in again.events()] == [48] and again.cursor("kmsg:b1") == Cursor("kmsg:b1", 3)


def test_corrupt_file_is_moved_aside_loudly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "j.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    j = Journal(path)
    assert j.events() == []
    j.record([xid(13, 1.0)])
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert any("CORRUPT" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


# Three whole batches, then a fourth stopped inside its transaction: its 50 events and totals written, the
# cursor being moved, no COMMIT yet. The kill lands there for certain, not "most likely".
_WRITER = """
import signal, sqlite3, sys
from pathlib import Path
from gpu_triage.exporter.sources.journal import Cursor, Event, Journal
n = 0

def trace(statement):
    if n == 4 and statement.startswith("INSERT INTO cursor_v3"):
        print("mid-transaction", flush=True)
        signal.pause()

connect = sqlite3.connect

def traced(*args, **kwargs):
    db = connect(*args, **kwargs)
    db.set_trace_callback(trace)
    return db

sqlite3.connect = traced
j = Journal(Path(sys.argv[1]))
while True:
    n += 1
    if n > 4:
        sys.exit("the fourth batch never reached its cursor")
    j.record([Event(ts=float(n), boot_id="b1", sources="kmsg", kind="xid", code=31, text="x" * 200, uuid="GPU-a")] * 50,
             cursor=Cursor("kmsg:b1", n))
"""


def test_a_killed_writer_leaves_a_consistent_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "mid-transaction"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    j = Journal(path)
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    events = j.events(limit=10**9)
    cursor = j.cursor("kmsg:b1")
    assert cursor is not None and cursor.seq == 3, "the fourth batch is not there, its cursor neither"
    # Every committed batch is whole: 50 events per cursor step, totals agree with the rows.
    assert len(events) == 50 * cursor.seq
    assert sum(t.count for t in j.totals()) == len(events)


def test_an_unusable_state_dir_is_a_clear_error_not_corruption(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(JournalError, match=r"cannot create .*a-file.*--state.dir must name a directory"):
        Journal(blocker / "state" / "journal.sqlite3")
    (tmp_path / "journal.sqlite3").mkdir()  # something sqlite cannot open: nothing to move aside
    with pytest.raises(JournalError, match="cannot open the event journal"):
        Journal(tmp_path / "journal.sqlite3")
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]


def test_an_empty_file_is_moved_aside_like_a_corrupt_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SQLite would take a zero-length file for a new database, and the counters would start over unnoticed."""
    path = tmp_path / "j.sqlite3"
    j = Journal(path)
    j.record([xid(13, 1.0)])
    j.close()
    path.write_bytes(b"")  # a truncation, or a file system that lost the data after a crash
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    again = Journal(path)
    assert again.stats.moved_aside == 1
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())
    assert any("CORRUPT" in r.getMessage() for r in caplog.records)


def test_a_failed_write_changes_nothing_and_says_so(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.record([xid(13, 1.0)], cursor=Cursor("kmsg:b1", 1))
    with pytest.raises(sqlite3.OperationalError), j._transaction(Cursor("kmsg:b1", 2)) as db:
        db.execute("INSERT INTO marks_v1 (ts, uuid, kind, note) VALUES (1, 'GPU-a', 'x', '')")
        raise sqlite3.OperationalError("database or disk is full")
    assert not j.stats.up and j.stats.write_errors == 1
    assert j.cursor("kmsg:b1") == Cursor("kmsg:b1", 1) and j.marks() == []
    j.record([xid(13, 2.0)], cursor=Cursor("kmsg:b1", 2))
    assert j.stats.up and j.cursor("kmsg:b1") == Cursor("kmsg:b1", 2)


def test_a_journal_on_a_full_disk_is_down_until_there_is_room(tmp_path: Path) -> None:
    """A full /var at a restart must not take the exporter away: the journal is a state, opened later."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        path = disk / "j.sqlite3"
        before = Journal(path)
        before.record([xid(13, 1.0)])
        before.close()
        filler = fill(disk)
        j = Journal(path)
        assert (j.is_open, j.stats.up) == (False, False) and j.stats.error
        with pytest.raises(sqlite3.Error):
            j.record([xid(13, 2.0)])
        fresh = Journal(disk / "new.sqlite3")
        assert not fresh.is_open and not (disk / "new.sqlite3").exists(), "no empty file to be taken for corrupt"
        filler.unlink()
        assert j.open() and fresh.open() and j.stats.up
        j.record([xid(13, 2.0)])
        assert [t.count for t in j.totals()] == [2], "the history from before is kept"
        assert (j.stats.moved_aside, fresh.stats.moved_aside) == (0, 0)
        assert not [p for p in disk.iterdir() if ".corrupt-" in p.name]
