"""Kernel-log parsing, a line at a time with the state that messages spanning lines need; `scan` for big inputs.

The formats are in diagnosis/xid/kernel_log.py, who wrote a line in diagnosis/xid/kernel_origin.py: a line that
another program wrote is never an event. The daemon's parser is strict (the driver's tag must start the
message, after nothing but a log writer's prefixes); `diagnose`'s is not (a pasted line may carry any
launcher's or ticket's prefix) but still refuses a line whose priority or syslog tag names another writer.
A NUL byte splits a line: what a file holds after a power loss is NUL padding, then the next line.

What needs state is the fallen-off-the-bus fault: the driver
prints it as a three-line Xid-less message and, usually, an `Xid …: 79` line too, in either order; the
parser reports the fault once, keeping the Xid line (it names the process). Lines that cannot be parsed
are counted in `ScanStats`, never raised.

`scan` is the fast path for big inputs: it finds the lines holding a trigger literal with `line_scan` (the
scanner training-log diagnosis uses too) and never looks at other lines. Line numbers count from 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpu_triage.diagnosis.core.line_scan import LineScanner
from gpu_triage.diagnosis.xid.kernel_log import (
    FALLEN,
    MAX_LINE_CHARS,
    SYNTHESIZED,
    TRIGGERS,
    EventKind,
    FallenMessage,
    KernelEvent,
    continuation,
    driver_tag,
    fallen_event,
    fallen_head,
    has_trigger,
    parse_event,
)
from gpu_triage.diagnosis.xid.kernel_origin import Origin, origin

# A decoded line has at least a quarter as many characters as bytes, so longer ones can be dropped unread.
_MAX_LINE_BYTES = 4 * MAX_LINE_CHARS
# The three lines of the Xid-less fallen-off-the-bus message may be interleaved with other CPUs' output,
# and so may that message and the driver's own Xid 79 for the same fault: both are printed together.
_FALLEN_WINDOW = 10


@dataclass(slots=True)
class ScanStats:
    """What was read and what was skipped; the daemon exports these ("skipped and counted, never fatal")."""

    lines: int = 0  # lines read by `scan`
    candidates: int = 0  # lines holding a trigger literal: the only ones parsed
    events: int = 0  # events handed out (a held fallen-off event counts when it is released)
    overlong: int = 0  # candidate lines longer than MAX_LINE_CHARS, skipped
    binary: int = 0  # candidate lines holding NUL bytes: each piece between them parsed as a line
    invalid_utf8: int = 0  # candidate lines that were not UTF-8; bad bytes replaced, then parsed
    malformed: int = 0  # lines that name an Xid/SXid, or start the fallen-off message, but do not parse
    not_kernel: int = 0  # lines holding the driver's words that the kernel did not write, skipped

    @property
    def skipped(self) -> int:
        return self.overlong + self.malformed + self.not_kernel


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

    def __init__(self, stats: ScanStats | None = None, *, strict: bool = True) -> None:
        self.stats = stats if stats is not None else ScanStats()
        self._strict = strict
        self._pending: FallenMessage | None = None
        self._held: list[tuple[int, KernelEvent]] = []  # (line that completed it, event), in that order
        self._recent79: dict[str, int] = {}  # bus id → line of its latest real Xid 79, oldest first

    def feed(self, text: str, line: int, kernel: bool | None = None) -> list[KernelEvent]:
        """The events this line completes or releases: usually none or one; `line` numbers must increase.

        `kernel` is what the line's transport says of its writer (a /dev/kmsg record's facility, the
        journal's `_TRANSPORT`): False refuses the line, None leaves it to the line's own prefixes."""
        text = text.rstrip("\r\n")
        if not has_trigger(text):
            return []
        stats = self.stats
        stats.candidates += 1
        if len(text) > MAX_LINE_CHARS:
            stats.overlong += 1
            return []
        if "\x00" not in text:
            return self._feed_text(text, line, kernel)
        stats.binary += 1
        events = []
        for piece in text.split("\x00"):
            if has_trigger(piece):
                events += self._feed_text(piece, line, kernel)
        return events

    def _feed_text(self, text: str, line: int, kernel: bool | None) -> list[KernelEvent]:
        stats = self.stats
        if not self._from_kernel(text, kernel):
            stats.not_kernel += 1
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

    def _from_kernel(self, text: str, kernel: bool | None) -> bool:
        if kernel is False:
            return False
        start = driver_tag(text)
        if start == -1:
            return True  # an `Xid (` without the driver's tag: no event, whoever wrote it
        who = origin(text[:start])
        return who is Origin.KERNEL or (who is Origin.QUOTED and not self._strict)

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
        if event.details.get("synthesized") != SYNTHESIZED:
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
        body = continuation(text)
        if body is None:
            return None
        pending = self._pending
        if pending is None:
            # The head scrolled out of the ring buffer or the file began mid-message: the fault is real
            # even though the GPU is unknown.
            return [fallen_event(None, line, text, None, [text])] if FALLEN in body else []
        pending.parts.append(text)
        if FALLEN not in body:
            return []
        self._pending = None
        return [pending.event()]

    def _feed_line(self, text: str, line: int) -> list[KernelEvent]:
        event = parse_event(text, line)
        if event is not None:
            return [event]
        head = fallen_head(text, line)
        if head is not None:
            self._drop_pending()
            self._pending = head
        elif "Xid" in text and ("NVRM:" in text or "SXid" in text):
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


def scan(chunks: Iterable[bytes], stats: ScanStats | None = None, *, strict: bool = True) -> Iterator[KernelEvent]:
    """Events in a big input given as byte chunks split anywhere; `stats` (if given) is filled as it goes.

    Equivalent to feeding every line, decoded as UTF-8 with bad bytes replaced, to a `KernelLogParser`.
    """
    parser = KernelLogParser(stats, strict=strict)
    # Binary lines go to the parser, which counts them; over-long ones the scanner drops and counts.
    scanner = LineScanner(TRIGGERS, max_line=_MAX_LINE_BYTES, keep_binary=True)
    for chunk in chunks:
        for candidate in scanner.feed(chunk):
            yield from parser.feed(_decode(candidate.data, parser.stats), candidate.line)
    for candidate in scanner.finish():
        yield from parser.feed(_decode(candidate.data, parser.stats), candidate.line)
    parser.stats.lines = scanner.lines
    parser.stats.overlong += scanner.skipped
    parser.stats.candidates += scanner.skipped
    yield from parser.finish()
