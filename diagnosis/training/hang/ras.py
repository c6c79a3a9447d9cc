"""NCCL RAS in the hang report: what it adds to a culprit the dumps named (its node, its line), and the
ranks it alone names (missing, dead, behind in operation count), as findings of their own.

RAS numbers a communicator's ranks its own way; only a communicator the size of the job's world has the
job's global ranks, so only those are matched with the dumps' ranks.
"""

from __future__ import annotations

from typing import Any

from gpu_triage.diagnosis.core.findings import Evidence, Finding
from gpu_triage.diagnosis.training.hang.nccl_ras import RasRank, RasReport
from gpu_triage.diagnosis.training.hang.specs import load_hang_specs
from gpu_triage.diagnosis.training.place.identity import IdentityBook

__all__ = ["ras_findings", "ras_json", "with_ras"]


def with_ras(f: Finding, reports: list[RasReport], world: int) -> Finding:
    """What RAS says of a culprit the dumps named: where it ran (RAS knows the node), and its line."""
    for report in reports:
        for r in report.ranks:
            size = report.comm_sizes.get(r.comm)
            if size is not None and size != world:
                continue  # RAS numbers a sub-communicator's ranks its own way
            if r.rank is not None and r.rank == f.rank and r.why in ("missing", "dead", "behind"):
                f.host = f.host or r.host
                f.details["ras"] = r.why
                f.evidence.append(Evidence(r.line or 1, r.text, report.source))
                return f
    return f


def ras_findings(reports: list[RasReport], identity: IdentityBook, named: set[int]) -> list[Finding]:
    """RAS's missing, dead and behind ranks that no dump already named."""
    spec_missing, spec_behind = load_hang_specs()["rank_missing"], load_hang_specs()["collective_never_joined"]
    by_kind: dict[tuple[str, str], list[RasRank]] = {}
    for report in reports:
        for r in report.ranks:
            if r.why in ("missing", "dead", "behind") and r.rank is not None and r.rank not in named:
                by_kind.setdefault((r.why if r.why != "dead" else "missing", r.comm), []).append(r)
    out = []
    for (why, comm), found in list(by_kind.items())[:8]:
        spec = spec_missing if why == "missing" else spec_behind
        ranks = sorted({r.rank for r in found if r.rank is not None})
        ahead = max((rep.ahead.get(comm, 0) for rep in reports), default=0)
        seq = min((r.count or 0) for r in found) + 1 if why == "behind" else ahead
        fields = {
            "ranks": ",".join(map(str, ranks)),
            "op": "a collective",
            "group": f"NCCL communicator {comm}",
            "seq": seq,
        }
        first = found[0]
        details: dict[str, Any] = {"source": "nccl_ras", "process_group": comm, "seq": seq, "ranks": ranks}
        if first.gpu is not None:
            details["cuda_dev"] = first.gpu
        title = spec.title.format(**fields, waiting="?", mismatch="op")
        if why == "behind":
            title += " (one RAS query: query again to tell a hang from a rank catching up)"
        out.append(
            Finding(
                id=f"{spec.class_id}:ras{comm.split()[0]}/seq{seq}",
                class_id=spec.class_id,
                severity=spec.severity,
                action=spec.action,
                title=title,
                playbook=spec.playbook,
                rank=ranks[0],
                host=first.host or identity.host_of(ranks[0]),
                gpu=identity.gpu_of(ranks[0]),
                evidence=[
                    Evidence(r.line or 1, r.text, next((x.source for x in reports if r in x.ranks), None))
                    for r in found[:4]
                ],
                steps=[s.format(**fields, waiting="?", mismatch="op") for s in spec.steps],
                details=details,
                ranks=ranks,
            )
        )
    return out


def ras_json(report: RasReport) -> dict[str, Any]:
    return {
        "source": report.source,
        "format": report.form,
        "ranks": [_rank_json(x) for x in report.ranks[:256]],
        "dead_processes": [_rank_json(x) for x in report.dead[:256]],
    }


def _rank_json(r: RasRank) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "communicator": r.comm,
        "host": r.host,
        "pid": r.pid,
        "gpu": r.gpu,
        "why": r.why,
        "count": r.count,
    }
