"""The simulator backend: the scenario's GPUs behind the same contract as NVML.

It fails the way NVML fails: a lost GPU raises GpuLostError from every call, a hung call blocks
until its fault is cleared or runs out, and an injected XID arrives through `wait_xids`, the
same path as NVML's XID events.
"""

from __future__ import annotations

import bisect
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gpu_triage.diagnosis.pci import canonical_bus_id
from gpu_triage.exporter.backends.base import (
    Collector,
    DriverXid,
    GpuIdentity,
    GpuLostError,
    Result,
    require_every_collector,
)
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
from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultBook, FaultKind, FaultSpec
from gpu_triage.exporter.backends.sim.mig import COMPUTE_SLICES, SimInstance, instances
from gpu_triage.exporter.backends.sim.model import GpuState, NodeModel, clock_reasons, mix64, noise
from gpu_triage.exporter.backends.sim.scenario import GpuShape, NodeShape, Scenario

MHZ = 1e6
# Where the eight GPUs of an HGX H100 baseboard usually sit on the PCI bus.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


class FaultError(ValueError):
    """A fault that does not fit this node (no such GPU or link)."""


class SimBackend:
    name = "sim"
    why = "--backend sim"

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time) -> None:
        self.scenario = scenario
        self._clock = clock
        self._lock = threading.Lock()
        self._book = FaultBook()
        self._xids: queue.SimpleQueue[DriverXid] = queue.SimpleQueue()
        start = clock()
        self._model = NodeModel(scenario, start)
        self._pending = sorted(scenario.faults, key=lambda f: f.at_seconds)  # not yet started
        self._pending_times = [start + f.at_seconds for f in self._pending]
        self._gpus = [self._identity(i) for i in range(scenario.node.gpus.count)]
        shape = scenario.node.gpus
        self._instances = [
            instances(scenario.seed, i, shape.mig_instances.get(i, []), shape.memory_bytes) for i in range(shape.count)
        ]

    # -- the GpuBackend contract ------------------------------------------------------------

    def discover(self) -> list[GpuIdentity]:
        return list(self._gpus)

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        now = self._clock()
        self._advance(now)
        faults = self._book.on(gpu.index, now)
        if any(f.spec.kind is FaultKind.GPU_LOST for f in faults):
            raise GpuLostError(f"GPU {gpu.index} is lost (simulated)")
        if any(f.spec.kind is FaultKind.GPU_RESET for f in faults):
            raise GpuLostError(f"GPU {gpu.index} is being reset (simulated)")
        hung = [f for f in faults if f.spec.kind is FaultKind.HUNG_CALL and f.spec.collector in (None, collector)]
        if hung:
            self._hang(hung)
        with self._lock:
            view = _View(
                gpu.index,
                self.scenario.node,
                self._model.gpus[gpu.index],
                self.scenario.seed,
                faults,
                {f.spec.kind for f in faults},
                self._instances[gpu.index],
            )
            return Result(_READERS[collector](view))

    def close(self) -> None:
        self._book.clear()  # releases any simulated hung call

    reports_xids = True

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        self._advance(self._clock())
        out: list[DriverXid] = []
        try:
            out.append(self._xids.get(timeout=timeout_seconds))
            while True:
                out.append(self._xids.get_nowait())
        except queue.Empty:
            pass
        return out

    # -- fault injection ----------------------------------------------------------------------

    def inject(self, spec: FaultSpec, source: str = "api") -> ActiveFault:
        count, links = self.scenario.node.gpus.count, self.scenario.node.gpus.nvlink_links
        if spec.gpu >= count:
            raise FaultError(f"no GPU {spec.gpu}: this node has GPUs 0..{count - 1}")
        if spec.link is not None and spec.link >= links:
            raise FaultError(f"no NVLink link {spec.link}: GPUs of this node have links 0..{links - 1}")
        now = self._clock()
        self._advance(now)
        return self._start(spec, now, source)

    def faults(self) -> list[ActiveFault]:
        self._book.expire(self._clock())
        return self._book.all()

    def clear_fault(self, fault_id: str) -> bool:
        return self._book.remove(fault_id)

    def clear_faults(self) -> int:
        return self._book.clear()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, spec: FaultSpec, at: float, source: str) -> ActiveFault:
        fault = self._book.add(spec, at, source)
        with self._lock:
            self._model.apply_instantaneous(spec)
        if spec.kind is FaultKind.XID and spec.xid is not None:
            self._xids.put(DriverXid(spec.gpu, spec.xid, at, spec.message))
        return fault

    def _advance(self, now: float) -> None:
        with self._lock:  # reads of different GPUs advance the clock concurrently: take each fault once
            due = bisect.bisect_right(self._pending_times, now)
            started, times = self._pending[:due], self._pending_times[:due]
            if due:
                del self._pending[:due], self._pending_times[:due]
        for fault, at in zip(started, times, strict=True):
            self._start(FaultSpec.model_validate(fault.model_dump(exclude={"at_seconds"})), at, "scenario")
        tick = int(now - self._model.start)
        with self._lock:
            for i, state in enumerate(self._model.gpus):
                if state.tick < tick:
                    self._model.advance(i, tick, self._book.lasting(i))
        # Only now: a fault that ran out since the last tick still shaped the ticks it covered.
        self._book.expire(now)

    def _hang(self, hung: list[ActiveFault]) -> None:
        """Block like a driver call stuck in the kernel, until the fault is cleared or runs out."""
        self._book.wait_until_gone({f.id for f in hung}, self._clock)

    def _identity(self, index: int) -> GpuIdentity:
        gpus = self.scenario.node.gpus
        if gpus.pci_bus_ids is not None:
            bus_id = canonical_bus_id(gpus.pci_bus_ids[index]) or gpus.pci_bus_ids[index]
        else:
            # Past eight GPUs (scale tests), each further baseboard gets its own PCI domain.
            domain, slot = divmod(index, len(_HGX_BUSES))
            bus_id = f"{domain:04x}:{_HGX_BUSES[slot]:02x}:00.0"
        seed = self.scenario.seed
        gpu_uuid = uuid.UUID(int=(hash_pair(seed, index) << 64) | hash_pair(seed, index + 1_000_003), version=4)
        return GpuIdentity(index=index, uuid=f"GPU-{gpu_uuid}", pci_bus_id=bus_id)


@dataclass(frozen=True, slots=True)
class _View:
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


def _inventory(v: _View) -> Inventory:
    return Inventory(
        name=v.shape.model,
        serial=f"{1650923000000 + hash_pair(v.seed, v.gpu) % 1000000:013d}",
        vbios_version=v.node.vbios_version,
        driver_version=v.node.driver_version,
        cuda_driver_version=v.node.cuda_driver_version,
        mig_enabled=v.mig,
    )


def _utilization(v: _View) -> Utilization:
    if v.mig:  # as NVML: "not supported" on a MIG-enabled GPU; profiling has each instance's activity
        return Utilization(None, None)
    mem_ratio = memory_controller(v.state.utilization, v.noise)
    return Utilization(gpu_ratio=round(v.state.utilization, 2), memory_controller_ratio=round(mem_ratio, 2))


def _instance_memory(v: _View) -> tuple[InstanceMemory, ...]:
    return tuple(
        InstanceMemory(i.mig, int(i.memory_bytes * v.state.memory_used_ratio) if v.busy else 0, i.memory_bytes)
        for i in v.instances
    )


def _memory(v: _View) -> Memory:
    reserved = v.shape.reserved_memory_bytes
    if v.mig:
        parts = _instance_memory(v)
        used = sum(m.used_bytes or 0 for m in parts)
        return Memory(used_bytes=used, total_bytes=v.shape.memory_bytes, reserved_bytes=reserved, instances=parts)
    usable = v.shape.memory_bytes - reserved
    used = int(usable * v.state.memory_used_ratio) if v.busy else 0
    return Memory(used_bytes=used, total_bytes=v.shape.memory_bytes, reserved_bytes=reserved)


def _power(v: _View) -> Power:
    return Power(
        usage_watts=round(v.state.power_watts, 3),
        limit_watts=v.shape.power_limit_watts,
        energy_joules=round(v.state.energy_joules, 3),
    )


def _thermal(v: _View) -> Thermal:
    return Thermal(
        gpu_celsius=float(round(v.state.temperature_celsius)),
        memory_celsius=float(round(v.state.memory_temperature_celsius)),
        fan_ratio=round(0.3 + 0.5 * v.state.utilization, 2) if v.shape.fan else None,
    )


def _clocks(v: _View) -> Clocks:
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


def _pcie(v: _View) -> Pcie:
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


def _nvlink(v: _View) -> NvLink:
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


def _processes(v: _View) -> Processes:
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


def _profiling(v: _View) -> Profiling:
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


def _health(v: _View) -> HealthWatch:
    return HealthWatch(None)  # the simulator plays NVML, which has no health watches


def _recovery(v: _View) -> Recovery:
    return Recovery(action=0)


def _ecc(v: _View) -> Ecc:
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


def _remapping(v: _View) -> Remapping:
    return Remapping(
        correctable_rows=v.state.remapped_correctable,
        uncorrectable_rows=v.state.remapped_uncorrectable,
        pending=FaultKind.ROW_REMAP_PENDING in v.kinds,
        failure=FaultKind.ROW_REMAP_FAILURE in v.kinds,
    )


_READERS: dict[Collector, Callable[[_View], Reading]] = {
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
require_every_collector(_READERS, "sim")


def hash_pair(seed: int, n: int) -> int:
    """A deterministic 64-bit value for (seed, n): the simulated GPUs' serials and UUIDs."""
    return mix64(seed, n, 0, 99)
