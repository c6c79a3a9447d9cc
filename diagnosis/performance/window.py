"""Rolling windows of GPU telemetry for the performance findings, kept as partial sums.

A window is a ring of buckets, each the time-weighted sums of one stretch of polls (a tenth of the base
window by default). A poll adds one sample to the open bucket: a few additions per GPU, whatever the window's
length; a finding sums a window's buckets when one closes. Sums are weighted by the seconds between polls,
so a GPU polled fast and slow (the fast and the slow collectors) is judged on time, not on sample counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_triage.diagnosis.core.findings import Workload

# Reasons that hold the clocks down for a cause the job's owner cannot fix in the job (nvml.h's
# nvmlClocksEventReason*): the power cap, thermal slowdowns, hardware slowdown and the power brake.
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")  # fmt: skip
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# Reasons that explain low clocks without anything being wrong: idle (0x1), an application-clock setting (0x2),
# sync boost (0x10), the display clock (0x100), the board's own limit (0x200) and reliability (0x400), the last two
# as nvidia-ml-py names them. Low clocks with none of these and none of the slowdowns are "without a reason".
EXPLAINED_BITS = 0x1 | 0x2 | 0x10 | 0x100 | 0x200 | 0x400
MAX_GAP_SECONDS = 120.0  # longer between two polls (the daemon was stopped or stalled): not counted as seen


@dataclass(frozen=True, slots=True)
class GpuSample:
    """What one poll says about one GPU, in base units; None: not read, or the GPU does not have it."""

    uuid: str
    index: int
    model: str | None = None
    utilization: float | None = None  # NVML: share of time a kernel ran
    sm_active: float | None = None  # profiling
    sm_occupancy: float | None = None
    dram_active: float | None = None
    pcie_rx_bytes_per_second: float | None = None  # into the GPU: host-to-device
    pcie_tx_bytes_per_second: float | None = None
    pcie_capacity: float | None = None  # bytes per second each way at the link's current generation and width
    nvlink_bytes_per_second: float | None = None  # the active links' traffic, each way averaged, summed
    nvlink_capacity: float | None = None  # the active links' capacity each way, summed
    sm_clock_hz: float | None = None
    sm_max_clock_hz: float | None = None
    reasons: int | None = None  # NVML's clocks-event reason bits
    reason_seconds: Mapping[str, float] = field(default_factory=dict)  # NVML's cumulative counters, by name
    temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    processes: int | None = None  # processes on the GPU; None: cannot be listed
    energy_joules: float | None = None  # cumulative
    power_watts: float | None = None
    mig_enabled: bool | None = None
    workloads: tuple[Workload, ...] = ()

    @property
    def activity(self) -> float | None:
        """SM activity where profiling has it, else utilization."""
        return self.sm_active if self.sm_active is not None else self.utilization


# The sums a bucket keeps, by position: (name, what it sums).
FIELDS = (
    "seen",  # seconds covered by polls
    "act", "act_n",  # activity x seconds, seconds where it is known
    "idle",  # seconds with activity under the idle threshold
    "held",  # seconds a workload, a process or memory held the GPU
    "occ", "occ_n", "dram", "dram_n",
    "rx", "tx", "pcie_n",  # shares of the PCIe link's capacity x seconds
    "link", "link_n",  # share of NVLink capacity x seconds
    "busy",  # seconds busy enough to judge clocks
    "clock", "clock_n",  # SM clock as a share of its maximum x busy seconds
    "low_clock",  # busy seconds with low clocks and no reason
    "slowdown",  # seconds a slowdown reason held the clocks down
    "temp", "temp_n",
    "bursts",  # idle-to-busy transitions
)  # fmt: skip
IX = {name: i for i, name in enumerate(FIELDS)}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What a sample is compared with as it is added (the rest is judged on the window's sums)."""

    idle_activity: float
    held_memory_bytes: float
    busy_activity: float
    clock_ratio_below: float


class GpuWindow:
    """One GPU's buckets, the open one last, and what the last sample was (for time deltas and counters)."""

    __slots__ = ("buckets", "index", "last", "last_time", "mig", "open", "uuid", "was_idle", "workloads")

    def __init__(self, keep: int) -> None:
        self.buckets: deque[list[float]] = deque(maxlen=keep)
        self.open = [0.0] * len(FIELDS)
        self.last: GpuSample | None = None
        self.last_time: float | None = None
        self.was_idle: bool | None = None
        self.workloads: tuple[Workload, ...] = ()
        self.index = -1
        self.uuid = ""
        self.mig: bool | None = None

    def close(self, skipped: int = 0) -> None:
        """Close the open bucket, and `skipped` empty ones after it (no poll fell in them): the buckets keep time."""
        self.buckets.append(self.open)
        for _ in range(min(skipped, self.buckets.maxlen or 0)):
            self.buckets.append([0.0] * len(FIELDS))
        self.open = [0.0] * len(FIELDS)

    def add(self, now: float, s: GpuSample, t: Thresholds) -> float:
        """Add `s`, taken at `now`; returns the seconds it stands for (0: the first, or after a gap)."""
        before, since = self.last, self.last_time
        self.last, self.last_time = s, now
        self.workloads, self.index, self.uuid, self.mig = s.workloads, s.index, s.uuid, s.mig_enabled
        if since is None or before is None:
            return 0.0
        dt = now - since
        if dt <= 0.0 or dt > MAX_GAP_SECONDS:
            return 0.0
        b = self.open
        b[0] += dt
        act = s.activity
        if act is not None:
            b[1] += act * dt
            b[2] += dt
            if act < t.idle_activity:
                b[3] += dt
        used = s.memory_used_bytes or 0
        if s.workloads or s.processes or used >= t.held_memory_bytes:
            b[4] += dt
        if s.sm_occupancy is not None:
            b[5] += s.sm_occupancy * dt
            b[6] += dt
        if s.dram_active is not None:
            b[7] += s.dram_active * dt
            b[8] += dt
        if s.pcie_capacity and s.pcie_rx_bytes_per_second is not None and s.pcie_tx_bytes_per_second is not None:
            b[9] += min(1.0, s.pcie_rx_bytes_per_second / s.pcie_capacity) * dt
            b[10] += min(1.0, s.pcie_tx_bytes_per_second / s.pcie_capacity) * dt
            b[11] += dt
        if s.nvlink_capacity and s.nvlink_bytes_per_second is not None:
            b[12] += min(1.0, s.nvlink_bytes_per_second / s.nvlink_capacity) * dt
            b[13] += dt
        if act is not None and act >= t.busy_activity:
            b[14] += dt
            if s.sm_clock_hz is not None and s.sm_max_clock_hz:
                ratio = s.sm_clock_hz / s.sm_max_clock_hz
                b[15] += ratio * dt
                b[16] += dt
                if ratio < t.clock_ratio_below and not (s.reasons or 0) & (SLOWDOWN_BITS | EXPLAINED_BITS):
                    b[17] += dt
        b[18] += _slowdown_seconds(before, s, dt)
        if s.temperature_celsius is not None:
            b[19] += s.temperature_celsius * dt
            b[20] += dt
        burst = s.utilization if s.utilization is not None else act
        if burst is not None:
            idle = burst < t.idle_activity
            if self.was_idle and not idle:
                b[21] += 1.0
            self.was_idle = idle
        return dt

    def total(self, buckets: int) -> list[float]:
        """The sums of the last `buckets` closed buckets."""
        out = [0.0] * len(FIELDS)
        n = len(self.buckets)
        for i in range(max(0, n - buckets), n):
            for k, v in enumerate(self.buckets[i]):
                out[k] += v
        return out


def _slowdown_seconds(before: GpuSample, s: GpuSample, dt: float) -> float:
    """Seconds of `dt` a slowdown held the clocks down: from NVML's duration counters when both samples have
    them (they say how long, between polls), else the reason bits now."""
    if s.reason_seconds and before.reason_seconds:
        held = max(
            (s.reason_seconds.get(r, 0.0) - before.reason_seconds.get(r, 0.0) for r in SLOWDOWN_REASONS), default=0.0
        )
        if held > 0.0:
            return min(dt, held)
        if any(r in s.reason_seconds for r in SLOWDOWN_REASONS):
            return 0.0
    return dt if (s.reasons or 0) & SLOWDOWN_BITS else 0.0


def mean(total: list[float], value: str, weight: str) -> float | None:
    w = total[IX[weight]]
    return total[IX[value]] / w if w > 0 else None


def workloads_of(windows: Iterable[GpuWindow]) -> dict[Workload, list[GpuWindow]]:
    out: dict[Workload, list[GpuWindow]] = {}
    for w in windows:
        for workload in w.workloads:
            out.setdefault(workload, []).append(w)
    return out
