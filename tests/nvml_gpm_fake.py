"""NVML's GPM and MIG functions, answered from a simulated node (next to `tests/nvml_fake.py`).

GPM samples are real `nvmlGpmSample_t` pointers, as the real library hands out, so the backend's
ctypes structures carry them unchanged; each remembers what the simulator said when it was taken.
`nvmlGpmMetricsGet` answers from the later sample in NVML's units (percent, MiB/s), and refuses what
NVML documents as wrong: samples not allocated, not taken, freed, of different devices, or less
than 100 ms apart (as an error the backend would see, so a test notices). MIG devices are handles
of their own, listed by `nvmlDeviceGetMigDeviceHandleByIndex`, with the memory, processes and
attributes of the simulator's instances.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Activity, Memory, Processes, Profiling
from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.backends.sim.mig import SimInstance, instances
from tests.nvml_fake import FakeNvml, Handle

MIB = 1024 * 1024
_PERCENT = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics_engine_active",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64_active",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32_active",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16_active",
}
_MIB = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_bytes_per_second",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_bytes_per_second",
}


@dataclass(frozen=True)
class MigHandle:
    index: int  # the parent GPU
    gpu_instance: int


@dataclass
class _Sample:
    buffer: Any  # keeps the memory the pointer points at alive
    device: Handle | MigHandle | None = None
    activity: Activity | None = None
    taken: float = 0.0


@dataclass
class FakeGpmMig:
    base: FakeNvml  # the NVML fake this one extends
    unsupported: set[int] = field(default_factory=set)  # GPUs without GPM
    clock: Callable[[], float] = time.monotonic
    samples: dict[int, _Sample] = field(default_factory=dict)  # allocated, by address
    calls: dict[str, int] = field(default_factory=dict)
    metric_errors: dict[int, int] = field(default_factory=dict)  # GPM metric id -> its nvmlReturn

    @property
    def sim(self) -> SimBackend:
        return self.base.sim

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        plain = {name: getattr(pynvml, name) for name in _MIG_AWARE}
        for name in dir(self):
            if name.startswith("nvml"):
                assert hasattr(pynvml, name), f"pynvml has no {name}: the fake would shadow nothing"
                monkeypatch.setattr(pynvml, name, self._counted(name, getattr(self, name)))
        for name, parent in plain.items():  # MIG handles here, the GPU's own handles to the NVML fake
            mine = getattr(self, f"_mig_{name}")
            monkeypatch.setattr(
                pynvml, name, lambda h, *a, _p=parent, _m=mine: _m(h, *a) if isinstance(h, MigHandle) else _p(h, *a)
            )

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            device = args[0] if args and isinstance(args[0], pynvml.c_nvmlDevice_t | MigHandle) else None
            self.base._check(name, None if device is None else self.base.handle(self._index(device)))
            return fn(*args)

        return call

    def _key(self, device: Handle | MigHandle) -> tuple[int, int | None]:
        """Which device: handles are ctypes pointers, which do not compare by what they point at."""
        return (device.index, device.gpu_instance) if isinstance(device, MigHandle) else (self.base.index(device), None)

    def _index(self, device: Handle | MigHandle) -> int:
        return device.index if isinstance(device, MigHandle) else self.base.index(device)

    # -- the simulator's view ------------------------------------------------------------------

    def _instances(self, gpu: int) -> tuple[SimInstance, ...]:
        shape, seed = self.sim.scenario.node.gpus, self.sim.scenario.seed
        return instances(seed, gpu, shape.mig_instances.get(gpu, []), shape.spec)

    def _instance(self, h: MigHandle) -> SimInstance:
        return next(i for i in self._instances(h.index) if i.mig.gpu_instance == h.gpu_instance)

    def _activity(self, device: Handle | MigHandle) -> Activity:
        profiling = self.base._read(self.base.handle(self._index(device)), Collector.PROFILING)
        assert isinstance(profiling, Profiling) and profiling.gpu is not None
        if not isinstance(device, MigHandle):
            return profiling.gpu
        return next(p.activity for p in profiling.instances if p.instance.gpu_instance == device.gpu_instance)

    # -- GPM -------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Handle) -> Any:
        return SimpleNamespace(version=1, isSupportedDevice=int(self._index(device) not in self.unsupported))

    def nvmlGpmSampleAlloc(self) -> Any:
        buffer = ctypes.create_string_buffer(64)
        pointer = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self.samples[ctypes.addressof(buffer)] = _Sample(buffer)
        return pointer

    def _sample(self, pointer: Any) -> _Sample:
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if address not in self.samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # never allocated, or freed
        return self.samples[address]

    def nvmlGpmSampleFree(self, pointer: Any) -> None:
        self._sample(pointer)
        del self.samples[ctypes.cast(pointer, ctypes.c_void_p).value]  # type: ignore[arg-type]

    def nvmlGpmSampleGet(self, device: Handle | MigHandle, pointer: Any) -> Any:
        sample = self._sample(pointer)
        sample.device, sample.activity, sample.taken = device, self._activity(device), self.clock()
        return pointer

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION or not 0 < request.numMetrics <= 98:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        same = (
            first.device is not None
            and second.device is not None
            and self._key(first.device) == self._key(second.device)
        )
        if not same or second.taken - first.taken < 0.1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert second.activity is not None
        links = {link.link: link for link in second.activity.nvlink_links}
        for slot in request.metrics[: request.numMetrics]:
            value = self._metric(second.activity, links, int(slot.metricId))
            code = self.metric_errors.get(int(slot.metricId))
            slot.nvmlReturn = (
                code
                if code is not None
                else pynvml.NVML_SUCCESS
                if value is not None
                else pynvml.NVML_ERROR_NOT_SUPPORTED
            )
            slot.value = math.nan if value is None else value
        return request

    def _metric(self, activity: Activity, links: dict[int, Any], metric: int) -> float | None:
        if metric in _PERCENT:
            ratio = getattr(activity, _PERCENT[metric])
            return None if ratio is None else ratio * 100
        if metric in _MIB:
            value = getattr(activity, _MIB[metric])
            return None if value is None else value / MIB
        link, tx = divmod(metric - pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC, 2)
        if link in links and metric >= pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC:
            value = links[link].tx_bytes_per_second if tx else links[link].rx_bytes_per_second
            return None if value is None else value / MIB
        return None  # the totals: a GPU that reports links is read per link

    # -- MIG ------------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, device: Handle) -> Any:
        if self._index(device) in self.sim.scenario.node.gpus.mig_instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nvml.h: not on MIG-enabled GPUs
        return self.base.nvmlDeviceGetUtilizationRates(device)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Handle) -> int:
        return 7 if self._index(device) in self.sim.scenario.node.gpus.mig_instances else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Handle, index: int) -> MigHandle:
        found = self._instances(self._index(device))
        if index >= len(found):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return MigHandle(self._index(device), found[index].mig.gpu_instance)

    def nvmlDeviceGetGpuInstanceId(self, h: MigHandle) -> int:
        return self._instance(h).mig.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, h: MigHandle) -> int:
        return self._instance(h).mig.compute_instance

    def nvmlDeviceGetAttributes(self, h: MigHandle) -> Any:
        inst = self._instance(h)
        return SimpleNamespace(
            gpuInstanceSliceCount=inst.slices,
            computeInstanceSliceCount=inst.slices,
            memorySizeMB=inst.memory_bytes // MIB,
        )

    def _mig_nvmlDeviceGetUUID(self, h: MigHandle) -> str:
        return self._instance(h).mig.uuid

    def _mig_nvmlDeviceGetMemoryInfo(self, h: MigHandle, version: int | None = None) -> Any:
        memory = self.base._read(self.base.handle(h.index), Collector.MEMORY)
        assert isinstance(memory, Memory)
        m = next(m for m in memory.instances if m.instance.gpu_instance == h.gpu_instance)
        return SimpleNamespace(total=m.total_bytes, used=m.used_bytes, free=(m.total_bytes or 0) - (m.used_bytes or 0))

    def _mig_nvmlDeviceGetComputeRunningProcesses(self, h: MigHandle) -> list[Any]:
        procs = self.base._read(self.base.handle(h.index), Collector.PROCESSES)
        assert isinstance(procs, Processes) and procs.processes is not None
        mine = [p for p in procs.processes if p.instance is not None and p.instance.gpu_instance == h.gpu_instance]
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes) for p in mine]


_MIG_AWARE = ("nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses")
