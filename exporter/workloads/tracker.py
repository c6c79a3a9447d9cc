"""Who is using each GPU: Kubernetes pods (the kubelet's pod-resources API) and Slurm jobs (the cgroups of
the processes NVML lists on the GPU), together, for the metrics, the API and the findings.

A GPU that stops answering has no process list any more: its Slurm jobs are the last ones seen, which is what
the person paged about it needs to know. A pod keeps its GPU in the kubelet's books until it is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.exporter.backends.readings import Processes
from gpu_triage.exporter.polling.snapshot import Snapshot
from gpu_triage.exporter.settings import Settings
from gpu_triage.exporter.workloads.placement import Assignment, DeviceIndex, Place
from gpu_triage.exporter.workloads.podresources import Answer
from gpu_triage.exporter.workloads.pods import PodMap, PodSource, State, assign
from gpu_triage.exporter.workloads.slurm import ProcessJobs
from gpu_triage.exporter.workloads.user_names import UserNames

ByGpu = Mapping[str, tuple[Assignment, ...]]  # GPU uuid -> who uses it


class Workloads:
    def __init__(
        self,
        settings: Settings,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        declared: Callable[[], Mapping[int, tuple[Workload, ...]]] | None = None,
    ) -> None:
        setting = settings.kubernetes_pod_resources_socket
        self.pods: PodSource | None = None
        if setting != "off":
            self.pods = PodSource(
                setting, settings.collector_slow_interval, settings.read_timeout, on_change=on_change, clock=clock
            )
        self.jobs = ProcessJobs(settings.path_procfs, deadline=settings.read_timeout, on_change=on_change)
        self.users = UserNames()
        self.declared = declared  # the simulator's scenario's pods and jobs, by GPU index
        self._last_jobs: dict[str, tuple[Assignment, ...]] = {}
        self.pod_map = PodMap()
        # The answer and the devices pod_map was made from: the same answer (the same object: comparing
        # thousands of pods on every render would cost what placing them does) on the same devices is placed once.
        self._placed: tuple[Answer | None, frozenset[tuple[str, Place]]] | None = None

    def start(self) -> None:
        if self.pods is not None:
            self.pods.start()

    def stop(self) -> None:
        if self.pods is not None:
            self.pods.stop()
        self.jobs.close()

    @property
    def settled(self) -> bool:
        """Whether every source has had its first say (until then, no workload is no news)."""
        return self.pods is None or self.pods.state != State.STARTING

    def current(self, snapshot: Snapshot) -> ByGpu:
        """Every GPU's pods and jobs now. Called for each render, under the daemon's render lock."""
        index = DeviceIndex(snapshot)
        answer = self.pods.answer if self.pods is not None else None
        devices = index.devices
        if self._placed is None or answer is not self._placed[0] or devices != self._placed[1]:
            self.pod_map = assign(answer, index) if answer is not None else PodMap()
            self._placed = (answer, devices)
        jobs = self._slurm_jobs(snapshot)
        declared = self.declared() if self.declared is not None else {}
        out: dict[str, tuple[Assignment, ...]] = {}
        for state in snapshot.gpus:
            uuid = state.identity.uuid
            found = self.pod_map.assignments.get(uuid, ()) + jobs.get(uuid, ())
            found += tuple(Assignment(w) for w in declared.get(state.identity.index, ()))
            if found:
                out[uuid] = found
        return out

    def _slurm_jobs(self, snapshot: Snapshot) -> dict[str, tuple[Assignment, ...]]:
        listed = {s.identity.uuid: s.get(Processes) for s in snapshot.gpus}
        pids = {p.pid for found in listed.values() if found and found.processes for p in found.processes}
        by_pid = self.jobs.jobs(pids)
        out: dict[str, tuple[Assignment, ...]] = {}
        for state in snapshot.gpus:
            uuid = state.identity.uuid
            processes = listed[uuid]
            if processes is None or processes.processes is None:
                if not state.up and uuid in self._last_jobs:  # lost or hung: who was on it
                    out[uuid] = self._last_jobs[uuid]
                continue
            found: dict[Assignment, None] = {}
            for p in processes.processes:
                if (job := by_pid.get(p.pid)) is None:
                    continue
                user = self.users.name(job.uid) if job.uid is not None else ""
                workload = Workload(
                    "slurm_job",
                    job.job_id,
                    step=job.step,
                    user=user,
                    mig_uuid=p.instance.uuid if p.instance else "",
                    gpu_instance=p.instance.gpu_instance if p.instance else None,
                )
                found[Assignment(workload, p.instance)] = None
            out[uuid] = tuple(found)
        self._last_jobs = {uuid: jobs for uuid, jobs in out.items() if jobs}
        return {uuid: jobs for uuid, jobs in out.items() if jobs}

    def status(self) -> dict[str, Any]:
        """What each source is doing, for /api/v1/gpus."""
        kubernetes: dict[str, Any] = {"state": "off"}
        if self.pods is not None:
            kubernetes = {
                **self.pods.status(),
                "unmatched_devices": self.pod_map.unmatched,
                "pods_not_shown": self.pod_map.not_shown,
            }
        return {"kubernetes": kubernetes, "slurm": {"source": "the GPU processes' cgroups", **self.jobs.status()}}
