"""Kernel-log line formats: NVRM Xid lines, NVSwitch SXid lines, PCI-to-UUID bindings, fallen-off-the-bus.

Input is whatever `dmesg`, `dmesg -T`, `journalctl -k`, syslog files, /dev/kmsg or a container platform
printed; only the text from `NVRM:` (or `SXid`) on is structured, the prefix before it is searched for
a timestamp and otherwise ignored. Only lines holding one of the two trigger literals, `NVRM:` (every
NVIDIA driver message) and `Xid (` (which also covers NVSwitch `SXid (` lines), can hold an event.

This module reads one line at a time and keeps no state: `parse_event` gives the event a line holds by
itself; the parts of the multi-line fallen-off-the-bus message come out as a `FallenMessage` head and
`continuation` bodies. diagnosis/xid/kernel_parser.py puts lines together into events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpu_triage.diagnosis.core.log_stamps import printed_stamp
from gpu_triage.diagnosis.core.pci import canonical_bus_id

# Real NVRM lines stay well under 1 KiB; a longer line is garbage, and the cap bounds the regex work.
MAX_LINE_CHARS = 8192
_TRIGGER_TEXT = ("NVRM:", "Xid (")  # a line holding neither holds no event
TRIGGERS = tuple(t.encode() for t in _TRIGGER_TEXT)  # the same, for searching bytes
FALLEN = "fallen off the bus"
SYNTHESIZED = "fallen_off_bus"  # details["synthesized"] of a 79 made from the Xid-less message


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
    pci_bus_id: str | None  # canonical (diagnosis.core.pci); None when the log redacted it
    line: int  # first line of the message, counting from 1
    text: str  # the line as read; a multi-line message's lines joined with " "
    pid: int | None = None
    process: str | None = None
    uuid: str | None = None
    timestamp: str | None = None  # as printed in the prefix, not interpreted
    details: Mapping[str, str] = field(default_factory=_no_details, hash=False)


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
_CONTINUATIONS = ("(PCI ID:", "installed in this system", FALLEN)

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


def has_trigger(text: str) -> bool:
    nvrm, xid = _TRIGGER_TEXT
    return nvrm in text or xid in text


def _timestamp(prefix: str) -> str | None:
    printed = printed_stamp(prefix)
    if printed is not None:
        return printed
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
    if FALLEN in text and (m := _GPU_NAMED.match(text, start)) is not None:
        return fallen_event(canonical_bus_id(m["bus"]), line, text, _timestamp(text[:start]), [text])
    return None


def fallen_event(bus: str | None, line: int, text: str, ts: str | None, parts: list[str]) -> KernelEvent:
    """The Xid 79 that the Xid-less fallen-off-the-bus message stands for; `parts` are its lines."""
    bodies = [p[p.find("NVRM:") + 5 :].strip() for p in parts]
    return KernelEvent(
        kind=EventKind.XID,
        code=79,
        pci_bus_id=bus,
        line=line,
        text=text,
        timestamp=ts,
        # Tells consumers this 79 was inferred from the message, not printed as an Xid by the driver.
        details=MappingProxyType({"synthesized": SYNTHESIZED, "message": " ".join(bodies)}),
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


def driver_tag(text: str) -> int:
    """Where the driver's own message starts in `text`: its `NVRM:` or `nvidia-nvswitchN:` tag (`SXid` where the
    switch driver's name is not in front of it); -1 when neither driver speaks."""
    nvrm, sxid = text.find("NVRM:"), text.find("SXid")
    if sxid != -1 and (nvrm == -1 or sxid < nvrm):
        device = _NVSWITCH.search(text, max(0, sxid - 24), sxid)
        return device.start() if device is not None else sxid
    return nvrm


def parse_event(text: str, line: int) -> KernelEvent | None:
    """The event `text` (one line, a trigger in it) holds by itself, or None."""
    start = text.find("NVRM:")
    if start != -1 and (event := _parse_nvrm(text, start, line)) is not None:
        return event
    start = text.find("SXid")
    return _parse_sxid(text, start, line) if start != -1 else None


@dataclass(slots=True)
class FallenMessage:
    """The head of a multi-line fallen-off-the-bus message, and the lines read after it so far."""

    line: int
    bus: str | None
    timestamp: str | None
    parts: list[str]

    def event(self) -> KernelEvent:
        return fallen_event(self.bus, self.line, " ".join(self.parts), self.timestamp, self.parts)


def fallen_head(text: str, line: int) -> FallenMessage | None:
    """The message if `text` is the first line of the three-line one: "The NVIDIA GPU <bus> (PCI ID: …"."""
    start = text.find("NVRM:")
    head = _GPU_NAMED.match(text, start) if start != -1 else None
    if head is None or head["head"] != "The NVIDIA GPU":
        return None
    return FallenMessage(line, canonical_bus_id(head["bus"]), _timestamp(text[:start]), [text])


def continuation(text: str) -> str | None:
    """The body of a later line of the three-line message (after `NVRM:`); None for any other line."""
    start = text.find("NVRM:")
    if start == -1:
        return None
    body = text[start + 5 :].lstrip()
    return body if body.startswith(_CONTINUATIONS) else None
