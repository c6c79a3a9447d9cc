"""gpu-triage's NVML backend on the virtual GPU: every collector against the simulator, and the error policy.

The simulator's readings go into the state file in NVML's units (vgpu_driver.py, written from
nvml.h) and come back out through the C library, pynvml and the backend's own conversions. The two
sets of conversions were written apart, so a unit mistake in either shows as a difference here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.exporter.backends.base import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.backends.sim.vgpu_driver import VgpuDriver
from tests.conftest import START, FakeClock
from tests.vgpu.conftest import Worker, vs


@pytest.fixture
def driven(state_file: Path) -> Iterator[tuple[SimBackend, VgpuDriver]]:
    """The simulator 400 s into h100-training (busy), published once to the state file."""
    clock = FakeClock(START)
    sim = SimBackend(load_scenario("h100-training"), clock=clock)
    clock.advance(400)
    driver = VgpuDriver(sim, state_file)
    yield sim, driver
    driver.stop()


def assert_close(ours: Any, truth: Any, path: str = "") -> None:
    """Equal, allowing for the rounding NVML's integer units impose (KB/s, mW, percent, MHz)."""
    if isinstance(truth, dict):
        assert set(ours) == set(truth), path
        for key in truth:
            assert_close(ours[key], truth[key], f"{path}.{key}")
    elif isinstance(truth, list | tuple):
        assert len(ours) == len(truth), path
        for i, (a, b) in enumerate(zip(ours, truth, strict=True)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(truth, float) and not isinstance(ours, bool):
        # Byte rates go through whole KB/s; ratios through whole percent (NVML's utilization).
        assert ours == pytest.approx(truth, rel=1e-6, abs=500 if abs(truth) >= 1e5 else 0.006), path
    else:
        assert ours == truth, path


def test_every_collector_reads_what_the_simulator_has(
    worker: Callable[..., Worker], driven: tuple[SimBackend, VgpuDriver], state_file: Path
) -> None:
    sim, _ = driven
    nvml = worker(state_file)
    gpus = nvml.run("result = ops.start()")
    assert [tuple(g) for g in gpus] == [dataclasses.astuple(g) for g in sim.discover()]
    assert gpus[0][2] == "0000:18:00.0"  # NVML said 00000000:18:00.0
    for collector in Collector:
        for gpu in sim.discover():
            ours = nvml.run(f"result = ops.read({gpu.index}, {collector.value!r})")
            assert ours["failed"] == [], (collector, gpu.index)
            truth = dataclasses.asdict(sim.read(gpu, collector).reading)
            mine = ours["reading"]
            if collector is Collector.PROCESSES:  # the simulated PIDs are not in this machine's /proc
                for proc in [*truth["processes"], *mine["processes"]]:
                    proc["name"] = None
            if collector is Collector.PROFILING:  # the values, not who measured them (gpm, sim)
                for reading in (truth, mine):
                    del reading["source"], reading["status"]
            if collector is Collector.CLOCKS:  # JSON keys; the domains are the same
                truth = {**truth, "current_hz": dict(truth["current_hz"]), "max_hz": dict(truth["max_hz"])}
            assert_close(mine, truth, f"{collector.value}[{gpu.index}]")


def test_not_supported_is_absent_and_logged_once(nvml: Worker) -> None:
    nvml.run("ops.start()")
    for _ in range(3):
        thermal = nvml.run("result = ops.read(0, 'thermal')")
        assert thermal["failed"] == [] and thermal["reading"]["fan_ratio"] is None  # SXM: no fan
    fan = [r for r in nvml.run("result = ops.logs()") if r.get("field") == "fan_speed"]
    assert [(r["level"], r["nvml"]) for r in fan] == [("DEBUG", "NotSupported")]


def test_batched_field_values_have_their_own_return_codes(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    recovery, pending = 230, 144  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_PENDING
    node[0].field_overrides = [vs.FieldOverride(field_id=recovery, nvml_return=3)]  # NOT_SUPPORTED
    node[1].field_overrides = [vs.FieldOverride(field_id=recovery, nvml_return=999)]  # UNKNOWN
    node[2].field_overrides = [vs.FieldOverride(field_id=pending, nvml_return=15)]  # GPU_IS_LOST
    state.write(node)
    nvml.run("ops.start()")
    assert nvml.run("result = ops.read(0, 'recovery')") == {"reading": {"action": None}, "failed": []}
    assert nvml.run("result = ops.read(1, 'recovery')")["failed"] == ["recovery_action"]
    assert "GpuIsLost" in nvml.run("result = ops.read(2, 'remapping')")["lost"]


def test_a_failed_link_count_is_asked_again(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[4].field_overrides = [vs.FieldOverride(field_id=91, nvml_return=999)]  # NVLINK_LINK_COUNT: UNKNOWN
    state.write(node)
    nvml.run("ops.start()")
    first = nvml.run("result = ops.read(4, 'nvlink')")
    assert first == {"reading": {"links": []}, "failed": ["nvlink_link_count"]}
    node[4].field_overrides = []
    state.write(node)
    assert len(nvml.run("result = ops.read(4, 'nvlink')")["reading"]["links"]) == 18


def test_the_poller_over_nvml_isolates_a_lost_gpu(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[3].lost = True
    state.write(node)
    nvml.run("ops.start()")
    polled = nvml.run("result = ops.poll()")
    assert polled["status"] == ["up"] * 3 + ["lost"] + ["up"] * 4
    assert all(polled["success"].values())


def test_a_gpu_lost_before_start_is_listed_and_reads_as_lost(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[6].lost = True
    state.write(node)
    gpus = nvml.run("result = ops.start()")
    assert len(gpus) == 8 and gpus[6][1] == "unknown-6"
    assert "no NVML handle" in nvml.run("result = ops.read(6, 'power')")["lost"]


@pytest.mark.parametrize(
    ("state_of", "message"),
    [
        (lambda tmp: tmp / "missing", "not loaded"),  # no state file: the library says DRIVER_NOT_LOADED
        (lambda tmp: tmp / "garbage", "reboot the node"),  # another layout: LIB_RM_VERSION_MISMATCH
    ],
)
def test_init_errors_tell_the_user_what_to_do(
    worker: Callable[..., Worker], tmp_path: Path, state_of: Callable[[Path], Path], message: str
) -> None:
    (tmp_path / "garbage").write_bytes(b"GTVGPUST" + bytes(vs.FILE_SIZE))
    nvml = worker(state_of(tmp_path))
    assert message in nvml.run("result = ops.open_error()")
