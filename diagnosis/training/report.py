"""The report of one `diagnose` call, and the findings only the whole job shows.

Some findings come from no single line but from what the ranks say together: different NCCL
versions across hosts (a library mismatch), different collectives at the same SeqNum (a collective
mismatch, ranked ahead of the timeouts it causes), and the straggler a collective timeout waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.diagnosis.core.findings import Evidence, Finding, rank_ranges
from gpu_triage.diagnosis.training.findings.collapse import Seen, Spec, Tally, Where, build
from gpu_triage.diagnosis.training.findings.collectives import (
    MAX_NAMED,
    Mismatch,
    ProgressTracker,
    Straggler,
    WorkTracker,
)
from gpu_triage.diagnosis.training.findings.root_cause import Ranked
from gpu_triage.diagnosis.training.place.identity import IdentityBook
from gpu_triage.diagnosis.training.rules.model import COLLECTIVE_MISMATCH, COLLECTIVE_TIMEOUT, NCCL_LIB_MISMATCH

MAX_MISMATCHES = 8  # collective mismatches reported; one usually explains the rest


@dataclass
class Report:
    """The result of one `diagnose` call; `to_json` is what POST /api/v1/diagnose and `diagnose --json` print."""

    events: list[dict[str, Any]]
    findings: list[Finding]
    sources: list[str | None] = field(default_factory=list)
    lines_read: int = 0
    lines_skipped: int = 0  # candidate lines that could not be read (over-long, binary)
    events_dropped: int = 0
    engine: str = "python"  # the block scan used: "hyperscan" or "python"
    performance: list[Finding] = field(default_factory=list)  # what slowed the job, beside what ended it
    hang: dict[str, Any] | None = None  # Flight Recorder and RAS inputs: the per-rank table (hang/report.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "root_cause": self.findings[0].id if self.findings else None,
            "events": [dict(e) for e in self.events],
            "findings": [f.to_json() for f in self.findings],
            "performance": [f.to_json() for f in self.performance],
            "summary": {
                "sources": len(self.sources),
                "lines_read": self.lines_read,
                "lines_skipped": self.lines_skipped,
                "events_dropped": self.events_dropped,
            },
            **({"hang": self.hang} if self.hang is not None else {}),
        }


class Reporter:
    """The findings of the whole job, given what the reading learnt."""

    def __init__(
        self,
        specs: dict[str, Spec],
        identity: IdentityBook,
        progress: ProgressTracker,
        works: WorkTracker,
        versions: dict[str, Seen],
        label: Callable[[int], str | None],
    ) -> None:
        self.specs = specs
        self.identity = identity
        self.progress = progress
        self.works = works
        self.versions = versions
        self.label = label

    def synthesized(self) -> list[Ranked]:
        out = [self._mismatch(m) for m in self.works.mismatches()[:MAX_MISMATCHES]]
        version = self._version_mismatch()
        return [*out, version] if version is not None else out

    def _version_mismatch(self) -> Ranked | None:
        if len(self.versions) < 2:
            return None
        ordered = sorted(self.versions.items(), key=lambda kv: tuple(int(p) for p in kv[0].split(".")))
        first, last = ordered[0][1], ordered[-1][1]
        part = Tally(self.specs[NCCL_LIB_MISMATCH], first, last, len(ordered))
        part.details["versions"] = ", ".join(v for v, _ in ordered)
        return build((NCCL_LIB_MISMATCH, None, None, None, None), part, self.label, "versions")

    def _mismatch(self, m: Mismatch) -> Ranked:
        """Ranks stuck at the same SeqNum in different collectives: the odd ones out are the place."""
        by_shape: dict[str, list[int]] = {}
        for w in m.works:
            name = w.op if w.numel is None else f"{w.op}({w.numel})"
            by_shape.setdefault(name, []).append(w.rank)
        odd = m.odd[0]
        seen = Seen(odd.source, odd.line, odd.text, odd.stamp)
        common = next(w for w in m.works if w not in m.odd)
        tally = Tally(self.specs[COLLECTIVE_MISMATCH], seen, seen, len(m.works))
        tally.others.append(Seen(common.source, common.line, common.text, common.stamp, -1))
        tally.details.update(
            seq=m.seq,
            pg=m.pg,
            collectives="; ".join(f"{name} on ranks {rank_ranges(ranks)}" for name, ranks in by_shape.items())[:200],
        )
        rank = odd.rank if len(m.odd) == 1 else None
        where: Where = (
            COLLECTIVE_MISMATCH,
            self.identity.host_of(rank) if rank is not None else None,
            rank,
            None,
            self.identity.gpu_of(rank) if rank is not None else None,
        )
        return build(where, tally, self.label, f"seq{m.seq}")

    def straggler(self, findings: list[Finding]) -> list[Finding]:
        """Name the rank the timeouts waited for, and put its finding first among them."""
        timeouts = [i for i, f in enumerate(findings) if f.class_id == COLLECTIVE_TIMEOUT]
        found = self.progress.straggler() if timeouts else None
        outliers = self.progress.outliers() if timeouts else []
        for i in timeouts:
            if found is not None:
                findings[i].details["straggler_rank"] = found.rank
            if findings[i].members and outliers:
                findings[i].details["outliers"] = rank_ranges(outliers[:MAX_NAMED])
        if found is None:
            return findings
        own = next((i for i in timeouts if findings[i].rank == found.rank), None)
        group = next((i for i in timeouts if found.rank in findings[i].ranks), None)
        if own is None and group is not None:
            self._mark(findings[group], found)
            return findings
        straggler = self._straggler_finding(found) if own is None else findings.pop(own)
        self._mark(straggler, found)
        findings.insert(timeouts[0], straggler)
        return findings

    def _mark(self, finding: Finding, found: Straggler) -> None:
        """Name the straggler in the title with its proof, the SeqNums, and lead the evidence with its line."""
        p = found.progress
        finding.title += f" (straggler: rank {found.rank}, {found.lag()})"
        proof = Evidence(p.line, p.text, self.label(p.source))
        rest = [e for e in finding.evidence if (e.source, e.line) != (proof.source, proof.line)]
        finding.evidence[:] = [proof, *rest]
        host, gpu = self.identity.host_of(found.rank), self.identity.gpu_of(found.rank)
        where = f"rank {found.rank}" + (f" on {host}" if host else "") + (f" (GPU {gpu})" if gpu else "")
        finding.details.update(
            straggler_rank=found.rank,
            last_completed=found.progress.completed,
            last_enqueued=found.progress.enqueued,
            others_last_completed=found.others_completed,
            others_last_enqueued=found.others_enqueued,
            reporting_ranks=found.reporting_ranks,
            pg=found.pg,
            straggler_where=where,
            straggler_lag=found.meaning(),
        )
        if host:
            finding.details["straggler_host"] = host

    def _straggler_finding(self, found: Straggler) -> Finding:
        p = found.progress
        seen = Seen(p.source, p.line, p.text, p.stamp)
        part = Tally(self.specs[COLLECTIVE_TIMEOUT], seen, seen)
        rank = found.rank
        where: Where = (COLLECTIVE_TIMEOUT, self.identity.host_of(rank), rank, None, self.identity.gpu_of(rank))
        return build(where, part, self.label).finding
