"""The simulated GPUs' physics: how their values move over time.

The model advances in whole-second ticks from the scenario start, so its state at a given time
depends only on the scenario, its seed and the faults, never on how often it was sampled: the
same clock readings give the same values. What moves, and why it moves that way:
- utilization follows the workload phase, with per-GPU noise;
- power follows utilization between idle and (nearly) the limit, capped by a power slowdown;
- temperature approaches ambient + power x celsius_per_watt with a first-order lag;
- energy integrates power;
- ECC and remapped-row counters grow only when a fault says so;
- clocks drop, and clock-event reasons appear, under a thermal or power slowdown; the time each reason
  held the clocks down accumulates, as NVML's throttle counters do;
- the bytes moved over PCIe and each NVLink accumulate from the rates activity.py gives.

Nothing here imports the readings: the state is physical (watts, joules, bytes, seconds, reasons by
name), and both the simulator's readers and the vGPU writer take it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_triage.exporter.backends.sim.activity import link_rate, pcie
from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultKind, FaultSpec
from gpu_triage.exporter.backends.sim.scenario import Load, Phase, Scenario

# Catching up longer than this after a pause is pointless: the thermal state has long settled.
_MAX_CATCH_UP_TICKS = 900
_MASK64 = (1 << 64) - 1


def mix64(seed: int, gpu: int, tick: int, channel: int = 0) -> int:
    """A deterministic pseudo-random 64-bit value for (seed, gpu, tick, channel): splitmix64."""
    z = (seed * 0x9E3779B97F4A7C15 + gpu * 0xBF58476D1CE4E5B9 + tick * 0x94D049BB133111EB + channel) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def noise(seed: int, gpu: int, tick: int, channel: int = 0) -> float:
    """`mix64` as a value in [-1, 1)."""
    return (mix64(seed, gpu, tick, channel) / 2**63) - 1.0


def hash_pair(seed: int, n: int) -> int:
    """A deterministic 64-bit value for (seed, n): the simulated GPUs' serials and UUIDs."""
    return mix64(seed, n, 0, 99)


@dataclass(frozen=True, slots=True)
class Effective:
    """The shape of a GPU's work in one tick (the scenario's Load with the simulator's usual values filled in)."""

    sm_share: float = 0.9
    occupancy_share: float = 0.42
    dram_scale: float = 1.0
    pcie_scale: float = 1.0
    nvlink_share: float = 0.45
    clock_ratio: float = 1.0
    power_cap: bool = False
    hold_memory: bool = False
    burst_seconds: int | None = None
    temperature_offset_celsius: float = 0.0


USUAL = Effective()
_LOAD_FIELDS = tuple(Load.model_fields)


def effective(phase: Phase, gpu: int) -> tuple[float, Effective]:
    """GPU `gpu`'s utilization and load shape in `phase`: the phase's, with the GPU's own where it has them."""
    own = phase.gpus.get(gpu)
    values = {}
    for name in _LOAD_FIELDS:
        value = getattr(own, name) if own is not None else None
        if value is None:
            value = getattr(phase, name)
        if value is not None:
            values[name] = value
    utilization = own.utilization if own is not None and own.utilization is not None else phase.utilization
    return utilization, (Effective(**values) if values else USUAL)


@dataclass
class GpuState:
    """One simulated GPU's state at `tick` seconds after the scenario start."""

    tick: int
    utilization: float
    memory_used_ratio: float
    power_watts: float
    temperature_celsius: float
    memory_temperature_celsius: float
    energy_joules: float = 0.0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    pcie_replays: int = 0
    nvlink_replays: list[int] = field(default_factory=list)
    nvlink_recoveries: list[int] = field(default_factory=list)  # every recovery, whatever its outcome
    nvlink_crcs: list[int] = field(default_factory=list)
    nvlink_failed_recoveries: list[int] = field(default_factory=list)
    nvlink_symbol_errors: list[int] = field(default_factory=list)
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0
    nvlink_tx_bytes: list[float] = field(default_factory=list)
    nvlink_rx_bytes: list[float] = field(default_factory=list)
    reason_seconds: dict[str, float] = field(default_factory=dict)  # clock-event reason -> time it held
    load: Effective = USUAL  # the shape of the work this tick


class NodeModel:
    """All GPUs of the simulated node. Not thread-safe: the backend serialises access."""

    def __init__(self, scenario: Scenario, start: float) -> None:
        self.scenario = scenario
        self.start = start  # wall-clock time of tick 0
        shape = scenario.node.gpus
        links = shape.nvlink_links
        self.gpus = [
            GpuState(
                tick=0,
                utilization=0.0,
                memory_used_ratio=0.0,
                power_watts=shape.idle_power_watts,
                temperature_celsius=shape.ambient_celsius + shape.idle_power_watts * shape.celsius_per_watt,
                memory_temperature_celsius=shape.ambient_celsius
                + shape.idle_power_watts * shape.celsius_per_watt * 1.1,
                nvlink_replays=[0] * links,
                nvlink_recoveries=[0] * links,
                nvlink_crcs=[0] * links,
                nvlink_failed_recoveries=[0] * links,
                nvlink_symbol_errors=[0] * links,
                nvlink_tx_bytes=[0.0] * links,
                nvlink_rx_bytes=[0.0] * links,
            )
            for _ in range(shape.count)
        ]

    def phase_at(self, tick: int) -> Phase:
        t = float(tick)
        cycle = self.scenario.cycle_seconds
        if t >= cycle:
            if not self.scenario.repeat:
                return self.scenario.workload[-1]
            t = math.fmod(t, cycle)
        for phase in self.scenario.workload:
            if t < phase.duration_seconds:
                return phase
            t -= phase.duration_seconds
        return self.scenario.workload[-1]

    def advance(self, gpu: int, tick: int, faults: list[ActiveFault]) -> None:
        """Step `gpu` forward to `tick`; `faults` are its lasting faults (with their start times)."""
        state = self.gpus[gpu]
        if tick - state.tick > _MAX_CATCH_UP_TICKS:
            state.tick = tick - _MAX_CATCH_UP_TICKS
        shape = self.scenario.node.gpus
        alpha = 1.0 - math.exp(-1.0 / shape.thermal_time_constant_seconds)
        while state.tick < tick:
            state.tick += 1
            k = state.tick
            phase = self.phase_at(k)
            kinds = {f.spec.kind for f in faults if f.active_at(self.time_of(k))}
            busy, load = effective(phase, gpu)
            if gpu in phase.idle_gpus or (load.burst_seconds and (k // load.burst_seconds) % 2):
                busy = 0.0
            util = min(1.0, max(0.0, busy + phase.jitter * noise(self.scenario.seed, gpu, k))) if busy else 0.0
            power = shape.idle_power_watts + (shape.power_limit_watts * 0.96 - shape.idle_power_watts) * util
            power *= 1.0 + 0.01 * noise(self.scenario.seed, gpu, k, 1)
            if load.power_cap:
                power = min(power, shape.power_limit_watts)  # at the cap: the clocks give way instead
            if FaultKind.THERMAL_SLOWDOWN in kinds:
                power *= 0.75  # the clocks are down, so is the draw
            if FaultKind.POWER_SLOWDOWN in kinds:
                power = min(power, shape.power_limit_watts * 0.55)
            heat = shape.ambient_celsius + power * shape.celsius_per_watt + load.temperature_offset_celsius
            if FaultKind.THERMAL_SLOWDOWN in kinds:
                heat += 32.0  # a cooling failure: the same draw runs much hotter
            state.utilization = util
            state.load = load
            state.memory_used_ratio = phase.memory_used_ratio if busy or load.hold_memory else 0.0
            state.power_watts = power
            state.energy_joules += power
            state.temperature_celsius += (heat - state.temperature_celsius) * alpha
            state.memory_temperature_celsius += (heat * 1.1 - state.memory_temperature_celsius) * alpha
            self._accumulate(gpu, state, kinds, faults, k)

    def _accumulate(self, gpu: int, state: GpuState, kinds: set[FaultKind], faults: list[ActiveFault], k: int) -> None:
        """One second's worth of the counters: bytes moved, time held down by each reason."""
        tx, rx = pcie(state.utilization, lambda channel: noise(self.scenario.seed, gpu, k, channel), state.load)
        state.pcie_tx_bytes += tx
        state.pcie_rx_bytes += rx
        down = {f.spec.link for f in faults if f.spec.kind is FaultKind.NVLINK_DOWN and f.active_at(self.time_of(k))}
        rate = link_rate(state.utilization, self.scenario.node.gpus.spec.nvlink.speed_mbps, state.load.nvlink_share)
        for link in range(len(state.nvlink_tx_bytes)):
            if link not in down:
                state.nvlink_tx_bytes[link] += rate
                state.nvlink_rx_bytes[link] += rate
        for reason in clock_reasons(state.utilization, kinds, state.load):
            state.reason_seconds[reason] = state.reason_seconds.get(reason, 0.0) + 1.0

    def time_of(self, tick: int) -> float:
        return self.start + tick

    def apply_instantaneous(self, spec: FaultSpec) -> None:
        """What a fault does once, at injection: the counters it bumps stay bumped."""
        state = self.gpus[spec.gpu]
        match spec.kind:
            case FaultKind.ECC_CORRECTABLE:
                state.ecc_corrected += spec.count
                state.ecc_corrected_aggregate += spec.count
            case FaultKind.ECC_UNCORRECTABLE:
                state.ecc_uncorrected += 1
                state.ecc_uncorrected_aggregate += 1
            case FaultKind.ROW_REMAP_PENDING:
                state.remapped_uncorrectable += 1
            case FaultKind.NVLINK_DOWN if spec.link is not None:
                # A link that drops goes into recovery and fails it; the errors that took it there were
                # replays and CRC errors before NVLink5, symbol errors from NVLink5 on.
                state.nvlink_recoveries[spec.link] += 1
                state.nvlink_failed_recoveries[spec.link] += 1
                state.nvlink_replays[spec.link] += 7
                state.nvlink_crcs[spec.link] += 3
                state.nvlink_symbol_errors[spec.link] += 40
            case _:
                pass


# Clock-event reasons by name (NVML's nvmlClocksEventReason*, as nvml.h names them in words).
GPU_IDLE = "gpu_idle"
SW_POWER_CAP = "sw_power_cap"
HW_SLOWDOWN = "hw_slowdown"
SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"


def clock_reasons(utilization: float, kinds: set[FaultKind], load: Effective = USUAL) -> frozenset[str]:
    """The clock-event reasons a GPU in this condition reports."""
    reasons = {GPU_IDLE} if utilization < 0.01 else set()
    if load.power_cap and utilization >= 0.01:
        reasons.add(SW_POWER_CAP)
    if FaultKind.THERMAL_SLOWDOWN in kinds:
        reasons |= {HW_THERMAL_SLOWDOWN, SW_THERMAL_SLOWDOWN, HW_SLOWDOWN}
    if FaultKind.POWER_SLOWDOWN in kinds:
        reasons |= {SW_POWER_CAP, HW_POWER_BRAKE_SLOWDOWN, HW_SLOWDOWN}
    return frozenset(reasons)
