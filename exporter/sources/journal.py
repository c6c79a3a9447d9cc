"""The event journal: every XID and SXID the daemon saw, in SQLite, surviving crashes and restarts.

WAL mode and one transaction per batch mean a crash loses at most the batch in flight and never
corrupts what was committed. The kernel-log cursor (origin, last sequence number, and for a file where
in which file) is committed in the same transaction as the events it covers, so after a restart the
daemon reads on from exactly where it stopped: what happened while it was down is counted, nothing is
counted twice. Per-GPU totals live in their own table, outside retention, so
`nvidia_gpu_xid_errors_total` never goes down.

A write that fails (a full disk) raises and moves nothing: the caller keeps the batch and tries again,
and `stats` says the journal is down until a write succeeds. A journal that cannot even be opened (a full
disk at start) is down in the same way until `open()` succeeds: the daemon serves GPU telemetry meanwhile
and retries. Only a state directory that cannot be one (not a directory, not writable) is a start error.
A file that is not a usable database (an empty file included) is moved aside with a loud log line and a
fresh one started: losing history is bad, a daemon stuck in a crash loop is worse. Its kernel-log cursors are
salvaged first (salvage.py) and carried into the new one, so what was logged while the daemon was down is still
read, and counted once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_triage.exporter.sources.salvage import salvage_cursors

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events_v1 (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    boot_id TEXT NOT NULL,
    kmsg_seq INTEGER,
    sources TEXT NOT NULL,
    kind TEXT NOT NULL,
    code INTEGER NOT NULL,
    gpu_index INTEGER,
    uuid TEXT,
    pci_bus_id TEXT,
    pid INTEGER,
    process TEXT,
    text TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_v1_ts ON events_v1 (ts);
CREATE INDEX IF NOT EXISTS events_v1_gpu ON events_v1 (uuid, ts);
CREATE TABLE IF NOT EXISTS totals_v1 (
    kind TEXT NOT NULL,
    uuid TEXT NOT NULL,
    gpu_index INTEGER,
    pci_bus_id TEXT,
    code INTEGER NOT NULL,
    count INTEGER NOT NULL,
    last_seen REAL NOT NULL,
    PRIMARY KEY (kind, uuid, pci_bus_id, code)
);
CREATE TABLE IF NOT EXISTS cursor_v3 (origin TEXT PRIMARY KEY, seq INTEGER NOT NULL, mark TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks_v1 (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    note TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Event:
    """An XID or SXID as journaled. `id` is 0 until the journal has stored it."""

    ts: float
    boot_id: str
    sources: str  # comma-separated: kmsg, nvml, sim, ...
    kind: str  # "xid" or "sxid"
    code: int
    text: str
    gpu_index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pid: int | None = None
    process: str | None = None
    kmsg_seq: int | None = None
    details: Mapping[str, str] = field(default_factory=dict)
    id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "timestamp": self.ts,
            "kind": self.kind,
            "xid" if self.kind == "xid" else "sxid": self.code,
            "gpu": self.gpu_index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "pid": self.pid,
            "process": self.process,
            "sources": self.sources.split(","),
            "boot_id": self.boot_id,
            "text": self.text,
            "details": dict(self.details),
        }


@dataclass(frozen=True, slots=True)
class Total:
    kind: str
    uuid: str  # "" when the GPU could not be identified
    gpu_index: int | None
    pci_bus_id: str | None
    code: int
    count: int
    last_seen: float


@dataclass(frozen=True, slots=True)
class Mark:
    """Something an operator or the machine did to a GPU: `acknowledged`, `reset`."""

    ts: float
    uuid: str
    kind: str
    note: str


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a kernel log was counted: `origin` (kmsg:<boot id>, file:<path>), the last record's `seq`,
    and for a file a `mark` saying which file and where in it (see logfile.FileMark)."""

    origin: str
    seq: int
    mark: str = ""


@dataclass
class JournalStats:
    up: bool = True
    write_errors: int = 0  # transactions that failed (a full disk, an I/O error)
    moved_aside: int = 0  # unusable journal files moved aside at start
    error: str | None = None


_WRITABLE = "--state.dir must name a directory the daemon can write"


class JournalError(Exception):
    """The journal cannot be used at all (not: it was corrupt; that one is moved aside)."""


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.stats = JournalStats()
        # Told of each mark once it is stored (an acknowledgement, a reset read in the kernel log), so that
        # the verdicts never have to read them all back.
        self.on_marks: Callable[[Sequence[Mark]], None] = lambda _: None
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JournalError(f"cannot create {path.parent}: {e.strerror or e} ({_WRITABLE})") from e
        if path.is_dir() or not os.access(path.parent, os.W_OK | os.X_OK):
            raise JournalError(f"cannot open the event journal {path} ({_WRITABLE})")
        self.open()

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def open(self) -> bool:
        """Open the journal if it is not open yet; False (and `stats` saying why) when it still cannot be."""
        with self._lock:
            if self._db is not None:
                return True
            existed = self.path.exists()
            try:
                self._db = self._open_or_move_aside()
            except sqlite3.Error as e:  # cannot open or write it (a full disk): not corruption
                if not existed:  # an empty file left by the failed attempt would pass for a corrupt one
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                if self.stats.error != str(e):
                    log.error(
                        "cannot open the event journal; serving GPU telemetry without XIDs and trying again",
                        extra={"path": str(self.path), "error": str(e)},
                    )
                self.stats.up, self.stats.error = False, str(e)
                return False
            if not self.stats.up:
                log.info("the event journal is open", extra={"path": str(self.path)})
            self.stats.up, self.stats.error = True, None
            return True

    def _open_or_move_aside(self) -> sqlite3.Connection:
        try:
            if self.path.exists() and self.path.stat().st_size == 0:
                # SQLite takes an empty file for a new database: the counters would start over unnoticed.
                raise sqlite3.DatabaseError("the file is empty")
            return self._open()
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as e:
            path = self.path
            cursors = salvage_cursors(path)  # before the move: the new journal reads on from where this one was
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            log.error(
                "EVENT JOURNAL IS CORRUPT: moved it aside and started a new one; XID history before now is "
                "only in the old file",
                extra={"path": str(path), "moved_to": str(aside), "error": str(e)},
            )
            for suffix in ("", "-wal", "-shm"):
                old = Path(f"{path}{suffix}")
                if old.exists():
                    old.rename(Path(f"{aside}{suffix}"))
            self.stats.moved_aside += 1
            db = self._open()
            db.executemany("INSERT OR REPLACE INTO cursor_v3 (origin, seq, mark) VALUES (?, ?, ?)", cursors)
            return db

    def _need(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.OperationalError(f"the event journal is not open ({self.stats.error})")
        return self._db

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable across process crashes
            db.executescript(_SCHEMA)
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'cursor_v2'").fetchone():
                # Cursors of an older version: /dev/kmsg's carry over; a file's counted lines, not bytes, are
                # turned into a place in the file by the follower (logfile.legacy_origin).
                db.executescript(
                    "BEGIN; INSERT OR IGNORE INTO cursor_v3 SELECT origin, seq, '' FROM cursor_v2;"
                    " DROP TABLE cursor_v2; COMMIT;"
                )
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- writing -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, cursor: Cursor | None) -> Iterator[sqlite3.Connection]:
        """One transaction under the lock, which also moves the kernel-log cursor.

        Batches arrive in order from one thread, so the cursor is simply set. A failure raises
        sqlite3.Error with nothing changed, and leaves `stats` saying why."""
        with self._lock:
            db = self._need()
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                if cursor is not None:
                    db.execute(
                        "INSERT INTO cursor_v3 (origin, seq, mark) VALUES (?, ?, ?) ON CONFLICT (origin) DO UPDATE"
                        " SET seq = excluded.seq, mark = excluded.mark",
                        (cursor.origin, cursor.seq, cursor.mark),
                    )
                db.execute("COMMIT")
            except BaseException as e:
                if db.in_transaction:  # SQLite may have rolled back already (a full disk does that)
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    self._failed(e)
                raise
            if not self.stats.up:
                log.info("the event journal is written again", extra={"path": str(self.path)})
            self.stats.up, self.stats.error = True, None

    def _failed(self, e: sqlite3.Error) -> None:
        self.stats.write_errors += 1
        if self.stats.up:
            log.error(
                "cannot write the event journal; keeping the batch and trying again",
                extra={"path": str(self.path), "error": str(e)},
            )
        self.stats.up, self.stats.error = False, str(e)

    def record(
        self,
        events: Sequence[Event],
        cursor: Cursor | None = None,
        marks: Sequence[Mark] = (),
        merges: Sequence[Event] = (),
    ) -> list[Event]:
        """Store `events` and `marks`, update `merges` (journaled events a second source reported too, now
        richer) and advance the kernel-log cursor, all in one transaction."""
        stored: list[Event] = []
        if not events and not marks and not merges and cursor is None:
            return stored
        with self._transaction(cursor) as db:
            self._insert_marks(db, marks)
            for event in merges:
                db.execute(
                    "UPDATE events_v1 SET ts = ?, sources = ?, text = ?, details = ?, pid = ?, process = ?,"
                    " kmsg_seq = ? WHERE id = ?",
                    (
                        event.ts, event.sources, event.text, json.dumps(dict(event.details)), event.pid,
                        event.process, event.kmsg_seq, event.id,
                    ),
                )  # fmt: skip
            for e in events:
                row = db.execute(
                    "INSERT INTO events_v1 (ts, boot_id, kmsg_seq, sources, kind, code, gpu_index, uuid,"
                    " pci_bus_id, pid, process, text, details) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        e.ts, e.boot_id, e.kmsg_seq, e.sources, e.kind, e.code, e.gpu_index, e.uuid,
                        e.pci_bus_id, e.pid, e.process, e.text, json.dumps(dict(e.details)),
                    ),
                )  # fmt: skip
                db.execute(
                    "INSERT INTO totals_v1 (kind, uuid, gpu_index, pci_bus_id, code, count, last_seen)"
                    " VALUES (?,?,?,?,?,1,?) ON CONFLICT (kind, uuid, pci_bus_id, code) DO UPDATE SET"
                    " count = count + 1, last_seen = max(last_seen, excluded.last_seen),"
                    " gpu_index = excluded.gpu_index",
                    (e.kind, e.uuid or "", e.gpu_index, e.pci_bus_id or "", e.code, e.ts),
                )
                stored.append(replace(e, id=int(row.lastrowid or 0)))
        if marks:
            self.on_marks(marks)
        return stored

    def mark(self, mark: Mark) -> None:
        with self._transaction(None) as db:
            self._insert_marks(db, [mark])
        self.on_marks([mark])

    @staticmethod
    def _insert_marks(db: sqlite3.Connection, marks: Sequence[Mark]) -> None:
        db.executemany(
            "INSERT INTO marks_v1 (ts, uuid, kind, note) VALUES (?,?,?,?)",
            [(m.ts, m.uuid, m.kind, m.note) for m in marks],
        )

    def purge(self, older_than: float) -> int:
        """Drop events and marks older than `older_than`; totals and cursors stay. Raises sqlite3.Error."""
        with self._transaction(None) as db:
            n = db.execute("DELETE FROM events_v1 WHERE ts < ?", (older_than,)).rowcount
            db.execute("DELETE FROM marks_v1 WHERE ts < ?", (older_than,))
        return int(n)

    # -- reading -------------------------------------------------------------------------------

    def cursor(self, origin: str) -> Cursor | None:
        """How far the kernel log `origin` (kmsg:<boot id>, file:<path>) was counted."""
        with self._lock:
            row = self._need().execute("SELECT seq, mark FROM cursor_v3 WHERE origin = ?", (origin,)).fetchone()
        return None if row is None else Cursor(origin, int(row[0]), str(row[1]))

    def events(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        uuid: str | None = None,
        gpu_index: int | None = None,
        code: int | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """Stored events matching every given filter, oldest first (the newest `limit` of them)."""
        where, args = ["1=1"], []
        for clause, value in (
            ("ts >= ?", since),
            ("ts <= ?", until),
            ("uuid = ?", uuid),
            ("gpu_index = ?", gpu_index),
            ("code = ?", code),
            ("kind = ?", kind),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        query = (
            "SELECT id, ts, boot_id, kmsg_seq, sources, kind, code, gpu_index, uuid, pci_bus_id, pid, process,"
            f" text, details FROM events_v1 WHERE {' AND '.join(where)} ORDER BY ts DESC, id DESC LIMIT ?"
        )
        with self._lock:
            rows = self._need().execute(query, (*args, limit)).fetchall()
        return [_event(row) for row in reversed(rows)]

    def totals(self) -> list[Total]:
        with self._lock:
            rows = (
                self._need()
                .execute(
                    "SELECT kind, uuid, gpu_index, pci_bus_id, code, count, last_seen FROM totals_v1"
                    " ORDER BY kind, gpu_index, uuid, code"
                )
                .fetchall()
            )
        return [Total(r[0], r[1], r[2], r[3] or None, r[4], r[5], r[6]) for r in rows]

    def marks(self) -> list[Mark]:
        with self._lock:
            rows = self._need().execute("SELECT ts, uuid, kind, note FROM marks_v1 ORDER BY ts").fetchall()
        return [Mark(*row) for row in rows]


def _event(row: tuple[Any, ...]) -> Event:
    (id_, ts, boot_id, seq, sources, kind, code, gpu_index, uuid, bus, pid, process, text, details) = row
    return Event(
        ts,
        boot_id,
        sources,
        kind,
        code,
        text,
        gpu_index,
        uuid,
        bus,
        pid,
        process,
        seq,
        json.loads(details),
        id_,
    )
