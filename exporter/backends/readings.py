"""What a backend reads from a GPU, one dataclass per collector, and the metric series each value becomes.

A plain value (one number, one series) is declared once, in field_table.py: its family, labels and
how each backend reads it; the reading only has the attribute. A reading whose values fan out over
links, clock domains or processes adds them in `more_samples`, and names such attributes in
`fanned_out`. At import every plain attribute here is checked to have exactly one spec there.

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

import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum, StrEnum
from itertools import chain
from typing import Any, ClassVar, NamedTuple

from gpu_triage.exporter.backends import field_table
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.metrics import families as f

Value = float | int | bool | None


class Sample(NamedTuple):  # a tuple, not a frozen dataclass: a page makes some 300 of them per GPU
    family: f.Family
    labels: tuple[str, ...]  # values of family.labels
    value: Value
    extra: tuple[tuple[str, str], ...] = ()  # more (name, value) labels: a MIG instance's, a link's
    # From a more precise source than another collector's sample of the same series, which then gives way
    # (PCIe bandwidth from profiling over the interval beats NVML's 20 ms window).
    preferred: bool = False


class Reading:
    """Base of every reading: its samples are its plain attributes' (field_table.py), plus `more_samples`."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    collector: ClassVar[Collector]
    fanned_out: ClassVar[frozenset[str]] = frozenset()  # number attributes more_samples spreads over series
    _plain: ClassVar[tuple[tuple[str, f.Family, tuple[str, ...], bool], ...]]
    _plain_values: ClassVar[Callable[[Reading], tuple[Value, ...]]]  # the plain attributes' values, in their order

    def __init_subclass__(cls, collector: Collector | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if collector is not None:
            cls.collector = collector

    def samples(self) -> Iterator[Sample]:
        yield from self.plain_samples()
        yield from self.more_samples()

    @classmethod
    def _plain_specs(cls) -> tuple[tuple[str, f.Family, tuple[str, ...], bool], ...]:
        plain = cls.__dict__.get("_plain")
        if plain is None:  # once per class: a page asks some 300 readings per GPU
            plain = tuple((s.attr, s.family, s.labels, s.preferred) for s in field_table.of(cls.__name__))
            cls._plain = plain
            names = [name for name, *_ in plain]
            cls._plain_values = (
                operator.attrgetter(*names) if len(names) > 1 else lambda r: tuple(getattr(r, n) for n in names)
            )
        return plain

    def plain_samples(self) -> Iterator[Sample]:
        for name, family, labels, preferred in self._plain_specs():
            yield Sample(family, labels, getattr(self, name), (), preferred)

    def more_samples(self) -> Iterator[Sample]:
        return iter(())

    def plain_part(self) -> Part:
        """The plain samples as a part whose series are the reading's class: its key is their values."""
        cls = type(self)
        cls._plain_specs()  # which makes _plain_values, once per class
        return cls._plain_values(self), self.plain_samples, cls

    def parts(self) -> Iterator[Part]:
        """The samples in parts, for a writer that keeps what it wrote: (key, samples, series).

        Where `series` is None, a part whose key equals the key of the same part of the last reading of this
        collector on this GPU has equal samples. Where it is not, it stands for which series the part has, in
        which order, whatever their values, and the key is the tuple of the samples' values: equal series and
        equal keys, equal samples; equal series, the same lines but for their values. Here: the plain values,
        keyed by their values, then the rest keyed by the reading itself (its fields compared). Equal is
        Python's: a kept line may write 0.0 for a -0.0, or a mapping's series in the order it had on the last
        page, the same values to Prometheus."""
        cls = type(self)
        if cls._plain_specs():
            yield self.plain_part()
        if cls.more_samples is not Reading.more_samples:
            yield self, self.more_samples, None


# (key, how to make the samples, what their series are or None); see Reading.parts.
Part = tuple[object, Callable[[], Iterable[Sample]], object]


@dataclass(frozen=True, slots=True)
class Inventory(Reading, collector=Collector.INVENTORY):
    name: str | None
    serial: str | None
    vbios_version: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # "12.8"
    mig_enabled: bool | None
    persistence_mode: bool | None = None
    gsp_firmware: bool | None = None  # the driver runs on the GPU's GSP


def cuda_version(raw: int | None) -> str | None:
    """The CUDA version as the driver encodes it (1000 * major + 10 * minor: 12080) as "12.8"."""
    return None if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"


@dataclass(frozen=True, slots=True)
class Utilization(Reading, collector=Collector.UTILIZATION):
    gpu_ratio: float | None
    memory_controller_ratio: float | None
    encoder_ratio: float | None = None
    decoder_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    instance: MigInstance
    used_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True, slots=True)
class Memory(Reading, collector=Collector.MEMORY):
    used_bytes: int | None
    total_bytes: int | None
    reserved_bytes: int | None
    instances: tuple[InstanceMemory, ...] = ()  # MIG devices, each with its own memory

    def more_samples(self) -> Iterator[Sample]:
        for m in self.instances:
            yield Sample(f.MEMORY_USED, (), m.used_bytes, m.instance.labels)
            yield Sample(f.MEMORY_TOTAL, (), m.total_bytes, m.instance.labels)


@dataclass(frozen=True, slots=True)
class Power(Reading, collector=Collector.POWER):
    usage_watts: float | None  # nvmlDeviceGetPowerUsage: a 1 s average on Ampere+ but GA100
    limit_watts: float | None  # the enforced limit
    energy_joules: float | None  # since the driver was loaded
    instant_watts: float | None = None  # NVML_FI_DEV_POWER_INSTANT
    default_limit_watts: float | None = None  # the limit the board comes with (nvidia-smi's "Default Power Limit")


class ThresholdKind(StrEnum):
    """The GPU's own temperature limits (nvmlTemperatureThresholds_t), named as the `threshold` label."""

    SHUTDOWN = "shutdown"  # the GPU shuts down to protect itself
    SLOWDOWN = "slowdown"  # hardware slowdown begins
    MEMORY_MAX = "memory_max"  # software slowdown for memory temperature
    GPU_MAX = "gpu_max"  # the GPU may be throttled below its base clock


@dataclass(frozen=True, slots=True)
class Thermal(Reading, collector=Collector.THERMAL):
    gpu_celsius: float | None
    memory_celsius: float | None
    fan_ratio: float | None
    thresholds: Mapping[ThresholdKind, float] = field(default_factory=dict)  # those the GPU reports

    def more_samples(self) -> Iterator[Sample]:
        for kind, celsius in self.thresholds.items():
            yield Sample(f.TEMPERATURE_THRESHOLD, (kind.value,), celsius)


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
    BOARD_LIMIT = "board_limit"
    RELIABILITY = "reliability"

    @property
    def bit(self) -> int:
        return _REASON_BITS[self]


# nvml.h 13.3 nvmlClocksEventReason* (0x1-0x100); board limit and reliability from nvidia-ml-py 13.615
# (nvmlClocksThrottleReasonBoardLimit, nvmlClocksThrottleReasonReliability), newer than that header.
_REASON_BITS = {
    ClockEventReason.GPU_IDLE: 0x1,
    ClockEventReason.APPLICATIONS_CLOCKS_SETTING: 0x2,
    ClockEventReason.SW_POWER_CAP: 0x4,
    ClockEventReason.HW_SLOWDOWN: 0x8,
    ClockEventReason.SYNC_BOOST: 0x10,
    ClockEventReason.SW_THERMAL_SLOWDOWN: 0x20,
    ClockEventReason.HW_THERMAL_SLOWDOWN: 0x40,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN: 0x80,
    ClockEventReason.DISPLAY_CLOCK_SETTING: 0x100,
    ClockEventReason.BOARD_LIMIT: 0x200,
    ClockEventReason.RELIABILITY: 0x400,
}


@dataclass(frozen=True, slots=True)
class Clocks(Reading, collector=Collector.CLOCKS):
    fanned_out = frozenset({"event_reasons"})
    current_hz: Mapping[ClockDomain, float]
    max_hz: Mapping[ClockDomain, float]
    event_reasons: int | None  # NVML bitmask, see ClockEventReason.bit
    performance_state: int | None  # P0..P15
    # How long each reason has held the clocks down since the driver loaded (NVML's ns counters).
    event_seconds: Mapping[ClockEventReason, float] = field(default_factory=dict)

    def more_samples(self) -> Iterator[Sample]:
        for domain in ClockDomain:
            yield Sample(f.CLOCK, (domain.value,), self.current_hz.get(domain))
            yield Sample(f.CLOCK_MAX, (domain.value,), self.max_hz.get(domain))
        if self.event_reasons is not None:
            for reason in ClockEventReason:
                yield Sample(f.CLOCK_EVENT, (reason.value,), bool(self.event_reasons & reason.bit))
        for reason, seconds in self.event_seconds.items():
            yield Sample(f.CLOCK_EVENT_SECONDS, (reason.value,), seconds)


@dataclass(frozen=True, slots=True)
class Pcie(Reading, collector=Collector.PCIE):
    link_generation: int | None
    max_link_generation: int | None
    link_width: int | None
    max_link_width: int | None
    replay_errors: int | None  # counter since driver load
    tx_bytes_per_second: float | None
    rx_bytes_per_second: float | None
    tx_bytes: int | None = None  # NVML's byte counters, which may wrap
    rx_bytes: int | None = None
    # The link's error counters by kind (NVML_FI_DEV_PCIE_COUNT_*, L0-to-recovery): only those the GPU has.
    errors: Mapping[str, int] = field(default_factory=dict)

    def more_samples(self) -> Iterator[Sample]:
        for kind, count in self.errors.items():
            yield Sample(f.PCIE_ERRORS, (kind,), count)

    def parts(self) -> Iterator[Part]:
        # The byte counters move at every poll, the error counters seldom.
        yield self.plain_part()
        yield tuple(self.errors.items()), self.more_samples, None


class LinkState(IntEnum):
    """NVML_FI_DEV_NVLINK_GET_STATE's values (NVML_NVLINK_STATE_*)."""

    INACTIVE = 0
    ACTIVE = 1
    SLEEP = 2  # a trained link resting in its low-power state; it wakes on traffic
    ACTIVE_TRAFFIC_DISABLED = 3


_INACTIVE = int(LinkState.INACTIVE)  # a plain int: an enum member looked up on its class at every link costs


@dataclass(frozen=True, slots=True)
class LinkReading:
    link: int
    state: int | None  # NVML's value, see LinkState; a value newer than LinkState is passed on as it is
    replay_errors: int | None
    recovery_errors: int | None  # recoveries, whatever their outcome (NVLink5: NVML's recovery events)
    crc_errors: int | None
    # NVLink5 (Blackwell and later), where NVML has these instead of replay and CRC counters.
    recovery_failed: int | None = None
    recovery_successful: int | None = None
    effective_errors: int | None = None
    symbol_errors: int | None = None
    # Data moved since the driver loaded, in bytes (NVML's KiB counters), and the rate over the last poll.
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None

    @property
    def up(self) -> bool:
        """Trained: anything but inactive (and not unknown)."""
        return self.state is not None and self.state != _INACTIVE


@dataclass(frozen=True, slots=True)
class NvLink(Reading, collector=Collector.NVLINK):
    links: tuple[LinkReading, ...]

    def more_samples(self) -> Iterator[Sample]:
        for _, part, _ in self.parts():
            yield from part()

    def parts(self) -> Iterator[Part]:
        # The links' states and error counters seldom move, their data counters at every poll: apart, the first
        # are written once and kept while they stay the same. The rates are a part of their own, named by its
        # links: where profiling's per-link rates win over them, they are not made again at each poll. (No two
        # parts share a family, so each family's series keep the order of the links.)
        links = self.links
        numbers = tuple(map(_LINK, links))
        yield tuple(map(_STATE_KEY, links)), functools.partial(_link_states, links), None
        yield tuple(chain.from_iterable(map(_BYTES, links))), functools.partial(_link_bytes, links), numbers
        yield tuple(chain.from_iterable(map(_RATES, links))), functools.partial(_link_rates, links), numbers


# What each part's samples are made of, read at C speed: a page compares them for every link of every GPU.
_STATE_KEY = operator.attrgetter(
    "link", "state", "replay_errors", "recovery_errors", "crc_errors", "recovery_failed", "recovery_successful",
    "effective_errors", "symbol_errors",
)  # fmt: skip
_BYTES = operator.attrgetter("tx_bytes", "rx_bytes")  # in the order _link_bytes and _link_rates give them
_RATES = operator.attrgetter("tx_bytes_per_second", "rx_bytes_per_second")
_LINK = operator.attrgetter("link")


def _link_states(links: tuple[LinkReading, ...]) -> Iterator[Sample]:
    for link in links:
        n = str(link.link)
        yield Sample(f.NVLINK_STATE, (n,), link.state)
        yield Sample(f.NVLINK_UP, (n,), None if link.state is None else link.up)
        yield Sample(f.NVLINK_ERRORS, (n, "replay"), link.replay_errors)
        yield Sample(f.NVLINK_ERRORS, (n, "recovery"), link.recovery_errors)
        yield Sample(f.NVLINK_ERRORS, (n, "crc"), link.crc_errors)
        yield Sample(f.NVLINK_ERRORS, (n, "recovery_failed"), link.recovery_failed)
        yield Sample(f.NVLINK_ERRORS, (n, "recovery_successful"), link.recovery_successful)
        yield Sample(f.NVLINK_ERRORS, (n, "effective"), link.effective_errors)
        yield Sample(f.NVLINK_ERRORS, (n, "symbol"), link.symbol_errors)


def _link_bytes(links: tuple[LinkReading, ...]) -> Iterator[Sample]:
    for link in links:
        n = str(link.link)
        yield Sample(f.NVLINK_BYTES, (n, "tx"), link.tx_bytes)
        yield Sample(f.NVLINK_BYTES, (n, "rx"), link.rx_bytes)


def _link_rates(links: tuple[LinkReading, ...]) -> Iterator[Sample]:
    # Profiling's per-link throughput, where there is profiling, is preferred to this.
    for link in links:
        link_label = (("link", str(link.link)),)
        yield Sample(f.NVLINK_THROUGHPUT, ("tx",), link.tx_bytes_per_second, link_label)
        yield Sample(f.NVLINK_THROUGHPUT, ("rx",), link.rx_bytes_per_second, link_label)


@dataclass(frozen=True, slots=True)
class Ecc(Reading, collector=Collector.ECC):
    enabled: bool | None
    corrected_volatile: int | None
    uncorrected_volatile: int | None
    corrected_aggregate: int | None
    uncorrected_aggregate: int | None
    retired_pages_single_bit: int | None  # pre-Ampere page retirement
    retired_pages_double_bit: int | None
    retired_pages_pending: bool | None
    # Volatile counts by location and error, {"dram": {"corrected": 0, "uncorrected": 0}, "sram": {...}},
    # where the GPU counts by location (nvidia-smi's SRAM/DRAM split).
    by_location: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def more_samples(self) -> Iterator[Sample]:
        for location, counts in self.by_location.items():
            for error, count in counts.items():
                yield Sample(f.ECC_LOCATION, (error, location), count)


@dataclass(frozen=True, slots=True)
class Remapping(Reading, collector=Collector.REMAPPING):
    correctable_rows: int | None
    uncorrectable_rows: int | None
    pending: bool | None
    failure: bool | None


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


# nvmlDeviceGpuRecoveryAction_t, named as the `action` label of nvidia_gpu_recovery_action_state.
RECOVERY_ACTIONS = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "recover_imex_domain",
                    "bus_reset", "system_reboot")  # fmt: skip
# NVML_GPU_FABRIC_STATE_* from 1 on (0, not supported, is no fabric at all), as the `state` label.
FABRIC_STATES = ("not_started", "in_progress", "completed")
# NVML_GPU_FABRIC_HEALTH_SUMMARY_* from 1 on (0 is not supported), as the `state` label.
FABRIC_HEALTH = ("healthy", "unhealthy", "limited_capacity")


@dataclass(frozen=True, slots=True)
class Fabric:
    """An NVSwitch or NVL system's registration of the GPU (nvmlDeviceGetGpuFabricInfoV)."""

    state: int  # NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed
    status: int  # the probe's nvmlReturn_t, meaningful once completed: 0 is success
    health_summary: int | None = None  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 1 healthy, 2 unhealthy, 3 limited


@dataclass(frozen=True, slots=True)
class Recovery(Reading, collector=Collector.RECOVERY):
    # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset,
    # 5 recover the IMEX domain, 6 bus reset, 7 system reboot
    action: int | None
    fabric: Fabric | None = None  # None: the GPU is in no fabric, or the source cannot say

    def more_samples(self) -> Iterator[Sample]:
        if self.action is not None:
            for value, name in enumerate(RECOVERY_ACTIONS):
                yield Sample(f.RECOVERY_ACTION_STATE, (name,), self.action == value)
        if self.fabric is not None:
            for value, name in enumerate(FABRIC_STATES, start=1):
                yield Sample(f.FABRIC_STATE, (name,), self.fabric.state == value)
            done = self.fabric.state == len(FABRIC_STATES)
            yield Sample(f.FABRIC_PROBE_FAILED, (), (self.fabric.status != 0) if done else None)
            if self.fabric.health_summary:  # 0: not supported
                for value, name in enumerate(FABRIC_HEALTH, start=1):
                    yield Sample(f.FABRIC_HEALTH, (name,), self.fabric.health_summary == value)


@dataclass(frozen=True, slots=True)
class LinkThroughput:
    link: int
    tx_bytes_per_second: float | None
    rx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class Activity(Reading):
    """Profiling values of a whole GPU or of one MIG instance (a part of `Profiling`, not a collector)."""

    fanned_out = frozenset({"nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"})

    graphics_engine_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    # The GPU's NVLink total, used only where the source has no per-link values: never both.
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_links: tuple[LinkThroughput, ...] = ()

    def more_samples(self) -> Iterator[Sample]:
        for link in self.nvlink_links:
            extra = (("link", str(link.link)),)
            yield Sample(f.NVLINK_THROUGHPUT, ("tx",), link.tx_bytes_per_second, extra, preferred=True)
            yield Sample(f.NVLINK_THROUGHPUT, ("rx",), link.rx_bytes_per_second, extra, preferred=True)
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
                yield s._replace(extra=part.instance.labels + s.extra)


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


def check_field_table(specs: Sequence[field_table.FieldSpec], readings: Sequence[type[Reading]]) -> list[str]:
    """What is wrong between the plain attributes of `readings` and `specs`: each needs exactly one of the other."""
    by_name = {cls.__name__: cls for cls in readings}
    problems, seen = [], set()
    for s in specs:
        cls = by_name.get(s.reading)
        where = f"field_table: {s.reading}.{s.attr}"
        if cls is None:
            problems.append(f"{where}: no such reading")
            continue
        if (s.reading, s.attr) in seen:
            problems.append(f"{where}: declared twice")
        seen.add((s.reading, s.attr))
        declared = cls.__dataclass_fields__.get(s.attr)
        if declared is None:
            problems.append(f"{where}: the reading has no such attribute")
        elif declared.type != f"{s.kind.__name__} | None":
            problems.append(f"{where}: a {s.kind.__name__} here, `{declared.type}` on the reading")
        if len(s.labels) != len(s.family.labels):
            problems.append(f"{where}: {len(s.labels)} label values for {s.family.name}{s.family.labels}")
    for name, cls in by_name.items():
        for attr in fields(cls):
            plain = attr.type in ("int | None", "float | None", "bool | None") and attr.name not in cls.fanned_out
            if plain and (name, attr.name) not in seen:
                problems.append(f"{name}.{attr.name}: a number with no spec in field_table (nor in `fanned_out`)")
    return problems


if problems := check_field_table(field_table.FIELDS, (*READING_OF.values(), Activity)):
    raise ImportError("; ".join(problems))
