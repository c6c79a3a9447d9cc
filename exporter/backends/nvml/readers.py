"""One reader per collector for the NVML backend: NVML's answers in, readings in base units out.

Units are converted here, once, as nvml.h gives them: mW -> W, mJ -> J, MHz -> Hz, percent -> ratio,
ns -> s. PCIe and NVLink (buses.py), MIG devices (mig.py) and GPM profiling (gpm.py)
have modules of their own.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import pynvml

from gpu_triage.exporter.backends.collectors import Collector, require_every_collector
from gpu_triage.exporter.backends.nvml.buses import BusState, read_nvlink, read_pcie
from gpu_triage.exporter.backends.nvml.field_values import FieldRequest
from gpu_triage.exporter.backends.nvml.gpm import GpmState, read_profiling
from gpu_triage.exporter.backends.nvml.kept import Kept
from gpu_triage.exporter.backends.nvml.mig import with_instance_memory, with_instance_processes
from gpu_triage.exporter.backends.nvml.plain import read_plain
from gpu_triage.exporter.backends.nvml.query import Query, text
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    ClockEventReason,
    Clocks,
    Ecc,
    Fabric,
    HealthWatch,
    Inventory,
    Memory,
    Power,
    Processes,
    ProcessReading,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    ThresholdKind,
    Utilization,
    cuda_version,
)


class ReaderState(BusState, GpmState, Protocol):
    """What the NVML backend keeps for its readers between reads: the readers take it, not the backend
    class, so they import nothing of backend.py (which imports them)."""

    thresholds: dict[int, dict[ThresholdKind, float]]  # the GPU's temperature limits, once read
    max_clocks: Kept[dict[ClockDomain, float]]  # the GPU's maximum clocks, in Hz, kept a while (kept.py)


MHZ = 1e6
NS = 1e-9
_CLOCKS = {
    ClockDomain.SM: pynvml.NVML_CLOCK_SM,
    ClockDomain.MEMORY: pynvml.NVML_CLOCK_MEM,
    ClockDomain.GRAPHICS: pynvml.NVML_CLOCK_GRAPHICS,
    ClockDomain.VIDEO: pynvml.NVML_CLOCK_VIDEO,
}
# Clock-event (throttle) durations, "All counters are in nanoseconds" (nvml.h).
_CLOCK_EVENT_FIELDS = {
    ClockEventReason.SW_POWER_CAP: pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    ClockEventReason.SYNC_BOOST: pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    ClockEventReason.SW_THERMAL_SLOWDOWN: pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    ClockEventReason.HW_THERMAL_SLOWDOWN: pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN: pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
_CLOCK_EVENTS = FieldRequest(
    [(fid, 0) for fid in _CLOCK_EVENT_FIELDS.values()], [f"clock_event_ns_{reason}" for reason in _CLOCK_EVENT_FIELDS]
)
_THRESHOLDS = {
    ThresholdKind.SHUTDOWN: pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    ThresholdKind.SLOWDOWN: pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    ThresholdKind.MEMORY_MAX: pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    ThresholdKind.GPU_MAX: pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
}
_ECC_LOCATIONS = {"dram": pynvml.NVML_MEMORY_LOCATION_DRAM, "sram": pynvml.NVML_MEMORY_LOCATION_SRAM}
_ECC_ERRORS = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _pstate(value: int | None) -> int | None:
    return None if value is None or value == pynvml.NVML_PSTATE_UNKNOWN else int(value)


def _inventory(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    mig = q("mig_mode", pynvml.nvmlDeviceGetMigMode, h)
    return Inventory(
        name=text(q("name", pynvml.nvmlDeviceGetName, h)),
        serial=text(q("serial", pynvml.nvmlDeviceGetSerial, h)),
        vbios_version=text(q("vbios_version", pynvml.nvmlDeviceGetVbiosVersion, h)),
        driver_version=text(q("driver_version", pynvml.nvmlSystemGetDriverVersion)),
        cuda_driver_version=cuda_version(q("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)),
        mig_enabled=None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
        gsp_firmware=_flag(gsp[0] if (gsp := q("gsp_firmware", pynvml.nvmlDeviceGetGspFirmwareMode, h)) else None),
        **read_plain(q, h, "Inventory"),
    )


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def _utilization(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    rates = q("utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
    encoder = q("encoder_utilization", pynvml.nvmlDeviceGetEncoderUtilization, h)  # [percent, sampling period]
    decoder = q("decoder_utilization", pynvml.nvmlDeviceGetDecoderUtilization, h)
    return Utilization(
        None if rates is None else _ratio(rates.gpu),
        None if rates is None else _ratio(rates.memory),
        None if encoder is None else _ratio(encoder[0]),
        None if decoder is None else _ratio(decoder[0]),
    )


def _memory(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    info = q.first(
        ("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, (h, pynvml.nvmlMemory_v2)),
        ("memory", pynvml.nvmlDeviceGetMemoryInfo, (h,)),  # drivers older than the versioned call
    )
    if info is None:
        return Memory(None, None, None)
    return Memory(int(info.used), int(info.total), _int(getattr(info, "reserved", None)))


def _power(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    return Power(**read_plain(q, h, "Power", b.board_limits["Power"]))


def _thermal(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    temp = q.first(
        ("temperature", pynvml.nvmlDeviceGetTemperatureV, (h, pynvml.NVML_TEMPERATURE_GPU)),
        ("temperature_legacy", pynvml.nvmlDeviceGetTemperature, (h, pynvml.NVML_TEMPERATURE_GPU)),
    )
    return Thermal(
        gpu_celsius=None if temp is None else float(temp),
        thresholds=_thresholds(b, q, h, gpu),
        **read_plain(q, h, "Thermal"),
    )


def _thresholds(b: ReaderState, q: Query, h: Any, gpu: int) -> dict[ThresholdKind, float]:
    """The GPU's own temperature limits: fixed for the board, so read until NVML has answered, then kept."""
    if gpu in b.thresholds:
        return b.thresholds[gpu]
    failed = len(q.failed)
    found = {}
    for kind, which in _THRESHOLDS.items():
        if (
            celsius := q(f"temperature_threshold_{kind}", pynvml.nvmlDeviceGetTemperatureThreshold, h, which)
        ) is not None:
            found[kind] = float(celsius)
    if len(q.failed) == failed:  # answers, "not supported" included: no need to ask again
        b.thresholds[gpu] = found
    return found


def _clocks(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    current = {}
    for domain, clock in _CLOCKS.items():
        if (mhz := q(f"clock_{domain}", pynvml.nvmlDeviceGetClockInfo, h, clock)) is not None:
            current[domain] = mhz * MHZ
    maximum = _max_clocks(b, q, h, gpu, current)
    reasons = q.first(
        ("clock_event_reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, (h,)),
        # drivers older than the "clocks event" rename
        ("clock_throttle_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, (h,)),
    )
    pstate = q("performance_state", pynvml.nvmlDeviceGetPerformanceState, h)
    durations = q.fields(h, _CLOCK_EVENTS)
    seconds = {r: ns * NS for r, ns in zip(_CLOCK_EVENT_FIELDS, durations, strict=True) if ns is not None}
    return Clocks(current, maximum, _int(reasons), _pstate(pstate), seconds)


def _max_clocks(
    b: ReaderState, q: Query, h: Any, gpu: int, current: dict[ClockDomain, float]
) -> dict[ClockDomain, float]:
    """The maximum clocks, kept between reads (kept.py) once every domain has answered, while every current clock
    answers and none is above its kept maximum: a current clock that does not answer may mean the maxima would not
    either."""

    def vouched(kept: dict[ClockDomain, float]) -> bool:
        return len(current) == len(_CLOCKS) and all(current[d] <= hz for d, hz in kept.items())

    def ask() -> tuple[dict[ClockDomain, float], bool]:
        failed, maximum = len(q.failed), {}
        for domain, clock in _CLOCKS.items():
            if (mhz := q(f"max_clock_{domain}", pynvml.nvmlDeviceGetMaxClockInfo, h, clock)) is not None:
                maximum[domain] = mhz * MHZ
        return maximum, len(q.failed) == failed and len(maximum) == len(_CLOCKS)  # whole: "not supported" asked again

    return dict(b.max_clocks.answer(gpu, vouched, ask))  # a copy: the kept one is never handed out


def _processes(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    procs = q("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []
    return Processes(
        tuple(ProcessReading(int(p.pid), b.process_name(int(p.pid)), _int(p.usedGpuMemory)) for p in procs)
    )


def _recovery(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    return Recovery(fabric=_fabric(q, h), **read_plain(q, h, "Recovery"))


def _fabric(q: Query, h: Any) -> Fabric | None:
    """The GPU's NVSwitch fabric registration; None on a GPU in no fabric (NVML: not supported)."""
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()  # the header's nvmlGpuFabricInfoV_t: v2 plus the health summary
    if q("fabric", pynvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info)) is None:
        return None
    if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    return Fabric(int(info.state), int(info.status), int(info.healthSummary))


def _ecc(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    mode = q("ecc_mode", pynvml.nvmlDeviceGetEccMode, h)
    plain = read_plain(q, h, "Ecc")
    retired = pynvml.nvmlDeviceGetRetiredPages
    sbe = q("retired_pages_sbe", retired, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = q("retired_pages_dbe", retired, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    by_location: dict[str, dict[str, int]] = {}
    if mode is not None and mode[0]:
        for location, where in _ECC_LOCATIONS.items():
            for error, kind in _ECC_ERRORS.items():
                name = f"ecc_{error}_{location}"
                count = q(name, pynvml.nvmlDeviceGetMemoryErrorCounter, h, kind, pynvml.NVML_VOLATILE_ECC, where)
                if count is not None:
                    by_location.setdefault(location, {})[error] = int(count)
    return Ecc(
        enabled=None if mode is None else bool(mode[0]),
        retired_pages_single_bit=None if sbe is None else len(sbe),
        retired_pages_double_bit=None if dbe is None else len(dbe),
        by_location=by_location,
        **plain,
    )


def _remapping(b: ReaderState, q: Query, h: Any, gpu: int) -> Reading:
    return Remapping(**read_plain(q, h, "Remapping"))


READERS = {
    Collector.INVENTORY: _inventory,
    Collector.UTILIZATION: _utilization,
    Collector.MEMORY: with_instance_memory(_memory),
    Collector.POWER: _power,
    Collector.THERMAL: _thermal,
    Collector.CLOCKS: _clocks,
    Collector.PCIE: read_pcie,
    Collector.NVLINK: read_nvlink,
    Collector.PROCESSES: with_instance_processes(_processes),
    Collector.RECOVERY: _recovery,
    Collector.ECC: _ecc,
    Collector.REMAPPING: _remapping,
    Collector.PROFILING: read_profiling,
    Collector.HEALTH: lambda *_: HealthWatch(None),  # health watches are DCGM's
}
require_every_collector(READERS, "nvml")
