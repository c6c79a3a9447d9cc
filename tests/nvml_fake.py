"""NVML's device functions, answered from a simulated node, for what the virtual GPU cannot do.

Most NVML behaviour is tested through the real pynvml on the C library in vgpu/ (tests/vgpu). This
fake stays for what that library cannot be made to do: any error code from any one function (a
legacy fallback, NO_PERMISSION, UNINITIALIZED mid-run), `nvmlDeviceGetIndex` failing while events
still name the GPU, an event wait that fails. The real `pynvml` module stays: its constants, structs
and error classes are what the backend sees, and handles are real `c_nvmlDevice_t` pointers. Only the
functions that would reach the driver are replaced; they answer from the simulator's model in NVML's
own units (mW, mJ, MHz, percent, KB/s), with link states as NVML's 0-3, field values in any value
type, and per-field (and per-link) return codes.
"""

from __future__ import annotations

import ctypes
import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpu_triage.exporter.backends.base import GpuIdentity, GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    Clocks,
    Memory,
    Processes,
    Reading,
    Utilization,
)
from gpu_triage.exporter.backends.sim import SimBackend

# nvmlValueType_t -> the member of nvmlValue_t that holds it
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_CLOCK_DOMAINS = {
    pynvml.NVML_CLOCK_SM: ClockDomain.SM,
    pynvml.NVML_CLOCK_MEM: ClockDomain.MEMORY,
    pynvml.NVML_CLOCK_GRAPHICS: ClockDomain.GRAPHICS,
    pynvml.NVML_CLOCK_VIDEO: ClockDomain.VIDEO,
}


Handle = Any  # a pynvml.c_nvmlDevice_t


@dataclass
class FakeNvml:
    sim: SimBackend
    init_error: int | None = None
    # (function name, gpu index or None for every GPU) -> NVML error code the call raises
    errors: dict[tuple[str, int | None], int] = field(default_factory=dict)
    # field id, or (field id, scope id), -> that field's own return code
    field_errors: dict[int | tuple[int, int], int] = field(default_factory=dict)
    # field id -> the nvmlValueType_t its value is returned in (default: unsigned long long, double for fractions)
    value_types: dict[int, int] = field(default_factory=dict)
    driver_version: str = "570.172.08"
    events: queue.SimpleQueue[tuple[int, int]] = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        self._devices = [pynvml.struct_c_nvmlDevice_t() for _ in self.sim.discover()]
        self._by_address = {ctypes.addressof(d): i for i, d in enumerate(self._devices)}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                assert hasattr(pynvml, name), f"pynvml has no {name}: the fake would shadow nothing"
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    # -- plumbing ------------------------------------------------------------------------------

    def handle(self, index: int) -> Handle:
        return ctypes.pointer(self._devices[index])

    def index(self, handle: Handle) -> int:
        return self._by_address[ctypes.cast(handle, ctypes.c_void_p).value]

    def _check(self, function: str, handle: Handle | None = None) -> None:
        index = None if handle is None else self.index(handle)
        code = self.errors.get((function, index), self.errors.get((function, None)))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, handle: Handle) -> GpuIdentity:
        return self.sim.discover()[self.index(handle)]

    def _read(self, handle: Handle, collector: Collector) -> Reading:
        try:
            return self.sim.read(self._gpu(handle), collector).reading
        except GpuLostError:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST) from None

    def _value(self, function: str, handle: Handle, collector: Collector, attr: str) -> Any:
        self._check(function, handle)
        value = getattr(self._read(handle, collector), attr)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- library and inventory -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.sim.discover())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check("nvmlDeviceGetHandleByIndex", self.handle(index))
        return self.handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetIndex", handle)
        return self.index(handle)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        self._check("nvmlDeviceGetPciInfo", handle)
        domain, bus, rest = self._gpu(handle).pci_bus_id.split(":")
        # NVML's form: 8-digit domain, upper case, as bytes.
        return SimpleNamespace(busId=f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}".encode())

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        return str(self._value("nvmlDeviceGetName", handle, Collector.INVENTORY, "name"))

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        return str(self._value("nvmlDeviceGetSerial", handle, Collector.INVENTORY, "serial"))

    def nvmlDeviceGetVbiosVersion(self, handle: Handle) -> str:
        return str(self._value("nvmlDeviceGetVbiosVersion", handle, Collector.INVENTORY, "vbios_version"))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        major, minor = self.sim.scenario.node.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        enabled = self._value("nvmlDeviceGetMigMode", handle, Collector.INVENTORY, "mig_enabled")
        return [int(enabled), int(enabled)]

    # -- fast fields ---------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        u = self._read(handle, Collector.UTILIZATION)
        assert isinstance(u, Utilization) and u.gpu_ratio is not None and u.memory_controller_ratio is not None
        return SimpleNamespace(gpu=round(u.gpu_ratio * 100), memory=round(u.memory_controller_ratio * 100))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        m = self._read(handle, Collector.MEMORY)
        assert isinstance(m, Memory) and m.total_bytes is not None and m.used_bytes is not None
        info = SimpleNamespace(total=m.total_bytes, used=m.used_bytes, free=m.total_bytes - m.used_bytes)
        if version is not None:
            info.reserved = m.reserved_bytes
        return info

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return round(self._value("nvmlDeviceGetPowerUsage", handle, Collector.POWER, "usage_watts") * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return round(self._value("nvmlDeviceGetEnforcedPowerLimit", handle, Collector.POWER, "limit_watts") * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Handle) -> int:
        name = "nvmlDeviceGetPowerManagementDefaultLimit"
        return round(self._value(name, handle, Collector.POWER, "default_limit_watts") * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        joules = self._value("nvmlDeviceGetTotalEnergyConsumption", handle, Collector.POWER, "energy_joules")
        return round(joules * 1000)

    def nvmlDeviceGetTemperatureV(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return round(self._value("nvmlDeviceGetTemperatureV", handle, Collector.THERMAL, "gpu_celsius"))

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return round(self._value("nvmlDeviceGetTemperature", handle, Collector.THERMAL, "gpu_celsius"))

    def nvmlDeviceGetFanSpeed(self, handle: Handle) -> int:
        return round(self._value("nvmlDeviceGetFanSpeed", handle, Collector.THERMAL, "fan_ratio") * 100)

    def _clocks(self, handle: Handle) -> Clocks:
        c = self._read(handle, Collector.CLOCKS)
        assert isinstance(c, Clocks)
        return c

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        self._check("nvmlDeviceGetClockInfo", handle)
        return round(self._clocks(handle).current_hz[_CLOCK_DOMAINS[clock]] / 1e6)

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, clock: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo", handle)
        return round(self._clocks(handle).max_hz[_CLOCK_DOMAINS[clock]] / 1e6)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetCurrentClocksEventReasons", handle, Collector.CLOCKS, "event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetCurrentClocksThrottleReasons", handle, Collector.CLOCKS, "event_reasons"))

    def nvmlDeviceGetPerformanceState(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetPerformanceState", handle, Collector.CLOCKS, "performance_state"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetCurrPcieLinkGeneration", handle, Collector.PCIE, "link_generation"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetMaxPcieLinkGeneration", handle, Collector.PCIE, "max_link_generation"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetCurrPcieLinkWidth", handle, Collector.PCIE, "link_width"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetMaxPcieLinkWidth", handle, Collector.PCIE, "max_link_width"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        return int(self._value("nvmlDeviceGetPcieReplayCounter", handle, Collector.PCIE, "replay_errors"))

    def nvmlDeviceGetPcieThroughput(self, handle: Handle, counter: int) -> int:
        attr = "tx_bytes_per_second" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "rx_bytes_per_second"
        return round(self._value("nvmlDeviceGetPcieThroughput", handle, Collector.PCIE, attr) / 1000)  # KB/s (nvml.h)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = self._read(handle, Collector.PROCESSES)
        assert isinstance(procs, Processes)
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes) for p in procs.processes]

    # -- slow fields ---------------------------------------------------------------------------

    def nvmlDeviceGetEccMode(self, handle: Handle) -> list[int]:
        enabled = self._value("nvmlDeviceGetEccMode", handle, Collector.ECC, "enabled")
        return [int(enabled), int(enabled)]

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> list[int]:
        attr = "retired_pages_double_bit" if cause == 1 else "retired_pages_single_bit"
        return [0x1000 * i for i in range(self._value("nvmlDeviceGetRetiredPages", handle, Collector.ECC, attr))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        pending = self._value("nvmlDeviceGetRetiredPagesPendingStatus", handle, Collector.ECC, "retired_pages_pending")
        return int(pending)

    def nvmlDeviceGetFieldValues(self, handle: Handle, ids: list[tuple[int, int]]) -> Any:
        self._check("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for slot, (field_id, scope) in zip(values, ids, strict=True):
            slot.fieldId, slot.scopeId = field_id, scope
            value = self._field(handle, field_id, scope)
            code = self.field_errors.get((field_id, scope), self.field_errors.get(field_id))
            if code is None and value is None:
                code = pynvml.NVML_ERROR_NOT_SUPPORTED
            slot.nvmlReturn = code if code is not None else pynvml.NVML_SUCCESS
            if slot.nvmlReturn == pynvml.NVML_SUCCESS:
                fraction = isinstance(value, float) and not value.is_integer()
                kind = self.value_types.get(field_id, 0 if fraction else pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
                slot.valueType = kind
                setattr(slot.value, _VALUE_MEMBERS[kind], value if kind == 0 else int(value or 0))
        return values

    def _field(self, handle: Handle, field_id: int, scope: int) -> float | int | bool | None:
        fields = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (Collector.THERMAL, lambda r: r.memory_celsius),
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (Collector.RECOVERY, lambda r: r.action),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (Collector.ECC, lambda r: r.corrected_volatile),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (Collector.ECC, lambda r: r.uncorrected_volatile),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (Collector.ECC, lambda r: r.corrected_aggregate),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (Collector.ECC, lambda r: r.uncorrected_aggregate),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (Collector.REMAPPING, lambda r: r.correctable_rows),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (Collector.REMAPPING, lambda r: r.uncorrectable_rows),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (Collector.REMAPPING, lambda r: r.pending),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (Collector.REMAPPING, lambda r: r.failure),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (Collector.NVLINK, lambda r: len(r.links)),
            pynvml.NVML_FI_DEV_NVLINK_GET_STATE: (Collector.NVLINK, lambda r: r.links[scope].state),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: (
                Collector.NVLINK,
                lambda r: r.links[scope].replay_errors,
            ),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: (
                Collector.NVLINK,
                lambda r: r.links[scope].recovery_errors,
            ),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: (Collector.NVLINK, lambda r: r.links[scope].crc_errors),
        }
        if field_id not in fields:
            return None
        collector, get = fields[field_id]
        value = get(self._read(handle, collector))
        return None if value is None else (int(value) if isinstance(value, bool) else value)

    # -- what the simulator has no value for: NVML's own "not supported" -------------------------

    def _not_supported(self, *_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPersistenceMode(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetGspFirmwareMode(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetTemperatureThreshold(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetGpuFabricInfoV(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetMemoryErrorCounter(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, *args: Any) -> Any:
        return self._not_supported(*args)

    def nvmlDeviceGetEncoderUtilization(self, handle: Handle) -> list[int]:
        return [
            round(self._value("nvmlDeviceGetEncoderUtilization", handle, Collector.UTILIZATION, "encoder_ratio") * 100),
            167000,
        ]

    def nvmlDeviceGetDecoderUtilization(self, handle: Handle) -> list[int]:
        return [
            round(self._value("nvmlDeviceGetDecoderUtilization", handle, Collector.UTILIZATION, "decoder_ratio") * 100),
            167000,
        ]

    # -- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetSupportedEventTypes", handle)
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    def nvmlDeviceRegisterEvents(self, handle: Handle, kinds: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        try:
            gpu, xid = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        # pynvml's c_nvmlEventData_t; nvml.h: 0xFFFFFFFF instance ids for an event of the whole device.
        return SimpleNamespace(
            device=self.handle(gpu),
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
