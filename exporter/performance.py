"""The daemon's side of the performance findings: each new snapshot, with who uses each GPU, into the pure
engine (diagnosis/performance/engine.py), once per poll and never for a render that only an XID caused.

What the engine is given per GPU comes from readings the poller already has: SM activity, occupancy and DRAM
activity from profiling (else NVML's utilization), PCIe throughput against the link's current generation and
width, the active NVLinks' throughput against their capacity, the SM clock against its maximum, the
clock-event reasons and their duration counters, temperature, memory, processes, energy, MIG mode.

A workload is counted by who it is, not how it runs: a pod by namespace and name (its containers together),
a Slurm job by id and user (its steps together), so that the accounting series stay one per workload per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.performance.data import PerformanceData
from gpu_triage.diagnosis.performance.engine import Account, PerfFinding, PerformanceEngine, PerformanceReport
from gpu_triage.diagnosis.performance.window import GpuSample
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    Clocks,
    Inventory,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    Profiling,
    Thermal,
    Utilization,
)
from gpu_triage.exporter.http.api_models import (
    PerformanceFindingOut,
    PerformanceGpu,
    PerformanceOut,
    PerformanceWorkload,
    WorkloadOut,
)
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.workloads.tracker import ByGpu


def workload_key(w: Workload) -> Workload:
    """The workload as the accounting counts it: a pod by namespace and name, a job by id and user."""
    if w.kind == "pod":
        return Workload("pod", w.name, namespace=w.namespace)
    return Workload(w.kind, w.name, user=w.user)


def gpu_sample(state: GpuState, workloads: tuple[Workload, ...], data: PerformanceData) -> GpuSample:
    g = state.identity
    util, mem, power = state.get(Utilization), state.get(Memory), state.get(Power)
    clocks, thermal, pcie = state.get(Clocks), state.get(Thermal), state.get(Pcie)
    links, procs, prof, inv = state.get(NvLink), state.get(Processes), state.get(Profiling), state.get(Inventory)
    act = prof.gpu if prof is not None else None
    model = inv.name if inv is not None else None
    rx = act.pcie_rx_bytes_per_second if act is not None else None
    tx = act.pcie_tx_bytes_per_second if act is not None else None
    if pcie is not None:
        rx = pcie.rx_bytes_per_second if rx is None else rx
        tx = pcie.tx_bytes_per_second if tx is None else tx
    nvlink_bytes = nvlink_capacity = None
    if links is not None:
        active = [link for link in links.links if link.up]
        rates = [
            (link.tx_bytes_per_second + link.rx_bytes_per_second) / 2
            for link in active
            if link.tx_bytes_per_second is not None and link.rx_bytes_per_second is not None
        ]
        if active and len(rates) == len(active):
            nvlink_bytes = sum(rates)
            nvlink_capacity = data.nvlink_capacity(model) * len(active)
    return GpuSample(
        uuid=g.uuid,
        index=g.index,
        model=model,
        utilization=util.gpu_ratio if util is not None else None,
        sm_active=act.sm_active if act is not None else None,
        sm_occupancy=act.sm_occupancy if act is not None else None,
        dram_active=act.dram_active if act is not None else None,
        pcie_rx_bytes_per_second=rx,
        pcie_tx_bytes_per_second=tx,
        pcie_capacity=data.pcie_capacity(pcie.link_generation, pcie.link_width) if pcie is not None else None,
        nvlink_bytes_per_second=nvlink_bytes,
        nvlink_capacity=nvlink_capacity,
        sm_clock_hz=clocks.current_hz.get(ClockDomain.SM) if clocks is not None else None,
        sm_max_clock_hz=clocks.max_hz.get(ClockDomain.SM) if clocks is not None else None,
        reasons=clocks.event_reasons if clocks is not None else None,
        reason_seconds={r.value: s for r, s in clocks.event_seconds.items()} if clocks is not None else {},
        temperature_celsius=thermal.gpu_celsius if thermal is not None else None,
        memory_used_bytes=mem.used_bytes if mem is not None else None,
        processes=len(procs.processes) if procs is not None and procs.processes is not None else None,
        energy_joules=power.energy_joules if power is not None else None,
        power_watts=power.usage_watts if power is not None else None,
        mig_enabled=inv.mig_enabled if inv is not None else None,
        workloads=workloads,
    )


class Performance:
    """The engine, fed once per snapshot. Called under the daemon's render lock."""

    def __init__(self, data: PerformanceData, window_seconds: float, node_role: str = "") -> None:
        self.engine = PerformanceEngine(data, window_seconds, node_role)
        self._fed: float | None = None  # monotonic time of the snapshot last fed

    def observe(self, snapshot: Snapshot, by_gpu: ByGpu) -> None:
        if not snapshot.taken_at or snapshot.taken_monotonic == self._fed:
            return  # no poll yet, or a render for an XID or a pod change: the telemetry is the same
        self._fed = snapshot.taken_monotonic
        samples = []
        for state in snapshot.gpus:
            if not state.up:
                continue  # a lost or hung GPU has no telemetry to judge; its window ends
            keys = tuple(dict.fromkeys(workload_key(a.workload) for a in by_gpu.get(state.identity.uuid, ())))
            samples.append(gpu_sample(state, keys, self.engine.data))
        self.engine.observe(snapshot.taken_monotonic, samples)

    @property
    def report(self) -> PerformanceReport:
        return self.engine.report

    @property
    def accounts(self) -> Mapping[tuple[str, Workload], Account]:
        return self.engine.accounts


def performance_json(report: PerformanceReport, window_seconds: float) -> PerformanceOut:
    """The `performance` section of /api/v1/diagnosis: findings per GPU and per workload, beside the verdict."""
    return PerformanceOut(
        window_seconds=window_seconds,
        judged=report.judged_at is not None,  # false while the first window fills
        note="why jobs are slow and which GPUs are held idle; never part of health or the action",
        gpus=[
            PerformanceGpu(gpu=found[0].gpu, uuid=uuid, findings=[_finding(f) for f in found])
            for uuid, found in sorted(report.by_gpu.items(), key=lambda item: item[1][0].gpu)
        ],
        workloads=[
            PerformanceWorkload(
                workload=WorkloadOut.model_validate(w.to_json()), gpus=list(gpus), findings=[_finding(f) for f in found]
            )
            for w, gpus, found in report.by_workload
        ],
    )


def _finding(f: PerfFinding) -> PerformanceFindingOut:
    return PerformanceFindingOut.model_validate(f.to_json())
