"""The simulator's readers, one per collector: what a read of a simulated GPU sees (`View`: its shape,
its state now, the faults on it) turned into a reading, as NVML would give it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpu_triage.exporter.backends.base import Collector, require_every_collector
from gpu_triage.exporter.backends.readings import ClockDomain as Domain
from gpu_triage.exporter.backends.readings import (
    Clocks,
    Ecc,
    HealthWatch,
    InstanceActivity,
    InstanceMemory,
    Inventory,
    LinkReading,
    LinkState,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    ProcessReading,
    Profiling,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    Utilization,
)
from gpu_triage.exporter.backends.sim.activity import activity, memory_controller, pcie
from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultKind
from gpu_triage.exporter.backends.sim.mig import COMPUTE_SLICES, SimInstance
from gpu_triage.exporter.backends.sim.model import GpuState, clock_reasons, hash_pair, noise
from gpu_triage.exporter.backends.sim.scenario import GpuShape, NodeShape

MHZ = 1e6


@dataclass(frozen=True, slots=True)
class View:
    """What a simulated read sees: the GPU's shape and state now, and the faults on it."""

    gpu: int
    node: NodeShape
    state: GpuState
    seed: int
    faults: list[ActiveFault]
    kinds: set[FaultKind]
    instances: tuple[SimInstance, ...]  # its MIG devices

    @property
    def shape(self) -> GpuShape:
        return self.node.gpus

    @property
    def mig(self) -> bool:
        return self.gpu in self.shape.mig_instances

    def instance_utilization(self, i: int) -> float:
        """A MIG instance's own load: the GPU's workload phase, each instance a little apart."""
        return min(1.0, max(0.0, self.state.utilization * (1 + 0.15 * self.noise(20 + i))))

    @property
    def busy(self) -> bool:
        return self.state.utilization >= 0.01

    @property
    def noise(self) -> Callable[[int], float]:
        return lambda channel: noise(self.seed, self.gpu, self.state.tick, channel)


def _inventory(v: View) -> Inventory:
    return Inventory(
        name=v.shape.model,
        serial=f"{1650923000000 + hash_pair(v.seed, v.gpu) % 1000000:013d}",
        vbios_version=v.node.vbios_version,
        driver_version=v.node.driver_version,
        cuda_driver_version=v.node.cuda_driver_version,
        mig_enabled=v.mig,
    )


def _utilization(v: View) -> Utilization:
    if v.mig:  # as NVML: "not supported" on a MIG-enabled GPU; profiling has each instance's activity
        return Utilization(None, None)
    mem_ratio = memory_controller(v.state.utilization, v.noise)
    return Utilization(gpu_ratio=round(v.state.utilization, 2), memory_controller_ratio=round(mem_ratio, 2))


def _instance_memory(v: View) -> tuple[InstanceMemory, ...]:
    return tuple(
        InstanceMemory(i.mig, int(i.memory_bytes * v.state.memory_used_ratio) if v.busy else 0, i.memory_bytes)
        for i in v.instances
    )


def _memory(v: View) -> Memory:
    reserved = v.shape.reserved_memory_bytes
    if v.mig:
        parts = _instance_memory(v)
        used = sum(m.used_bytes or 0 for m in parts)
        return Memory(used_bytes=used, total_bytes=v.shape.memory_bytes, reserved_bytes=reserved, instances=parts)
    usable = v.shape.memory_bytes - reserved
    used = int(usable * v.state.memory_used_ratio) if v.busy else 0
    return Memory(used_bytes=used, total_bytes=v.shape.memory_bytes, reserved_bytes=reserved)


def _power(v: View) -> Power:
    return Power(
        usage_watts=round(v.state.power_watts, 3),
        limit_watts=v.shape.power_limit_watts,
        energy_joules=round(v.state.energy_joules, 3),
    )


def _thermal(v: View) -> Thermal:
    return Thermal(
        gpu_celsius=float(round(v.state.temperature_celsius)),
        memory_celsius=float(round(v.state.memory_temperature_celsius)),
        fan_ratio=round(0.3 + 0.5 * v.state.utilization, 2) if v.shape.fan else None,
    )


def _clocks(v: View) -> Clocks:
    shape = v.shape
    slow = 1.0
    if FaultKind.THERMAL_SLOWDOWN in v.kinds:
        slow *= 0.6
    if FaultKind.POWER_SLOWDOWN in v.kinds:
        slow *= 0.75
    sm = (shape.max_sm_clock_mhz if v.busy else shape.idle_sm_clock_mhz) * slow
    video = shape.max_video_clock_mhz if v.busy else 765.0
    current = {
        Domain.SM: round(sm) * MHZ,
        Domain.GRAPHICS: round(sm) * MHZ,
        Domain.MEMORY: shape.max_memory_clock_mhz * MHZ,
        Domain.VIDEO: video * MHZ,
    }
    maximum = {
        Domain.SM: shape.max_sm_clock_mhz * MHZ,
        Domain.GRAPHICS: shape.max_sm_clock_mhz * MHZ,
        Domain.MEMORY: shape.max_memory_clock_mhz * MHZ,
        Domain.VIDEO: shape.max_video_clock_mhz * MHZ,
    }
    return Clocks(current, maximum, clock_reasons(v.state.utilization, v.kinds), performance_state=0)


def _pcie(v: View) -> Pcie:
    tx, rx = pcie(v.state.utilization, v.noise)
    return Pcie(
        link_generation=v.shape.pcie_generation,
        max_link_generation=v.shape.pcie_generation,
        link_width=v.shape.pcie_width,
        max_link_width=v.shape.pcie_width,
        replay_errors=v.state.pcie_replays,
        tx_bytes_per_second=round(tx, -3),
        rx_bytes_per_second=round(rx, -3),
    )


def _nvlink(v: View) -> NvLink:
    down = {f.spec.link for f in v.faults if f.spec.kind is FaultKind.NVLINK_DOWN}
    s = v.state
    return NvLink(
        tuple(
            LinkReading(
                link=i,
                state=LinkState.INACTIVE if i in down else LinkState.ACTIVE,
                replay_errors=s.nvlink_replays[i],
                recovery_errors=s.nvlink_recoveries[i],
                crc_errors=s.nvlink_crcs[i],
            )
            for i in range(v.shape.nvlink_links)
        )
    )


def _processes(v: View) -> Processes:
    migs = tuple(i.mig for i in v.instances)
    if not v.busy:
        return Processes((), migs)
    if v.mig:  # one server per MIG instance
        return Processes(
            tuple(
                ProcessReading(41000 + 17 * v.gpu + m.instance.gpu_instance, "python3", m.used_bytes, m.instance)
                for m in _instance_memory(v)
            ),
            migs,
        )
    usable = v.shape.memory_bytes - v.shape.reserved_memory_bytes
    used = int(usable * v.state.memory_used_ratio)
    return Processes((ProcessReading(pid=41000 + 17 * v.gpu, name="python3", used_bytes=used),))


def _profiling(v: View) -> Profiling:
    down = frozenset(f.spec.link for f in v.faults if f.spec.kind is FaultKind.NVLINK_DOWN and f.spec.link is not None)
    parts = tuple(
        InstanceActivity(inst.mig, activity(v.instance_utilization(i), v.noise, buses=False))
        for i, inst in enumerate(v.instances)
    )
    utilization = v.state.utilization
    if v.mig:  # the whole GPU: its instances' activity, weighted by their share of the SMs
        utilization = (
            sum(v.instance_utilization(i) * inst.slices for i, inst in enumerate(v.instances)) / COMPUTE_SLICES
        )
    whole = activity(utilization, v.noise, links=v.shape.nvlink_links, down=down)
    return Profiling(source="sim", status="simulated", gpu=whole, instances=parts)


def _health(v: View) -> HealthWatch:
    return HealthWatch(None)  # the simulator plays NVML, which has no health watches


def _recovery(v: View) -> Recovery:
    return Recovery(action=0)


def _ecc(v: View) -> Ecc:
    s = v.state
    # Hopper reports row remapping; the pre-Ampere page-retirement calls are "not supported".
    return Ecc(
        enabled=True,
        corrected_volatile=s.ecc_corrected,
        uncorrected_volatile=s.ecc_uncorrected,
        corrected_aggregate=s.ecc_corrected_aggregate,
        uncorrected_aggregate=s.ecc_uncorrected_aggregate,
        retired_pages_single_bit=None,
        retired_pages_double_bit=None,
        retired_pages_pending=None,
    )


def _remapping(v: View) -> Remapping:
    return Remapping(
        correctable_rows=v.state.remapped_correctable,
        uncorrectable_rows=v.state.remapped_uncorrectable,
        pending=FaultKind.ROW_REMAP_PENDING in v.kinds,
        failure=FaultKind.ROW_REMAP_FAILURE in v.kinds,
    )


READERS: dict[Collector, Callable[[View], Reading]] = {
    Collector.INVENTORY: _inventory,
    Collector.UTILIZATION: _utilization,
    Collector.MEMORY: _memory,
    Collector.POWER: _power,
    Collector.THERMAL: _thermal,
    Collector.CLOCKS: _clocks,
    Collector.PCIE: _pcie,
    Collector.NVLINK: _nvlink,
    Collector.PROCESSES: _processes,
    Collector.RECOVERY: _recovery,
    Collector.ECC: _ecc,
    Collector.REMAPPING: _remapping,
    Collector.PROFILING: _profiling,
    Collector.HEALTH: _health,
}
require_every_collector(READERS, "sim")
