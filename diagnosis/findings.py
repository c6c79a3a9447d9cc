"""Diagnosis result shapes shared by the XID and training-log classifiers.

`Finding.to_json` is the finding of GET /api/v1/diagnosis, POST /api/v1/diagnose and `gpu-triage diagnose
--json` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_triage.diagnosis.actions import Action, Severity


class Judged(Protocol):
    """Anything that carries a verdict: a finding, an XID decision."""

    @property
    def action(self) -> Action: ...

    @property
    def severity(self) -> Severity: ...


def urgency(judged: Judged) -> tuple[int, int]:
    """Sort key, most urgent first: the action's precedence, then the severity's."""
    return judged.action.rank, judged.severity.rank


@dataclass(frozen=True, slots=True)
class Evidence:
    """One input line that supports a finding. `line` counts from 1 within its input."""

    line: int
    text: str
    source: str | None = None  # the file it came from, when several were read

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"line": self.line, "text": self.text}
        if self.source is not None:
            out["file"] = self.source
        return out


@dataclass(slots=True)
class Finding:
    """A diagnosed problem: what it is, where, how bad, what to do, and the lines that show it.

    `class_id` is `xid_<code>` for XID findings, `sxid_<code>` for NVSwitch ones and a class id of the
    training-log rules otherwise. Repeated lines of the same problem collapse into one finding: `count`
    says how many, `evidence` keeps the first and the last (and the first of each other kind). `rank` is
    the global rank. A symptom shared by many ranks is one finding for them all: `ranks` lists them and
    `members` keeps each one's place, count and first line.
    """

    id: str
    class_id: str
    severity: Severity
    action: Action
    title: str
    playbook: str
    gpu: str | None = None  # canonical PCI bus id
    rank: int | None = None
    host: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    count: int = 1
    steps: list[str] = field(default_factory=list)  # the immediate next steps, in order
    details: dict[str, str | int] = field(default_factory=dict)  # fields extracted from the lines
    local_rank: int | None = None
    place_inferred: bool = False  # host, rank or GPU came from other lines than the finding's own
    ranks: list[int] = field(default_factory=list)  # the ranks a folded finding covers
    members: list[dict[str, Any]] = field(default_factory=list)  # per place of a folded finding

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "class": self.class_id,
            "severity": self.severity.value,
            "action": self.action.value,
            "title": self.title,
            "playbook": self.playbook,
            "gpu": self.gpu,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "place_inferred": self.place_inferred,
            "ranks": list(self.ranks),
            "count": self.count,
            "evidence": [e.to_json() for e in self.evidence],
            "steps": list(self.steps),
            "details": dict(self.details),
        }
        if self.members:
            out["members"] = [dict(m) for m in self.members]
        return out
