"""Who wrote a kernel-log line: the kernel, another program, or nobody can tell.

Only the kernel speaks for a GPU. Userspace can write to the kernel log too (`/dev/kmsg` takes writes
from root and privileged containers, journald forwards to it with `ForwardToKMsg=yes`), and syslog files
and the journal hold every program's lines next to the kernel's. What the lines themselves say about
their writer:

* A /dev/kmsg record's priority: the kernel gives every record written from userspace a facility of 1
  (LOG_USER) or whatever non-zero facility the writer asked for, never 0 (`devkmsg_write` in
  kernel/printk/printk.c: "we enforce LOG_USER, to be able to reliably distinguish kernel-generated
  messages from userspace-injected ones"). Facility 0 is the kernel's alone. The same holds for a
  syslog `<N>` priority and for `dmesg -x`'s `kern  :` column.
* A syslog or journal line's tag: `kernel` for the kernel (`host kernel: …`, RFC 5424's APP-NAME);
  a line `logger` wrote carries the user's name or the tag it was given.
* Where the driver's message starts: the NVIDIA driver starts every message with `NVRM: ` and the
  NVSwitch driver with `nvidia-nvswitchN: `. Before that come only the prefixes a log writer adds
  (timestamps, priority, host and tag, the kernel's caller id). A line where something else comes
  first quotes the driver's words inside another message: an audit record naming a file, a USB
  device's product string.

`origin` reads the text before the driver's tag and says which of these it is. A tag spoofed as
`kernel` in a text file cannot be told apart: where that matters, read /dev/kmsg.
"""

from __future__ import annotations

import re
from enum import StrEnum

from gpu_triage.diagnosis.core.log_stamps import header


class Origin(StrEnum):
    KERNEL = "kernel"  # nothing but a log writer's prefixes before the driver's message
    OTHER = "other"  # a priority, facility or tag that names a writer other than the kernel
    QUOTED = "quoted"  # other text before the driver's tag: its words quoted inside another message


_LOG_KERN = 0  # the kernel's syslog facility
_MAX_PREFIXES = 8  # a real line carries three or four; more is not a log writer's doing
# RFC 5424 (rsyslog's RSYSLOG_SyslogProtocol23Format): `<4>1 2024-05-01T12:00:00.123Z host kernel - - - msg`.
_RFC5424 = re.compile(
    r"(?:<(?P<pri>\d{1,10})>)?1 \S{1,64} \S{1,255} (?P<app>\S{1,48}) \S{1,128} \S{1,32} (?:-|(?:\[[^\]]{0,1024}\])+) "
)
# `dmesg -x` (--decode): `kern  :warn  : [ 12.3] …`; Talos' `talosctl dmesg`: `node: kern: warning: [stamp]: …`.
_DECODED = re.compile(r"(?P<facility>[a-z][a-z0-9]{1,7}) {0,6}:(?P<level>[a-z]{3,7}) {0,4}: ")
_TALOS = re.compile(
    r"(?:[\w.:-]{1,253}: )?(?P<facility>[a-z][a-z0-9]{1,7}): (?P<level>[a-z]{3,7}): \[[^\[\]]{1,64}\]: "
)
# The kernel's caller id (CONFIG_PRINTK_CALLER) as dmesg prints it: `[    T1234]` for a task, `[  C12]` for a CPU.
_CALLER = re.compile(r"\[ {0,12}[TC]\d{1,10}\] ?")
# After a stamp that carries no sender (`journalctl -o short-monotonic`: `[ 1234.5] host kernel: `).
_SENDER = re.compile(r"[\w.-]{1,253} (?P<ident>[\w./-]{1,64})(?:\[\d{1,10}\])?: ")
# A syslog stamp and sender ending right before the driver's tag, whatever came first (a launcher's
# prefix on a pasted line): the sender is who wrote the line.
_TRAILING_SENDER = re.compile(
    r"(?:\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[+-]\d{2}:?\d{2}| [A-Za-z]{1,6}|Z)?|\d{9,11}\.\d{1,9})"
    r" [\w.-]{1,253} (?P<ident>[\w./-]{1,64})(?:\[\d{1,10}\])?: $"
)
_TAIL_CHARS = 400  # how much of a long prefix the trailing sender is looked for in


def _facility(priority: int | None) -> int | None:
    return None if priority is None else priority >> 3


def _step(rest: str, after_stamp: bool) -> tuple[str, bool, Origin | None] | None:
    """Remove one log writer's prefix from the start of `rest`: (what is left, whether it was a stamp, a writer
    other than the kernel if the prefix names one); None when `rest` starts with no prefix."""
    if (h := header(rest)) is not None:
        other = _facility(h.priority) not in (None, _LOG_KERN) or (h.ident is not None and h.ident != "kernel")
        return rest[h.end :], h.kind in ("dmesg", "iso"), Origin.OTHER if other else None
    if (m := _RFC5424.match(rest)) is not None:
        other = _facility(int(m["pri"]) if m["pri"] else None) not in (None, _LOG_KERN) or m["app"] != "kernel"
        return rest[m.end() :], False, Origin.OTHER if other else None
    for pattern in (_TALOS, _DECODED):
        if (m := pattern.match(rest)) is not None:
            return rest[m.end() :], False, None if m["facility"] == "kern" else Origin.OTHER
    if (m := _CALLER.match(rest)) is not None:
        return rest[m.end() :], after_stamp, None
    if after_stamp and (m := _SENDER.match(rest)) is not None:
        return rest[m.end() :], False, None if m["ident"] == "kernel" else Origin.OTHER
    stripped = rest.lstrip(" \t")
    return (stripped, after_stamp, None) if stripped != rest else None


def origin(prefix: str) -> Origin:
    """Who wrote a line, from the text before the driver's tag (`NVRM:`, `nvidia-nvswitchN:`)."""
    rest, after_stamp = prefix, False
    for _ in range(_MAX_PREFIXES):
        if not rest:
            return Origin.KERNEL
        step = _step(rest, after_stamp)
        if step is None:
            break
        rest, after_stamp, other = step
        if other is not None:
            return other
    if not rest:
        return Origin.KERNEL
    tail = _TRAILING_SENDER.search(prefix[-_TAIL_CHARS:])
    return Origin.OTHER if tail is not None and tail["ident"] != "kernel" else Origin.QUOTED
