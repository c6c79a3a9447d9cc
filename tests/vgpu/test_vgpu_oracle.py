"""The NVML backend against the simulator's model, through a vGPU written without any of the backend's code.

The simulator's model holds the physical truth (watts, bytes, seconds, reasons by name). exporter/vgpu/image.py
writes it into the state file in NVML's units and meanings as nvml.h gives them, with constants of its
own; the C library answers pynvml; the NVML backend converts back with its constants. The simulator's
own readings of the same model are the expected values. A unit, a bit or a meaning the backend gets
wrong (power read as W, a clock-event bit off by one, KiB taken for kB) shows here as a difference,
and the mutants below prove that it does.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.vgpu.driver import VgpuDriver
from tests.conftest import START, FakeClock
from tests.vgpu.backend_ops import series
from tests.vgpu.conftest import REPO, Worker

BUSY_AT = 400  # seconds into each scenario: past the idle start, in the busy phase


@pytest.fixture
def drive(state_file: Path) -> Iterator[Callable[[str], tuple[SimBackend, VgpuDriver, FakeClock]]]:
    drivers: list[VgpuDriver] = []

    def start(scenario: str) -> tuple[SimBackend, VgpuDriver, FakeClock]:
        clock = FakeClock(START)
        sim = SimBackend(load_scenario(scenario), clock=clock)
        clock.advance(BUSY_AT)
        driver = VgpuDriver(sim, state_file)
        drivers.append(driver)
        return sim, driver, clock

    yield start
    for d in drivers:
        d.stop()


def differences(ours: Any, truth: Any, path: str = "") -> list[str]:
    """Where the backend's reading differs from the model's, allowing only for NVML's integer units."""
    if isinstance(truth, dict):
        if set(ours) != set(truth):
            return [f"{path}: keys {sorted(map(str, ours))} != {sorted(map(str, truth))}"]
        return [d for key in truth for d in differences(ours[key], truth[key], f"{path}.{key}")]
    if isinstance(truth, list | tuple):
        if len(ours) != len(truth):
            return [f"{path}: {len(ours)} items != {len(truth)}"]
        return [d for i, (a, b) in enumerate(zip(ours, truth, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(truth, float) and not isinstance(ours, bool):
        # Ratios go through whole percent (NVML's utilization); everything else is exact to rounding.
        if ours is None or ours != pytest.approx(truth, rel=1e-9, abs=0.006 if abs(truth) <= 1 else 1e-6):
            return [f"{path}: {ours!r} != {truth!r}"]
        return []
    return [] if ours == truth else [f"{path}: {ours!r} != {truth!r}"]


def compare(nvml: Worker, sim: SimBackend, driver: VgpuDriver, clock: FakeClock) -> list[str]:
    """Every collector of every GPU, one second after a first read that primes the counters."""
    nvml.run("ops.start()")
    for collector in Collector:
        for gpu in sim.discover():
            nvml.run(f"ops.read({gpu.index}, {collector.value!r})")
    clock.advance(1)
    driver.tick()
    nvml.run("ops.advance(1)")
    found = []
    for collector in Collector:
        for gpu in sim.discover():
            ours = nvml.run(f"result = ops.read({gpu.index}, {collector.value!r}, with_series=True)")
            if ours.get("failed"):
                found.append(f"{collector.value}[{gpu.index}] failed: {ours['failed']}")
            truth = dataclasses.asdict(sim.read(gpu, collector).reading)
            mine = ours.get("reading", {"lost": ours.get("lost")})
            if collector is Collector.PROCESSES:  # the simulated PIDs are not in this machine's /proc
                for proc in [*truth["processes"], *mine["processes"]]:
                    proc["name"] = None
            if collector is Collector.PROFILING:  # the values, not who measured them (gpm, sim)
                for reading in (truth, mine):
                    del reading["source"], reading["status"]
            found += differences(mine, _json(truth), f"{collector.value}[{gpu.index}]")
            # And as /metrics shows it, families and labels: a bit decoded under the wrong reason shows only here.
            shown, expected = ours.get("series", {}), series(sim.read(gpu, collector).reading)
            if collector is Collector.PROCESSES:
                shown, expected = _without_process_names(shown), _without_process_names(expected)
            found += differences(shown, expected, f"{collector.value}[{gpu.index}] series")
    return found


def _without_process_names(shown: dict[str, Any]) -> dict[str, Any]:
    return {key.replace(",python3", ","): value for key, value in shown.items()}


def _json(value: Any) -> Any:
    """The model's reading as it comes back from the worker: JSON keys, lists for tuples."""
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


@pytest.mark.parametrize(
    "scenario", ["h100-training", "h100-mig", "h200-mig", "b200-training", "a100-training", "l40s-inference"]
)
def test_every_collector_reads_what_the_model_has(
    worker: Callable[..., Worker], drive: Callable[[str], Any], state_file: Path, scenario: str
) -> None:
    sim, driver, clock = drive(scenario)
    assert compare(worker(state_file), sim, driver, clock) == []


# Deliberately wrong readers, each as a backend might get one wrong, and a scenario where the value it
# spoils is not zero: the comparison must catch every one.
MUTANTS = {
    "power read as W, not mW": (
        "r.READERS[C.POWER] = (lambda f: lambda *a: dataclasses.replace(f(*a), usage_watts=f(*a).usage_watts * 1000))"
        "(r.READERS[C.POWER])",
        "b200-training",
        "power[0].usage_watts",
    ),
    "clock-event bits off by one": (
        "import gpu_triage.exporter.backends.readings as rd\n"
        "rd._REASON_BITS.update({k: v << 1 for k, v in rd._REASON_BITS.items()})",
        "l40s-inference",  # GPU 2 runs hot: thermal reasons are set
        "clocks[2] series",
    ),
    "NVLink KiB taken for kB": (
        "import gpu_triage.exporter.backends.nvml.buses as b\nb.KIB = 1000",
        "b200-training",
        "nvlink[0].links[0].tx_bytes",
    ),
    "throttle ns taken for us": ("r.NS = 1e-6", "l40s-inference", "clocks[2].event_seconds"),
    "MHz taken for kHz": ("r.MHZ = 1e3", "a100-training", "clocks[0].current_hz"),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_a_wrong_unit_in_a_reader_is_caught(
    worker: Callable[..., Worker], drive: Callable[[str], Any], state_file: Path, mutant: str
) -> None:
    patch, scenario, where = MUTANTS[mutant]
    sim, driver, clock = drive(scenario)
    nvml = worker(state_file)
    nvml.run(
        "import dataclasses\nimport gpu_triage.exporter.backends.nvml.readers as r\n"
        f"from gpu_triage.exporter.backends.collectors import Collector as C\n{patch}"
    )
    found = compare(nvml, sim, driver, clock)
    assert any(d.startswith(where) for d in found), found


def test_the_vgpu_writer_imports_nothing_of_the_backend() -> None:
    """The writer's side of the comparison shares no constant with the readers it checks."""
    code = (
        "import sys\n"
        "import gpu_triage.exporter.vgpu.image, gpu_triage.exporter.vgpu.state\n"
        "bad = [m for m in sys.modules if m == 'pynvml' or m.startswith('gpu_triage.exporter.backends.nvml')"
        " or m in ('gpu_triage.exporter.backends.readings', 'gpu_triage.exporter.backends.sim.readers')]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
