"""Diagnosis result shapes shared by the XID and training-log classifiers.

`Finding.to_json` is the finding of GET /api/v1/diagnosis, POST /api/v1/diagnose and `gpu-triage diagnose
--json` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_triage.diagnosis.core.actions import Action, Severity


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
    """One input line that supports a finding. `line` counts from 1 within its input (the daemon: the kernel log's
    sequence number); None for what no line says, such as a reading of the telemetry."""

    line: int | None
    text: str
    source: str | None = None  # the file it came from, when several were read

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"line": self.line, "text": self.text}
        if self.source is not None:
            out["file"] = self.source
        return out


@dataclass(frozen=True, slots=True)
class Workload:
    """Who was using a GPU: a Kubernetes pod's container, or a Slurm job step. The daemon finds them (the
    kubelet's pod-resources API, the processes' cgroups); diagnosis/ only carries them on findings."""

    kind: str  # "pod" or "slurm_job"
    name: str  # the pod's name, or the job id (numeric, or Slurm's SLUID)
    namespace: str = ""  # pod
    container: str = ""  # pod
    step: str = ""  # Slurm: 0, 1, batch, extern, interactive...
    user: str = ""  # Slurm: the user name, or the uid where the name does not resolve
    mig_uuid: str = ""  # the MIG device it holds, when it holds one rather than the whole GPU
    gpu_instance: int | None = None  # that MIG device's GPU instance

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.kind == "pod":
            out = {"kind": self.kind, "namespace": self.namespace, "pod": self.name, "container": self.container}
        else:
            out = {"kind": self.kind, "job_id": self.name, "step": self.step, "user": self.user}
        if self.mig_uuid:
            out["mig_uuid"] = self.mig_uuid
        if self.gpu_instance is not None:
            out["gpu_instance"] = self.gpu_instance
        return out

    def short(self) -> str:
        """'pod ml/trainer-0' or 'job 1234': for one-line reasons."""
        return f"pod {self.namespace}/{self.name}" if self.kind == "pod" else f"job {self.name}"

    def describe(self) -> str:
        """'pod ml/trainer-0 (container main)' or 'Slurm job 1234 step 0 (alice)'."""
        if self.kind == "pod":
            return f"pod {self.namespace}/{self.name} (container {self.container})"
        step = f" step {self.step}" if self.step else ""
        return f"Slurm job {self.name}{step}" + (f" ({self.user})" if self.user else "")


@dataclass(slots=True)
class Finding:
    """A diagnosed problem: what it is, where, how bad, what to do, and the lines that show it.

    `class_id` is `xid_<code>` for XID findings, `sxid_<code>` for NVSwitch ones and a class id of the
    training-log rules otherwise; code decides on the typed `xid`, `sxid` and `aborted`, never on the class
    id's spelling or on `details`, which are only shown. Repeated lines of the same problem collapse into
    one finding: `count` says how many, `evidence` keeps the first and the last (and the first of each
    other kind). `rank` is the global rank. A symptom shared by many ranks is one finding for them all:
    `ranks` lists them and `members` keeps each one's place, count and first line.
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
    workloads: tuple[Workload, ...] = ()  # who was on the GPU when the daemon first saw the finding open
    # Not in to_json: what the code decides on.
    xid: int | None = None  # the XID code of a GPU the finding is
    sxid: int | None = None  # the SXid code of an NVSwitch the finding is
    aborted: bool = False  # a process ended on purpose by SIGABRT (its own error came first)

    @property
    def from_kernel(self) -> bool:
        """An XID or an SXid: what the driver said, not a training log's line."""
        return self.xid is not None or self.sxid is not None

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
            # Only the daemon knows who used a GPU: offline diagnoses keep the shape they always had.
            **({"workloads": [w.to_json() for w in self.workloads]} if self.workloads else {}),
        }
        if self.members:
            out["members"] = [dict(m) for m in self.members]
        return out


def rank_ranges(ranks: list[int]) -> str:
    """`[0, 1, 2, 3, 5, 7, 8]` -> `0-3, 5, 7-8` with en dashes (numerically, ranges of consecutive ranks)."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}\u2013{ordered[j]}")
        i = j + 1
    return ", ".join(parts)
