"""A simulated node driven on a clock of the test's own, polled as the daemon polls it (fast fields every
interval, profiling and the other slow ones every slow interval), into the daemon's performance feed."""

from __future__ import annotations

from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.diagnosis.performance.data import load_performance
from gpu_triage.exporter.backends.base import GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Reading
from gpu_triage.exporter.backends.sim.backend import SimBackend
from gpu_triage.exporter.backends.sim.scenario import load_scenario
from gpu_triage.exporter.performance import Performance
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.workloads.placement import Assignment
from tests.conftest import FakeClock

START = 1_800_000_000.0


def drive(
    scenario: str,
    seconds: float,
    *,
    window: float = 300.0,
    interval: float = 5.0,
    slow: float = 60.0,
    role: str = "",
    seen: dict[int, set[str]] | None = None,
) -> tuple[Performance, SimBackend, Snapshot]:
    """Run `scenario` for `seconds`; `seen` collects every class found on each GPU at any time on the way."""
    clock = FakeClock(START)
    backend = SimBackend(load_scenario(scenario), clock=clock)
    gpus = backend.discover()
    perf = Performance(load_performance(), window, role)
    readings: dict[int, dict[Collector, Reading]] = {g.index: {} for g in gpus}
    declared = backend.declared_workloads()
    by_gpu = {g.uuid: tuple(Assignment(w) for w in declared.get(g.index, ())) for g in gpus}
    next_slow = 0.0
    t = 0.0
    snapshot = Snapshot(0.0, "sim")
    while t <= seconds:
        clock.now = START + t
        collectors = [c for c in Collector if not c.slow or t >= next_slow]
        if t >= next_slow:
            next_slow += slow
        lost: set[int] = set()
        for g in gpus:
            for c in collectors:
                try:
                    readings[g.index][c] = backend.read(g, c).reading
                except GpuLostError:
                    lost.add(g.index)  # as the poller does: no readings, the GPU marked lost
                    readings[g.index].clear()
                    break
        states = tuple(
            GpuState(g, MappingProxyType({}), MappingProxyType({Collector.POWER: GpuStatus.LOST}))
            if g.index in lost
            else GpuState(g, MappingProxyType(dict(readings[g.index])))
            for g in gpus
        )
        snapshot = Snapshot(clock.now, "sim", states, taken_monotonic=t + 1000.0)
        perf.observe(snapshot, by_gpu)
        if seen is not None:
            for gpu, found in classes(perf).items():
                seen.setdefault(gpu, set()).update(found)
        t += interval
    return perf, backend, snapshot


def classes(perf: Performance) -> dict[int, set[str]]:
    """GPU index -> the classes found on it."""
    return {found[0].gpu: {f.cls for f in found} for found in perf.report.by_gpu.values() if found}
