"""What a backend reads from a GPU, one dataclass per collector, and the metric series each value becomes.

A plain value names its series on its field (`series(FAMILY, "label value")`), so adding one is a
line here and a line in each backend's reader: /metrics picks it up by itself. A reading whose
values fan out over links, clock domains or processes adds them in `more_samples`.

Units are the base units of the metric names: bytes, watts, joules, hertz, celsius, ratios 0..1.
`None` means the GPU does not have the value (NVML's "not supported"): its series is left out.

MIG instances are series of the same families as the whole GPU, told apart by four more labels
(`gpu_instance`, `compute_instance`, `mig_profile`, `mig_uuid`), as dcgm-exporter does; the whole
GPU's series keep exactly the labels they have without MIG. So a query about whole GPUs selects
`{gpu_instance=""}` on the families that have instance series (memory, processes, profiling), and
one about instances `{gpu_instance!=""}`. `gpu` and `uuid` stay the parent GPU's on an instance's
series: its XIDs, ECC errors and health are the parent's, and join on them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import IntEnum, StrEnum
from typing import Any, ClassVar

from gpu_triage.exporter.backends import families as f
from gpu_triage.exporter.backends.base import Collector

Value = float | int | bool | None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device: a compute instance inside a GPU instance, as NVML numbers them."""

    gpu_instance: int
    compute_instance: int
    profile: str  # "3g.40gb", or "1c.3g.40gb" for a compute instance smaller than its GPU instance
    uuid: str  # "MIG-…"

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        values = (str(self.gpu_instance), str(self.compute_instance), self.profile, self.uuid)
        return tuple(zip(f.MIG_LABELS, values, strict=True))


@dataclass(frozen=True, slots=True)
class Sample:
    family: f.Family
    labels: tuple[str, ...]  # values of family.labels
    value: Value
    extra: tuple[tuple[str, str], ...] = ()  # more (name, value) labels: a MIG instance's, a link's
    # From a more precise source than another collector's sample of the same series, which then gives way
    # (PCIe bandwidth from profiling over the interval beats NVML's 20 ms window).
    preferred: bool = False


def series(family: f.Family, *labels: str, preferred: bool = False, default: Any = MISSING) -> Any:
    """Declare the series a reading's field becomes (the field's own label values, if any)."""
    return field(default=default, metadata={"series": (family, labels, preferred)})


class Reading:
    """Base of every reading: its samples come from its fields' `series`, plus `more_samples`."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    collector: ClassVar[Collector]
    _plain: ClassVar[tuple[tuple[str, f.Family, tuple[str, ...], bool], ...]]

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
        for name, family, labels, preferred in plain:
            yield Sample(family, labels, getattr(self, name), preferred=preferred)
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
    mig_enabled: bool | None = series(f.MIG_ENABLED)


def cuda_version(raw: int | None) -> str | None:
    """The CUDA version as the driver encodes it (1000 * major + 10 * minor: 12080) as "12.8"."""
    return None if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"


@dataclass(frozen=True, slots=True)
class Utilization(Reading, collector=Collector.UTILIZATION):
    gpu_ratio: float | None = series(f.UTILIZATION)
    memory_controller_ratio: float | None = series(f.MEMORY_CONTROLLER)


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    instance: MigInstance
    used_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True, slots=True)
class Memory(Reading, collector=Collector.MEMORY):
    used_bytes: int | None = series(f.MEMORY_USED)
    total_bytes: int | None = series(f.MEMORY_TOTAL)
    reserved_bytes: int | None = series(f.MEMORY_RESERVED)
    instances: tuple[InstanceMemory, ...] = ()  # MIG devices, each with its own memory

    def more_samples(self) -> Iterator[Sample]:
        for m in self.instances:
            yield Sample(f.MEMORY_USED, (), m.used_bytes, m.instance.labels)
            yield Sample(f.MEMORY_TOTAL, (), m.total_bytes, m.instance.labels)


@dataclass(frozen=True, slots=True)
class Power(Reading, collector=Collector.POWER):
    usage_watts: float | None = series(f.POWER)
    limit_watts: float | None = series(f.POWER_LIMIT)  # the enforced limit
    energy_joules: float | None = series(f.ENERGY)  # since the driver was loaded


@dataclass(frozen=True, slots=True)
class Thermal(Reading, collector=Collector.THERMAL):
    gpu_celsius: float | None = series(f.TEMPERATURE)
    memory_celsius: float | None = series(f.MEMORY_TEMPERATURE)
    fan_ratio: float | None = series(f.FAN)


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
    performance_state: int | None = series(f.PSTATE)  # P0..P15

    def more_samples(self) -> Iterator[Sample]:
        for domain in ClockDomain:
            yield Sample(f.CLOCK, (domain.value,), self.current_hz.get(domain))
            yield Sample(f.CLOCK_MAX, (domain.value,), self.max_hz.get(domain))
        if self.event_reasons is not None:
            for reason in ClockEventReason:
                yield Sample(f.CLOCK_EVENT, (reason.value,), bool(self.event_reasons & reason.bit))


@dataclass(frozen=True, slots=True)
class Pcie(Reading, collector=Collector.PCIE):
    link_generation: int | None = series(f.PCIE_GEN)
    max_link_generation: int | None = series(f.PCIE_MAX_GEN)
    link_width: int | None = series(f.PCIE_WIDTH)
    max_link_width: int | None = series(f.PCIE_MAX_WIDTH)
    replay_errors: int | None = series(f.PCIE_REPLAYS)  # counter since driver load
    tx_bytes_per_second: float | None = series(f.PCIE_THROUGHPUT, "tx")
    rx_bytes_per_second: float | None = series(f.PCIE_THROUGHPUT, "rx")


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
            yield Sample(f.NVLINK_STATE, (n,), link.state)
            yield Sample(f.NVLINK_UP, (n,), None if link.state is None else link.up)
            yield Sample(f.NVLINK_ERRORS, (n, "replay"), link.replay_errors)
            yield Sample(f.NVLINK_ERRORS, (n, "recovery"), link.recovery_errors)
            yield Sample(f.NVLINK_ERRORS, (n, "crc"), link.crc_errors)


@dataclass(frozen=True, slots=True)
class Ecc(Reading, collector=Collector.ECC):
    enabled: bool | None = series(f.ECC_ENABLED)
    corrected_volatile: int | None = series(f.ECC_ERRORS, "corrected")
    uncorrected_volatile: int | None = series(f.ECC_ERRORS, "uncorrected")
    corrected_aggregate: int | None = series(f.ECC_AGGREGATE, "corrected")
    uncorrected_aggregate: int | None = series(f.ECC_AGGREGATE, "uncorrected")
    retired_pages_single_bit: int | None = series(f.RETIRED_PAGES, "single_bit")  # pre-Ampere page retirement
    retired_pages_double_bit: int | None = series(f.RETIRED_PAGES, "double_bit")
    retired_pages_pending: bool | None = series(f.RETIRED_PENDING)


@dataclass(frozen=True, slots=True)
class Remapping(Reading, collector=Collector.REMAPPING):
    correctable_rows: int | None = series(f.REMAPPED_ROWS, "correctable")
    uncorrectable_rows: int | None = series(f.REMAPPED_ROWS, "uncorrectable")
    pending: bool | None = series(f.REMAP_PENDING)
    failure: bool | None = series(f.REMAP_FAILURE)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    name: str | None
    used_bytes: int | None
    instance: MigInstance | None = None  # the MIG device it runs on


@dataclass(frozen=True, slots=True)
class Processes(Reading, collector=Collector.PROCESSES):
    processes: tuple[ProcessReading, ...] | None  # None: this backend cannot list them
    instances: tuple[MigInstance, ...] = ()  # the GPU's MIG devices, counted even when they run nothing

    def more_samples(self) -> Iterator[Sample]:
        if self.processes is None:
            return
        yield Sample(f.PROCESSES, (), len(self.processes))
        for mig in self.instances:
            yield Sample(f.PROCESSES, (), sum(p.instance == mig for p in self.processes), mig.labels)
        for p in self.processes:
            extra = p.instance.labels if p.instance else ()
            yield Sample(f.PROCESS_MEMORY, (str(p.pid), p.name or ""), p.used_bytes, extra)


@dataclass(frozen=True, slots=True)
class Recovery(Reading, collector=Collector.RECOVERY):
    # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset,
    # 5 recover the IMEX domain, 6 bus reset, 7 system reboot
    action: int | None = series(f.RECOVERY_ACTION)


@dataclass(frozen=True, slots=True)
class LinkThroughput:
    link: int
    tx_bytes_per_second: float | None
    rx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class Activity(Reading):
    """Profiling values of a whole GPU or of one MIG instance (a part of `Profiling`, not a collector)."""

    graphics_engine_active: float | None = series(f.GRAPHICS_ENGINE_ACTIVE, default=None)
    sm_active: float | None = series(f.SM_ACTIVE, default=None)
    sm_occupancy: float | None = series(f.SM_OCCUPANCY, default=None)
    tensor_active: float | None = series(f.TENSOR_ACTIVE, default=None)
    dram_active: float | None = series(f.DRAM_ACTIVE, default=None)
    fp64_active: float | None = series(f.FP64_ACTIVE, default=None)
    fp32_active: float | None = series(f.FP32_ACTIVE, default=None)
    fp16_active: float | None = series(f.FP16_ACTIVE, default=None)
    pcie_tx_bytes_per_second: float | None = series(f.PCIE_THROUGHPUT, "tx", preferred=True, default=None)
    pcie_rx_bytes_per_second: float | None = series(f.PCIE_THROUGHPUT, "rx", preferred=True, default=None)
    # The GPU's NVLink total, used only where the source has no per-link values: never both.
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_links: tuple[LinkThroughput, ...] = ()

    def more_samples(self) -> Iterator[Sample]:
        for link in self.nvlink_links:
            extra = (("link", str(link.link)),)
            yield Sample(f.NVLINK_THROUGHPUT, ("tx",), link.tx_bytes_per_second, extra)
            yield Sample(f.NVLINK_THROUGHPUT, ("rx",), link.rx_bytes_per_second, extra)
        if not self.nvlink_links:
            yield Sample(f.NVLINK_THROUGHPUT, ("tx",), self.nvlink_tx_bytes_per_second)
            yield Sample(f.NVLINK_THROUGHPUT, ("rx",), self.nvlink_rx_bytes_per_second)


@dataclass(frozen=True, slots=True)
class InstanceActivity:
    instance: MigInstance
    activity: Activity


@dataclass(frozen=True, slots=True)
class Profiling(Reading, collector=Collector.PROFILING):
    """What the SMs, tensor cores and memory did over the last interval, or why nothing is known."""

    source: str | None  # "gpm", "dcgm", "sim"; None when this GPU has no profiling
    status: str  # what the source is doing, or why there is none ("GPM is not supported on this GPU")
    gpu: Activity | None = None
    instances: tuple[InstanceActivity, ...] = ()

    def more_samples(self) -> Iterator[Sample]:
        if self.gpu is not None:
            yield from self.gpu.samples()
        for part in self.instances:
            for s in part.activity.samples():
                yield replace(s, extra=part.instance.labels + s.extra)


@dataclass(frozen=True, slots=True)
class HealthIncident:
    """A problem a DCGM health watch reported: which system, how bad, and DCGM's own words."""

    system: str  # pcie, nvlink, memory, inforom, thermal, power, driver
    failed: bool  # DCGM's FAIL; a WARN otherwise
    message: str
    code: int | None = None  # DCGM's DCGM_FR_* error code


@dataclass(frozen=True, slots=True)
class HealthWatch(Reading, collector=Collector.HEALTH):
    incidents: tuple[HealthIncident, ...] | None  # None: no health watches here (they are DCGM's)


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
        Profiling,
        HealthWatch,
    )
}
if missing := set(Collector) - READING_OF.keys():
    raise ImportError(f"collectors without a reading type: {sorted(missing)}")
