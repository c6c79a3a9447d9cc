"""The readable form of a diagnosis report: root cause first, where, what to do, the evidence.

Colour only when writing to a terminal (and NO_COLOR is unset): a pipe or a file gets plain text.
"""

from __future__ import annotations

import textwrap
from typing import Any

_COLOURS = {"critical": "\033[1;31m", "unknown": "\033[1;35m", "warning": "\033[33m", "info": "\033[2m"}
_BOLD, _RESET = "\033[1m", "\033[0m"


def _where(finding: dict[str, Any]) -> str:
    parts = []
    if finding.get("host"):
        parts.append(f"host {finding['host']}")
    if finding.get("rank") is not None:
        parts.append(f"rank {finding['rank']}")
    if finding.get("gpu"):
        parts.append(f"GPU {finding['gpu']}")
    return ", ".join(parts) or "(not named in the logs)"


def render(report: dict[str, Any], colour: bool = False) -> str:
    """`report` is `Report.to_json()`: the same data the --json output and the API give."""

    def paint(text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if colour else text

    findings = report["findings"]
    summary = report.get("summary", {})
    lines = []
    if not findings:
        lines.append("No problem found.")
    for i, f in enumerate(findings):
        head = "Root cause:" if i == 0 else f"{i + 1}."
        severity = paint(f"[{f['severity']}]", _COLOURS.get(f["severity"], ""))
        count = f"  (x{f['count']})" if f.get("count", 1) > 1 else ""
        lines.append(f"{paint(head, _BOLD)} {f['title']}  {severity}{count}")
        lines.append(f"    class {f['class']}; where: {_where(f)}")
        if f["details"].get("note"):
            lines.append(f"    why: {f['details']['note']}")
        if f["details"].get("likely_caused_by"):
            lines.append(f"    likely a symptom of: {f['details']['likely_caused_by']}")
        if i == 0 or f["severity"] in ("critical", "unknown"):
            lines.append(f"    do now: {paint(f['action'], _BOLD)}")
            for n, step in enumerate(f.get("steps", []), 1):
                lines.extend(textwrap.wrap(step, 96, initial_indent=f"      {n}. ", subsequent_indent="         "))
        for e in f["evidence"]:
            where = f"{e['source']}:{e['line']}" if e.get("source") else f"line {e['line']}"
            lines.append(f"    {paint(where, _COLOURS['info'])}  {e['text'][:300]}")
        lines.append(f"    runbook: /runbooks/{f['playbook']}")
        lines.append("")
    read = summary.get("lines_read")
    if read is not None:
        note = f"{read} lines read, {len(report['events'])} XID lines"
        if summary.get("lines_skipped"):
            note += f", {summary['lines_skipped']} unreadable lines skipped"
        lines.append(paint(note, _COLOURS["info"]))
    return "\n".join(lines).rstrip("\n") + "\n"
