"""What a read of a simulated GPU sees: its shape, its state now, the faults on it.

The simulator's readers (readers.py) turn a View into readings, the vGPU writer (exporter/vgpu/image.py) into
NVML's answers; neither knows the other. Nothing here imports the readings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultKind
from gpu_triage.exporter.backends.sim.mig import SimInstance
from gpu_triage.exporter.backends.sim.model import GpuState, clock_reasons, hash_pair, noise
from gpu_triage.exporter.backends.sim.products import Product
from gpu_triage.exporter.backends.sim.scenario import GpuShape, NodeShape

# Slowdowns scale the SM clock: a thermal one to 60 %, a power one to 75 %.
_THERMAL_CLOCK, _POWER_CLOCK = 0.6, 0.75
_CAPPED_CLOCK = 0.8  # a job drawing more than the power cap runs at about this share of its clock
IDLE_VIDEO_MHZ = 765.0


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
    def held(self) -> bool:
        """A process holds the GPU: it works, or keeps its memory while it waits."""
        return self.busy or self.state.load.hold_memory

    @property
    def noise(self) -> Callable[[int], float]:
        return lambda channel: noise(self.seed, self.gpu, self.state.tick, channel)

    @property
    def spec(self) -> Product:
        return self.shape.spec

    @property
    def serial(self) -> str:
        return f"{1650923000000 + hash_pair(self.seed, self.gpu) % 1000000:013d}"

    @property
    def reasons(self) -> frozenset[str]:
        """The clock-event reasons holding the clocks now, by name (model.py)."""
        return clock_reasons(self.state.utilization, self.kinds, self.state.load)

    @property
    def links_down(self) -> frozenset[int]:
        return frozenset(
            f.spec.link for f in self.faults if f.spec.kind is FaultKind.NVLINK_DOWN and f.spec.link is not None
        )

    def memory_used_bytes(self) -> int:
        """The whole GPU's allocated memory (MIG: its instances')."""
        if self.mig:
            return sum(self.instance_used_bytes(i) for i in range(len(self.instances)))
        usable = self.shape.memory_bytes - self.shape.reserved_memory_bytes
        return int(usable * self.state.memory_used_ratio) if self.held else 0

    def instance_used_bytes(self, i: int) -> int:
        inst = self.instances[i]
        return int(inst.memory_bytes * self.state.memory_used_ratio) if self.held else 0

    def clocks_mhz(self) -> dict[str, float]:
        """Current clocks by domain (graphics, sm, memory, video), MHz."""
        shape = self.shape
        slow = 1.0
        if FaultKind.THERMAL_SLOWDOWN in self.kinds:
            slow *= _THERMAL_CLOCK
        if FaultKind.POWER_SLOWDOWN in self.kinds:
            slow *= _POWER_CLOCK
        if self.busy:
            slow *= self.state.load.clock_ratio * (_CAPPED_CLOCK if self.state.load.power_cap else 1.0)
        sm = round((shape.max_sm_clock_mhz if self.busy else shape.idle_sm_clock_mhz) * slow)
        video = shape.max_video_clock_mhz if self.busy else IDLE_VIDEO_MHZ
        return {"graphics": sm, "sm": sm, "memory": shape.max_memory_clock_mhz, "video": video}

    def max_clocks_mhz(self) -> dict[str, float]:
        shape = self.shape
        return {
            "graphics": shape.max_sm_clock_mhz,
            "sm": shape.max_sm_clock_mhz,
            "memory": shape.max_memory_clock_mhz,
            "video": shape.max_video_clock_mhz,
        }

    def fan_ratio(self) -> float | None:
        return round(0.3 + 0.5 * self.state.utilization, 2) if self.shape.fan else None

    def process_pid(self, gpu_instance: int = 0) -> int:
        return 41000 + 17 * self.gpu + gpu_instance
