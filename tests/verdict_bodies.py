"""/api/v1/diagnosis bodies for tests of what reads them (`gpu-triage check`, the Slurm scripts): made by the daemon's
own report (exporter/verdict_report.py) from verdicts diagnosis/ makes of XIDs and readings, never written by hand,
so that a change to the report's shape reaches every reader's test."""

from __future__ import annotations

from gpu_triage.diagnosis.core.findings import Finding, Workload
from gpu_triage.diagnosis.xid.health import Telemetry, assess_gpu
from gpu_triage.diagnosis.xid.incidents import Occurrence
from gpu_triage.diagnosis.xid.node_verdict import Blind, assess_node, sxid_findings
from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.http.api_models import Diagnosis
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.verdict_report import diagnosis_json
from tests.diagnosis.kernel_lines import parse_line

NOW = 1_764_600_000.0
BUSES = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]


def xid(code: int, text: str = "") -> Occurrence:
    return Occurrence(code, text or f"NVRM: Xid (PCI:0000:00:00): {code}, pid=1, name=x, y", NOW - 60, "b1", 1)


def report(
    xids: dict[int, list[Occurrence]] | None = None,
    telemetry: dict[int, Telemetry] | None = None,
    node_findings: list[Finding] | None = None,
    incomplete: tuple[Blind, ...] = (),
    workloads: dict[int, tuple[Workload, ...]] | None = None,
) -> Diagnosis:
    """/api/v1/diagnosis as the daemon renders it (`.body()`: its JSON), for the verdicts diagnosis/ makes of these XIDs and readings."""
    gpus = [GpuIdentity(i, f"GPU-{i}", bus) for i, bus in enumerate(BUSES)]
    verdicts = []
    for g in gpus:
        v = assess_gpu(
            g.pci_bus_id,
            (xids or {}).get(g.index, []),
            (telemetry or {}).get(g.index, Telemetry()),
            boot_id="b1",
            now=NOW,
        )
        for f in v.findings:
            f.workloads = (workloads or {}).get(g.index, ())
        verdicts.append(v)
    node = assess_node(verdicts, node_findings or [], incomplete)
    snapshot = Snapshot(NOW, "sim", tuple(GpuState(g) for g in gpus))
    return diagnosis_json(snapshot, node, "b1", NOW)


def fatal_sxid() -> Finding:
    """The finding a fatal SXid makes, from the switch driver's line as the parser reads it."""
    event = parse_line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error")
    assert event is not None and event.code is not None
    [found] = sxid_findings([Occurrence(event.code, event.text, NOW, "b1", 1, event.details)], boot_id="b1")
    return found
