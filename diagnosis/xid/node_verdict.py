"""The node's verdict: its GPUs' verdicts, and what no GPU holds.

Beside its GPUs, a node has findings of its own: NVSwitch SXIDs; XIDs that name a bus id which is none of
its GPUs (a GPU that fell off the bus before the daemon started and that the driver no longer lists, or
another device), judged as their code is and never made a lost GPU; and the sources the verdict depends on
that the daemon cannot read (the kernel log, the driver's events, its journal). A node whose daemon cannot
see is `unknown` however its GPUs look: it would miss the next XID. What it did see still counts, so an
unhealthy GPU keeps the node unhealthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_triage.diagnosis.core.actions import Action, Health, Severity, most_urgent
from gpu_triage.diagnosis.core.findings import Evidence, Finding, urgency
from gpu_triage.diagnosis.xid.catalog import XidCatalog
from gpu_triage.diagnosis.xid.health import GpuVerdict, Telemetry, assess_gpu, condition, drives
from gpu_triage.diagnosis.xid.incidents import Occurrence

# The bus id that stands for every unknown device past the first few: a real node has a handful, and a log
# that names thousands (corrupt, or another machine's) must not grow the verdict, the page or /metrics.
OTHER_DEVICES = "other"


@dataclass(frozen=True, slots=True)
class Blind:
    """A source the verdict depends on that the daemon cannot read now, and why."""

    # kmsg, the driver's event source (nvml, dcgm, sim), journal, xid (no XID source at all), or backend (the GPUs'
    # readings: the backend fails, or they are stale)
    source: str
    problem: str
    starting: bool = False  # not read yet, rather than failing: the daemon has just started


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    health: Health
    action: Action
    gpus: tuple[GpuVerdict, ...]
    findings: tuple[Finding, ...]  # node-level findings: NVSwitches, unknown devices, sources it cannot read
    incomplete: tuple[Blind, ...] = ()  # what the verdict could not see: its health is unknown at best


def sxid_findings(sxids: Sequence[Occurrence], *, boot_id: str) -> list[Finding]:
    """Node-level findings for NVSwitch SXIDs of the current boot, fatal ones first."""
    out: dict[str, Finding] = {}
    for occ in sxids:
        if occ.boot_id and occ.boot_id != boot_id:
            continue
        fatal = occ.details.get("severity", "").lower() == "fatal"
        cid = "sxid_fatal" if fatal else "sxid_nonfatal"
        finding = out.get(cid)
        if finding is None:
            out[cid] = finding = condition(cid, None)
            finding.evidence.append(Evidence(occ.ref, occ.text))
            finding.count = 0
        finding.count += 1
        finding.details[f"sxid_{occ.code}"] = int(finding.details.get(f"sxid_{occ.code}", 0)) + 1
    return sorted(out.values(), key=lambda f: f.action.rank)


def unknown_device_findings(
    bus: str,
    occurrences: Sequence[Occurrence],
    *,
    boot_id: str,
    now: float,
    uuid: str | None = None,
    cleared_at: float | None = None,
    catalog: XidCatalog | None = None,
) -> list[Finding]:
    """The findings of XIDs on `bus`, a device that is none of the node's GPUs: each judged as its code and its
    incident say, as any GPU's would be, and nothing more claimed (no telemetry, no lost GPU). `uuid`: the GPU
    the kernel log said sits there, if it did (the driver brought it up, then stopped listing it)."""
    judged = assess_gpu(bus, occurrences, Telemetry(), boot_id=boot_id, now=now, cleared_at=cleared_at, catalog=catalog)
    out = []
    for f in judged.findings:
        code = f.xid
        what = f"GPU {uuid} by the kernel log" if uuid else "a device"
        f.id, f.class_id, f.gpu = f"unknown_device:{bus}:xid_{code}", "unknown_device", None
        if bus == OTHER_DEVICES:
            f.title = f"Xid {code} on more unknown devices than gpu-triage keeps apart: {f.title}"
        else:
            f.title = f"Xid {code} on {bus}, {what} the driver does not list as a GPU of this node: {f.title}"
        f.details.update(pci_bus_id=bus, xid=code if code is not None else "?")
        if uuid:
            f.details["uuid"] = uuid
        f.steps = [
            f"`lspci -s {bus}` says what the device is; `nvidia-smi -L` lists the GPUs the driver sees. A GPU that "
            "fell off the bus before gpu-triage started is not listed any more.",
            f.action.description,
            f"`gpu-triage xid {code}` says what the code means.",
        ]
        out.append(f)
    return out


# The conditions of a source the verdict cannot do without; any other name is the driver's event source.
_BLIND = {
    "kmsg": "kernel_log_unreadable",
    "journal": "journal_unwritable",
    "xid": "no_xid_source",
    "backend": "backend_failing",
}
BLIND_CLASSES = frozenset({*_BLIND.values(), "driver_events_down"})


def blind_findings(incomplete: Sequence[Blind]) -> list[Finding]:
    """One finding per source the daemon cannot read: what it could not see is what makes the verdict unknown."""
    out = []
    for b in incomplete:
        finding = condition(_BLIND.get(b.source, "driver_events_down"), None, b.problem, where=b.source)
        finding.details["source"] = b.source
        out.append(finding)
    return out


_WORST = (Health.UNHEALTHY, Health.UNKNOWN, Health.DEGRADED, Health.HEALTHY)


def assess_node(
    gpus: Sequence[GpuVerdict], node_findings: Sequence[Finding] = (), incomplete: Sequence[Blind] = ()
) -> NodeVerdict:
    """The node's health is its worst GPU's (or NVSwitch's, or unknown device's); its action the most urgent of
    all. A source it cannot read makes it unknown, unless something already makes it unhealthy: a daemon that
    cannot see is never healthy, and what it did see still counts."""
    blind = blind_findings(incomplete)
    found = [*node_findings, *blind]
    healths = [g.health for g in gpus]
    # What the daemon cannot see makes the node unknown, never unhealthy: only what it saw can do that.
    driving = [f for f in node_findings if drives(f)]
    if any(f.severity is Severity.CRITICAL for f in driving):
        healths.append(Health.UNHEALTHY)
    elif driving:
        healths.append(Health.DEGRADED)
    if incomplete:
        healths.append(Health.UNKNOWN)
    health = next((h for h in _WORST if h in healths), Health.UNKNOWN if not gpus else Health.HEALTHY)
    action = most_urgent([g.action for g in gpus] + [f.action for f in [*driving, *blind]])
    return NodeVerdict(health, action, tuple(gpus), tuple(sorted(found, key=urgency)), tuple(incomplete))
