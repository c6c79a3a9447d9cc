"""What the performance findings and the per-workload accounting cost the daemon: figures, not pass/fail.

    .venv/bin/python bench/bench_performance.py

1. Per poll, for 8 GPUs: the daemon's feed (`Performance.observe`: readings to samples, one bucket sum per GPU,
   the accounting) over two simulated hours of 5 s polls on perf-straggler (its job on all 8 GPUs), with the
   judgements at each bucket's close (every 30 s at the default 5 m window) included and also shown alone.
2. The same on a node of 8 GPUs each time-sliced among 16 pods (128 workloads, the accounting's worst case).
3. Building the /metrics families of the findings and the counters, per render.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.performance.data import load_performance
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.metrics.performance import performance_families
from gpu_triage.exporter.performance import Performance
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.workloads.placement import Assignment

INTERVAL, HOURS = 5.0, 2.0


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def snapshots(scenario: str) -> tuple[list[Snapshot], SimBackend]:
    """Two hours of polls of `scenario`, read up front: the bench times the feed, not the simulator."""
    clock = Clock()
    sim = SimBackend(load_scenario(scenario), clock=clock)
    gpus = sim.discover()
    readings: dict[int, dict[Collector, object]] = {g.index: {} for g in gpus}
    out = []
    t = 0.0
    while t < HOURS * 3600:
        clock.now = 1_800_000_000.0 + t
        slow = t % 60 == 0
        for g in gpus:
            for c in Collector:
                if slow or not c.slow:
                    readings[g.index][c] = sim.read(g, c).reading
        states = tuple(GpuState(g, MappingProxyType(dict(readings[g.index]))) for g in gpus)  # type: ignore[arg-type]
        out.append(Snapshot(clock.now, "sim", states, taken_monotonic=1000.0 + t))
        t += INTERVAL
    return out, sim


def feed(polls: list[Snapshot], by_gpu: dict[str, tuple[Assignment, ...]]) -> tuple[list[float], list[float]]:
    perf = Performance(load_performance(), 300.0)
    times, judged = [], []
    for snap in polls:
        before = perf.report
        t0 = time.perf_counter()
        perf.observe(snap, by_gpu)
        dt = time.perf_counter() - t0
        times.append(dt)
        if perf.report is not before:
            judged.append(dt)
    return times, judged


def show(label: str, times: list[float], judged: list[float]) -> None:
    ms = sorted(t * 1000 for t in times)
    j = sorted(t * 1000 for t in judged)
    print(
        f"{label}: {len(ms)} polls, mean {statistics.fmean(ms):.3f} ms, p50 {ms[len(ms) // 2]:.3f} ms, "
        f"p99 {ms[int(len(ms) * 0.99)]:.3f} ms, max {ms[-1]:.3f} ms; "
        f"polls that judged ({len(j)}): mean {statistics.fmean(j):.3f} ms, max {j[-1]:.3f} ms"
    )


def main() -> None:
    polls, sim = snapshots("perf-straggler")
    declared = sim.declared_workloads()
    by_gpu = {g.uuid: tuple(Assignment(w) for w in declared.get(g.index, ())) for g in sim.discover()}
    show("8 GPUs, one job", *feed(polls, by_gpu))
    shared = {
        g.uuid: tuple(Assignment(Workload("pod", f"p{g.index}-{k}", namespace="team")) for k in range(16))
        for g in sim.discover()
    }
    show("8 GPUs, 16 pods each", *feed(polls, shared))
    perf = Performance(load_performance(), 300.0)
    for snap in polls[:200]:
        perf.observe(snap, shared)
    t0 = time.perf_counter()
    for _ in range(200):
        families = list(performance_families(polls[199], perf.report, perf.accounts))
    per = (time.perf_counter() - t0) / 200 * 1000
    samples = sum(len(f.samples) for f in families)
    print(f"/metrics families, 8 GPUs x 16 pods: {per:.3f} ms per render, {samples} samples")


if __name__ == "__main__":
    main()
