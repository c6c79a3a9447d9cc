"""The kernel-log cursors of an event journal too damaged to use: read back before the file is moved aside.

A journal that cannot be opened is moved aside and a new one started (journal.py). Its events are lost to the
new one, but its cursors must not be: without them a followed kernel-log file is read from its end, and the XIDs
written while the daemon was down (often the ones that explain why it went down) are never counted. So before the
move, the cursor table is read from a copy of the file (the original stays as it was, for whoever investigates):

- as it is: a damaged index or events page leaves the cursor table readable;
- with its 100-byte header written anew, when that is what was damaged ("file is not a database"). The header's
  fields follow from the file itself, as SQLite's file format document defines them (sqlite.org/fileformat.html,
  "The Database Header"): the page size from the write-ahead log's own header when there is one (its bytes 8-11),
  else the sizes that divide the file, the default 4096 first; write and read versions 2 for WAL mode; a page
  count of the file's size; UTF-8; schema format 4. Page 1's schema table starts right after the header, so it
  survives a clobbered header, and the write-ahead log, copied beside, still applies its newer pages.

Nothing here trusts what it reads for more than a place to read on from: a salvaged cursor that is wrong makes the
reader start over or skip to the end of a file, as having none would.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import struct
import tempfile
from pathlib import Path

# (origin, seq, mark): a row of the cursor table, as journal.Cursor has it.
Row = tuple[str, int, str]

log = logging.getLogger(__name__)

_MAGIC = b"SQLite format 3\x00"
_WAL_MAGIC = (0x377F0682, 0x377F0683)
_PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)
_MAX_CURSORS = 10_000  # a journal holds one per kernel log followed


def salvage_cursors(path: Path) -> list[Row]:
    """The cursors the damaged journal at `path` still holds; none when they cannot be read."""
    with tempfile.TemporaryDirectory(prefix="gpu-triage-salvage-") as tmp:
        copy = Path(tmp) / "journal.sqlite3"
        try:
            shutil.copyfile(path, copy)
            wal = Path(f"{path}-wal")
            if wal.exists():
                shutil.copyfile(wal, Path(f"{copy}-wal"))
        except OSError:
            return []
        found = _read(copy)
        if found is None:
            for page_size in _page_sizes(copy):
                _write_header(copy, page_size)
                if (found := _read(copy)) is not None:
                    break
    if found:
        log.warning("salvaged the kernel-log cursors of the damaged journal", extra={"cursors": len(found)})
    return found or []


def _read(copy: Path) -> list[Row] | None:
    try:
        db = sqlite3.connect(copy, isolation_level=None)
        try:
            rows = db.execute("SELECT origin, seq, mark FROM cursor_v3 LIMIT ?", (_MAX_CURSORS,)).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return [
        (origin, seq, mark)
        for origin, seq, mark in rows
        if isinstance(origin, str) and isinstance(seq, int) and isinstance(mark, str)
    ]


def _page_sizes(copy: Path) -> list[int]:
    """The page size the write-ahead log names, else every size that divides the file, the usual one first."""
    wal = Path(f"{copy}-wal")
    try:
        head = wal.read_bytes()[:12] if wal.exists() else b""
    except OSError:
        head = b""
    if len(head) == 12:
        magic, _, size = struct.unpack(">III", head)
        if magic in _WAL_MAGIC and size in _PAGE_SIZES:
            return [size]
    length = copy.stat().st_size
    return [size for size in _PAGE_SIZES if length and length % size == 0]


def _write_header(copy: Path, page_size: int) -> None:
    pages = copy.stat().st_size // page_size
    header = struct.pack(
        ">16sHBBBBBBIIIIIIIIIIII20sII",
        _MAGIC,
        1 if page_size == 65536 else page_size,  # 65536 is written as 1
        2,  # file format write version: WAL
        2,  # read version: WAL
        0,  # reserved bytes per page
        64,  # maximum embedded payload fraction: must be 64
        32,  # minimum embedded payload fraction: must be 32
        32,  # leaf payload fraction: must be 32
        1,  # file change counter
        pages,  # database size in pages: valid while the change counter equals version-valid-for below
        0,  # first freelist trunk page
        0,  # freelist pages
        1,  # schema cookie
        4,  # schema format number
        0,  # default page cache size
        0,  # largest root b-tree page (no auto-vacuum)
        1,  # text encoding: UTF-8
        0,  # user version
        0,  # incremental vacuum
        0,  # application id
        bytes(20),  # reserved for expansion: zero
        1,  # version-valid-for
        3_037_002,  # SQLITE_VERSION_NUMBER that wrote it
    )
    assert len(header) == 100
    with copy.open("r+b") as f:
        f.write(header)
