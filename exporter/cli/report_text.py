"""The readable form of a diagnosis report: root cause first, where, what to do, the evidence.

One screen whatever the job's size: findings many ranks share come folded (diagnosis/training/findings/fold.py), the
root cause gets its steps and evidence, every other finding three lines at most, and past
`MAX_SHOWN` findings the rest is counted, not printed (`--json` has everything). Colour only when
writing to a terminal (and NO_COLOR is unset): a pipe or a file gets plain text.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import Any

from gpu_triage.diagnosis.core.actions import Action

_COLOURS = {"critical": "\033[1;31m", "unknown": "\033[1;35m", "warning": "\033[33m", "info": "\033[2m"}
_BOLD, _RESET = "\033[1m", "\033[0m"
MAX_SHOWN = 12  # findings printed; the rest are counted
_EVIDENCE_CHARS = 160
# What a log line may carry that a terminal would act on instead of printing: C0 controls but tab (BEL,
# backspace, ESC starting a CSI or an OSC such as a hyperlink), DEL, C1 controls (U+009B is a CSI on its
# own), and the bidirectional overrides that reorder what is shown. Evidence is the log's text, and the
# on-call engineer must read what it says, not what it makes the terminal draw.
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` with every character a terminal would act on written out as an escape (`\\x1b`)."""
    return _CONTROLS.sub(_escape, str(text))


def _where(finding: dict[str, Any]) -> str:
    parts = []
    if finding.get("host"):
        parts.append(f"host {finding['host']}")
    if finding.get("rank") is not None:
        local = finding.get("local_rank")
        parts.append(f"rank {finding['rank']}" + (f" (local {local})" if local is not None else ""))
    elif finding.get("local_rank") is not None:
        parts.append(f"local rank {finding['local_rank']}")
    if finding.get("gpu"):
        parts.append(f"GPU {finding['gpu']}")
    if finding.get("details", {}).get("switch"):
        parts.append(f"NVSwitch {finding['details']['switch']}")
    if not parts and finding.get("ranks"):
        parts.append(f"{len(finding['ranks'])} ranks")
    where = safe(", ".join(parts)) or "(not named in the logs)"
    return where + (" (inferred)" if finding.get("place_inferred") and parts else "")


def _evidence(e: dict[str, Any]) -> str:
    where = f"{safe(e['file'])}:{e['line']}" if e.get("file") else f"line {e['line']}"
    text = e["text"].strip()
    return f"{where}  {safe(text[:_EVIDENCE_CHARS])}{'…' if len(text) > _EVIDENCE_CHARS else ''}"


def _hang_note(hang: dict[str, Any]) -> str:
    """What the Flight Recorder and RAS inputs were: how many dumps, which ranks left none."""
    missing = [row["rank"] for row in hang.get("ranks", []) if row.get("dump") is None]
    note = f"{hang['dumps']} Flight Recorder dumps of {hang.get('world_size') or '?'} ranks read"
    if missing:
        note += f" (no dump from rank {', '.join(map(str, missing[:16]))}{' …' if len(missing) > 16 else ''})"
    if hang.get("ras"):
        note += f", {len(hang['ras'])} NCCL RAS reports"
    if hang.get("skipped"):
        note += f", {len(hang['skipped'])} inputs skipped (see stderr or --json)"
    return note


def _performance(slow: list[dict[str, Any]], paint: Callable[[str, str], str]) -> list[str]:
    """What slowed the job, apart from what ended it."""
    lines = [paint("Performance (slows a job, does not end one):", _BOLD)] if slow else []
    for f in slow[:MAX_SHOWN]:
        severity = paint(f"[{f['severity']}]", _COLOURS.get(f["severity"], ""))
        lines.append(f"  - {safe(f['title'])}  {severity}")
        lines.append(f"    {f['class']}; where: {_where(f)}; runbook: /runbooks/{f['playbook']}")
        if f["evidence"]:
            lines.append(f"    {paint(_evidence(f['evidence'][0]), _COLOURS['info'])}")
    return lines


def render(report: dict[str, Any], colour: bool = False) -> str:
    """`report` is `Report.to_json()`: the same data the --json output and the API give."""

    def paint(text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if colour else text

    findings = report["findings"]
    summary = report.get("summary", {})
    lines: list[str] = []
    if not findings:
        lines.append("No problem found.")
    elif all(f["action"] == Action.IGNORE for f in findings):
        # Listed for the record, but nothing to do: not a root cause.
        events = sum(f.get("count", 1) for f in findings)
        lines.append(f"No problem found ({events} ignorable event{'s' if events != 1 else ''}).")
        for f in findings[:MAX_SHOWN]:
            lines.append(paint(f"    ignored: {safe(f['title'])}; {f['class']}; where: {_where(f)}", _COLOURS["info"]))
        if len(findings) > MAX_SHOWN:
            lines.append(f"    … and {len(findings) - MAX_SHOWN} more (gpu-triage diagnose --json lists them all)")
        findings = []  # nothing below is a problem
    for i, f in enumerate(findings[:MAX_SHOWN]):
        head = "Root cause:" if i == 0 else f"{i + 1}."
        severity = paint(f"[{f['severity']}]", _COLOURS.get(f["severity"], ""))
        count = f"  (x{f['count']})" if f.get("count", 1) > 1 else ""
        lines.append(f"{paint(head, _BOLD)} {safe(f['title'])}  {severity}{count}")
        caused = f["details"].get("likely_caused_by")
        symptom_of = f"; likely a symptom of {safe(caused)}" if caused else ""
        lines.append(f"    {f['class']}; where: {_where(f)}{symptom_of}")
        if i == 0:
            if f["details"].get("note"):
                lines.append(f"    why: {safe(f['details']['note'])}")
            lines.append(f"    do now: {paint(f['action'], _BOLD)}")
            for n, step in enumerate(f.get("steps", []), 1):
                lines.extend(textwrap.wrap(step, 96, initial_indent=f"      {n}. ", subsequent_indent="         "))
            for e in f["evidence"][:4]:
                lines.append(f"    {paint(_evidence(e), _COLOURS['info'])}")
            lines.append(f"    runbook: /runbooks/{f['playbook']}")
            lines.append("")
        else:
            if f["evidence"]:
                lines.append(f"    {paint(_evidence(f['evidence'][0]), _COLOURS['info'])}")
            if f["severity"] in ("critical", "unknown") and not caused:
                lines.append(f"    do now: {paint(f['action'], _BOLD)}; runbook: /runbooks/{f['playbook']}")
    if len(findings) > MAX_SHOWN:
        lines.append(f"… and {len(findings) - MAX_SHOWN} more findings (gpu-triage diagnose --json lists them all)")
    lines += _performance(report.get("performance", []), paint)
    if report.get("hang"):
        lines.append(paint(safe(_hang_note(report["hang"])), _COLOURS["info"]))
    read = summary.get("lines_read")
    if read is not None:
        note = f"{read} lines read, {len(report['events'])} kernel events"
        if summary.get("lines_skipped"):
            note += f", {summary['lines_skipped']} unreadable lines skipped"
        lines.append(paint(note, _COLOURS["info"]))
    return "\n".join(lines).rstrip("\n") + "\n"
