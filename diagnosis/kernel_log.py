"""Kernel-log parsing: NVRM Xid lines, NVSwitch SXid lines, PCI-to-UUID bindings, fallen-off-the-bus.

Input is whatever `dmesg`, `dmesg -T`, `journalctl -k`, syslog files, /dev/kmsg or a container platform
printed; only the text from `NVRM:` (or `SXid`) on is structured, the prefix before it is searched for
a timestamp and otherwise ignored. Lines that cannot be parsed are counted in `ScanStats`, never raised.

Only lines holding one of the two trigger literals, `NVRM:` (every NVIDIA driver message) and `Xid (`
(which also covers NVSwitch `SXid (` lines), are parsed. `scan` is the fast path for big inputs: it
finds the lines holding the literals with `line_scan` (the scanner training-log diagnosis uses too) and
never looks at other lines. Line numbers count from 1.

A GPU that falls off the bus is usually reported twice: the Xid-less "has fallen off the bus" message
and an `Xid …: 79` line, in either order. The parser reports that fault once, keeping the Xid line (it
names the process); see `KernelLogParser`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpu_triage.diagnosis.line_scan import LineScanner
from gpu_triage.diagnosis.pci import canonical_bus_id

# Real NVRM lines stay well under 1 KiB; a longer line is garbage, and the cap bounds the regex work.
MAX_LINE_CHARS = 8192
# A decoded line has at least a quarter as many characters as bytes, so longer ones can be dropped unread.
_MAX_LINE_BYTES = 4 * MAX_LINE_CHARS
# The three lines of the Xid-less fallen-off-the-bus message may be interleaved with other CPUs' output,
# and so may that message and the driver's own Xid 79 for the same fault: both are printed together.
_FALLEN_WINDOW = 10
_SYNTHESIZED = "fallen_off_bus"
_FALLEN = "fallen off the bus"


class EventKind(StrEnum):
    XID = "xid"
    SXID = "sxid"  # NVSwitch fault: its own code space, never an Xid
    GPU_BINDING = "gpu_binding"  # `NVRM: GPU at PCI:…: GPU-<uuid>`: joins bus id to uuid without NVML


def _no_details() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class KernelEvent:
    kind: EventKind
    code: int | None  # Xid or SXid code, any integer; 79 for the Xid-less fallen-off-the-bus messages
    pci_bus_id: str | None  # canonical (diagnosis.pci); None when the log redacted it
    line: int  # first line of the message, counting from 1
    text: str  # the line as read; a multi-line message's lines joined with " "
    pid: int | None = None
    process: str | None = None
    uuid: str | None = None
    timestamp: str | None = None  # as printed in the prefix, not interpreted
    details: Mapping[str, str] = field(default_factory=_no_details, hash=False)


@dataclass(slots=True)
class ScanStats:
    """What was read and what was skipped; the daemon exports these ("skipped and counted, never fatal")."""

    lines: int = 0  # lines read by `scan`
    candidates: int = 0  # lines holding a trigger literal: the only ones parsed
    events: int = 0  # events handed out (a held fallen-off event counts when it is released)
    overlong: int = 0  # candidate lines longer than MAX_LINE_CHARS, skipped
    binary: int = 0  # candidate lines holding NUL bytes, skipped
    invalid_utf8: int = 0  # candidate lines that were not UTF-8; bad bytes replaced, then parsed
    malformed: int = 0  # lines that name an Xid/SXid, or start the fallen-off message, but do not parse

    @property
    def skipped(self) -> int:
        return self.overlong + self.binary + self.malformed


_BUS = r"(?:PCI:)?(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"

# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
# NVRM: Xid (0000:03:00): 14, Channel 00000001          <- drivers before the "PCI:" tag
# NVRM: Xid (PCI:...): 31, pid='<unknown>', name=<unknown>, ...   <- bus id redacted by a log shipper
# The bus id is whatever sits in the parentheses; the code must end at a comma, a blank or the line end,
# so a line cut inside the parentheses never yields the PCI domain as a code.
_XID = re.compile(r"NVRM: {0,8}Xid {0,4}\((?P<bus>[^()]{0,40})\): {0,8}(?P<code>[0-9]{1,6})(?=[, ]|$)", re.ASCII)
# nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error (First)
_SXID = re.compile(r"SXid \((?P<bus>[^()]{0,40})\): {0,8}(?P<code>[0-9]{1,6})(?=[, ]|$)", re.ASCII)
# The switch driver prints "Fatal" / "Non-fatal"; other spellings are taken too, and written its way.
_SXID_PAYLOAD = re.compile(
    r"(?P<severity>(?i:non[- ]?fatal|fatal))\b,? {0,4}(?:Link (?P<link>-?[0-9]{1,4})\b)?", re.ASCII
)
_NVSWITCH = re.compile(r"(?P<device>nvidia-nvswitch[0-9]{0,4}): {0,4}$", re.ASCII)
# NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-a2a8-aa5e-ab77-7a1e0e2b0a79
_BINDING = re.compile(
    rf"NVRM: {{0,8}}GPU at (?P<bus>{_BUS}): {{0,4}}"
    r"(?P<uuid>GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})",
    re.ASCII,
)
# NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.
# NVRM: GPU at 0000:01:00.0 has fallen off the bus.
# NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus …
# The last one is usually printed as three lines; its first line alone is the "head" below.
_GPU_NAMED = re.compile(rf"NVRM: {{0,8}}(?P<head>The NVIDIA GPU|GPU at|GPU) (?P<bus>{_BUS})\b", re.ASCII)
_CONTINUATIONS = ("(PCI ID:", "installed in this system", _FALLEN)

# Payload details, searched in the text after pid/name.
_CAUSED_BY = re.compile(r"caused by (?:an? )?previous Xid:? {0,2}(?P<code>[0-9]{1,6})", re.ASCII | re.IGNORECASE)
_RECOVERY = re.compile(
    r"recovery action changed from (?P<old>0x[0-9a-fA-F]{1,8})(?: \((?P<old_label>[^()]{0,64})\))?"
    r" to (?P<new>0x[0-9a-fA-F]{1,8})(?: \((?P<new_label>[^()]{0,64})\))?",
    re.ASCII,
)
# 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)
_NVLINK5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]{1,40}(?:/[A-Z0-9_]{1,40})?) {1,4}(?P<severity>Fatal|Nonfatal|Non-fatal)"
    r" {1,4}(?P<xc>XC[0-9]) {1,4}(?P<injected>i[0-9]{1,3}) {1,4}Link {1,4}(?P<link>-?[0-9]{1,4})"
    r" {1,4}\((?P<regs>[^()]{0,200})\)",
    re.ASCII,
)
_SM = re.compile(r"GPC (?P<gpc>[0-9]{1,4}), TPC (?P<tpc>[0-9]{1,4})(?:, SM (?P<sm>[0-9]{1,4}))?", re.ASCII)
_CHANNEL = re.compile(r"\b(?:Ch|ChID|Channel) (?P<channel>[0-9a-fA-F]{1,8})\b", re.ASCII)

# Timestamps at the start of the prefix, first match wins (so syslog's wall clock beats the dmesg
# seconds that follow it). Month and weekday names are any word: syslog prints them in the locale.
_TS_LEADING = re.compile(
    r" {0,8}(?:"
    r"\[ {0,12}(?P<mono>[0-9]{1,12}\.[0-9]{1,9})\]"  # dmesg
    r"|\[(?P<ctime>\S{1,12} {1,2}\S{1,12} {1,2}[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4})\]"  # dmesg -T
    r"|(?P<iso>[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?)"  # journal short-iso(-precise), RFC 3339 syslog
    r"|(?P<syslog>\S{1,12} {1,2}[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?)(?= )"  # syslog
    r"|[0-9]{1,3},[0-9]{1,20},(?P<kmsg>[0-9]{1,20}),[^;]{0,32};"  # /dev/kmsg record header
    r")",
    re.ASCII,
)


def _strip_eol(text: str) -> str:
    return text.rstrip("\r\n")


_TRIGGERS = (b"NVRM:", b"Xid (")


def _has_trigger(text: str) -> bool:
    return "NVRM:" in text or "Xid (" in text


def _timestamp(prefix: str) -> str | None:
    m = _TS_LEADING.match(prefix)
    if m is not None:
        return next(g for g in m.groups() if g)
    # Platforms that put their own host and level first (Talos: "kern: warning: [2024-…]: ") keep the
    # kernel's timestamp in the last bracket before the message.
    tail = prefix.rstrip(": \t")
    if tail.endswith("]"):
        start = tail.rfind("[")
        if start != -1 and len(tail) - start <= 66:
            return tail[start + 1 : -1].strip() or None
    return None


def _split_pid_name(rest: str) -> tuple[int | None, str | None, str]:
    """`pid=…, name=…, message` → (pid, process, message); both fields are optional."""
    pid: int | None = None
    process: str | None = None
    if rest.startswith("pid="):
        value, _, rest = rest[4:].partition(",")
        value = value.strip().strip("'\"")
        if value.isascii() and value.isdigit() and len(value) <= 10:
            pid = int(value)
        rest = rest.lstrip()
    if rest.startswith("name="):
        # Process names may hold commas, colons and brackets ("nvc:[driver]"); the field ends at the
        # first comma followed by a blank, which is how the driver separates fields.
        cut = rest.find(", ", 5)
        name = (rest[5:] if cut == -1 else rest[5:cut]).strip()
        rest = "" if cut == -1 else rest[cut + 2 :]
        process = name if name and name != "<unknown>" else None
    return pid, process, rest.strip()


def parse_recovery_change(text: str) -> tuple[int, str | None] | None:
    """Xid 154's "recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)" → (2, label)."""
    m = _RECOVERY.search(text)
    if m is None:
        return None
    return int(m["new"], 16), m["new_label"]


def _payload_details(message: str) -> dict[str, str]:
    details: dict[str, str] = {}
    if message:
        details["message"] = message
    if (m := _CAUSED_BY.search(message)) is not None:
        details["caused_by_xid"] = str(int(m["code"]))
    if (m := _RECOVERY.search(message)) is not None:
        details["recovery_action"] = str(int(m["new"], 16))
        details["previous_recovery_action"] = str(int(m["old"], 16))
        if m["new_label"]:
            details["recovery_action_label"] = m["new_label"].strip()
    if (m := _NVLINK5.match(message)) is not None:
        regs = m["regs"].split()
        details.update(
            unit=m["unit"],
            severity="Nonfatal" if m["severity"] == "Non-fatal" else m["severity"],
            xc=m["xc"],
            injected=m["injected"],
            link=m["link"],
        )
        if regs:
            details["intr_info"] = regs[0]
        if len(regs) > 1:
            details["error_status"] = regs[1]
    if (m := _SM.search(message)) is not None:
        details.update((k, str(int(v))) for k, v in m.groupdict().items() if v is not None)
    if (m := _CHANNEL.search(message)) is not None:
        details["channel"] = m["channel"]
    return details


def _parse_nvrm(text: str, start: int, line: int) -> KernelEvent | None:
    if (m := _XID.match(text, start)) is not None:
        pid, process, message = _split_pid_name(text[m.end() :].lstrip(" ,"))
        return KernelEvent(
            kind=EventKind.XID,
            code=int(m["code"]),
            pci_bus_id=canonical_bus_id(m["bus"]),
            line=line,
            text=text,
            pid=pid,
            process=process,
            timestamp=_timestamp(text[:start]),
            details=MappingProxyType(_payload_details(message)),
        )
    if (m := _BINDING.match(text, start)) is not None:
        return KernelEvent(
            kind=EventKind.GPU_BINDING,
            code=None,
            pci_bus_id=canonical_bus_id(m["bus"]),
            line=line,
            text=text,
            uuid="GPU-" + m["uuid"][4:].lower(),
            timestamp=_timestamp(text[:start]),
        )
    if _FALLEN in text and (m := _GPU_NAMED.match(text, start)) is not None:
        return _fallen_event(canonical_bus_id(m["bus"]), line, text, _timestamp(text[:start]), [text])
    return None


def _fallen_event(bus: str | None, line: int, text: str, ts: str | None, parts: list[str]) -> KernelEvent:
    bodies = [p[p.find("NVRM:") + 5 :].strip() for p in parts]
    return KernelEvent(
        kind=EventKind.XID,
        code=79,
        pci_bus_id=bus,
        line=line,
        text=text,
        timestamp=ts,
        # Tells consumers this 79 was inferred from the message, not printed as an Xid by the driver.
        details=MappingProxyType({"synthesized": _SYNTHESIZED, "message": " ".join(bodies)}),
    )


def _parse_sxid(text: str, start: int, line: int) -> KernelEvent | None:
    m = _SXID.match(text, start)
    if m is None:
        return None
    prefix = text[:start]
    details: dict[str, str] = {}
    if (dev := _NVSWITCH.search(prefix)) is not None:
        details["device"] = dev["device"]
        prefix = prefix[: dev.start()]
    message = text[m.end() :].lstrip(" ,").strip()
    if message:
        details["message"] = message
    if (p := _SXID_PAYLOAD.match(message)) is not None:
        details["severity"] = "Fatal" if p["severity"].lower() == "fatal" else "Non-fatal"
        if p["link"] is not None:
            details["link"] = p["link"]
    return KernelEvent(
        kind=EventKind.SXID,
        code=int(m["code"]),
        pci_bus_id=canonical_bus_id(m["bus"]),
        line=line,
        text=text,
        timestamp=_timestamp(prefix),
        details=MappingProxyType(details),
    )


def _parse(text: str, line: int) -> KernelEvent | None:
    start = text.find("NVRM:")
    if start != -1 and (event := _parse_nvrm(text, start, line)) is not None:
        return event
    start = text.find("SXid")
    return _parse_sxid(text, start, line) if start != -1 else None


def parse_line(text: str, line: int = 1) -> KernelEvent | None:
    """The event on one line, or None. Stateless: the three-line fallen-off message needs the parser."""
    text = _strip_eol(text)
    if len(text) > MAX_LINE_CHARS or "\x00" in text or not _has_trigger(text):
        return None
    return _parse(text, line)


@dataclass(slots=True)
class _Pending:
    """The head of a multi-line fallen-off-the-bus message, waiting for the line that names the fault."""

    line: int
    bus: str | None
    timestamp: str | None
    parts: list[str]


def _continuation(text: str) -> str | None:
    start = text.find("NVRM:")
    if start == -1:
        return None
    body = text[start + 5 :].lstrip()
    return body if body.startswith(_CONTINUATIONS) else None


class KernelLogParser:
    """Line-at-a-time parser; keeps the state the three-line fallen-off-the-bus message needs.

    The driver reports a GPU falling off the bus with an Xid-less message and, usually, an Xid 79 line
    too, in either order. So that the fault is counted once, the event made from the message (tagged
    `details["synthesized"]`) is held back while an Xid 79 for the same bus may still come, and dropped
    if one comes; one that follows such an Xid 79 is dropped at once. "May still come" means within
    _FALLEN_WINDOW line numbers. A held event is released, before the events of the line that releases
    it, by the first trigger line beyond that window, by `flush` or by `finish`.

    Feeding it every line or only the lines holding a trigger gives the same events: every window is
    measured in line numbers, not in lines fed.
    """

    def __init__(self, stats: ScanStats | None = None) -> None:
        self.stats = stats if stats is not None else ScanStats()
        self._pending: _Pending | None = None
        self._held: list[tuple[int, KernelEvent]] = []  # (line that completed it, event), in that order
        self._recent79: dict[str, int] = {}  # bus id → line of its latest real Xid 79, oldest first

    def feed(self, text: str, line: int) -> list[KernelEvent]:
        """The events this line completes or releases: usually none or one; `line` numbers must increase."""
        text = _strip_eol(text)
        if not _has_trigger(text):
            return []
        stats = self.stats
        stats.candidates += 1
        if len(text) > MAX_LINE_CHARS:
            stats.overlong += 1
            return []
        if "\x00" in text:
            stats.binary += 1
            return []
        if self._pending is not None and line - self._pending.line > _FALLEN_WINDOW:
            self._drop_pending()
        released = self._release(line)
        events = self._feed_continuation(text, line)
        if events is None:
            events = self._feed_line(text, line)
        out = released + [e for e in events if self._keep(e, line)]
        stats.events += len(out)
        return out

    def flush(self) -> list[KernelEvent]:
        """Release every held event now, in line order.

        For a caller that reads in batches: the two reports of one fault are printed together, so the
        end of a batch is a safe point to stop waiting for the second.
        """
        released = self._release(None)
        self.stats.events += len(released)
        return released

    def finish(self) -> list[KernelEvent]:
        """End of input: the held events; a fallen-off message still missing its last line is malformed."""
        self._drop_pending()
        return self.flush()

    def _release(self, line: int | None) -> list[KernelEvent]:
        """Held events whose window has passed by `line` (all of them for None), in line order."""
        held = self._held
        # Held in the order they completed, so the expired ones come first.
        cut = len(held) if line is None else sum(1 for at, _ in held if line - at > _FALLEN_WINDOW)
        if cut == 0:
            return []
        released, self._held = held[:cut], held[cut:]
        return sorted((e for _, e in released), key=lambda e: e.line)

    def _keep(self, event: KernelEvent, line: int) -> bool:
        """Whether `event`, completed on `line`, goes out now; False when it is held or is a duplicate."""
        bus = event.pci_bus_id
        if event.code != 79 or event.kind is not EventKind.XID or bus is None:
            return True
        recent = self._recent79
        # A message completed on `line` began at most _FALLEN_WINDOW lines before it, so an Xid 79 more
        # than twice that far back can match nothing any more.
        while recent and line - next(iter(recent.values())) > 2 * _FALLEN_WINDOW:
            del recent[next(iter(recent))]
        if event.details.get("synthesized") != _SYNTHESIZED:
            # The real line is the richer report of the fault: it names the process.
            self._held = [(at, e) for at, e in self._held if e.pci_bus_id != bus]
            recent.pop(bus, None)  # re-inserted last, so the dict stays in line order
            recent[bus] = line
            return True
        if bus in recent and event.line - recent[bus] <= _FALLEN_WINDOW:
            return False
        self._held.append((line, event))
        return False

    def _feed_continuation(self, text: str, line: int) -> list[KernelEvent] | None:
        body = _continuation(text)
        if body is None:
            return None
        pending = self._pending
        if pending is None:
            # The head scrolled out of the ring buffer or the file began mid-message: the fault is real
            # even though the GPU is unknown.
            return [_fallen_event(None, line, text, None, [text])] if _FALLEN in body else []
        pending.parts.append(text)
        if _FALLEN not in body:
            return []
        self._pending = None
        joined = " ".join(pending.parts)
        return [_fallen_event(pending.bus, pending.line, joined, pending.timestamp, pending.parts)]

    def _feed_line(self, text: str, line: int) -> list[KernelEvent]:
        event = _parse(text, line)
        if event is not None:
            return [event]
        start = text.find("NVRM:")
        head = _GPU_NAMED.match(text, start) if start != -1 else None
        if head is not None and head["head"] == "The NVIDIA GPU":
            self._drop_pending()
            bus = canonical_bus_id(head["bus"])
            self._pending = _Pending(line, bus, _timestamp(text[:start]), [text])
        elif "Xid" in text and (start != -1 or "SXid" in text):
            self.stats.malformed += 1
        return []

    def _drop_pending(self) -> None:
        # Only a message that already promised the fault ("… installed in this system has") and then
        # stopped is broken; the same head also starts harmless messages (unsupported GPU, …).
        if self._pending is not None and self._pending.parts[-1].rstrip().endswith(" has"):
            self.stats.malformed += 1
        self._pending = None


def _decode(raw: bytes, stats: ScanStats) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.invalid_utf8 += 1
        return raw.decode("utf-8", errors="replace")


def scan(chunks: Iterable[bytes], stats: ScanStats | None = None) -> Iterator[KernelEvent]:
    """Events in a big input given as byte chunks split anywhere; `stats` (if given) is filled as it goes.

    Equivalent to feeding every line, decoded as UTF-8 with bad bytes replaced, to a `KernelLogParser`.
    """
    parser = KernelLogParser(stats)
    # Binary lines go to the parser, which counts them; over-long ones the scanner drops and counts.
    scanner = LineScanner(_TRIGGERS, max_line=_MAX_LINE_BYTES, keep_binary=True)
    for chunk in chunks:
        for candidate in scanner.feed(chunk):
            yield from parser.feed(_decode(candidate.data, parser.stats), candidate.line)
    for candidate in scanner.finish():
        yield from parser.feed(_decode(candidate.data, parser.stats), candidate.line)
    parser.stats.lines = scanner.lines
    parser.stats.overlong += scanner.skipped
    parser.stats.candidates += scanner.skipped
    yield from parser.finish()
