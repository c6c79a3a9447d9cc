"""Snapshot -> Prometheus metric families: names, units, labels (the README's "Metrics" section lists them).

Families are built fresh for each snapshot, never kept as long-lived gauges, so a GPU or a link
that disappears takes its series with it. Values are what the last background poll read:
`gpu_triage_last_poll_timestamp_seconds` says when. The per-GPU families are a table (`FAMILIES`)
plus one small function per reading type that says which values go where.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpu_triage import __version__
from gpu_triage.exporter.backends.base import (
    ClockDomain,
    ClockEventReason,
    Clocks,
    Ecc,
    Inventory,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    Utilization,
)
from gpu_triage.exporter.polling.snapshot import Snapshot

GPU_LABELS = ("gpu", "uuid")
INFO_LABELS = ("pci_bus_id", "model", "serial", "vbios_version", "driver_version", "cuda_driver_version")


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()  # beyond gpu and uuid
    counter: bool = False

    def new(self) -> GaugeMetricFamily | CounterMetricFamily:
        cls = CounterMetricFamily if self.counter else GaugeMetricFamily
        return cls(self.name, self.help, labels=[*GPU_LABELS, *self.labels], unit=self.unit)


FAMILIES = (
    Family("nvidia_gpu_up", "1 if the GPU answered the last poll; 0 if it is lost or a call to it hung."),
    Family("nvidia_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (0-1).", "ratio"),
    Family(
        "nvidia_gpu_memory_controller_utilization_ratio",
        "Fraction of time the memory controller was busy reading or writing (0-1).",
        "ratio",
    ),
    Family("nvidia_gpu_memory_used_bytes", "GPU memory in use, in bytes.", "bytes"),
    Family("nvidia_gpu_memory_total_bytes", "GPU memory installed, in bytes.", "bytes"),
    Family(
        "nvidia_gpu_memory_reserved_bytes",
        "GPU memory reserved by the driver and firmware, in bytes.",
        "bytes",
    ),
    Family("nvidia_gpu_power_watts", "Power drawn by the board, in watts.", "watts"),
    Family("nvidia_gpu_power_limit_watts", "Enforced power limit, in watts.", "watts"),
    Family(
        "nvidia_gpu_energy_joules",
        "Energy used since the driver was loaded, in joules.",
        "joules",
        counter=True,
    ),
    Family("nvidia_gpu_temperature_celsius", "GPU core temperature, in degrees Celsius.", "celsius"),
    Family(
        "nvidia_gpu_memory_temperature_celsius",
        "GPU memory (HBM) temperature, in degrees Celsius.",
        "celsius",
    ),
    Family("nvidia_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (0-1).", "ratio"),
    Family("nvidia_gpu_clock_hertz", "Current clock of each clock domain, in hertz.", "hertz", ("clock",)),
    Family("nvidia_gpu_clock_max_hertz", "Maximum clock of each clock domain, in hertz.", "hertz", ("clock",)),
    Family(
        "nvidia_gpu_clock_event_reason_active",
        "1 while this reason holds the clocks down (NVML clocks-event / throttle reasons), else 0.",
        labels=("reason",),
    ),
    Family("nvidia_gpu_performance_state", "Performance state (0 = P0, fastest, .. 15 = P15)."),
    Family("nvidia_gpu_pcie_link_generation", "Current PCIe link generation."),
    Family("nvidia_gpu_pcie_link_max_generation", "Highest PCIe link generation the GPU and the slot support."),
    Family("nvidia_gpu_pcie_link_width", "Current PCIe link width, in lanes."),
    Family("nvidia_gpu_pcie_link_max_width", "Widest PCIe link the GPU and the slot support, in lanes."),
    Family("nvidia_gpu_pcie_replay_errors", "PCIe replays since the driver was loaded.", counter=True),
    Family(
        "nvidia_gpu_pcie_throughput_bytes_per_second",
        "PCIe throughput over NVML's 20 ms sampling window, in bytes per second.",
        labels=("direction",),
    ),
    Family("nvidia_gpu_nvlink_up", "1 if the NVLink link is active, else 0.", labels=("link",)),
    Family(
        "nvidia_gpu_nvlink_errors",
        "NVLink data-link errors by kind: replay, recovery, crc.",
        labels=("link", "error"),
        counter=True,
    ),
    Family("nvidia_gpu_ecc_enabled", "1 if ECC is enabled, else 0."),
    Family(
        "nvidia_gpu_ecc_errors",
        "ECC errors since the driver was loaded (volatile), by error: corrected or uncorrected.",
        labels=("error",),
        counter=True,
    ),
    Family(
        "nvidia_gpu_ecc_aggregate_errors",
        "ECC errors over the GPU's lifetime (aggregate), by error: corrected or uncorrected.",
        labels=("error",),
        counter=True,
    ),
    Family("nvidia_gpu_retired_pages", "Memory pages retired (pre-Ampere GPUs), by cause.", labels=("cause",)),
    Family("nvidia_gpu_retired_pages_pending", "1 if a page retirement waits for a GPU reset, else 0."),
    Family("nvidia_gpu_remapped_rows", "Memory rows remapped (Ampere and later), by cause.", labels=("cause",)),
    Family("nvidia_gpu_row_remap_pending", "1 if a row remap waits for a GPU reset to take effect, else 0."),
    Family("nvidia_gpu_row_remap_failure", "1 if a row remap failed (an RMA criterion), else 0."),
    Family("nvidia_gpu_mig_enabled", "1 if MIG mode is enabled, else 0."),
    Family(
        "nvidia_gpu_recovery_action",
        "Recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.",
    ),
    Family("nvidia_gpu_processes", "Compute processes running on the GPU."),
    Family(
        "nvidia_gpu_process_memory_used_bytes",
        "GPU memory used by each compute process, in bytes.",
        "bytes",
        ("pid", "process"),
    ),
)

Value = tuple[str, tuple[str, ...], float | int | bool | None]  # family, extra label values, value


def _inventory(r: Inventory) -> Iterator[Value]:
    yield "nvidia_gpu_mig_enabled", (), r.mig_enabled


def _utilization(r: Utilization) -> Iterator[Value]:
    yield "nvidia_gpu_utilization_ratio", (), r.gpu_ratio
    yield "nvidia_gpu_memory_controller_utilization_ratio", (), r.memory_controller_ratio


def _memory(r: Memory) -> Iterator[Value]:
    yield "nvidia_gpu_memory_used_bytes", (), r.used_bytes
    yield "nvidia_gpu_memory_total_bytes", (), r.total_bytes
    yield "nvidia_gpu_memory_reserved_bytes", (), r.reserved_bytes


def _power(r: Power) -> Iterator[Value]:
    yield "nvidia_gpu_power_watts", (), r.usage_watts
    yield "nvidia_gpu_power_limit_watts", (), r.limit_watts
    yield "nvidia_gpu_energy_joules", (), r.energy_joules


def _thermal(r: Thermal) -> Iterator[Value]:
    yield "nvidia_gpu_temperature_celsius", (), r.gpu_celsius
    yield "nvidia_gpu_memory_temperature_celsius", (), r.memory_celsius
    yield "nvidia_gpu_fan_speed_ratio", (), r.fan_ratio


def _clocks(r: Clocks) -> Iterator[Value]:
    for domain in ClockDomain:
        yield "nvidia_gpu_clock_hertz", (domain.value,), r.current_hz.get(domain)
        yield "nvidia_gpu_clock_max_hertz", (domain.value,), r.max_hz.get(domain)
    if r.event_reasons is not None:
        for reason in ClockEventReason:
            yield "nvidia_gpu_clock_event_reason_active", (reason.value,), bool(r.event_reasons & reason.bit)
    yield "nvidia_gpu_performance_state", (), r.performance_state


def _pcie(r: Pcie) -> Iterator[Value]:
    yield "nvidia_gpu_pcie_link_generation", (), r.link_generation
    yield "nvidia_gpu_pcie_link_max_generation", (), r.max_link_generation
    yield "nvidia_gpu_pcie_link_width", (), r.link_width
    yield "nvidia_gpu_pcie_link_max_width", (), r.max_link_width
    yield "nvidia_gpu_pcie_replay_errors", (), r.replay_errors
    yield "nvidia_gpu_pcie_throughput_bytes_per_second", ("tx",), r.tx_bytes_per_second
    yield "nvidia_gpu_pcie_throughput_bytes_per_second", ("rx",), r.rx_bytes_per_second


def _nvlink(r: NvLink) -> Iterator[Value]:
    for link in r.links:
        n = str(link.link)
        yield "nvidia_gpu_nvlink_up", (n,), link.active
        yield "nvidia_gpu_nvlink_errors", (n, "replay"), link.replay_errors
        yield "nvidia_gpu_nvlink_errors", (n, "recovery"), link.recovery_errors
        yield "nvidia_gpu_nvlink_errors", (n, "crc"), link.crc_errors


def _ecc(r: Ecc) -> Iterator[Value]:
    yield "nvidia_gpu_ecc_enabled", (), r.enabled
    yield "nvidia_gpu_ecc_errors", ("corrected",), r.corrected_volatile
    yield "nvidia_gpu_ecc_errors", ("uncorrected",), r.uncorrected_volatile
    yield "nvidia_gpu_ecc_aggregate_errors", ("corrected",), r.corrected_aggregate
    yield "nvidia_gpu_ecc_aggregate_errors", ("uncorrected",), r.uncorrected_aggregate
    yield "nvidia_gpu_retired_pages", ("single_bit",), r.retired_pages_single_bit
    yield "nvidia_gpu_retired_pages", ("double_bit",), r.retired_pages_double_bit
    yield "nvidia_gpu_retired_pages_pending", (), r.retired_pages_pending


def _remapping(r: Remapping) -> Iterator[Value]:
    yield "nvidia_gpu_remapped_rows", ("correctable",), r.correctable_rows
    yield "nvidia_gpu_remapped_rows", ("uncorrectable",), r.uncorrectable_rows
    yield "nvidia_gpu_row_remap_pending", (), r.pending
    yield "nvidia_gpu_row_remap_failure", (), r.failure


def _recovery(r: Recovery) -> Iterator[Value]:
    yield "nvidia_gpu_recovery_action", (), r.action


def _processes(r: Processes) -> Iterator[Value]:
    yield "nvidia_gpu_processes", (), len(r.processes)
    for p in r.processes:
        yield "nvidia_gpu_process_memory_used_bytes", (str(p.pid), p.name or ""), p.used_bytes


_VALUES: dict[type[Any], Callable[[Any], Iterator[Value]]] = {
    Inventory: _inventory,
    Utilization: _utilization,
    Memory: _memory,
    Power: _power,
    Thermal: _thermal,
    Clocks: _clocks,
    Pcie: _pcie,
    NvLink: _nvlink,
    Ecc: _ecc,
    Remapping: _remapping,
    Recovery: _recovery,
    Processes: _processes,
}


def values(reading: Reading) -> Iterator[Value]:
    """Which family each value of `reading` goes to."""
    return _VALUES[type(reading)](reading)


def gpu_families(snapshot: Snapshot) -> list[Metric]:
    """Every per-GPU family, in a stable order; a value the GPU does not have is left out."""
    info = InfoMetricFamily(
        "nvidia_gpu",
        "Descriptive attributes of each GPU (join them onto other series by uuid); the value is always 1.",
        labels=[*GPU_LABELS, *INFO_LABELS],
    )
    families = {f.name: f.new() for f in FAMILIES}
    up = families["nvidia_gpu_up"]
    for state in snapshot.gpus:
        g = state.identity
        labels = [str(g.index), g.uuid]
        inv = state.get(Inventory)
        described = (
            (inv.name, inv.serial, inv.vbios_version, inv.driver_version, inv.cuda_driver_version) if inv else ()
        )
        info.add_metric([*labels, g.pci_bus_id, *(d or "" for d in described or ("",) * 5)], {})
        up.add_metric(labels, 1.0 if state.up else 0.0)
        for reading in state.readings.values():
            for name, extra, value in values(reading):
                if value is not None:
                    families[name].add_metric([*labels, *extra], float(value))
    return [info, *families.values()]


def daemon_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The daemon's own health: build, backend, each collector, the last poll."""
    build = InfoMetricFamily("gpu_triage_build", "gpu-triage version and the Python that runs it; always 1.")
    build.add_metric([], {"version": __version__, "python_version": platform.python_version()})
    yield build
    backend = GaugeMetricFamily(
        "gpu_triage_backend_up", "1 if the GPU backend (NVML, DCGM, sim) works, else 0.", labels=["backend"]
    )
    backend.add_metric([snapshot.backend], 1.0 if snapshot.backend_up else 0.0)
    yield backend
    success = GaugeMetricFamily(
        "gpu_triage_collector_success",
        "1 if the collector's last run read every GPU in time and without errors, else 0.",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "gpu_triage_collector_duration_seconds",
        "Wall time of the collector's slowest GPU read in its last run, in seconds.",
        labels=["collector"],
        unit="seconds",
    )
    last = GaugeMetricFamily(
        "gpu_triage_collector_last_success_timestamp_seconds",
        "Unix time of the collector's last successful run, in seconds.",
        labels=["collector"],
        unit="seconds",
    )
    for collector, status in sorted(snapshot.collectors.items()):
        success.add_metric([collector.value], 1.0 if status.success else 0.0)
        duration.add_metric([collector.value], status.duration_seconds)
        if status.last_success is not None:
            last.add_metric([collector.value], status.last_success)
    yield from (success, duration, last)
    if snapshot.taken_at:
        poll = GaugeMetricFamily(
            "gpu_triage_last_poll_timestamp_seconds",
            "Unix time of the poll that this page's GPU values come from (they are cached), in seconds.",
            unit="seconds",
        )
        poll.add_metric([], snapshot.taken_at)
        yield poll
