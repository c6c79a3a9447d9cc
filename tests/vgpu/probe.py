"""Everything pynvml can read about one device, for the worker: each value, or {"nvml": code}."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml as n

# Field ids read by dump(): the ones gpu-triage and common tools ask for.
FIELDS = [
    n.NVML_FI_DEV_ECC_CURRENT,
    n.NVML_FI_DEV_ECC_PENDING,
    n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    n.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    n.NVML_FI_DEV_ECC_SBE_VOL_DEV,
    n.NVML_FI_DEV_ECC_DBE_AGG_L2,
    n.NVML_FI_DEV_RETIRED_SBE,
    n.NVML_FI_DEV_RETIRED_DBE,
    n.NVML_FI_DEV_RETIRED_PENDING,
    n.NVML_FI_DEV_MEMORY_TEMP,
    n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    n.NVML_FI_DEV_NVLINK_LINK_COUNT,
    n.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
    n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    n.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L1,
    n.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L7,
    n.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    n.NVML_FI_DEV_REMAPPED_COR,
    n.NVML_FI_DEV_REMAPPED_UNC,
    n.NVML_FI_DEV_REMAPPED_PENDING,
    n.NVML_FI_DEV_REMAPPED_FAILURE,
    n.NVML_FI_DEV_POWER_AVERAGE,
    n.NVML_FI_DEV_POWER_INSTANT,
    n.NVML_FI_DEV_POWER_CURRENT_LIMIT,
    n.NVML_FI_DEV_ENERGY,
    n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    n.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
    n.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
    n.NVML_FI_DEV_PCIE_COUNT_LANE_ERROR,
    n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
]
# The NVLink5 (Blackwell) counters, scoped by link, after the older ones in links().
LINK_COUNTS = [
    n.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
    n.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
    n.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS,
    n.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    n.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
]


def attempt(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except n.NVMLError as err:
        return {"nvml": err.value}


def fields(handle: Any, ids: list[Any]) -> list[dict[str, Any]]:
    """Field values as {"ret", "type", "value"}, the value read from the member its type names."""
    member = ["dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal"]
    out = []
    for fv in n.nvmlDeviceGetFieldValues(handle, ids):
        value = getattr(fv.value, member[fv.valueType]) if fv.nvmlReturn == 0 else None
        out.append({"id": fv.fieldId, "scope": fv.scopeId, "ret": fv.nvmlReturn, "type": fv.valueType, "value": value})
    return out


def links(handle: Any, count: int) -> list[dict[str, Any]]:
    out = []
    for link in range(count):
        counters = [attempt(n.nvmlDeviceGetNvLinkErrorCounter, handle, link, c) for c in range(5)]
        state = attempt(n.nvmlDeviceGetNvLinkState, handle, link)
        version = attempt(n.nvmlDeviceGetNvLinkVersion, handle, link)
        scoped = [
            (fid, link)
            for fid in (
                n.NVML_FI_DEV_NVLINK_GET_STATE,
                n.NVML_FI_DEV_NVLINK_GET_SPEED,
                n.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                n.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                n.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
                n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
                n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
                *LINK_COUNTS,
            )
        ]
        out.append({"counters": counters, "state": state, "version": version, "fields": fields(handle, scoped)})
    return out


def fabric(handle: Any) -> dict[str, Any]:
    """nvmlDeviceGetGpuFabricInfoV with the header's v3 struct."""
    info = n.c_nvmlGpuFabricInfo_v3_t()
    n.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return {
        "state": info.state,
        "status": info.status,
        "clique": info.cliqueId,
        "uuid": bytes(info.clusterUuid).hex(),
        "health_mask": info.healthMask,
        "summary": info.healthSummary,
    }


def dump(handle: Any) -> dict[str, Any]:
    """Every query, through pynvml's own wrappers; raw ctypes only where pynvml has none."""
    h = handle
    pci = attempt(n.nvmlDeviceGetPciInfo, h)
    ext = n.nvmlPciInfoExt_v1_t()
    ext.version = n.nvmlPciInfoExt_v1
    return {
        "name": attempt(n.nvmlDeviceGetName, h),
        "uuid": attempt(n.nvmlDeviceGetUUID, h),
        "serial": attempt(n.nvmlDeviceGetSerial, h),
        "board_part_number": attempt(n.nvmlDeviceGetBoardPartNumber, h),
        "vbios": attempt(n.nvmlDeviceGetVbiosVersion, h),
        "inforom_image": attempt(n.nvmlDeviceGetInforomImageVersion, h),
        "index": attempt(n.nvmlDeviceGetIndex, h),
        "minor_number": attempt(n.nvmlDeviceGetMinorNumber, h),
        "brand": attempt(n.nvmlDeviceGetBrand, h),
        "architecture": attempt(n.nvmlDeviceGetArchitecture, h),
        "cuda_cc": attempt(n.nvmlDeviceGetCudaComputeCapability, h),
        "pci": pci,
        "pci_ext": attempt(lambda: (n.nvmlDeviceGetPciInfoExt(h, ctypes.byref(ext)), ext)[1]),
        "pcie": [
            attempt(f, h)
            for f in (
                n.nvmlDeviceGetCurrPcieLinkGeneration,
                n.nvmlDeviceGetMaxPcieLinkGeneration,
                n.nvmlDeviceGetCurrPcieLinkWidth,
                n.nvmlDeviceGetMaxPcieLinkWidth,
                n.nvmlDeviceGetPcieReplayCounter,
            )
        ],
        "pcie_throughput": [attempt(n.nvmlDeviceGetPcieThroughput, h, c) for c in (0, 1)],
        "memory": attempt(n.nvmlDeviceGetMemoryInfo, h),
        "memory_v2": attempt(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2),
        "bar1": attempt(n.nvmlDeviceGetBAR1MemoryInfo, h),
        "utilization": attempt(n.nvmlDeviceGetUtilizationRates, h),
        "encoder": attempt(n.nvmlDeviceGetEncoderUtilization, h),
        "decoder": attempt(n.nvmlDeviceGetDecoderUtilization, h),
        "power": attempt(n.nvmlDeviceGetPowerUsage, h),
        "energy": attempt(n.nvmlDeviceGetTotalEnergyConsumption, h),
        "enforced_limit": attempt(n.nvmlDeviceGetEnforcedPowerLimit, h),
        "limit": attempt(n.nvmlDeviceGetPowerManagementLimit, h),
        "limit_constraints": attempt(n.nvmlDeviceGetPowerManagementLimitConstraints, h),
        "default_limit": attempt(n.nvmlDeviceGetPowerManagementDefaultLimit, h),
        "temperature": attempt(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
        "temperature_v": attempt(n.nvmlDeviceGetTemperatureV, h, n.NVML_TEMPERATURE_GPU),
        "thresholds": [attempt(n.nvmlDeviceGetTemperatureThreshold, h, t) for t in range(8)],
        "fan": attempt(n.nvmlDeviceGetFanSpeed, h),
        "clocks": [attempt(n.nvmlDeviceGetClockInfo, h, t) for t in range(4)],
        "max_clocks": [attempt(n.nvmlDeviceGetMaxClockInfo, h, t) for t in range(4)],
        "clock_ids": [[attempt(n.nvmlDeviceGetClock, h, t, i) for i in range(4)] for t in range(4)],
        "event_reasons": attempt(n.nvmlDeviceGetCurrentClocksEventReasons, h),
        "throttle_reasons": attempt(n.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        "pstate": attempt(n.nvmlDeviceGetPerformanceState, h),
        "compute_mode": attempt(n.nvmlDeviceGetComputeMode, h),
        "persistence_mode": attempt(n.nvmlDeviceGetPersistenceMode, h),
        "display_mode": attempt(n.nvmlDeviceGetDisplayMode, h),
        "display_active": attempt(n.nvmlDeviceGetDisplayActive, h),
        "ecc_mode": attempt(n.nvmlDeviceGetEccMode, h),
        "ecc_totals": [[attempt(n.nvmlDeviceGetTotalEccErrors, h, e, c) for c in (0, 1)] for e in (0, 1)],
        "ecc_locations": [
            [[attempt(n.nvmlDeviceGetMemoryErrorCounter, h, e, c, loc) for loc in range(8)] for c in (0, 1)]
            for e in (0, 1)
        ],
        "remapped_rows": attempt(n.nvmlDeviceGetRemappedRows, h),
        "retired": [attempt(n.nvmlDeviceGetRetiredPages, h, c) for c in (0, 1)],
        "retired_v2": [attempt(n.nvmlDeviceGetRetiredPages_v2, h, c) for c in (0, 1)],
        "retired_pending": attempt(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "mig_mode": attempt(n.nvmlDeviceGetMigMode, h),
        "max_mig": attempt(n.nvmlDeviceGetMaxMigDeviceCount, h),
        "supported_events": attempt(n.nvmlDeviceGetSupportedEventTypes, h),
        "compute_processes": attempt(n.nvmlDeviceGetComputeRunningProcesses, h),
        "graphics_processes": attempt(n.nvmlDeviceGetGraphicsRunningProcesses, h),
        "gpm_supported": attempt(lambda: n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice),
        "fields": attempt(fields, h, FIELDS),
        "fabric": attempt(fabric, h),
        "gsp": attempt(n.nvmlDeviceGetGspFirmwareMode, h),
    }
