"""GPM profiling and MIG devices in the NVML backend, through the real pynvml with GPM and MIG faked."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpu_triage.exporter.backends.base import GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.backends.nvml.gpm import MIN_GAP_SECONDS, GpmProfiler
from gpu_triage.exporter.backends.readings import Activity, Memory, Processes, Profiling, Utilization
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from tests.conftest import FakeClock
from tests.nvml_fake import FakeNvml
from tests.nvml_gpm_fake import FakeGpmMig


class Timeline:
    """One clock for the simulator, GPM's sample times and the profiler's waits: a wait moves it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.clock.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def timeline(clock: FakeClock) -> Timeline:
    return Timeline(clock)


def _backend(sim: SimBackend, timeline: Timeline, monkeypatch: pytest.MonkeyPatch) -> tuple[NvmlBackend, FakeGpmMig]:
    base = FakeNvml(sim)
    base.install(monkeypatch)
    gpm = FakeGpmMig(base, clock=timeline.monotonic)
    gpm.install(monkeypatch)
    backend = NvmlBackend()
    backend.gpm = GpmProfiler(clock=timeline.monotonic, sleep=timeline.sleep)
    backend.discover()
    return backend, gpm


@pytest.fixture
def nvml(
    sim: SimBackend, timeline: Timeline, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[NvmlBackend, FakeGpmMig]]:
    timeline.clock.advance(400)  # training
    backend, gpm = _backend(sim, timeline, monkeypatch)
    yield backend, gpm
    backend.close()
    assert gpm.samples == {}, "every GPM sample is freed on close"


def profiling(backend: NvmlBackend, gpu: int = 0) -> Profiling:
    result = backend.read(backend.discover()[gpu], Collector.PROFILING)
    assert isinstance(result.reading, Profiling)
    return result.reading


def assert_same_activity(ours: Activity | None, truth: Activity | None) -> None:
    assert ours is not None and truth is not None
    for name in ("graphics_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert getattr(ours, name) == pytest.approx(getattr(truth, name), abs=1e-9), name
    for name in ("fp64_active", "fp32_active", "fp16_active", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"):
        assert getattr(ours, name) == pytest.approx(getattr(truth, name), rel=1e-9), name
    assert [(link.link, link.tx_bytes_per_second, link.rx_bytes_per_second) for link in ours.nvlink_links] == [
        (link.link, pytest.approx(link.tx_bytes_per_second), pytest.approx(link.rx_bytes_per_second))
        for link in truth.nvlink_links
    ]
    assert ours.nvlink_tx_bytes_per_second is None, "per link, so no total that would count twice"


def test_values_are_the_gpus_in_base_units(nvml: tuple[NvmlBackend, FakeGpmMig], sim: SimBackend) -> None:
    backend, _ = nvml
    for gpu in range(8):
        ours = profiling(backend, gpu)
        assert (ours.source, ours.status) == ("gpm", "sampling")
        truth = sim.read(sim.discover()[gpu], Collector.PROFILING).reading
        assert isinstance(truth, Profiling)
        assert_same_activity(ours.gpu, truth.gpu)


def test_one_sample_per_collection_after_the_first(
    nvml: tuple[NvmlBackend, FakeGpmMig], timeline: Timeline, sim: SimBackend
) -> None:
    backend, gpm = nvml
    profiling(backend)
    assert len(timeline.waits) == 1 and timeline.waits[0] >= MIN_GAP_SECONDS  # the first read pairs two samples
    assert gpm.calls["nvmlGpmSampleGet"] == 2 and len(gpm.samples) == 1  # one kept for the next read
    for _ in range(3):
        timeline.clock.advance(60)
        ours = profiling(backend)
        truth = sim.read(sim.discover()[0], Collector.PROFILING).reading
        assert_same_activity(ours.gpu, truth.gpu)  # type: ignore[attr-defined]
    assert len(timeline.waits) == 1, "no waiting once a sample is kept"
    assert gpm.calls["nvmlGpmSampleGet"] == 5 and gpm.calls["nvmlGpmMetricsGet"] == 4
    assert len(gpm.samples) == 1


def test_reads_closer_than_the_minimum_gap_wait_for_it(
    nvml: tuple[NvmlBackend, FakeGpmMig], timeline: Timeline
) -> None:
    backend, _ = nvml
    profiling(backend)
    timeline.clock.advance(0.02)
    assert profiling(backend).gpu is not None  # the fake refuses samples under 100 ms apart
    assert len(timeline.waits) == 2 and timeline.waits[1] == pytest.approx(MIN_GAP_SECONDS)


def test_a_gpu_without_gpm_has_no_profiling_and_says_why(
    sim: SimBackend, timeline: Timeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, gpm = _backend(sim, timeline, monkeypatch)
    gpm.unsupported.add(2)
    assert profiling(backend, 2) == Profiling(None, "GPM is not supported on this GPU (Hopper and later have it)")
    assert profiling(backend, 3).source == "gpm"
    assert gpm.calls["nvmlGpmQueryDeviceSupport"] == 2
    profiling(backend, 2)
    assert gpm.calls["nvmlGpmQueryDeviceSupport"] == 2, "the answer is kept"
    backend.close()


def test_a_driver_without_gpm(sim: SimBackend, timeline: Timeline, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, gpm = _backend(sim, timeline, monkeypatch)
    gpm.base.errors[("nvmlGpmQueryDeviceSupport", None)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    result = backend.read(backend.discover()[0], Collector.PROFILING)
    assert result.failed_fields == () and result.reading == Profiling(
        None, "this driver has no GPM (NVML answered not supported)"
    )
    backend.close()


def test_turned_off_for_another_profiler(nvml: tuple[NvmlBackend, FakeGpmMig]) -> None:
    backend, gpm = nvml
    profiling(backend)
    backend.gpm.turn_off("a DCGM host engine watches the profiling fields")
    assert gpm.samples == {}
    assert profiling(backend) == Profiling(None, "a DCGM host engine watches the profiling fields")
    assert gpm.calls["nvmlGpmSampleGet"] == 2


def test_a_lost_gpu_frees_its_samples_and_starts_over(
    nvml: tuple[NvmlBackend, FakeGpmMig], sim: SimBackend, timeline: Timeline
) -> None:
    backend, gpm = nvml
    profiling(backend, 3)
    lost = sim.inject(FaultSpec(gpu=3, kind="gpu_lost"))
    timeline.clock.advance(60)
    with pytest.raises(GpuLostError):
        profiling(backend, 3)
    assert gpm.samples == {}
    sim.clear_fault(lost.id)
    timeline.clock.advance(60)
    assert profiling(backend, 3).gpu is not None
    assert len(timeline.waits) == 2, "after the loss it pairs two fresh samples, not one from before"


def test_a_metric_the_gpu_lacks_is_absent_alone(nvml: tuple[NvmlBackend, FakeGpmMig]) -> None:
    backend, gpm = nvml
    gpm.metric_errors[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY] = pynvml.NVML_ERROR_NOT_SUPPORTED
    reading = profiling(backend).gpu
    assert reading is not None and reading.sm_occupancy is None and reading.sm_active is not None


def test_a_failed_metrics_call_fails_the_collector_and_keeps_the_sample(
    nvml: tuple[NvmlBackend, FakeGpmMig], timeline: Timeline
) -> None:
    backend, gpm = nvml
    profiling(backend)
    gpm.base.errors[("nvmlGpmMetricsGet", None)] = pynvml.NVML_ERROR_UNKNOWN
    timeline.clock.advance(60)
    result = backend.read(backend.discover()[0], Collector.PROFILING)
    assert result.failed_fields == ("gpm_metrics",) and result.reading.gpu is None  # type: ignore[attr-defined]
    del gpm.base.errors[("nvmlGpmMetricsGet", None)]
    timeline.clock.advance(60)
    assert profiling(backend).gpu is not None and len(timeline.waits) == 1
    assert len(gpm.samples) == 1


def test_mig_devices_have_their_memory_processes_and_activity(
    timeline: Timeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend(load_scenario("h100-mig"), clock=timeline.clock)
    timeline.clock.advance(300)
    backend, gpm = _backend(sim, timeline, monkeypatch)
    for gpu in (0, 1, 2):
        identity = backend.discover()[gpu]
        for collector in (Collector.MEMORY, Collector.PROCESSES, Collector.UTILIZATION):
            ours = backend.read(identity, collector)
            truth = sim.read(identity, collector).reading
            assert ours.failed_fields == ()
            if isinstance(truth, Processes):  # names come from /proc
                assert isinstance(ours.reading, Processes) and ours.reading.processes is not None
                assert [(p.pid, p.used_bytes, p.instance) for p in ours.reading.processes] == [
                    (p.pid, p.used_bytes, p.instance) for p in truth.processes or ()
                ]
                assert ours.reading.instances == truth.instances
            else:
                assert ours.reading == truth, collector
        ours_profile = profiling(backend, gpu)
        truth_profile = sim.read(identity, Collector.PROFILING).reading
        assert isinstance(truth_profile, Profiling)
        assert [p.instance for p in ours_profile.instances] == [p.instance for p in truth_profile.instances]
        for mine, real in zip(ours_profile.instances, truth_profile.instances, strict=True):
            assert mine.activity.sm_active == pytest.approx(real.activity.sm_active)
            assert mine.activity.pcie_tx_bytes_per_second is None  # the buses are the whole GPU's
    memory = backend.read(backend.discover()[0], Collector.MEMORY).reading
    assert isinstance(memory, Memory)
    assert [(m.instance.gpu_instance, m.instance.profile) for m in memory.instances] == [(1, "3g.40gb"), (2, "4g.40gb")]
    assert backend.read(backend.discover()[0], Collector.UTILIZATION).reading == Utilization(None, None)
    backend.close()
    assert gpm.samples == {}


def test_the_reads_of_a_poll_share_one_listing_of_mig_devices_unless_a_read_failed_since(
    timeline: Timeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend(load_scenario("h100-mig"), clock=timeline.clock)
    timeline.clock.advance(300)
    backend, gpm = _backend(sim, timeline, monkeypatch)
    gpu = backend.discover()[0]

    def listings() -> int:  # each listing asks for the slot count once
        return gpm.calls.get("nvmlDeviceGetMaxMigDeviceCount", 0)

    for collector in (Collector.MEMORY, Collector.PROCESSES, Collector.PROFILING):
        backend.read(gpu, collector)
    assert listings() == 1
    backend.read(gpu, Collector.MEMORY)  # the next poll
    assert listings() == 2
    lost = sim.inject(FaultSpec(gpu=0, kind="gpu_lost"))
    with pytest.raises(GpuLostError):
        backend.read(gpu, Collector.PROCESSES)
    sim.clear_fault(lost.id)
    backend.read(gpu, Collector.PROFILING)  # has not taken the listing, but the GPU failed a read since
    assert listings() == 3
    backend.close()
