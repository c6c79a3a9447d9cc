"""A GPU's verdict: healthy, degraded, unhealthy or unknown, and the one thing to do about it.

The verdict is derived, never stored: the GPU's XIDs (from the journal) and what the poller last read
go in, with the current boot, the time and the operator's acknowledgements; findings come out, root
cause first, with the health and the most urgent action among them. A finding closes by itself when
its cause is gone:
- a reboot (a new boot id) closes every XID finding of earlier boots;
- a GPU reset (the driver initialising the GPU again in this boot) closes what a reset cures;
- application-level findings (restart or debug the app) close an hour after their last XID;
- an acknowledgement closes every XID finding up to that moment.
Telemetry conditions (a lost GPU, a pending row remap) hold exactly as long as the telemetry says.

Only the node's own GPUs get a verdict here; what no GPU holds is in diagnosis/xid/node_verdict.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_triage.diagnosis.core.actions import Action, GpuStatus, Health, Severity, most_urgent
from gpu_triage.diagnosis.core.findings import Evidence, Finding, urgency
from gpu_triage.diagnosis.xid.catalog import XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.code_findings import findings
from gpu_triage.diagnosis.xid.conditions import DCGM_HEALTH_SYSTEMS, load_conditions
from gpu_triage.diagnosis.xid.incidents import Decision, Occurrence, decide

APP_FINDING_SECONDS = 3600.0
_FALLEN_OFF_THE_BUS = 79  # the Xid the driver logs when a GPU stops answering on PCIe
_APP_ACTIONS = frozenset({Action.RESTART_APP, Action.CHECK_APP, Action.IGNORE})
_CURED_BY_RESET = frozenset(a for a in Action if a.rank >= Action.DRAIN_AND_RESET.rank)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What the poller last read that bears on health; None where the GPU does not say."""

    status: GpuStatus = GpuStatus.UP
    lost_since: float | None = None  # when the backend first answered that the GPU is lost
    lost_answer: str | None = None  # what it answered
    source: str = "NVML"  # who said all this: the backend's name as evidence lines give it (NVML, DCGM, ...)
    recovery_action: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    uncorrected_ecc: int | None = None
    retired_pages_pending: bool | None = None
    thermal_slowdown: bool = False
    power_brake: bool = False
    nvlink_down: tuple[int, ...] = ()
    # DCGM health watches: (system, failed, DCGM's message); a WARN is not a FAIL.
    health_incidents: tuple[tuple[str, bool, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    gpu: str  # canonical PCI bus id
    health: Health
    action: Action
    findings: tuple[Finding, ...]  # open findings, root cause first


def condition(
    cid: str,
    gpu: str | None,
    detail: str | None = None,
    action: Action | None = None,
    severity: Severity | None = None,
    where: str | None = None,
) -> Finding:
    c = load_conditions()[cid]
    return Finding(
        id=f"{cid}:{gpu or where or 'node'}",
        class_id=cid,
        severity=severity or c.severity,
        action=action or c.action or Action.RUN_DIAGNOSTICS,
        title=c.title,
        playbook=c.playbook,
        gpu=gpu,
        evidence=[Evidence(None, detail)] if detail else [],
        steps=list(c.steps),
    )


def condition_findings(t: Telemetry, gpu: str, catalog: XidCatalog | None = None) -> list[Finding]:
    """The findings the telemetry alone supports, most urgent first."""
    catalog = catalog or load_catalog()
    out = []
    if t.status == GpuStatus.LOST:
        lost = condition("gpu_lost", gpu, t.lost_answer or "the backend answered that the GPU is lost")
        if t.lost_since is not None:
            lost.details["first_seen"] = int(t.lost_since)
        out.append(lost)
    elif t.status == GpuStatus.HUNG:
        out.append(condition("gpu_unresponsive", gpu, "a driver call did not return before its deadline"))
    if t.recovery_action:
        name, action = catalog.mappings.recovery_named(t.recovery_action)
        out.append(condition("recovery_action", gpu, f"{t.source} recovery action: {name}", action))
    if t.row_remap_failure:
        out.append(condition("row_remap_failure", gpu, f"{t.source}: row remapping failure = yes"))
    if t.uncorrected_ecc:
        ecc = f"{t.source}: {t.uncorrected_ecc} uncorrectable ECC errors (volatile)"
        out.append(condition("ecc_uncorrectable", gpu, ecc))
    if t.row_remap_pending:
        out.append(condition("row_remap_pending", gpu, f"{t.source}: row remapping pending = yes"))
    if t.retired_pages_pending:
        out.append(condition("retired_pages_pending", gpu, f"{t.source}: page retirement pending = yes"))
    if t.nvlink_down:
        links = ", ".join(str(link) for link in t.nvlink_down)
        out.append(condition("nvlink_down", gpu, f"{t.source}: NVLink links down: {links}"))
    if t.thermal_slowdown:
        out.append(condition("thermal_slowdown", gpu, f"{t.source} clock-event reasons: thermal slowdown"))
    if t.power_brake:
        out.append(condition("power_brake_slowdown", gpu, f"{t.source} clock-event reasons: hardware power brake"))
    out += _dcgm_health(t, gpu)
    return sorted(out, key=urgency)


def _dcgm_health(t: Telemetry, gpu: str) -> list[Finding]:
    """One finding per DCGM health system that reports trouble; a WARN alone makes it a warning."""
    out = []
    for system in DCGM_HEALTH_SYSTEMS:
        incidents = [(failed, message) for s, failed, message in t.health_incidents if s == system]
        if not incidents:
            continue
        failed = any(f for f, _ in incidents)
        finding = condition(f"dcgm_health_{system}", gpu, severity=None if failed else Severity.WARNING)
        finding.evidence = [
            Evidence(None, f"DCGM {system} health: {'FAIL' if f else 'WARN'}: {m}") for f, m in incidents
        ]
        out.append(finding)
    return out


def _open(d: Decision, boot_id: str, now: float, cleared_at: float | None, resets: Sequence[float]) -> bool:
    occ = d.occurrence
    if occ.boot_id and boot_id and occ.boot_id != boot_id:
        return False  # a reboot since: whatever it needed has been done
    ts = occ.ts if occ.ts is not None else now
    if cleared_at is not None and ts <= cleared_at:
        return False
    if d.action in _CURED_BY_RESET and any(r > ts for r in resets):
        return False
    last = d.incident_end if d.incident_end is not None else ts
    return not (d.action in _APP_ACTIONS and now - last > APP_FINDING_SECONDS)


def assess_gpu(
    gpu: str,
    occurrences: Sequence[Occurrence],
    telemetry: Telemetry,
    *,
    boot_id: str,
    now: float,
    cleared_at: float | None = None,
    resets: Sequence[float] = (),
    catalog: XidCatalog | None = None,
    crowded: frozenset[int] = frozenset(),
) -> GpuVerdict:
    """One GPU's verdict from its XID history (all boots: history matters), telemetry and clears. `crowded`: the
    refs of occurrences other GPUs shared (incidents.crowd)."""
    catalog = catalog or load_catalog()
    boundaries = [*resets, *([cleared_at] if cleared_at is not None else [])]
    recovery = telemetry.recovery_action
    decisions = decide(occurrences, recovery_now=recovery, boundaries=boundaries, catalog=catalog, crowded=crowded)
    live = [d for d in decisions if _open(d, boot_id, now, cleared_at, resets)]
    xid_findings = findings(live, gpu, catalog)
    conditions = condition_findings(telemetry, gpu, catalog)
    if telemetry.recovery_action and xid_findings:  # the XID root cause already carries it: one finding, not two
        conditions = [f for f in conditions if f.class_id != "recovery_action"]
    fallen = next((f for f in xid_findings if f.xid == _FALLEN_OFF_THE_BUS), None)
    if fallen is not None and telemetry.status == GpuStatus.LOST:
        # The GPU lost now is what its Xid 79 said: one finding, which also says what the backend answers.
        lost = [f for f in conditions if f.class_id == "gpu_lost"]
        conditions = [f for f in conditions if f.class_id != "gpu_lost"]
        fallen.evidence += [e for f in lost for e in f.evidence]
    driving, rest = _partition([*xid_findings, *conditions])
    every = sorted(driving, key=urgency) + rest
    return GpuVerdict(gpu, _health(driving, telemetry), most_urgent([f.action for f in driving]), tuple(every))


def drives(f: Finding) -> bool:
    return f.action is not Action.IGNORE and f.severity is not Severity.INFO


def _partition(found: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(the findings that drive the verdict, the rest), each in the given order."""
    driving: list[Finding] = []
    rest: list[Finding] = []
    for f in found:
        (driving if drives(f) else rest).append(f)
    return driving, rest


def _health(driving: Sequence[Finding], t: Telemetry) -> Health:
    if t.status == GpuStatus.LOST or any(f.severity is Severity.CRITICAL for f in driving):
        return Health.UNHEALTHY
    if t.status == GpuStatus.HUNG:
        return Health.UNKNOWN
    return Health.DEGRADED if driving else Health.HEALTHY


# `gpu-triage check`: the exit codes health-check hooks (Slurm, Kubernetes, NHC) understand.
EXIT_CODES: Mapping[Health, int] = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.UNHEALTHY: 2, Health.UNKNOWN: 3}
