"""The NVML backend: real GPUs through nvidia-ml-py (the `pynvml` module).

Every call goes through `Query` (nvml_query.py), so the error policy lives in one place. Calls
name `pynvml.<function>` at call time rather than importing the functions, so the code that
runs in production is also what the tests drive with substituted device functions.
Units are converted here, once: mW -> W, mJ -> J, MHz -> Hz, percent -> ratio, KiB/s -> B/s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

from gpu_triage.diagnosis.pci import canonical_bus_id
from gpu_triage.exporter.backends.base import (
    BackendError,
    Collector,
    DriverXid,
    GpuIdentity,
    GpuLostError,
    Result,
    require_every_collector,
)
from gpu_triage.exporter.backends.nvml_gpm import GpmProfiler, read_profiling
from gpu_triage.exporter.backends.nvml_mig import with_instance_memory, with_instance_processes
from gpu_triage.exporter.backends.nvml_query import BROKEN, FieldLog, Query, describe_init_error, error_name
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
)

log = logging.getLogger(__name__)
MHZ = 1e6

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


def _cuda_version(raw: int | None) -> str | None:
    return None if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"
    why = "--backend nvml"

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise BackendError(describe_init_error(err)) from err
        self._handles: dict[int, Any] = {}
        self._links: dict[int, int] = {}
        self._log = FieldLog()
        self._events: Any = None
        self._events_lock = threading.Lock()
        self._process_names: dict[int, str | None] = {}
        self.gpm = GpmProfiler()

    def discover(self) -> list[GpuIdentity]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendError(f"cannot count GPUs: {error_name(err)}") from err
        gpus = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle)) or f"unknown-{index}"
                raw_bus = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId) or ""
            except pynvml.NVMLError as err:
                if err.value in BROKEN:
                    raise BackendError(f"NVML: {error_name(err)}") from err
                # A GPU that is already lost at start still counts: it is reported as down.
                log.error("GPU not readable at discovery", extra={"gpu": index, "nvml": error_name(err)})
                gpus.append(GpuIdentity(index, f"unknown-{index}", f"unknown-{index}"))
                continue
            self._handles[index] = handle
            gpus.append(GpuIdentity(index, uuid, canonical_bus_id(raw_bus) or raw_bus.lower()))
        return gpus

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        handle = self._handles.get(gpu.index)
        if handle is None:
            raise GpuLostError(f"GPU {gpu.index} has no NVML handle")
        q = Query(gpu.index, self._log)
        reading = _READERS[collector](self, q, handle, gpu.index)
        return Result(reading, tuple(q.failed))

    def close(self) -> None:
        self.gpm.close()
        with self._events_lock:
            if self._events is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._events)
                self._events = None
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    # -- XID events ----------------------------------------------------------------------------

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs from NVML's event API. Events are not replayed: what came before registration is
        only in the kernel log, which is why the kmsg source exists too."""
        events = self._event_set()
        if events is None:
            raise BackendError("no GPU here can report XID events through NVML")
        out: list[DriverXid] = []
        wait_ms = int(timeout_seconds * 1000)
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(events, wait_ms)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_TIMEOUT or out:
                    return out  # a persistent error comes back on the next call
                # Start over with a fresh event set, after the caller's back-off: an error that
                # persists (a GPU lost from the set) must not turn this into a busy loop.
                self._drop_event_set()
                raise BackendError(f"NVML event wait failed: {error_name(err)}") from err
            if data.eventType == pynvml.nvmlEventTypeXidCriticalError:
                try:
                    index = int(pynvml.nvmlDeviceGetIndex(data.device))
                except pynvml.NVMLError:
                    index = -1
                out.append(DriverXid(gpu=index, code=int(data.eventData), timestamp=time.time()))
            wait_ms = 0  # drain whatever else is queued, then return

    def _event_set(self) -> Any:
        with self._events_lock:
            if self._events is not None:
                return self._events
            try:
                events = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as err:
                log.warning("NVML events unavailable", extra={"nvml": error_name(err)})
                return None
            registered = 0
            for index, handle in self._handles.items():
                try:
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                    if supported & pynvml.nvmlEventTypeXidCriticalError:
                        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
                        registered += 1
                except pynvml.NVMLError as err:
                    log.warning("cannot watch XID events", extra={"gpu": index, "nvml": error_name(err)})
            if not registered:
                pynvml.nvmlEventSetFree(events)
                return None
            self._events = events
            return events

    def _drop_event_set(self) -> None:
        with self._events_lock:
            events, self._events = self._events, None
        if events is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(events)

    # -- collectors ----------------------------------------------------------------------------

    def _inventory(self, q: Query, h: Any, gpu: int) -> Reading:
        mig = q("mig_mode", pynvml.nvmlDeviceGetMigMode, h)
        return Inventory(
            name=_text(q("name", pynvml.nvmlDeviceGetName, h)),
            serial=_text(q("serial", pynvml.nvmlDeviceGetSerial, h)),
            vbios_version=_text(q("vbios_version", pynvml.nvmlDeviceGetVbiosVersion, h)),
            driver_version=_text(q("driver_version", pynvml.nvmlSystemGetDriverVersion)),
            cuda_driver_version=_cuda_version(q("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)),
            mig_enabled=None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
        )

    def _utilization(self, q: Query, h: Any, gpu: int) -> Reading:
        rates = q("utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
        if rates is None:
            return Utilization(None, None)
        return Utilization(_ratio(rates.gpu), _ratio(rates.memory))

    def _memory(self, q: Query, h: Any, gpu: int) -> Reading:
        info = q("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
        if info is None:
            info = q("memory", pynvml.nvmlDeviceGetMemoryInfo, h)
        if info is None:
            return Memory(None, None, None)
        return Memory(int(info.used), int(info.total), _int(getattr(info, "reserved", None)))

    def _power(self, q: Query, h: Any, gpu: int) -> Reading:
        usage = q("power_usage", pynvml.nvmlDeviceGetPowerUsage, h)
        limit = q("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        energy = q("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        return Power(
            usage_watts=None if usage is None else usage / 1000.0,
            limit_watts=None if limit is None else limit / 1000.0,
            energy_joules=None if energy is None else energy / 1000.0,
        )

    def _thermal(self, q: Query, h: Any, gpu: int) -> Reading:
        temp = q("temperature", pynvml.nvmlDeviceGetTemperatureV, h, pynvml.NVML_TEMPERATURE_GPU)
        if temp is None:  # drivers older than the versioned call
            temp = q("temperature_legacy", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        (memory_temp,) = q.fields(h, [(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)], ["memory_temperature"])
        fan = q("fan_speed", pynvml.nvmlDeviceGetFanSpeed, h)
        return Thermal(
            gpu_celsius=None if temp is None else float(temp),
            memory_celsius=memory_temp,
            fan_ratio=_ratio(fan),
        )

    def _clocks(self, q: Query, h: Any, gpu: int) -> Reading:
        current, maximum = {}, {}
        for domain, clock in _CLOCKS.items():
            if (mhz := q(f"clock_{domain}", pynvml.nvmlDeviceGetClockInfo, h, clock)) is not None:
                current[domain] = mhz * MHZ
            if (mhz := q(f"max_clock_{domain}", pynvml.nvmlDeviceGetMaxClockInfo, h, clock)) is not None:
                maximum[domain] = mhz * MHZ
        reasons = q("clock_event_reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is None:  # drivers older than the "clocks event" rename
            reasons = q("clock_throttle_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        pstate = q("performance_state", pynvml.nvmlDeviceGetPerformanceState, h)
        return Clocks(current, maximum, _int(reasons), _int(pstate))

    def _pcie(self, q: Query, h: Any, gpu: int) -> Reading:
        # Each throughput call samples a 20 ms window, which is why PCIe is its own collector.
        tx = q("pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = q("pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return Pcie(
            link_generation=q("pcie_link_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            max_link_generation=q("pcie_max_link_gen", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
            link_width=q("pcie_link_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            max_link_width=q("pcie_max_link_width", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
            replay_errors=q("pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter, h),
            tx_bytes_per_second=None if tx is None else tx * 1024.0,
            rx_bytes_per_second=None if rx is None else rx * 1024.0,
        )

    def _nvlink(self, q: Query, h: Any, gpu: int) -> Reading:
        links = self._link_count(q, h, gpu)
        if not links:
            return NvLink(())
        ids = [(field, link) for link in range(links) for field in _LINK_FIELDS]
        names = [f"nvlink_{link}_{field}" for link in range(links) for field in _LINK_FIELDS]
        values = q.fields(h, ids, names)
        out = []
        for link in range(links):
            state, replay, recovery, crc = values[link * 4 : link * 4 + 4]
            active = None if state is None else state == pynvml.NVML_FEATURE_ENABLED
            out.append(LinkReading(link, active, _int(replay), _int(recovery), _int(crc)))
        return NvLink(tuple(out))

    def _link_count(self, q: Query, h: Any, gpu: int) -> int:
        if gpu not in self._links:
            failed = len(q.failed)
            (count,) = q.fields(h, [(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)], ["nvlink_link_count"])
            if len(q.failed) > failed:
                return 0  # a failed read, not an answer: ask again next poll
            self._links[gpu] = int(count or 0)
        return self._links[gpu]

    def _processes(self, q: Query, h: Any, gpu: int) -> Reading:
        procs = q("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        return Processes(
            tuple(ProcessReading(int(p.pid), self._process_name(int(p.pid)), _int(p.usedGpuMemory)) for p in procs)
        )

    def _process_name(self, pid: int) -> str | None:
        # Shared by the read workers of every GPU: never read back what another thread may clear.
        if pid in (names := self._process_names):
            return names[pid]
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip() or None
        except OSError:
            name = None  # another PID namespace, or already gone
        if len(names) > 4096:  # pids churn; keep the cache bounded
            names.clear()
        names[pid] = name
        return name

    def _recovery(self, q: Query, h: Any, gpu: int) -> Reading:
        (action,) = q.fields(h, [(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)], ["recovery_action"])
        return Recovery(_int(action))

    def _ecc(self, q: Query, h: Any, gpu: int) -> Reading:
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

    def _remapping(self, q: Query, h: Any, gpu: int) -> Reading:
        names = ["remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure"]
        cor, unc, pending, failure = q.fields(h, [(f, 0) for f in _REMAP_FIELDS], names)
        return Remapping(
            correctable_rows=_int(cor),
            uncorrectable_rows=_int(unc),
            pending=None if pending is None else bool(pending),
            failure=None if failure is None else bool(failure),
        )


_READERS = {
    Collector.INVENTORY: NvmlBackend._inventory,
    Collector.UTILIZATION: NvmlBackend._utilization,
    Collector.MEMORY: with_instance_memory(NvmlBackend._memory),
    Collector.POWER: NvmlBackend._power,
    Collector.THERMAL: NvmlBackend._thermal,
    Collector.CLOCKS: NvmlBackend._clocks,
    Collector.PCIE: NvmlBackend._pcie,
    Collector.NVLINK: NvmlBackend._nvlink,
    Collector.PROCESSES: with_instance_processes(NvmlBackend._processes),
    Collector.RECOVERY: NvmlBackend._recovery,
    Collector.ECC: NvmlBackend._ecc,
    Collector.REMAPPING: NvmlBackend._remapping,
    Collector.PROFILING: read_profiling,
    Collector.HEALTH: lambda *_: HealthWatch(None),  # health watches are DCGM's
}
require_every_collector(_READERS, "nvml")
