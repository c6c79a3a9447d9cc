"""One reader per collector for the NVML backend: NVML's answers in, readings in base units out.

Units are converted here, once: mW -> W, mJ -> J, MHz -> Hz, percent -> ratio, KB/s -> B/s. MIG
devices (nvml_mig.py) and GPM profiling (nvml_gpm.py) have modules of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from gpu_triage.exporter.backends.base import Collector, require_every_collector
from gpu_triage.exporter.backends.nvml_gpm import read_profiling
from gpu_triage.exporter.backends.nvml_mig import with_instance_memory, with_instance_processes
from gpu_triage.exporter.backends.nvml_query import Query, text
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    Clocks,
    Ecc,
    HealthWatch,
    Inventory,
    LinkReading,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    ProcessReading,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    Utilization,
    cuda_version,
)

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.nvml import NvmlBackend

MHZ = 1e6
# nvmlDeviceGetPcieThroughput answers in "KB/s" (nvml.h; NVIDIA's NVML API reference says the same), and
# decimal kilobytes are meant: the same header writes "KiB" where it means 1024 bytes (the NVLink
# throughput fields, NVML_FI_DEV_NVLINK_THROUGHPUT_*). To be confirmed on a GPU with a copy of known size.
PCIE_KB = 1000
_CLOCKS = {
    ClockDomain.SM: pynvml.NVML_CLOCK_SM,
    ClockDomain.MEMORY: pynvml.NVML_CLOCK_MEM,
    ClockDomain.GRAPHICS: pynvml.NVML_CLOCK_GRAPHICS,
    ClockDomain.VIDEO: pynvml.NVML_CLOCK_VIDEO,
}
_ECC_FIELDS = (
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
)
_REMAP_FIELDS = (
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)
# Per-link fields, scoped by link index: state, then the three data-link error counters.
_LINK_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _pstate(value: int | None) -> int | None:
    return None if value is None or value == pynvml.NVML_PSTATE_UNKNOWN else int(value)


def _inventory(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    mig = q("mig_mode", pynvml.nvmlDeviceGetMigMode, h)
    return Inventory(
        name=text(q("name", pynvml.nvmlDeviceGetName, h)),
        serial=text(q("serial", pynvml.nvmlDeviceGetSerial, h)),
        vbios_version=text(q("vbios_version", pynvml.nvmlDeviceGetVbiosVersion, h)),
        driver_version=text(q("driver_version", pynvml.nvmlSystemGetDriverVersion)),
        cuda_driver_version=cuda_version(q("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)),
        mig_enabled=None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
    )


def _utilization(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    rates = q("utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
    if rates is None:
        return Utilization(None, None)
    return Utilization(_ratio(rates.gpu), _ratio(rates.memory))


def _memory(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    info = q.first(
        ("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, (h, pynvml.nvmlMemory_v2)),
        ("memory", pynvml.nvmlDeviceGetMemoryInfo, (h,)),  # drivers older than the versioned call
    )
    if info is None:
        return Memory(None, None, None)
    return Memory(int(info.used), int(info.total), _int(getattr(info, "reserved", None)))


def _power(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    usage = q("power_usage", pynvml.nvmlDeviceGetPowerUsage, h)
    limit = q("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    energy = q("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
    return Power(
        usage_watts=None if usage is None else usage / 1000.0,
        limit_watts=None if limit is None else limit / 1000.0,
        energy_joules=None if energy is None else energy / 1000.0,
    )


def _thermal(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    temp = q.first(
        ("temperature", pynvml.nvmlDeviceGetTemperatureV, (h, pynvml.NVML_TEMPERATURE_GPU)),
        ("temperature_legacy", pynvml.nvmlDeviceGetTemperature, (h, pynvml.NVML_TEMPERATURE_GPU)),
    )
    (memory_temp,) = q.fields(h, [(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)], ["memory_temperature"])
    fan = q("fan_speed", pynvml.nvmlDeviceGetFanSpeed, h)
    return Thermal(
        gpu_celsius=None if temp is None else float(temp),
        memory_celsius=memory_temp,
        fan_ratio=_ratio(fan),
    )


def _clocks(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    current, maximum = {}, {}
    for domain, clock in _CLOCKS.items():
        if (mhz := q(f"clock_{domain}", pynvml.nvmlDeviceGetClockInfo, h, clock)) is not None:
            current[domain] = mhz * MHZ
        if (mhz := q(f"max_clock_{domain}", pynvml.nvmlDeviceGetMaxClockInfo, h, clock)) is not None:
            maximum[domain] = mhz * MHZ
    reasons = q.first(
        ("clock_event_reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, (h,)),
        # drivers older than the "clocks event" rename
        ("clock_throttle_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, (h,)),
    )
    pstate = q("performance_state", pynvml.nvmlDeviceGetPerformanceState, h)
    return Clocks(current, maximum, _int(reasons), _pstate(pstate))


def _pcie(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    # Each throughput call samples a 20 ms window, which is why PCIe is its own collector.
    tx = q("pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    rx = q("pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    return Pcie(
        link_generation=q("pcie_link_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        max_link_generation=q("pcie_max_link_gen", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        link_width=q("pcie_link_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        max_link_width=q("pcie_max_link_width", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        replay_errors=q("pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter, h),
        tx_bytes_per_second=None if tx is None else tx * PCIE_KB,
        rx_bytes_per_second=None if rx is None else rx * PCIE_KB,
    )


def _nvlink(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    links = _link_count(b, q, h, gpu)
    if not links:
        return NvLink(())
    ids = [(field, link) for link in range(links) for field in _LINK_FIELDS]
    names = [f"nvlink_{link}_{field}" for link in range(links) for field in _LINK_FIELDS]
    values = q.fields(h, ids, names)
    out = []
    for link in range(links):
        state, replay, recovery, crc = values[link * 4 : link * 4 + 4]
        # NVML's link state as it is (0 inactive, 1 active, 2 sleep, 3 active, traffic disabled). The
        # count is of links the GPU has, cabled or not: an uncabled one is inactive for good.
        out.append(LinkReading(link, _int(state), _int(replay), _int(recovery), _int(crc)))
    return NvLink(tuple(out))


def _link_count(b: NvmlBackend, q: Query, h: Any, gpu: int) -> int:
    if gpu not in b.link_counts:
        failed = len(q.failed)
        (count,) = q.fields(h, [(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)], ["nvlink_link_count"])
        if len(q.failed) > failed:
            return 0  # a failed read, not an answer: ask again next poll
        b.link_counts[gpu] = int(count or 0)
    return b.link_counts[gpu]


def _processes(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    procs = q("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []
    return Processes(
        tuple(ProcessReading(int(p.pid), b.process_name(int(p.pid)), _int(p.usedGpuMemory)) for p in procs)
    )


def _recovery(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    (action,) = q.fields(h, [(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)], ["recovery_action"])
    return Recovery(_int(action))


def _ecc(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    mode = q("ecc_mode", pynvml.nvmlDeviceGetEccMode, h)
    names = ["ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate"]
    sbe_vol, dbe_vol, sbe_agg, dbe_agg = q.fields(h, [(f, 0) for f in _ECC_FIELDS], names)
    retired = pynvml.nvmlDeviceGetRetiredPages
    sbe = q("retired_pages_sbe", retired, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = q("retired_pages_dbe", retired, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = q("retired_pages_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    return Ecc(
        enabled=None if mode is None else bool(mode[0]),
        corrected_volatile=_int(sbe_vol),
        uncorrected_volatile=_int(dbe_vol),
        corrected_aggregate=_int(sbe_agg),
        uncorrected_aggregate=_int(dbe_agg),
        retired_pages_single_bit=None if sbe is None else len(sbe),
        retired_pages_double_bit=None if dbe is None else len(dbe),
        retired_pages_pending=None if pending is None else bool(pending),
    )


def _remapping(b: NvmlBackend, q: Query, h: Any, gpu: int) -> Reading:
    names = ["remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure"]
    cor, unc, pending, failure = q.fields(h, [(f, 0) for f in _REMAP_FIELDS], names)
    return Remapping(
        correctable_rows=_int(cor),
        uncorrectable_rows=_int(unc),
        pending=None if pending is None else bool(pending),
        failure=None if failure is None else bool(failure),
    )


READERS = {
    Collector.INVENTORY: _inventory,
    Collector.UTILIZATION: _utilization,
    Collector.MEMORY: with_instance_memory(_memory),
    Collector.POWER: _power,
    Collector.THERMAL: _thermal,
    Collector.CLOCKS: _clocks,
    Collector.PCIE: _pcie,
    Collector.NVLINK: _nvlink,
    Collector.PROCESSES: with_instance_processes(_processes),
    Collector.RECOVERY: _recovery,
    Collector.ECC: _ecc,
    Collector.REMAPPING: _remapping,
    Collector.PROFILING: read_profiling,
    Collector.HEALTH: lambda *_: HealthWatch(None),  # health watches are DCGM's
}
require_every_collector(READERS, "nvml")
