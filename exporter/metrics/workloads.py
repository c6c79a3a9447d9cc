"""Who uses each GPU, as info series to join on: `nvidia_gpu_pod_info` and `nvidia_gpu_job_info`.

Info series rather than labels on the GPU's series, so that those stay one series per GPU whoever runs on it
(a label that changes with every job would start new series every job, and break every rate() across it).
A pod or job on a MIG device carries the MIG device's labels (`gpu_instance`, `compute_instance`,
`mig_profile`, `mig_uuid`), as the MIG device's own series do; one on the whole GPU carries none. Join as:

    nvidia_gpu_utilization_ratio * on(instance, uuid) group_left(namespace, pod) nvidia_gpu_pod_info{gpu_instance=""}
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from gpu_triage.exporter.polling.snapshot import Snapshot
from gpu_triage.exporter.workloads.pods import SOURCE
from gpu_triage.exporter.workloads.tracker import ByGpu, Workloads


def workload_families(snapshot: Snapshot, by_gpu: ByGpu, workloads: Workloads) -> Iterator[Metric]:
    pods = InfoMetricFamily(
        "nvidia_gpu_pod",
        "The Kubernetes pod and container given the GPU (or its MIG device) by the kubelet; the value is always 1.",
        labels=["gpu", "uuid", "namespace", "pod", "container"],
    )
    jobs = InfoMetricFamily(
        "nvidia_gpu_job",
        "The Slurm job step whose processes run on the GPU (or its MIG device), from their cgroups; always 1.",
        labels=["gpu", "uuid", "job_id", "step", "user"],
    )
    for state in snapshot.gpus:
        g = state.identity
        for a in by_gpu.get(g.uuid, ()):
            mig = dict(a.mig.labels) if a.mig else {}
            w = a.workload
            if w.kind == "pod":
                pods.add_metric([str(g.index), g.uuid, w.namespace, w.name, w.container], mig)
            else:
                jobs.add_metric([str(g.index), g.uuid, w.name, w.step, w.user], mig)
    yield pods
    yield jobs
    up = GaugeMetricFamily(
        "gpu_triage_workload_source_up",
        "1 if the last read of the source naming each GPU's pods (the kubelet's pod-resources API) worked, "
        "0 if it failed; absent when the source is off or, with auto, not there.",
        labels=["source"],
    )
    if workloads.pods is not None and workloads.pods.up is not None:
        up.add_metric([SOURCE], 1.0 if workloads.pods.up else 0.0)
    yield up
