"""Kernel-log records: one line of the kernel log, with its sequence number and time, and the reader's counts."""

from __future__ import annotations

import re
from dataclasses import dataclass


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


# The kernel writes PRI and SEQ as unsigned numbers and USEC as a 64-bit microsecond count; anything
# else (longer, non-ASCII digits) is not a record the kernel wrote.
_HEADER = re.compile(r"[0-9]{1,10},([0-9]{1,19}),([0-9]{1,19})(?:,[^;]*)?", re.ASCII)
_MAX_SEQ = 2**63 - 1  # the journal keeps it as a signed 64-bit integer


def parse_record(raw: str, boot_time: float) -> Record | None:
    """'PRI,SEQ,USEC,FLAGS[,...];TEXT' -> Record; None when it is not in that format."""
    header, sep, text = raw.partition(";")
    m = _HEADER.fullmatch(header) if sep else None
    if m is None or int(m[1]) > _MAX_SEQ:
        return None
    # Continuation lines (" SUBSYSTEM=pci") follow the first newline; the message is the first line.
    return Record(int(m[1]), boot_time + int(m[2]) / 1e6, text.split("\n", 1)[0])
