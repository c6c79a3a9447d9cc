"""Why a job is slow and what it costs, on /metrics.

`nvidia_gpu_performance_finding{class}`: one series per GPU and class, 1 while the finding holds, 0 otherwise
(also while the first window fills), so that the series stay put whatever the GPU does; absent for a GPU the
daemon cannot read now. The workload
on the GPU joins on `nvidia_gpu_pod_info` / `nvidia_gpu_job_info`.

Per workload and GPU, counters that start at 0 when the daemon first sees the workload on the GPU and end
when it leaves (Prometheus' rate() and increase() take both in their stride):

    nvidia_gpu_workload_energy_joules_total            the GPU's energy while the workload held it
    nvidia_gpu_workload_allocated_seconds_total        GPU-seconds held
    nvidia_gpu_workload_active_seconds_total           GPU-seconds held, weighted by SM activity (utilization
                                                       without profiling)
    nvidia_gpu_workload_idle_allocated_seconds_total   GPU-seconds held while idle

A GPU shared by several workloads (time-slicing, MPS) splits each figure evenly among them, so a GPU's shares
add up to the GPU. Labels: `gpu`, `uuid`, `namespace` and `pod` for a pod, `job_id` and `user` for a Slurm
job, the others empty. Cardinality: one series per family for each workload on each GPU now; the kubelet
caps pods per GPU (128 here), and the daemon tracks 2048 at most.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.performance.data import CLASSES
from gpu_triage.diagnosis.performance.engine import Account, PerformanceReport
from gpu_triage.exporter.metrics.exposition import Preformatted, series_head
from gpu_triage.exporter.polling.snapshot import Snapshot

_LABELS = ["gpu", "uuid", "namespace", "pod", "job_id", "user"]
_COUNTERS = (
    ("nvidia_gpu_workload_energy_joules", "Energy the GPU used while the workload held it, in joules.", "joules",
     "energy_joules"),
    ("nvidia_gpu_workload_allocated_seconds", "GPU-seconds the workload held the GPU.", "seconds",
     "allocated_seconds"),
    ("nvidia_gpu_workload_active_seconds", "GPU-seconds the workload held the GPU, weighted by SM activity "
     "(utilization where the GPU has no profiling).", "seconds", "active_seconds"),
    ("nvidia_gpu_workload_idle_allocated_seconds", "GPU-seconds the workload held the GPU while it was idle.",
     "seconds", "idle_seconds"),
)  # fmt: skip


_FINDING = GaugeMetricFamily(
    "nvidia_gpu_performance_finding",
    "1 while a performance finding of this class holds for the GPU (why a job is slow, an idle GPU held), "
    "0 otherwise; never a health verdict. Classes: " + ", ".join(CLASSES) + ".",
    labels=["gpu", "uuid", "class"],
)


@functools.lru_cache(maxsize=1 << 12)
def _finding_heads(gpu: str, uuid: str) -> tuple[tuple[str, str], ...]:
    """A GPU's series of the finding family, written once: a node's GPUs are the same from one page to the next."""
    return tuple((cls, series_head(_FINDING.name, (("gpu", gpu), ("uuid", uuid), ("class", cls)))) for cls in CLASSES)


def _labels(gpu: int, uuid: str, w: Workload) -> list[str]:
    if w.kind == "pod":
        return [str(gpu), uuid, w.namespace, w.name, "", ""]
    return [str(gpu), uuid, "", "", w.name, w.user]


def performance_families(
    snapshot: Snapshot, report: PerformanceReport, accounts: Mapping[tuple[str, Workload], Account]
) -> Iterator[Metric]:
    finding: list[str] = []
    for state in snapshot.gpus:
        if not state.up:
            continue
        g = state.identity
        holding = {f.cls for f in report.by_gpu.get(g.uuid, ())}
        finding += [
            f"{head}{'1.0' if cls in holding else '0.0'}\n" for cls, head in _finding_heads(str(g.index), g.uuid)
        ]
    yield Preformatted(_FINDING, "".join(finding).encode())
    for name, doc, unit, attr in _COUNTERS:
        family = CounterMetricFamily(name, doc, labels=_LABELS, unit=unit)
        for (uuid, workload), account in sorted(accounts.items(), key=lambda item: (item[1].gpu, item[0][1].name)):
            family.add_metric(_labels(account.gpu, uuid, workload), getattr(account, attr))
        yield family
