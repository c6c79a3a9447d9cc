"""Why a job is slow, and which GPUs are held idle: performance findings from rolling windows of telemetry.

Pure: the daemon hands in each poll's samples with the time (`observe`), and reads the findings and the
per-workload accounting back (`report`, `accounts`). No clock, no I/O. The findings follow the order in
which an operator looks for the cause of a slow job: is the GPU busy at all, is it fed, is it waiting on
communication, are its clocks held down, is it waiting on memory, is one GPU the odd one out; and MIG
against the node's role. They are reported beside the health verdict and never change it.

Findings are judged when a bucket of the window closes (a tenth of the base window by default), not at every
poll: a poll costs a few additions per GPU, the judgement a sum over each window's buckets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.performance.data import CLASSES, ClassSpec, PerformanceData
from gpu_triage.diagnosis.performance.rules import CHECKS, stragglers
from gpu_triage.diagnosis.performance.window import GpuSample, GpuWindow, Thresholds, workloads_of

NODE_ROLES = ("", "training", "inference")
# Workloads tracked at once for the accounting: far more than a node runs (a GPU time-sliced among a hundred
# pods, eight times over); a workload's series end when it leaves its GPU.
MAX_ACCOUNTS = 2048


@dataclass(frozen=True, slots=True)
class PerfFinding:
    cls: str
    spec: ClassSpec
    gpu: int
    uuid: str
    evidence: Mapping[str, float]
    window_seconds: float
    workloads: tuple[Workload, ...] = ()

    def summary(self) -> str:
        """One line of figures, for the page and `gpu-triage check --performance`."""
        parts = []
        for key, value in self.evidence.items():
            if key.endswith("celsius"):
                parts.append(f"{key.removesuffix('_celsius').replace('_', ' ')} {value:.0f} °C")
            elif key == "bursts":
                parts.append(f"{value:.0f} bursts")
            elif value >= 0:
                parts.append(f"{key.replace('_', ' ')} {value * 100:.0f}%")
        return f"{self.spec.title}: " + ", ".join(parts) + f" over {_duration(self.window_seconds)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "severity": self.spec.severity.value,
            "title": self.spec.title,
            "playbook": self.spec.playbook,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "window_seconds": self.window_seconds,
            "evidence": {k: round(v, 4) for k, v in self.evidence.items()},
            "summary": self.summary(),
            "workloads": [w.to_json() for w in self.workloads],
        }


@dataclass(frozen=True, slots=True)
class Account:
    """What a workload used of one GPU since the daemon first saw it there: its series' values."""

    gpu: int
    energy_joules: float = 0.0
    allocated_seconds: float = 0.0
    active_seconds: float = 0.0  # allocated seconds weighted by activity
    idle_seconds: float = 0.0  # allocated seconds with activity under the idle threshold


@dataclass(frozen=True, slots=True)
class PerformanceReport:
    judged_at: float | None = None  # None: no window judged yet (warming up)
    by_gpu: Mapping[str, tuple[PerfFinding, ...]] = field(default_factory=lambda: MappingProxyType({}))
    by_workload: tuple[tuple[Workload, tuple[int, ...], tuple[PerfFinding, ...]], ...] = ()


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


class PerformanceEngine:
    def __init__(self, data: PerformanceData, window_seconds: float, node_role: str = "") -> None:
        if node_role not in NODE_ROLES:
            raise ValueError(f"node role {node_role!r} is not one of training, inference or empty")
        if not window_seconds > 0:
            raise ValueError("the base window must be positive")
        self.data = data
        self.window = window_seconds
        self.node_role = node_role
        self.bucket_seconds = window_seconds / data.buckets_per_window
        idle = data.classes["gpu_idle_allocated"]
        self.thresholds = Thresholds(
            idle_activity=idle.value("idle_activity"),
            held_memory_bytes=idle.value("held_memory_bytes"),
            busy_activity=data.classes["throttled"].value("busy_activity"),
            clock_ratio_below=data.classes["throttled"].value("clock_ratio_below"),
        )
        self._keep = max(s.windows for s in data.classes.values()) * data.buckets_per_window
        self._gpus: dict[str, GpuWindow] = {}
        self._bucket: int | None = None
        self._accounts: dict[tuple[str, Workload], Account] = {}
        self.report = PerformanceReport()

    def observe(self, now: float, samples: Sequence[GpuSample]) -> None:
        """Add one poll's samples, taken at `now` (seconds on a clock that only moves forward)."""
        bucket = math.floor(now / self.bucket_seconds)
        if self._bucket is not None and bucket > self._bucket:
            for w in self._gpus.values():
                w.close(bucket - self._bucket - 1)  # coverage counts what was seen, the buckets how long
            self._judge(now)
        self._bucket = bucket if self._bucket is None else max(bucket, self._bucket)
        present = set()
        for s in samples:
            present.add(s.uuid)
            window = self._gpus.get(s.uuid)
            if window is None:
                window = self._gpus[s.uuid] = GpuWindow(self._keep)
            energy_before = window.last.energy_joules if window.last is not None else None
            dt = window.add(now, s, self.thresholds)
            if dt > 0.0 and s.workloads:
                self._account(s, dt, energy_before)
        for gone in self._gpus.keys() - present:
            del self._gpus[gone]
        live = {(s.uuid, w) for s in samples for w in s.workloads}
        for key in self._accounts.keys() - live:
            del self._accounts[key]  # the workload left the GPU: its series end

    def _account(self, s: GpuSample, dt: float, energy_before: float | None) -> None:
        share = 1.0 / len(s.workloads)  # a shared (time-sliced) GPU: split evenly, so shares add up to the GPU
        joules = 0.0
        if s.energy_joules is not None and energy_before is not None and s.energy_joules >= energy_before:
            joules = s.energy_joules - energy_before
        elif s.power_watts is not None:
            joules = s.power_watts * dt  # no energy counter (or it went back: a driver reload)
        act = s.activity
        for workload in s.workloads:
            key = (s.uuid, workload)
            old = self._accounts.get(key)
            if old is None:
                if len(self._accounts) >= MAX_ACCOUNTS:
                    continue
                old = Account(s.index)
            self._accounts[key] = Account(
                s.index,
                old.energy_joules + joules * share,
                old.allocated_seconds + dt * share,
                old.active_seconds + (dt * share * min(1.0, act) if act is not None else 0.0),
                old.idle_seconds + (dt * share if act is not None and act < self.thresholds.idle_activity else 0.0),
            )

    @property
    def accounts(self) -> Mapping[tuple[str, Workload], Account]:
        """(GPU uuid, workload) -> what the workload used of that GPU so far."""
        return MappingProxyType(dict(self._accounts))

    def _judge(self, now: float) -> None:
        per_bucket = self.data.buckets_per_window
        found: dict[str, list[PerfFinding]] = {}
        judged = False
        totals: dict[int, dict[str, list[float]]] = {}  # windows -> uuid -> sums, each computed once
        for cid in CLASSES:
            spec = self.data.classes[cid]
            n = spec.windows * per_bucket
            need = self.data.coverage * n * self.bucket_seconds
            by_uuid = totals.setdefault(spec.windows, {})
            for uuid, w in self._gpus.items():
                if uuid not in by_uuid:
                    by_uuid[uuid] = w.total(n)
            # Watched the whole window (the first bucket may be partial) and seen most of it (polls may stall).
            covered = {u: t for u, t in by_uuid.items() if len(self._gpus[u].buckets) >= n and t[0] >= need}
            judged = judged or bool(covered)
            seconds = spec.windows * self.window
            if cid in CHECKS:
                for uuid, total in covered.items():
                    w = self._gpus[uuid]
                    if w.mig:
                        continue  # the whole GPU's figures say nothing of the instance each workload holds
                    if (ev := CHECKS[cid](total, spec)) is not None:
                        finding = PerfFinding(cid, spec, w.index, uuid, ev, seconds, w.workloads)
                        found.setdefault(uuid, []).append(finding)
            elif cid == "straggler_gpu":
                self._stragglers(spec, covered, seconds, found)
            elif cid == "mig_policy":
                self._mig_policy(spec, seconds, found)
        by_gpu = {u: tuple(f) for u, f in found.items()}
        when = now if judged or self.report.judged_at is not None else None
        self.report = PerformanceReport(when, MappingProxyType(by_gpu), _by_workload(self._gpus.values(), by_gpu))

    def _stragglers(
        self, spec: ClassSpec, covered: Mapping[str, list[float]], seconds: float, found: dict[str, list[PerfFinding]]
    ) -> None:
        for workload, windows in workloads_of(self._gpus.values()).items():
            on = {
                w.index: (uuid, covered[uuid])
                for uuid, w in self._gpus.items()
                if w in windows and uuid in covered and not w.mig  # a MIG GPU's figures are its instances' sum
            }
            for gpu, ev in stragglers({g: t for g, (_, t) in on.items()}, spec).items():
                uuid = on[gpu][0]
                # An idle GPU lags by definition; its own finding says more than "straggler".
                if not any(f.cls in (spec.id, "gpu_idle_allocated") for f in found.get(uuid, ())):
                    found.setdefault(uuid, []).append(PerfFinding(spec.id, spec, gpu, uuid, ev, seconds, (workload,)))

    def _mig_policy(self, spec: ClassSpec, seconds: float, found: dict[str, list[PerfFinding]]) -> None:
        if not self.node_role:
            return
        want = self.node_role == "inference"
        for uuid, w in self._gpus.items():
            if w.mig is not None and w.mig != want:
                ev = {"mig_enabled": 1.0 if w.mig else 0.0, "inference_node": 1.0 if want else 0.0}
                found.setdefault(uuid, []).append(PerfFinding(spec.id, spec, w.index, uuid, ev, seconds, w.workloads))


def _by_workload(
    windows: Iterable[GpuWindow], by_gpu: Mapping[str, tuple[PerfFinding, ...]]
) -> tuple[tuple[Workload, tuple[int, ...], tuple[PerfFinding, ...]], ...]:
    out = []
    for workload, ws in workloads_of(windows).items():
        ordered = sorted(ws, key=lambda w: w.index)
        findings = tuple(f for w in ordered for f in by_gpu.get(w.uuid, ()) if workload in f.workloads)
        out.append((workload, tuple(w.index for w in ordered), findings))
    return tuple(out)
