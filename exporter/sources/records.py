"""Kernel-log records: one line of the kernel log, with its sequence number and time, and the reader's counts.

A record says who wrote it where its format can: a /dev/kmsg record by its facility (0 is the kernel's;
the kernel gives everything written to /dev/kmsg from userspace another one), a journal entry exported
as JSON (`journalctl -o json`) by its `_TRANSPORT`, which journald sets itself and no client can.
A plain line says nothing here; the kernel-log parser reads its prefixes (diagnosis/xid/kernel_origin.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    ts: float  # wall-clock seconds
    text: str
    kernel: bool | None = None  # whether the kernel wrote it, where the record's format says; None: not said


@dataclass
class KmsgStats:
    """For the source's status metrics."""

    up: bool = False
    overruns: int = 0  # EPIPE: records the kernel overwrote before we read them
    malformed: int = 0  # records we could not split into header and text
    error: str | None = None


# The kernel writes PRI and SEQ as unsigned numbers and USEC as a 64-bit microsecond count; anything
# else (longer, non-ASCII digits) is not a record the kernel wrote.
_HEADER = re.compile(r"([0-9]{1,10}),([0-9]{1,19}),([0-9]{1,19})(?:,[^;]*)?", re.ASCII)
_MAX_SEQ = 2**63 - 1  # the journal keeps it as a signed 64-bit integer
_LOG_KERN = 0


def parse_record(raw: str, boot_time: float) -> Record | None:
    """'PRI,SEQ,USEC,FLAGS[,...];TEXT' -> Record; None when it is not in that format."""
    header, sep, text = raw.partition(";")
    m = _HEADER.fullmatch(header) if sep else None
    if m is None or int(m[2]) > _MAX_SEQ:
        return None
    # Continuation lines (" SUBSYSTEM=pci") follow the first newline; the message is the first line.
    kernel = int(m[1]) >> 3 == _LOG_KERN
    return Record(int(m[2]), boot_time + int(m[3]) / 1e6, text.split("\n", 1)[0], kernel)


def parse_journal_json(raw: str) -> tuple[float | None, str, bool] | None:
    """One entry of `journalctl -o json` -> (its time, its message, whether the kernel wrote it); None when the
    line is not such an entry. The message may be a list of byte values (journald's form for non-UTF-8 text)."""
    if not raw.startswith("{") or '"MESSAGE"' not in raw:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    usec = entry.get("__REALTIME_TIMESTAMP")
    ts = int(usec) / 1e6 if isinstance(usec, str) and usec.isdigit() and len(usec) <= 19 else None
    return ts, message.split("\n", 1)[0], entry.get("_TRANSPORT") == "kernel"
