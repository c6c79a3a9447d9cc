"""parse_line for tests: the event one kernel-log line holds by itself, as the parser's first step sees it."""

from __future__ import annotations

from gpu_triage.diagnosis.xid.kernel_log import MAX_LINE_CHARS, KernelEvent, has_trigger, parse_event


def parse_line(text: str, line: int = 1) -> KernelEvent | None:
    """The event on one line, or None. Stateless: the lines of the three-line fallen-off message give
    nothing on their own here (KernelLogParser puts them together)."""
    text = text.rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS or "\x00" in text or not has_trigger(text):
        return None
    return parse_event(text, line)
