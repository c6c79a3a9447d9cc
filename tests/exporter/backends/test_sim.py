"""The simulator moves like hardware, deterministically, and fails the way NVML fails."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from gpu_triage.exporter.backends.base import GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import (
    ClockEventReason,
    Ecc,
    HealthWatch,
    Inventory,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    Profiling,
    Remapping,
    Thermal,
    Utilization,
)
from gpu_triage.exporter.backends.readings import Clocks as ClocksReading
from gpu_triage.exporter.backends.sim import FaultError, FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.backends.sim.model import noise
from tests.conftest import FakeClock


def read(sim: SimBackend, gpu: int, collector: Collector) -> object:
    return sim.read(sim.discover()[gpu], collector).reading


def power(sim: SimBackend, gpu: int = 0) -> Power:
    reading = read(sim, gpu, Collector.POWER)
    assert isinstance(reading, Power)
    return reading


def thermal(sim: SimBackend, gpu: int = 0) -> Thermal:
    reading = read(sim, gpu, Collector.THERMAL)
    assert isinstance(reading, Thermal)
    return reading


def clocks(sim: SimBackend, gpu: int = 0) -> ClocksReading:
    reading = read(sim, gpu, Collector.CLOCKS)
    assert isinstance(reading, ClocksReading)
    return reading


def test_noise_is_deterministic_and_bounded() -> None:
    values = [noise(7, gpu, tick) for gpu in range(8) for tick in range(500)]
    assert values == [noise(7, gpu, tick) for gpu in range(8) for tick in range(500)]
    assert all(-1.0 <= v < 1.0 for v in values)
    assert len(set(values)) > 3900  # not stuck on a few values
    assert noise(7, 0, 1) != noise(8, 0, 1)


def test_same_seed_and_clock_give_the_same_values_however_often_sampled() -> None:
    scenario = load_scenario("h100-training")
    dense_clock, sparse_clock = FakeClock(), FakeClock()
    dense, sparse = SimBackend(scenario, clock=dense_clock), SimBackend(scenario, clock=sparse_clock)
    for _ in range(300):  # one sample per second...
        dense_clock.advance(1)
        dense.read(dense.discover()[0], Collector.THERMAL)
    sparse_clock.advance(300)  # ...or one after five minutes
    for collector in Collector:
        for gpu in dense.discover():
            assert dense.read(gpu, collector) == sparse.read(gpu, collector)


def test_power_follows_utilization_and_temperature_lags_it(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(30)  # the "job start" phase: idle
    idle = power(sim)
    assert idle.usage_watts is not None and idle.usage_watts < 100
    clock.advance(35)  # training began at 60 s
    busy = power(sim)
    assert busy.usage_watts is not None and busy.usage_watts > 600
    assert busy.limit_watts is not None and busy.usage_watts <= busy.limit_watts
    temps = []
    for _ in range(10):
        temps.append(thermal(sim).gpu_celsius)
        clock.advance(20)
    assert temps == sorted(temps), "temperature should climb toward its new level, not jump"
    assert temps[0] is not None and temps[-1] is not None and temps[-1] - temps[0] > 15
    assert temps[-1] < 28 + 700 * 0.065 + 1  # ...and settle below ambient + power x celsius_per_watt


def test_energy_integrates_power(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(100)
    before = power(sim)
    total = 0.0
    for _ in range(60):
        clock.advance(1)
        p = power(sim)
        assert p.usage_watts is not None
        total += p.usage_watts
    after = power(sim)
    assert before.energy_joules is not None and after.energy_joules is not None
    assert after.energy_joules - before.energy_joules == pytest.approx(total, rel=1e-6)


def test_ecc_counters_grow_only_when_a_fault_says_so(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(600)
    quiet = read(sim, 5, Collector.ECC)
    assert isinstance(quiet, Ecc) and quiet.corrected_volatile == 0 and quiet.uncorrected_volatile == 0
    sim.inject(FaultSpec(gpu=5, kind="ecc_correctable", count=3))
    sim.inject(FaultSpec(gpu=5, kind="ecc_uncorrectable"))
    clock.advance(600)
    ecc = read(sim, 5, Collector.ECC)
    assert isinstance(ecc, Ecc)
    assert (ecc.corrected_volatile, ecc.uncorrected_volatile, ecc.uncorrected_aggregate) == (3, 1, 1)
    other = read(sim, 4, Collector.ECC)
    assert isinstance(other, Ecc) and other.corrected_volatile == 0


@pytest.mark.parametrize(
    ("kind", "reasons"),
    [
        ("thermal_slowdown", {ClockEventReason.HW_THERMAL_SLOWDOWN, ClockEventReason.HW_SLOWDOWN}),
        ("power_slowdown", {ClockEventReason.SW_POWER_CAP, ClockEventReason.HW_POWER_BRAKE_SLOWDOWN}),
    ],
)
def test_slowdowns_drop_clocks_and_set_their_reasons(
    sim: SimBackend, clock: FakeClock, kind: str, reasons: set[ClockEventReason]
) -> None:
    clock.advance(300)
    normal = clocks(sim, 2)
    sim.inject(FaultSpec(gpu=2, kind=kind, duration_seconds=120))
    clock.advance(60)
    slow = clocks(sim, 2)
    assert slow.current_hz["sm"] < 0.8 * normal.current_hz["sm"]
    assert slow.event_reasons is not None and normal.event_reasons == 0
    assert {r for r in ClockEventReason if slow.event_reasons & r.bit} >= reasons
    assert clocks(sim, 3).event_reasons == 0  # only the faulty GPU
    clock.advance(120)  # the fault runs out
    assert clocks(sim, 2).event_reasons == 0


def test_thermal_slowdown_heats_the_gpu(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(900)
    before = thermal(sim, 2).gpu_celsius
    sim.inject(FaultSpec(gpu=2, kind="thermal_slowdown"))
    clock.advance(200)
    after = thermal(sim, 2).gpu_celsius
    assert before is not None and after is not None and after > before + 15


def test_lost_gpu_fails_every_call_until_cleared(sim: SimBackend, clock: FakeClock) -> None:
    fault = sim.inject(FaultSpec(gpu=3, kind="gpu_lost"))
    for collector in Collector:
        with pytest.raises(GpuLostError):
            sim.read(sim.discover()[3], collector)
    assert isinstance(read(sim, 2, Collector.POWER), Power)  # the others answer
    assert sim.clear_fault(fault.id)
    assert isinstance(read(sim, 3, Collector.POWER), Power)


def test_a_reset_makes_the_gpu_unreachable_until_it_is_over(sim: SimBackend, clock: FakeClock) -> None:
    sim.inject(FaultSpec(gpu=5, kind="gpu_reset", duration_seconds=3))
    with pytest.raises(GpuLostError, match="reset"):
        sim.read(sim.discover()[5], Collector.POWER)
    clock.advance(3)
    assert isinstance(read(sim, 5, Collector.POWER), Power)


def test_hung_call_blocks_until_cleared(sim: SimBackend) -> None:
    fault = sim.inject(FaultSpec(gpu=1, kind="hung_call", collector="power"))
    done = threading.Event()

    def call() -> None:
        sim.read(sim.discover()[1], Collector.POWER)
        done.set()

    threading.Thread(target=call, daemon=True).start()
    assert not done.wait(0.3), "the call should hang"
    assert isinstance(read(sim, 1, Collector.THERMAL), Thermal)  # only the power call hangs
    sim.clear_fault(fault.id)
    assert done.wait(2), "clearing the fault releases the call"


def test_nvlink_down_and_remap_faults(sim: SimBackend, clock: FakeClock) -> None:
    sim.inject(FaultSpec(gpu=4, kind="nvlink_down", link=7))
    sim.inject(FaultSpec(gpu=6, kind="row_remap_pending"))
    sim.inject(FaultSpec(gpu=6, kind="row_remap_failure"))
    links = read(sim, 4, Collector.NVLINK)
    assert isinstance(links, NvLink) and len(links.links) == 18
    assert [link.link for link in links.links if not link.up] == [7]
    assert links.links[7].recovery_errors == 1
    remap = read(sim, 6, Collector.REMAPPING)
    assert isinstance(remap, Remapping) and remap.pending and remap.failure and remap.uncorrectable_rows == 1


def test_injected_xid_arrives_as_a_driver_event(sim: SimBackend, clock: FakeClock) -> None:
    assert sim.wait_xids(0.0) == []
    sim.inject(FaultSpec(gpu=5, kind="xid", xid=79, message="GPU has fallen off the bus."))
    events = sim.wait_xids(1.0)
    assert [(e.gpu, e.code, e.timestamp) for e in events] == [(5, 79, clock.now)]


def test_scenario_faults_fire_on_schedule() -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-faults"), clock=clock)
    clock.advance(119)
    assert sim.wait_xids(0.0) == []
    clock.advance(1)
    assert [(e.gpu, e.code) for e in sim.wait_xids(0.0)] == [(1, 13)]
    clock.advance(400)
    assert [(e.gpu, e.code) for e in sim.wait_xids(0.0)] == [(6, 48), (3, 79)]
    with pytest.raises(GpuLostError):
        sim.read(sim.discover()[3], Collector.POWER)
    kinds = sorted(f.spec.kind.value for f in sim.faults())
    assert "thermal_slowdown" not in kinds  # ran out after its 300 s
    assert "gpu_lost" in kinds


def test_faults_that_do_not_fit_the_node_are_refused(sim: SimBackend) -> None:
    with pytest.raises(FaultError, match="no GPU 8"):
        sim.inject(FaultSpec(gpu=8, kind="gpu_lost"))
    with pytest.raises(FaultError, match="no NVLink link 18"):
        sim.inject(FaultSpec(gpu=0, kind="nvlink_down", link=18))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpu": 0, "kind": "xid"}, "'xid' is required"),
        ({"gpu": 0, "kind": "gpu_lost", "xid": 79}, "'xid' is required for kind xid and only allowed there"),
        ({"gpu": 0, "kind": "nvlink_down"}, "'link' is required"),
        ({"gpu": 0, "kind": "meltdown"}, "Input should be"),
        ({"gpu": -1, "kind": "gpu_lost"}, "greater than or equal to 0"),
        ({"gpu": 0, "kind": "gpu_lost", "duration_seconds": 0}, "greater than 0"),
        ({"gpu": 0, "kind": "gpu_lost", "colour": "red"}, "Extra inputs are not permitted"),
    ],
)
def test_fault_spec_validation(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FaultSpec.model_validate(body)


def test_a_hung_call_with_a_duration_ends_on_its_own() -> None:
    sim = SimBackend(load_scenario("h100-training"))  # real clock: the fault must run out in real time
    sim.inject(FaultSpec(gpu=0, kind="hung_call", duration_seconds=0.3))
    started = time.monotonic()
    sim.read(sim.discover()[0], Collector.POWER)
    assert 0.2 < time.monotonic() - started < 2.0


def profiling(sim: SimBackend, gpu: int = 0) -> Profiling:
    reading = read(sim, gpu, Collector.PROFILING)
    assert isinstance(reading, Profiling) and reading.gpu is not None
    return reading


def test_profiling_follows_the_same_utilization_as_power(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(30)  # idle
    idle = profiling(sim).gpu
    assert idle is not None and idle.sm_active == 0 and idle.tensor_active == 0 and idle.dram_active == 0
    clock.advance(300)  # training
    for gpu in range(8):
        busy = profiling(sim, gpu).gpu
        assert busy is not None and busy.sm_active is not None and busy.tensor_active is not None
        assert 0.8 < busy.sm_active < busy.graphics_engine_active <= 1  # type: ignore[operator]
        assert 0.4 < busy.tensor_active < busy.sm_active
        assert busy.fp64_active < busy.fp16_active < busy.fp32_active < busy.tensor_active  # type: ignore[operator]
        p = power(sim, gpu)
        assert p.usage_watts is not None and p.usage_watts > 600
        pcie = read(sim, gpu, Collector.PCIE)
        assert isinstance(pcie, Pcie)  # the two PCIe sources agree: the page shows one of them
        assert (busy.pcie_tx_bytes_per_second, busy.pcie_rx_bytes_per_second) == (
            pcie.tx_bytes_per_second,
            pcie.rx_bytes_per_second,
        )
        assert len(busy.nvlink_links) == 18 and all(link.tx_bytes_per_second for link in busy.nvlink_links)


def test_a_link_that_is_down_carries_nothing(sim: SimBackend, clock: FakeClock) -> None:
    clock.advance(300)
    sim.inject(FaultSpec(gpu=4, kind="nvlink_down", link=7))
    links = profiling(sim, 4).gpu.nvlink_links  # type: ignore[union-attr]
    assert [link.link for link in links if not link.tx_bytes_per_second and not link.rx_bytes_per_second] == [7]


def test_mig_gpus_have_instances_with_their_own_memory_processes_and_activity() -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-mig"), clock=clock)
    clock.advance(300)
    for gpu in (0, 1):
        inventory = read(sim, gpu, Collector.INVENTORY)
        assert isinstance(inventory, Inventory) and inventory.mig_enabled
        assert read(sim, gpu, Collector.UTILIZATION) == Utilization(None, None)  # as NVML on a MIG GPU
        memory = read(sim, gpu, Collector.MEMORY)
        assert isinstance(memory, Memory) and memory.total_bytes is not None
        assert [m.instance.profile for m in memory.instances] == ["3g.40gb", "4g.40gb"]
        assert memory.used_bytes == sum(m.used_bytes or 0 for m in memory.instances) > 0
        for m in memory.instances:
            assert m.total_bytes is not None and 0.45 < m.total_bytes / memory.total_bytes < 0.55
        procs = read(sim, gpu, Collector.PROCESSES)
        assert isinstance(procs, Processes) and procs.processes is not None
        assert {p.instance for p in procs.processes} == {m.instance for m in memory.instances} == set(procs.instances)
        prof = profiling(sim, gpu)
        assert [p.instance for p in prof.instances] == [m.instance for m in memory.instances]
        assert all(
            p.activity.nvlink_links == () and p.activity.pcie_tx_bytes_per_second is None for p in prof.instances
        )
        # The whole GPU is its instances' activity weighted by their SMs (3 and 4 of 7 slices).
        weighted = sum(p.activity.graphics_engine_active * s for p, s in zip(prof.instances, (3, 4), strict=True))  # type: ignore[operator]
        assert prof.gpu.graphics_engine_active == pytest.approx(weighted / 7, abs=0.002)  # type: ignore[union-attr]
    uuids = {m.instance.uuid for g in (0, 1) for m in read(sim, g, Collector.MEMORY).instances}  # type: ignore[attr-defined]
    assert len(uuids) == 4 and all(u.startswith("MIG-") for u in uuids)
    whole = read(sim, 2, Collector.MEMORY)
    assert isinstance(whole, Memory) and whole.instances == ()
    assert isinstance(read(sim, 2, Collector.UTILIZATION), Utilization)
    assert read(sim, 2, Collector.UTILIZATION).gpu_ratio is not None  # type: ignore[attr-defined]


def test_the_simulator_has_no_dcgm_health_watches(sim: SimBackend) -> None:
    assert read(sim, 0, Collector.HEALTH) == HealthWatch(None)
