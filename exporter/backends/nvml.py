"""The NVML backend: real GPUs through nvidia-ml-py (the `pynvml` module).

Every call goes through `Query` (nvml_query.py), so the error policy lives in one place. Calls
name `pynvml.<function>` at call time rather than importing the functions, so the code that
runs in production is also what the tests drive with substituted device functions.
Units are converted here, once: mW -> W, mJ -> J, MHz -> Hz, percent -> ratio, KB/s -> B/s.

A handle that stops naming its GPU (INVALID_ARGUMENT after a reset or an unbind) makes the GPU lost
until the next slow poll looks it up again, by UUID (or PCI bus id); fast polls do not call the
driver on it meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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
from gpu_triage.exporter.backends.nvml_events import XidEvents
from gpu_triage.exporter.backends.nvml_gpm import GpmProfiler, read_profiling
from gpu_triage.exporter.backends.nvml_mig import with_instance_memory, with_instance_processes
from gpu_triage.exporter.backends.nvml_query import (
    BROKEN,
    FieldLog,
    HandleLostError,
    Query,
    describe_init_error,
    error_name,
    readable,
    text,
)
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

log = logging.getLogger(__name__)
MHZ = 1e6
# nvmlDeviceGetPcieThroughput answers in "KB/s" (nvml.h; NVIDIA's NVML API reference says the same), and
# decimal kilobytes are meant: the same header writes "KiB" where it means 1024 bytes (the NVLink
# throughput fields, NVML_FI_DEV_NVLINK_THROUGHPUT_*). To be confirmed on a GPU with a copy of known size.
PCIE_KB = 1000
# The initial PID namespace's inode number, fixed by the kernel (PROC_PID_INIT_INO, include/linux/proc_ns.h).
_HOST_PID_NAMESPACE = "pid:[4026531836]"

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


def host_pid_namespace(proc: Path) -> bool:
    """Whether we run in the host's PID namespace, where NVML's PIDs (the host's) name our /proc entries.

    Compared with the initial namespace's fixed inode rather than with /proc/1/ns/pid: in a container
    PID 1 is the container's own init, in the container's namespace, and reading it needs ptrace rights.
    """
    try:
        return str((proc / "self" / "ns" / "pid").readlink()) == _HOST_PID_NAMESPACE
    except OSError:
        return False


class NvmlBackend:
    name = "nvml"
    why = "--backend nvml"

    def __init__(self, *, proc: Path = Path("/proc")) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise BackendError(describe_init_error(err)) from err
        self._handles: dict[int, Any] = {}
        self._stale: set[int] = set()  # GPUs whose handle stopped naming them: looked up again when slow
        self._lookup_locks: dict[int, threading.Lock] = {}
        self._links: dict[int, int] = {}
        self._log = FieldLog()
        self._events = XidEvents(lambda: dict(self._handles))
        self.gpm = GpmProfiler()
        self._proc = proc
        # In a container with a PID namespace of its own, /proc/<pid> of an NVML PID is some other
        # process or none: the process label is left out rather than wrong.
        self._names_visible = host_pid_namespace(proc)
        if not self._names_visible:
            log.info("not in the host's PID namespace: GPU processes are listed by PID without names")

    def discover(self) -> list[GpuIdentity]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendError(f"cannot count GPUs: {error_name(err)}") from err
        gpus = []
        for index in range(count):
            self._lookup_locks[index] = threading.Lock()
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = self._string(index, "uuid", pynvml.nvmlDeviceGetUUID, handle) or f"unknown-{index}"
                raw_bus = self._string(index, "pci_bus_id", lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle)
            except pynvml.NVMLError as err:
                if err.value in BROKEN:
                    raise BackendError(f"NVML: {error_name(err)}") from err
                # A GPU that is already lost at start still counts: it is reported as down.
                log.error("GPU not readable at discovery", extra={"gpu": index, "nvml": error_name(err)})
                gpus.append(GpuIdentity(index, f"unknown-{index}", f"unknown-{index}"))
                continue
            self._handles[index] = handle
            raw_bus = raw_bus or ""
            gpus.append(GpuIdentity(index, uuid, canonical_bus_id(raw_bus) or raw_bus.lower()))
        return gpus

    def _string(self, gpu: int, field: str, fn: Any, handle: Any) -> str | None:
        try:
            return text(fn(handle))
        except UnicodeDecodeError as err:  # a corrupt InfoROM must not stop the daemon from starting
            return readable(err, gpu, field, self._log)

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        handle = self._handle(gpu, collector)
        q = Query(gpu.index, self._log, handle)
        try:
            reading = _READERS[collector](self, q, handle, gpu.index)
        except HandleLostError:
            if gpu.index not in self._stale:
                self._stale.add(gpu.index)
                log.warning(
                    "GPU handle no longer valid (a reset or an unbind?): the GPU is down until the next "
                    "slow poll finds it again",
                    extra={"gpu": gpu.index, "collector": collector},
                )
            raise
        self._events.readmit(gpu.index)
        return Result(reading, tuple(q.failed))

    def _handle(self, gpu: GpuIdentity, collector: Collector) -> Any:
        if gpu.index in self._stale:
            if not collector.slow:
                raise GpuLostError(f"GPU {gpu.index}: waiting for the next slow poll to look its handle up again")
            self._look_up_again(gpu)
        handle = self._handles.get(gpu.index)
        if handle is None:
            raise GpuLostError(f"GPU {gpu.index} has no NVML handle")
        return handle

    def _look_up_again(self, gpu: GpuIdentity) -> None:
        """A fresh handle for a GPU whose old one went stale, by UUID, else by PCI bus id."""
        with self._lookup_locks[gpu.index]:  # the slow collectors of one GPU run at once: look up once
            if gpu.index not in self._stale:
                return
            if not gpu.uuid.startswith("unknown-"):
                by, lookup, key = "uuid", pynvml.nvmlDeviceGetHandleByUUID, gpu.uuid
            elif not gpu.pci_bus_id.startswith("unknown-"):
                by, lookup, key = "pci_bus_id", pynvml.nvmlDeviceGetHandleByPciBusId_v2, gpu.pci_bus_id
            else:
                raise GpuLostError(f"GPU {gpu.index} cannot be looked up: its UUID and bus id are unknown")
            try:
                handle = lookup(key)
                pynvml.nvmlDeviceGetUUID(handle)  # the new handle must answer, not just exist
            except pynvml.NVMLError as err:
                if err.value in BROKEN:
                    raise BackendError(f"NVML: {error_name(err)}") from err
                raise GpuLostError(f"GPU {gpu.index}: looking its handle up again: {error_name(err)}") from err
            except UnicodeDecodeError:
                pass  # it answered
            self._handles[gpu.index] = handle
            self._stale.discard(gpu.index)
            self._events.renew()  # registrations belong to the old handle
            self.gpm.forget(gpu.index)
            log.info("GPU handle looked up again; the GPU answers", extra={"gpu": gpu.index, "by": by})

    def close(self) -> None:
        self.gpm.close()
        self._events.close()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    reports_xids = True

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs from NVML's event API (nvml_events.py)."""
        return self._events.wait(timeout_seconds)

    # -- collectors ----------------------------------------------------------------------------

    def _inventory(self, q: Query, h: Any, gpu: int) -> Reading:
        mig = q("mig_mode", pynvml.nvmlDeviceGetMigMode, h)
        return Inventory(
            name=text(q("name", pynvml.nvmlDeviceGetName, h)),
            serial=text(q("serial", pynvml.nvmlDeviceGetSerial, h)),
            vbios_version=text(q("vbios_version", pynvml.nvmlDeviceGetVbiosVersion, h)),
            driver_version=text(q("driver_version", pynvml.nvmlSystemGetDriverVersion)),
            cuda_driver_version=cuda_version(q("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)),
            mig_enabled=None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
        )

    def _utilization(self, q: Query, h: Any, gpu: int) -> Reading:
        rates = q("utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
        if rates is None:
            return Utilization(None, None)
        return Utilization(_ratio(rates.gpu), _ratio(rates.memory))

    def _memory(self, q: Query, h: Any, gpu: int) -> Reading:
        info = q.first(
            ("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, (h, pynvml.nvmlMemory_v2)),
            ("memory", pynvml.nvmlDeviceGetMemoryInfo, (h,)),  # drivers older than the versioned call
        )
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

    def _clocks(self, q: Query, h: Any, gpu: int) -> Reading:
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
            tx_bytes_per_second=None if tx is None else tx * PCIE_KB,
            rx_bytes_per_second=None if rx is None else rx * PCIE_KB,
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
            # NVML's link state as it is (0 inactive, 1 active, 2 sleep, 3 active, traffic disabled). The
            # count is of links the GPU has, cabled or not: an uncabled one is inactive for good.
            out.append(LinkReading(link, _int(state), _int(replay), _int(recovery), _int(crc)))
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
        """Read afresh each poll, from /proc/<pid>/stat: a cached name goes stale when the PID is reused."""
        if not self._names_visible:
            return None
        try:
            stat = (self._proc / str(pid) / "stat").read_bytes()
        except OSError:
            return None  # already gone
        # "pid (comm) state ...": comm may itself hold spaces and parentheses, so up to the last ")".
        start, end = stat.find(b"("), stat.rfind(b")")
        return stat[start + 1 : end].decode(errors="replace") or None if 0 <= start < end else None

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
