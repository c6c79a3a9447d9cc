"""What a backend reads from a GPU, one dataclass per collector, and the metric series each value becomes.

A plain value names its series on its field (`series(FAMILY, "label value")`), so adding one is a
line here and a line in each backend's reader: /metrics picks it up by itself. A reading whose
values fan out over links, clock domains or processes adds them in `more_samples`.

Units are the base units of the metric names: bytes, watts, joules, hertz, celsius, ratios 0..1.
`None` means the GPU does not have the value (NVML's "not supported"): its series is left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum, StrEnum
from typing import Any, ClassVar

from gpu_triage.exporter.backends.base import Collector


@dataclass(frozen=True, slots=True)
class Family:
    """A per-GPU metric family: every series carries `gpu` and `uuid`, then `labels`."""

    name: str
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    counter: bool = False


# Declared in the order they appear on /metrics.
UP = Family("nvidia_gpu_up", "1 if the GPU answered the last poll; 0 if it is lost or a call to it hung.")
UTILIZATION = Family("nvidia_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (0-1).", "ratio")
MEMORY_CONTROLLER = Family(
    "nvidia_gpu_memory_controller_utilization_ratio",
    "Fraction of time the memory controller was busy reading or writing (0-1).",
    "ratio",
)
MEMORY_USED = Family("nvidia_gpu_memory_used_bytes", "GPU memory in use, in bytes.", "bytes")
MEMORY_TOTAL = Family("nvidia_gpu_memory_total_bytes", "GPU memory installed, in bytes.", "bytes")
MEMORY_RESERVED = Family(
    "nvidia_gpu_memory_reserved_bytes", "GPU memory reserved by the driver and firmware, in bytes.", "bytes"
)
POWER = Family("nvidia_gpu_power_watts", "Power drawn by the board, in watts.", "watts")
POWER_LIMIT = Family("nvidia_gpu_power_limit_watts", "Enforced power limit, in watts.", "watts")
ENERGY = Family(
    "nvidia_gpu_energy_joules", "Energy used since the driver was loaded, in joules.", "joules", counter=True
)
TEMPERATURE = Family("nvidia_gpu_temperature_celsius", "GPU core temperature, in degrees Celsius.", "celsius")
MEMORY_TEMPERATURE = Family(
    "nvidia_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature, in degrees Celsius.", "celsius"
)
FAN = Family("nvidia_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (0-1).", "ratio")
CLOCK = Family("nvidia_gpu_clock_hertz", "Current clock of each clock domain, in hertz.", "hertz", ("clock",))
CLOCK_MAX = Family("nvidia_gpu_clock_max_hertz", "Maximum clock of each clock domain, in hertz.", "hertz", ("clock",))
CLOCK_EVENT = Family(
    "nvidia_gpu_clock_event_reason_active",
    "1 while this reason holds the clocks down (NVML clocks-event / throttle reasons), else 0.",
    labels=("reason",),
)
PSTATE = Family("nvidia_gpu_performance_state", "Performance state (0 = P0, fastest, .. 15 = P15).")
PCIE_GEN = Family("nvidia_gpu_pcie_link_generation", "Current PCIe link generation.")
PCIE_MAX_GEN = Family(
    "nvidia_gpu_pcie_link_max_generation", "Highest PCIe link generation the GPU and the slot support."
)
PCIE_WIDTH = Family("nvidia_gpu_pcie_link_width", "Current PCIe link width, in lanes.")
PCIE_MAX_WIDTH = Family("nvidia_gpu_pcie_link_max_width", "Widest PCIe link the GPU and the slot support, in lanes.")
PCIE_REPLAYS = Family("nvidia_gpu_pcie_replay_errors", "PCIe replays since the driver was loaded.", counter=True)
PCIE_THROUGHPUT = Family(
    "nvidia_gpu_pcie_throughput_bytes_per_second",
    "PCIe throughput over NVML's 20 ms sampling window, in bytes per second.",
    labels=("direction",),
)
NVLINK_STATE = Family(
    "nvidia_gpu_nvlink_state",
    "NVLink link state as NVML reports it: 0 inactive, 1 active, 2 sleep, 3 active with traffic disabled.",
    labels=("link",),
)
NVLINK_UP = Family(
    "nvidia_gpu_nvlink_up",
    "1 if the NVLink link is trained (active, asleep or active with traffic disabled), 0 if it is inactive. "
    "A link that was never up is usually not cabled.",
    labels=("link",),
)
NVLINK_ERRORS = Family(
    "nvidia_gpu_nvlink_errors",
    "NVLink data-link errors by kind: replay, recovery, crc.",
    labels=("link", "error"),
    counter=True,
)
ECC_ENABLED = Family("nvidia_gpu_ecc_enabled", "1 if ECC is enabled, else 0.")
ECC_ERRORS = Family(
    "nvidia_gpu_ecc_errors",
    "ECC errors since the driver was loaded (volatile), by error: corrected or uncorrected.",
    labels=("error",),
    counter=True,
)
ECC_AGGREGATE = Family(
    "nvidia_gpu_ecc_aggregate_errors",
    "ECC errors over the GPU's lifetime (aggregate), by error: corrected or uncorrected.",
    labels=("error",),
    counter=True,
)
RETIRED_PAGES = Family(
    "nvidia_gpu_retired_pages", "Memory pages retired (pre-Ampere GPUs), by cause.", labels=("cause",)
)
RETIRED_PENDING = Family("nvidia_gpu_retired_pages_pending", "1 if a page retirement waits for a GPU reset, else 0.")
REMAPPED_ROWS = Family(
    "nvidia_gpu_remapped_rows", "Memory rows remapped (Ampere and later), by cause.", labels=("cause",)
)
REMAP_PENDING = Family("nvidia_gpu_row_remap_pending", "1 if a row remap waits for a GPU reset to take effect, else 0.")
REMAP_FAILURE = Family("nvidia_gpu_row_remap_failure", "1 if a row remap failed (an RMA criterion), else 0.")
MIG_ENABLED = Family("nvidia_gpu_mig_enabled", "1 if MIG mode is enabled, else 0.")
RECOVERY_ACTION = Family(
    "nvidia_gpu_recovery_action",
    "Recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
    "5 recover the IMEX domain, 6 PCIe bus reset, 7 system reboot.",
)
PROCESSES = Family("nvidia_gpu_processes", "Compute processes running on the GPU.")
PROCESS_MEMORY = Family(
    "nvidia_gpu_process_memory_used_bytes",
    "GPU memory used by each compute process, in bytes.",
    "bytes",
    ("pid", "process"),
)

FAMILIES: tuple[Family, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Family))

Value = float | int | bool | None


@dataclass(frozen=True, slots=True)
class Sample:
    family: Family
    labels: tuple[str, ...]  # values of family.labels
    value: Value


def series(family: Family, *labels: str) -> Any:
    """Declare the series a reading's field becomes (the field's own label values, if any)."""
    return field(metadata={"series": (family, labels)})


class Reading:
    """Base of every reading: its samples come from its fields' `series`, plus `more_samples`."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    collector: ClassVar[Collector]
    _plain: ClassVar[tuple[tuple[str, Family, tuple[str, ...]], ...]]

    def __init_subclass__(cls, collector: Collector | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if collector is not None:
            cls.collector = collector

    def samples(self) -> Iterator[Sample]:
        cls = type(self)
        plain = cls.__dict__.get("_plain")
        if plain is None:  # the dataclass decorator runs after __init_subclass__: look fields up once, here
            plain = tuple((f.name, *f.metadata["series"]) for f in fields(self) if "series" in f.metadata)
            cls._plain = plain
        for name, family, labels in plain:
            yield Sample(family, labels, getattr(self, name))
        yield from self.more_samples()

    def more_samples(self) -> Iterator[Sample]:
        return iter(())


@dataclass(frozen=True, slots=True)
class Inventory(Reading, collector=Collector.INVENTORY):
    name: str | None
    serial: str | None
    vbios_version: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # "12.8"
    mig_enabled: bool | None = series(MIG_ENABLED)


@dataclass(frozen=True, slots=True)
class Utilization(Reading, collector=Collector.UTILIZATION):
    gpu_ratio: float | None = series(UTILIZATION)
    memory_controller_ratio: float | None = series(MEMORY_CONTROLLER)


@dataclass(frozen=True, slots=True)
class Memory(Reading, collector=Collector.MEMORY):
    used_bytes: int | None = series(MEMORY_USED)
    total_bytes: int | None = series(MEMORY_TOTAL)
    reserved_bytes: int | None = series(MEMORY_RESERVED)


@dataclass(frozen=True, slots=True)
class Power(Reading, collector=Collector.POWER):
    usage_watts: float | None = series(POWER)
    limit_watts: float | None = series(POWER_LIMIT)  # the enforced limit
    energy_joules: float | None = series(ENERGY)  # since the driver was loaded


@dataclass(frozen=True, slots=True)
class Thermal(Reading, collector=Collector.THERMAL):
    gpu_celsius: float | None = series(TEMPERATURE)
    memory_celsius: float | None = series(MEMORY_TEMPERATURE)
    fan_ratio: float | None = series(FAN)


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
class Clocks(Reading, collector=Collector.CLOCKS):
    current_hz: Mapping[ClockDomain, float]
    max_hz: Mapping[ClockDomain, float]
    event_reasons: int | None  # NVML bitmask, see ClockEventReason.bit
    performance_state: int | None = series(PSTATE)  # P0..P15

    def more_samples(self) -> Iterator[Sample]:
        for domain in ClockDomain:
            yield Sample(CLOCK, (domain.value,), self.current_hz.get(domain))
            yield Sample(CLOCK_MAX, (domain.value,), self.max_hz.get(domain))
        if self.event_reasons is not None:
            for reason in ClockEventReason:
                yield Sample(CLOCK_EVENT, (reason.value,), bool(self.event_reasons & reason.bit))


@dataclass(frozen=True, slots=True)
class Pcie(Reading, collector=Collector.PCIE):
    link_generation: int | None = series(PCIE_GEN)
    max_link_generation: int | None = series(PCIE_MAX_GEN)
    link_width: int | None = series(PCIE_WIDTH)
    max_link_width: int | None = series(PCIE_MAX_WIDTH)
    replay_errors: int | None = series(PCIE_REPLAYS)  # counter since driver load
    tx_bytes_per_second: float | None = series(PCIE_THROUGHPUT, "tx")
    rx_bytes_per_second: float | None = series(PCIE_THROUGHPUT, "rx")


class LinkState(IntEnum):
    """NVML_FI_DEV_NVLINK_GET_STATE's values (NVML_NVLINK_STATE_*)."""

    INACTIVE = 0
    ACTIVE = 1
    SLEEP = 2  # a trained link resting in its low-power state; it wakes on traffic
    ACTIVE_TRAFFIC_DISABLED = 3


@dataclass(frozen=True, slots=True)
class LinkReading:
    link: int
    state: int | None  # NVML's value, see LinkState; a value newer than LinkState is passed on as it is
    replay_errors: int | None
    recovery_errors: int | None
    crc_errors: int | None

    @property
    def up(self) -> bool:
        """Trained: anything but inactive (and not unknown)."""
        return self.state is not None and self.state != LinkState.INACTIVE


@dataclass(frozen=True, slots=True)
class NvLink(Reading, collector=Collector.NVLINK):
    links: tuple[LinkReading, ...]

    def more_samples(self) -> Iterator[Sample]:
        for link in self.links:
            n = str(link.link)
            yield Sample(NVLINK_STATE, (n,), link.state)
            yield Sample(NVLINK_UP, (n,), None if link.state is None else link.up)
            yield Sample(NVLINK_ERRORS, (n, "replay"), link.replay_errors)
            yield Sample(NVLINK_ERRORS, (n, "recovery"), link.recovery_errors)
            yield Sample(NVLINK_ERRORS, (n, "crc"), link.crc_errors)


@dataclass(frozen=True, slots=True)
class Ecc(Reading, collector=Collector.ECC):
    enabled: bool | None = series(ECC_ENABLED)
    corrected_volatile: int | None = series(ECC_ERRORS, "corrected")
    uncorrected_volatile: int | None = series(ECC_ERRORS, "uncorrected")
    corrected_aggregate: int | None = series(ECC_AGGREGATE, "corrected")
    uncorrected_aggregate: int | None = series(ECC_AGGREGATE, "uncorrected")
    retired_pages_single_bit: int | None = series(RETIRED_PAGES, "single_bit")  # pre-Ampere page retirement
    retired_pages_double_bit: int | None = series(RETIRED_PAGES, "double_bit")
    retired_pages_pending: bool | None = series(RETIRED_PENDING)


@dataclass(frozen=True, slots=True)
class Remapping(Reading, collector=Collector.REMAPPING):
    correctable_rows: int | None = series(REMAPPED_ROWS, "correctable")
    uncorrectable_rows: int | None = series(REMAPPED_ROWS, "uncorrectable")
    pending: bool | None = series(REMAP_PENDING)
    failure: bool | None = series(REMAP_FAILURE)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    name: str | None
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class Processes(Reading, collector=Collector.PROCESSES):
    processes: tuple[ProcessReading, ...]

    def more_samples(self) -> Iterator[Sample]:
        yield Sample(PROCESSES, (), len(self.processes))
        for p in self.processes:
            yield Sample(PROCESS_MEMORY, (str(p.pid), p.name or ""), p.used_bytes)


@dataclass(frozen=True, slots=True)
class Recovery(Reading, collector=Collector.RECOVERY):
    # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset,
    # 5 recover the IMEX domain, 6 bus reset, 7 system reboot
    action: int | None = series(RECOVERY_ACTION)


READING_OF: Mapping[Collector, type[Reading]] = {
    cls.collector: cls
    for cls in (
        Inventory,
        Utilization,
        Memory,
        Power,
        Thermal,
        Clocks,
        Pcie,
        NvLink,
        Ecc,
        Remapping,
        Processes,
        Recovery,
    )
}
if missing := set(Collector) - READING_OF.keys():
    raise ImportError(f"collectors without a reading type: {sorted(missing)}")
