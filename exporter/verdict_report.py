"""The verdict as people and tools read it: the /api/v1/diagnosis body, and the one-line summary that
STATUS=, the landing page and `gpu-triage check` show."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_triage.diagnosis.core.actions import Action, GpuStatus
from gpu_triage.diagnosis.core.findings import Finding, Workload, rank_ranges, urgency
from gpu_triage.diagnosis.training.findings.fold import fold_gpus
from gpu_triage.diagnosis.xid.health import GpuVerdict, drives
from gpu_triage.diagnosis.xid.incidents import GPU_INSTANCE
from gpu_triage.diagnosis.xid.node_verdict import BLIND_CLASSES, Blind, NodeVerdict
from gpu_triage.exporter.http.api_models import (
    BlindOut,
    Diagnosis,
    FindingOut,
    GpuVerdictOut,
    NodeOut,
    Place,
    WorkloadOut,
)
from gpu_triage.exporter.polling.snapshot import Snapshot


def diagnosis_json(
    snapshot: Snapshot,
    node: NodeVerdict,
    boot_id: str,
    now: float,
    workloads: Mapping[str, tuple[Workload, ...]] | None = None,
) -> Diagnosis:
    """/api/v1/diagnosis. `workloads` (by GPU uuid): who uses each GPU now; each finding carries who did
    when it opened."""
    by_bus: dict[str, GpuVerdict] = {v.gpu: v for v in node.gpus}
    using = workloads or {}
    gpus = []
    for state in snapshot.gpus:
        g = state.identity
        verdict = by_bus.get(g.pci_bus_id)
        on_it = [workload_out(w) for w in using.get(g.uuid, ())]
        if verdict is None:  # no verdict covers the GPU yet: its verdict's keys are absent
            gpus.append(GpuVerdictOut(gpu=g.index, uuid=g.uuid, status=GpuStatus(state.status), workloads=on_it))
            continue
        gpus.append(
            GpuVerdictOut(
                gpu=g.index,
                uuid=g.uuid,
                status=GpuStatus(state.status),
                pci_bus_id=verdict.gpu,
                health=verdict.health,
                action=verdict.action,
                findings=[finding_out(f) for f in verdict.findings],
                workloads=on_it,
            )
        )
    # One crash, one finding: an application's Xid on many GPUs is one entry here (each GPU keeps its own above).
    findings = [finding_out(f) for f in fold_gpus(sorted(all_findings(node), key=urgency))]
    needs = affected(snapshot, node)
    return Diagnosis(
        node=NodeOut(
            health=node.health,
            action=node.action,
            summary=summary(snapshot, node, needs),
            affected=needs,
            incomplete=[blind_json(b) for b in node.incomplete],
        ),
        gpus=gpus,
        findings=findings,
        boot_id=boot_id,
        generated_at=now,
        generated_at_iso=iso_time(now),
    )


def finding_out(f: Finding) -> FindingOut:
    """A finding as the daemon answers it: who used its GPU (none: an empty list), and each time in its details
    also as ISO 8601."""
    out = f.to_json()
    out.setdefault("workloads", [])
    details = out["details"]
    for key in _TIMES:
        if isinstance(details.get(key), int | float):
            details[f"{key}_iso"] = iso_time(details[key])
    return FindingOut.model_validate(out)


def workload_out(w: Workload) -> WorkloadOut:
    return WorkloadOut.model_validate(w.to_json())


_TIMES = ("first_seen", "last_seen", "since")  # unix seconds in a finding's details
_SHOWN = 6  # places named in a summary line; the rest are counted
_PROBLEM_CHARS = 160
# What a source that cannot be read is called in one line, and what to do about it.
_BLIND_TEXT = {
    "kmsg": ("kernel log unreadable", "give the daemon CAP_SYSLOG (kernel.dmesg_restrict=1) or fix --kmsg.path"),
    "journal": ("event journal unwritable", "free space under --state.dir"),
    "xid": ("no XID source", "turn --source.kmsg or --source.events on"),
    "backend": ("GPU readings failing", "check that nvidia-smi (or nv-hostengine) answers"),
}


def blind_json(b: Blind) -> BlindOut:
    what, fix = _BLIND_TEXT.get(b.source, (f"{b.source} XID events down", "see the daemon's log"))
    return BlindOut(source=b.source, what=what, problem=b.problem[:_PROBLEM_CHARS], fix=fix)


def iso_time(seconds: float) -> str:
    """Unix seconds as ISO 8601 in UTC, to the second: what a person reads next to the number."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def cause(f: Finding) -> str:
    """What a finding is, in a word or two of a summary line: 'Xid 79', 'lost', 'row_remap_failure'."""
    if f.class_id == "unknown_device":
        return f"Xid {f.details.get('xid')}"
    if f.xid is not None:
        return f"Xid {f.xid}"
    return _CAUSES.get(f.class_id, f.class_id)


_CAUSES = {"gpu_lost": "lost", "gpu_unresponsive": "hung", "sxid_fatal": "fatal SXid", "sxid_nonfatal": "SXid"}


def affected(snapshot: Snapshot, node: NodeVerdict) -> list[Place]:
    """Every place that needs an action, most urgent first: each GPU with its action and the finding behind it,
    then what no GPU holds (NVSwitches, unknown devices). A source that cannot be read is not a place: it is in
    `incomplete`."""
    index = {g.identity.pci_bus_id: g.identity.index for g in snapshot.gpus}
    out: list[Place] = []
    for v in node.gpus:
        f = next((f for f in v.findings if f.action is v.action), None)
        if v.action is Action.IGNORE or f is None:
            continue
        gpu = index.get(v.gpu)
        where = f"GPU {gpu}" if gpu is not None else v.gpu
        if (instance := f.details.get(GPU_INSTANCE)) is not None:
            where += f" instance {instance}"  # the MIG instance the driver put the XID in
        out.append(_place(v.action, where, gpu, v.gpu, f))
    for f in node.findings:
        if drives(f) and f.class_id not in BLIND_CLASSES:
            bus = f.details.get("pci_bus_id")
            where = "NVSwitch" if f.class_id.startswith("sxid") else str(bus)
            out.append(_place(f.action, where, None, str(bus) if bus else None, f))
    return sorted(out, key=lambda a: a.action.rank)  # stable: GPU order within one action


def _place(action: Action, where: str, gpu: int | None, bus: str | None, f: Finding) -> Place:
    workloads = [workload_out(w) for w in f.workloads]
    return Place(action=action, where=where, gpu=gpu, pci_bus_id=bus, cause=cause(f), finding=f.id, workloads=workloads)


def name_places(places: Sequence[Place], who: bool = False) -> str:
    """'REBOOT_NODE: GPU 1 Xid 79, GPU 5 lost; RESET_GPU: GPU 3 Xid 48': each action with the places that need
    it, most urgent first, at most _SHOWN places (then '+N more'). GPUs that need the same action for the same
    cause are named together ('CHECK_APP: GPUs 0-7 Xid 13': one application's crash). `who` adds the pod or
    job that was there."""
    merged: list[_Named] = []
    together: dict[tuple[Action, str], _Named] = {}
    for p in places:
        key = (p.action, p.cause)
        if p.gpu is None or p.where != f"GPU {p.gpu}":  # a bus id, a MIG instance, a switch
            merged.append(_Named(p, [], list(p.workloads)))
        elif key in together:
            together[key].gpus.append(p.gpu)
            together[key].workloads.extend(p.workloads)
        else:
            together[key] = _Named(p, [p.gpu], list(p.workloads))
            merged.append(together[key])
    groups: dict[str, list[str]] = {}
    for named in merged[:_SHOWN]:
        p, gpus = named.place, named.gpus
        # ASCII, for the drain reason of a scheduler that keeps only that.
        where = f"GPUs {rank_ranges(gpus).replace(chr(0x2013), '-')}" if len(gpus) > 1 else p.where
        text = f"{where} {p.cause}"
        if who and (workload := _short_workload(named.workloads)):
            text += f" {workload}"
        groups.setdefault(p.action.value, []).append(text)
    line = "; ".join(f"{action}: {', '.join(names)}" for action, names in groups.items())
    more = len(merged) - _SHOWN
    return line + (f" +{more} more" if more > 0 else "")


@dataclass
class _Named:
    """A place as a summary line names it: GPUs with the same action and cause together."""

    place: Place
    gpus: list[int]
    workloads: list[WorkloadOut]


def _short_workload(workloads: list[WorkloadOut]) -> str:
    """'pod ml/trainer-0', 'job 4242', '+2' more: who was on the GPU, short."""
    if not workloads:
        return ""
    w = workloads[0]
    first = f"pod {w.namespace}/{w.pod}" if w.kind == "pod" else f"job {w.job_id}"
    return first + (f" +{len(workloads) - 1}" if len(workloads) > 1 else "")


def name_blind(incomplete: Sequence[BlindOut]) -> str:
    """'incomplete: kernel log unreadable (Permission denied (/dev/kmsg)): give the daemon CAP_SYSLOG ...'."""
    parts = [f"{b.what} ({b.problem}): {b.fix}" for b in incomplete]
    return "incomplete: " + "; ".join(parts) if parts else ""


def summary(snapshot: Snapshot, node: NodeVerdict, places: Sequence[Place] | None = None) -> str:
    """One line for STATUS=, the landing page and `gpu-triage check`: the GPUs, the node's health, every place that
    needs an action, and what the verdict could not see."""
    up = sum(g.up for g in snapshot.gpus)
    line = f"{len(snapshot.gpus)} GPUs, {up} up; node {node.health.value}"
    named = name_places(places if places is not None else affected(snapshot, node))
    if named:
        line += f": {named}"
    if node.incomplete:
        line += "; " + name_blind([blind_json(b) for b in node.incomplete])
    return line


def all_findings(node: NodeVerdict) -> list[Finding]:
    return [f for g in node.gpus for f in g.findings] + list(node.findings)
