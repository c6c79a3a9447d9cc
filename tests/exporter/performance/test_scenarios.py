"""Each perf-* simulator scenario yields its class on the right GPUs and workload, through the daemon's feed;
perf-healthy and the other scenarios yield none, at any point of the run (warm-up and checkpoints included);
and in the daemon, the findings are in the API and on /metrics while the health verdict stays what it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.backends.sim.scenario import builtin_scenarios
from gpu_triage.exporter.daemon import Daemon
from tests.conftest import FakeClock, settings
from tests.exporter.performance.drive import classes, drive

ALL = set(range(8))
EXPECTED = {
    "perf-idle-allocated": ({0, 1}, "gpu_idle_allocated", "pod ml-research/notebook-7"),
    "perf-input-bound": (ALL, "input_bound", "pod vision/resnet-train-0"),
    "perf-comm-bound": (ALL, "communication_bound", "job 5150"),
    "perf-throttled": (ALL, "throttled", "pod llm/pretrain-0"),
    "perf-straggler": ({5}, "straggler_gpu", "job 7777"),
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_each_scenario_shows_its_class_on_its_gpus_and_workload(scenario: str) -> None:
    gpus, cls, who = EXPECTED[scenario]
    seen: dict[int, set[str]] = {}
    perf, _, _ = drive(scenario, 20 * 60, seen=seen)
    assert classes(perf) == {key: {cls} for key in gpus}
    assert seen == {key: {cls} for key in gpus}, "no other class on the way (warm-up included)"
    shown = {w.short(): {f.cls for f in found} for w, _, found in perf.report.by_workload}
    assert shown[who] == {cls}


def test_the_straggler_is_shown_within_two_windows() -> None:
    perf, _, _ = drive("perf-straggler", 2 * 300)
    assert classes(perf) == {5: {"straggler_gpu"}}


# Scenarios whose faults hold clocks down: a thermal slowdown is `throttled` as well as a health condition (GPU 2
# of both runs hot); the others of h100-faults (ECC, XIDs, a link down, GPU 3 lost) are no performance finding.
FAULTS = {"l40s-inference": {2: {"throttled"}}, "h100-faults": {2: {"throttled"}}}


@pytest.mark.parametrize("scenario", sorted(s.name for s in builtin_scenarios() if s.name not in EXPECTED))
def test_healthy_scenarios_show_nothing_at_any_time(scenario: str) -> None:
    seen: dict[int, set[str]] = {}
    drive(scenario, 3600, seen=seen)  # perf-healthy: noisy warm-up, 2-minute checkpoint stalls, 4 cycles
    assert seen == FAULTS.get(scenario, {})


def test_the_daemon_shows_findings_beside_an_unchanged_verdict(tmp_path: Path) -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("perf-idle-allocated"), clock=clock)
    # A 20 s base window: the idle window is a minute.
    daemon = Daemon(
        sim, settings(tmp_path, performance_window=20.0), clock=clock, monotonic=clock.monotonic, boot_id="boot-1"
    )
    daemon.start()
    try:
        for _ in range(40):
            clock.advance(2.0)
            daemon.poller.poll(Collector)
        body = daemon.diagnosis().body()
        page = daemon.metrics.text.decode()
    finally:
        daemon.stop()
    assert body["node"]["health"] == "healthy" and body["node"]["action"] == "IGNORE"
    assert all(g["health"] == "healthy" for g in body["gpus"])
    perf = body["performance"]
    assert perf["judged"] and perf["window_seconds"] == 20.0
    assert [(g["gpu"], [f["class"] for f in g["findings"]]) for g in perf["gpus"]] == [
        (0, ["gpu_idle_allocated"]),
        (1, ["gpu_idle_allocated"]),
    ]
    notebook = next(w for w in perf["workloads"] if w["workload"].get("pod") == "notebook-7")
    assert notebook["gpus"] == [0, 1] and {f["gpu"] for f in notebook["findings"]} == {0, 1}
    assert notebook["findings"][0]["playbook"] == "gpu-allocated-idle"
    families = {f.name: f for f in text_string_to_metric_families(page)}
    held = {(s.labels["gpu"], s.labels["class"]): s.value for s in families["nvidia_gpu_performance_finding"].samples}
    assert held[("0", "gpu_idle_allocated")] == 1.0 and held[("2", "gpu_idle_allocated")] == 0.0
    assert len(held) == 8 * 7
    idle = {
        (s.labels["gpu"], s.labels["namespace"], s.labels["pod"]): s.value
        for s in families["nvidia_gpu_workload_idle_allocated_seconds"].samples
        if s.name.endswith("_total")
    }
    assert idle[("0", "ml-research", "notebook-7")] == pytest.approx(78.0, abs=2.0)
    assert idle[("2", "ml", "trainer-0")] < 10.0  # its warm-up only
    energy = [s for s in families["nvidia_gpu_workload_energy_joules"].samples if s.name.endswith("_total")]
    assert len(energy) == 8 and all(s.value > 0 for s in energy)
