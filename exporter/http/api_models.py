"""The JSON the daemon answers under /api/v1, as pydantic models: the routes declare them (so /openapi.json
carries each response's schema), `gpu-triage check` and `node-condition` parse the verdict with them.

A key that today's JSON leaves out (a pod's `job_id`, an offline finding's `workloads`, a GPU's verdict
before there is one) is a field with a default: it is written only when it was set (`body()` and the routes
dump with `exclude_unset`), so null and absent stay what they were. Every other field is required.
Declaration order is the order of the keys. Per-class finding `details`, a GPU's readings and the hang table
differ from one class or collector to the next: they are JSON values, not Any.

Imports pydantic and the verdict vocabulary only: `gpu-triage check` loads this module too. The answer of
GET /api/v1/xid/{code} is a TypedDict of its own (exporter/xid_explain.py), so that `gpu-triage xid` loads
no pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from gpu_triage.diagnosis.core.actions import Action, GpuStatus, Health, Severity

JsonObject = dict[str, JsonValue]


class ApiModel(BaseModel):
    # Ignore keys a newer daemon adds: a client reads what it knows. The tests compare each model's dump
    # with what diagnosis/ writes, so a key the model lacks cannot vanish from the API unnoticed.
    # defer_build: a model's validator is built when first used, not at import; most daemons are only
    # ever scraped.
    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True, defer_build=True)

    def body(self) -> JsonObject:
        """The model as the API writes it."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class WorkloadOut(ApiModel):
    """Who uses a GPU: a Kubernetes pod's container (namespace, pod, container) or a Slurm job step (job_id,
    step, user)."""

    kind: str = Field(description="pod or slurm_job")
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    job_id: str | None = None
    step: str | None = None
    user: str | None = None
    mig_uuid: str | None = Field(default=None, description="the MIG device it holds")
    gpu_instance: int | None = None


class Evidence(ApiModel):
    line: int | None = Field(description="line number within its input, from 1")
    text: str
    file: str | None = Field(default=None, description="the input it is in, when there were several")


class FindingOut(ApiModel):
    """A diagnosed problem: what, where, how bad, what to do, and the lines that show it."""

    id: str
    class_id: str = Field(alias="class", description="xid_<code>, sxid_<code>, or a training-log class id")
    severity: Severity
    action: Action
    title: str
    playbook: str = Field(description="runbook id: /runbooks/<playbook>")
    gpu: str | None = Field(description="PCI bus id")
    rank: int | None
    local_rank: int | None
    host: str | None
    place_inferred: bool
    ranks: list[int]
    count: int
    evidence: list[Evidence]
    steps: list[str]
    details: JsonObject = Field(description="per class: XID fields, first_seen/last_seen (+ _iso), ranks...")
    workloads: list[WorkloadOut] = Field(default_factory=list, description="who used the GPU (the daemon only)")
    members: list[JsonObject] = Field(default_factory=list, description="the findings folded into this one")


# --- GET /api/v1/diagnosis ---------------------------------------------------------------------------------


class Place(ApiModel):
    """A place that needs an action: a GPU (or a MIG instance of it), an NVSwitch, an unknown device."""

    action: Action
    where: str = Field(description="'GPU 3', 'GPU 3 instance 1', 'NVSwitch', or a PCI bus id")
    gpu: int | None = Field(description="NVML index")
    pci_bus_id: str | None
    cause: str = Field(description="'Xid 79', 'lost', 'row_remap_failure'...")
    finding: str = Field(description="the id of the finding behind it")
    workloads: list[WorkloadOut]


class BlindOut(ApiModel):
    """A source the verdict depends on that the daemon cannot read."""

    source: str = Field(description="kmsg, journal, xid, backend, or an XID event source")
    what: str
    problem: str
    fix: str


class NodeOut(ApiModel):
    health: Health
    action: Action
    summary: str
    affected: list[Place] = Field(description="every place that needs an action, most urgent first")
    incomplete: list[BlindOut] = Field(description="what the verdict could not see; non-empty: health unknown")


class GpuVerdictOut(ApiModel):
    gpu: int = Field(description="NVML index")
    uuid: str
    status: GpuStatus
    # Absent while no verdict covers the GPU yet.
    pci_bus_id: str | None = None
    health: Health | None = None
    action: Action | None = None
    findings: list[FindingOut] = Field(default_factory=list)
    workloads: list[WorkloadOut]


class PerformanceFindingOut(ApiModel):
    class_id: str = Field(alias="class")
    severity: Severity
    title: str
    playbook: str
    gpu: int
    uuid: str
    window_seconds: float
    evidence: dict[str, float]
    summary: str
    workloads: list[WorkloadOut]


class PerformanceGpu(ApiModel):
    gpu: int
    uuid: str
    findings: list[PerformanceFindingOut]


class PerformanceWorkload(ApiModel):
    workload: WorkloadOut
    gpus: list[int]
    findings: list[PerformanceFindingOut]


class PerformanceOut(ApiModel):
    """Why jobs are slow and which GPUs are held idle: beside the verdict, never part of it."""

    window_seconds: float
    judged: bool = Field(description="false while the first window fills")
    note: str
    gpus: list[PerformanceGpu]
    workloads: list[PerformanceWorkload]


class Diagnosis(ApiModel):
    """The node's verdict: per-GPU health, findings, the one action to take."""

    node: NodeOut
    gpus: list[GpuVerdictOut]
    findings: list[FindingOut] = Field(description="one per problem, most urgent first")
    boot_id: str
    generated_at: float
    generated_at_iso: str
    performance: PerformanceOut | None = None


# --- GET /api/v1/gpus -------------------------------------------------------------------------------------


class GpuReadings(ApiModel):
    """One GPU as the last poll read it; one object per collector that answered (its reading's fields)."""

    gpu: int
    uuid: str
    pci_bus_id: str
    status: GpuStatus
    problems: dict[str, str] = Field(description="collector: why it failed")
    workloads: list[WorkloadOut]
    # The collectors, in the order the API writes them (sorted); a collector with no reading is absent.
    clocks: JsonObject | None = None
    ecc: JsonObject | None = None
    health: JsonObject | None = None
    inventory: JsonObject | None = None
    memory: JsonObject | None = None
    nvlink: JsonObject | None = None
    pcie: JsonObject | None = None
    power: JsonObject | None = None
    processes: JsonObject | None = None
    profiling: JsonObject | None = None
    recovery: JsonObject | None = None
    remapping: JsonObject | None = None
    thermal: JsonObject | None = None
    utilization: JsonObject | None = None


class Gpus(ApiModel):
    backend: str
    backend_reason: str
    backend_problem: str | None
    taken_at: float | None = Field(description="null before the first poll")
    workload_sources: dict[str, JsonObject]
    gpus: list[GpuReadings]


# --- GET /api/v1/events ---------------------------------------------------------------------------------


class JournalEvent(ApiModel):
    id: int
    timestamp: float
    kind: Literal["xid", "sxid"]
    xid: int | None = Field(default=None, description="kind xid")
    sxid: int | None = Field(default=None, description="kind sxid")
    gpu: int | None
    uuid: str | None
    pci_bus_id: str | None
    pid: int | None
    process: str | None
    sources: list[str]
    boot_id: str
    text: str
    details: JsonObject


class Events(ApiModel):
    events: list[JournalEvent]


# --- POST /api/v1/diagnose --------------------------------------------------------------------------------


class KernelEvent(ApiModel):
    """An XID or SXID line found in the input."""

    line: int
    xid: int | None = None
    sxid: int | None = None
    pci_bus_id: str | None
    pid: int | None = None
    process: str | None = None
    severity: str | None = Field(default=None, description="SXid: Fatal or Non-fatal")
    timestamp: str | None = Field(description="as the line's prefix prints it, not interpreted")
    text: str
    file: str | None = None


class InputSummary(ApiModel):
    sources: int
    lines_read: int
    lines_skipped: int
    events_dropped: int


class DiagnoseReport(ApiModel):
    """Kernel and training logs, Flight Recorder dumps, NCCL RAS output: root cause first."""

    root_cause: str | None = Field(description="the id of the first finding")
    events: list[KernelEvent]
    findings: list[FindingOut]
    performance: list[FindingOut]
    summary: InputSummary
    hang: JsonObject | None = Field(default=None, description="the per-rank table, with dumps or RAS output")
