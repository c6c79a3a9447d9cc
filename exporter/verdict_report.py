"""The verdict as people and tools read it: the /api/v1/diagnosis body, and the one-line summary that
STATUS=, the landing page and `gpu-triage check` show."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpu_triage.diagnosis.actions import Action
from gpu_triage.diagnosis.findings import Finding, Workload, urgency
from gpu_triage.diagnosis.health import GpuVerdict, NodeVerdict, verdict_json
from gpu_triage.exporter.polling.snapshot import Snapshot


def diagnosis_json(
    snapshot: Snapshot,
    node: NodeVerdict,
    boot_id: str,
    now: float,
    workloads: Mapping[str, tuple[Workload, ...]] | None = None,
) -> dict[str, Any]:
    """/api/v1/diagnosis. `workloads` (by GPU uuid): who uses each GPU now; each finding carries who did
    when it opened."""
    by_bus: dict[str, GpuVerdict] = {v.gpu: v for v in node.gpus}
    using = workloads or {}
    gpus = []
    for state in snapshot.gpus:
        g = state.identity
        verdict = by_bus.pop(g.pci_bus_id, None)
        gpus.append(
            {
                "gpu": g.index,
                "uuid": g.uuid,
                "status": state.status,
                **(verdict_json(verdict) if verdict else {}),
                "workloads": [w.to_json() for w in using.get(g.uuid, ())],
            }
        )
    for missing in by_bus.values():  # known only from the kernel log
        gpus.append({"gpu": None, "uuid": None, "status": "missing", **verdict_json(missing), "workloads": []})
    findings = [f.to_json() for f in sorted(all_findings(node), key=urgency)]
    for finding in [*findings, *(f for g in gpus for f in g.get("findings", []))]:
        finding.setdefault("workloads", [])
        details = finding["details"]
        for key in _TIMES:
            if isinstance(details.get(key), int | float):
                details[f"{key}_iso"] = iso_time(details[key])
    return {
        "node": {"health": node.health.value, "action": node.action.value, "summary": summary(snapshot, node)},
        "gpus": gpus,
        "findings": findings,
        "boot_id": boot_id,
        "generated_at": now,
        "generated_at_iso": iso_time(now),
    }


_TIMES = ("first_seen", "last_seen", "since")  # unix seconds in a finding's details


def iso_time(seconds: float) -> str:
    """Unix seconds as ISO 8601 in UTC, to the second: what a person reads next to the number."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def summary(snapshot: Snapshot, node: NodeVerdict) -> str:
    """One line for STATUS=, the landing page and `gpu-triage check`."""
    up = sum(g.up for g in snapshot.gpus)
    line = f"{len(snapshot.gpus)} GPUs, {up} up; node {node.health.value}"
    if node.action is not Action.IGNORE:
        worst = next((v for v in node.gpus if v.action is node.action), None)
        where = ""
        if worst is not None:
            index = next((g.identity.index for g in snapshot.gpus if g.identity.pci_bus_id == worst.gpu), None)
            where = f" on GPU {index}" if index is not None else f" on {worst.gpu}"
        line += f": {node.action.value}{where}"
    return line


def all_findings(node: NodeVerdict) -> list[Finding]:
    return [f for g in node.gpus for f in g.findings] + list(node.findings)
