"""One GPU's XID decisions (diagnosis/xid/incidents.py) as findings: one per code, root causes first."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_triage.diagnosis.core.findings import Evidence, Finding, urgency
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID, XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.incidents import COMPUTE_INSTANCE, GPU_INSTANCE, Decision


def _scope(details: dict[str, str | int], group: Sequence[Decision]) -> None:
    """A finding is one MIG instance's when every occurrence of its code was in that instance; when they were in
    several, or some on the whole GPU, it is the whole GPU's, and the instances are listed."""
    scopes = {d.occurrence.details.get(GPU_INSTANCE) for d in group}
    if len(scopes) > 1:
        details.pop(GPU_INSTANCE, None)
        details.pop(COMPUTE_INSTANCE, None)
        details["gpu_instances"] = ", ".join(sorted((s for s in scopes if s is not None), key=int))


def findings(decisions: Sequence[Decision], gpu: str | None, catalog: XidCatalog | None = None) -> list[Finding]:
    """One finding per XID code, root causes first (most urgent, then earliest), then symptoms."""
    catalog = catalog or load_catalog()
    by_code: dict[int, list[Decision]] = {}
    for d in decisions:
        by_code.setdefault(d.occurrence.code, []).append(d)
    out = []
    for code, group in by_code.items():
        roots = [d for d in group if d.root]
        lead = min(roots, key=urgency) if roots else group[0]
        entry = catalog.get(code)
        first, last = group[0].occurrence, group[-1].occurrence
        evidence = [Evidence(first.ref, first.text)]
        if len(group) > 1:
            evidence.append(Evidence(last.ref, last.text))
        details: dict[str, str | int] = dict(lead.occurrence.details.items())
        _scope(details, group)
        if lead.note:
            details["note"] = lead.note
        if entry is not None:
            details["mnemonic"] = entry.mnemonic
        for key, when in (("first_seen", first.ts), ("last_seen", last.ts)):
            if when is not None:
                details[key] = int(when)
        out.append(
            Finding(
                id=f"xid_{code}:{gpu or 'unknown'}",
                class_id=f"xid_{code}",
                severity=lead.severity,
                action=lead.action,
                title=entry.title
                if entry
                else f"Xid {code}: not in NVIDIA's catalog; the raw line says what the driver saw",
                playbook=entry.playbook if entry else UNKNOWN_XID.playbook,
                gpu=gpu,
                evidence=evidence,
                count=len(group),
                details=details,
                xid=code,
            )
        )
    root_codes = {d.occurrence.code for d in decisions if d.root}
    out.sort(
        key=lambda f: (
            f.xid not in root_codes,
            *urgency(f),
            f.details.get("first_seen", 0),
        )
    )
    return out
