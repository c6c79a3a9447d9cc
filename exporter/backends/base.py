"""The backend contract: what a source of GPU telemetry (NVML, DCGM, the simulator) must provide.

A backend finds the GPUs once (`discover`) and then answers `read(gpu, collector)` for one group
of fields of one GPU. The poller calls `read` from worker threads with a deadline, so a backend
may block (a sick driver does); it never has to time itself out.

Failures are reported at three sizes:
- a field the GPU does not have ("not supported") is `None` in the reading: not an error;
- a field that failed for another reason is named in `Result.failed_fields`;
- a GPU that is gone raises `GpuLostError`; a backend that is broken as a whole raises `BackendError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable


class BackendError(Exception):
    """The backend cannot work at all (library missing, driver not loaded, host engine gone)."""


class GpuLostError(Exception):
    """The GPU stopped answering the way NVML's GPU_IS_LOST / RESET_REQUIRED say it has."""


class Collector(StrEnum):
    """A group of fields read together; each reports its own success and duration."""

    INVENTORY = "inventory"
    UTILIZATION = "utilization"
    MEMORY = "memory"
    POWER = "power"
    THERMAL = "thermal"
    CLOCKS = "clocks"
    PCIE = "pcie"
    NVLINK = "nvlink"
    PROCESSES = "processes"
    RECOVERY = "recovery"
    ECC = "ecc"
    REMAPPING = "remapping"

    @property
    def slow(self) -> bool:
        """Fields that change rarely and cost more: read every `--collector.slow-interval`."""
        return self in _SLOW


_SLOW = frozenset({Collector.INVENTORY, Collector.ECC, Collector.REMAPPING})


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int  # NVML index: the `gpu` label
    uuid: str  # "GPU-…": the `uuid` label
    pci_bus_id: str  # canonical "dddd:bb:dd.f"


@dataclass(frozen=True, slots=True)
class Inventory:
    name: str | None
    serial: str | None
    vbios_version: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # "12.8"
    mig_enabled: bool | None


@dataclass(frozen=True, slots=True)
class Utilization:
    gpu_ratio: float | None
    memory_controller_ratio: float | None


@dataclass(frozen=True, slots=True)
class Memory:
    used_bytes: int | None
    total_bytes: int | None
    reserved_bytes: int | None


@dataclass(frozen=True, slots=True)
class Power:
    usage_watts: float | None
    limit_watts: float | None  # the enforced limit
    energy_joules: float | None  # since the driver was loaded


@dataclass(frozen=True, slots=True)
class Thermal:
    gpu_celsius: float | None
    memory_celsius: float | None
    fan_ratio: float | None


class ClockDomain(StrEnum):
    SM = "sm"
    MEMORY = "memory"
    GRAPHICS = "graphics"
    VIDEO = "video"


class ClockEventReason(StrEnum):
    """NVML's clocks-event (throttle) reason bits, named as the `reason` label."""

    GPU_IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
    HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
    HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"
    DISPLAY_CLOCK_SETTING = "display_clock_setting"

    @property
    def bit(self) -> int:
        return _REASON_BITS[self]


_REASON_BITS = {reason: 1 << i for i, reason in enumerate(ClockEventReason)}


@dataclass(frozen=True, slots=True)
class Clocks:
    current_hz: Mapping[ClockDomain, float]
    max_hz: Mapping[ClockDomain, float]
    event_reasons: int | None  # NVML bitmask, see ClockEventReason.bit
    performance_state: int | None  # P0..P15


@dataclass(frozen=True, slots=True)
class Pcie:
    link_generation: int | None
    max_link_generation: int | None
    link_width: int | None
    max_link_width: int | None
    replay_errors: int | None  # counter since driver load
    tx_bytes_per_second: float | None
    rx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class LinkReading:
    link: int
    active: bool | None
    replay_errors: int | None
    recovery_errors: int | None
    crc_errors: int | None


@dataclass(frozen=True, slots=True)
class NvLink:
    links: tuple[LinkReading, ...]


@dataclass(frozen=True, slots=True)
class Ecc:
    enabled: bool | None
    corrected_volatile: int | None
    uncorrected_volatile: int | None
    corrected_aggregate: int | None
    uncorrected_aggregate: int | None
    retired_pages_single_bit: int | None  # pre-Ampere page retirement
    retired_pages_double_bit: int | None
    retired_pages_pending: bool | None


@dataclass(frozen=True, slots=True)
class Remapping:
    correctable_rows: int | None
    uncorrectable_rows: int | None
    pending: bool | None
    failure: bool | None


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    name: str | None
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class Processes:
    processes: tuple[ProcessReading, ...]


@dataclass(frozen=True, slots=True)
class Recovery:
    action: int | None  # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain+reset


Reading = (
    Inventory | Utilization | Memory | Power | Thermal | Clocks | Pcie | NvLink | Ecc | Remapping | Processes | Recovery
)


@dataclass(frozen=True, slots=True)
class Result:
    """One collector's reading of one GPU, with the fields that failed (not merely unsupported)."""

    reading: Reading
    failed_fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DriverXid:
    """An XID reported by the driver's event API (NVML events, or the simulator's injection)."""

    gpu: int
    code: int
    timestamp: float
    message: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[GpuIdentity]:
        """The GPUs of this node, in NVML index order."""
        ...

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        """Read one collector's fields of one GPU. May block; may raise GpuLostError or BackendError."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class XidEventSource(Protocol):
    """A backend that reports XIDs as they happen (NVML's event API, the simulator)."""

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs that arrived since the last call, waiting up to `timeout_seconds` for the first."""
        ...
