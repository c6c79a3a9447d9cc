"""MIG devices through NVML: which there are, and each one's memory and processes.

A MIG device (a compute instance in a GPU instance) has its own NVML handle. Memory and the process
list per device need no privileges through that handle, while the parent's handle gives aggregates
only to root; so on a MIG-enabled GPU the processes are listed per device, which also says which
device each runs on. Listing them costs about five calls per device, and the memory, process and
profiling reads all need them: `listed` lists them once per poll for all three (per_poll.py). Never
longer: NVML reuses handles when instances are destroyed and created, so a kept handle can point at
another instance.

These wrap the NVML backend's own readers (readers.py) and take its `Query`, so NVML's error policy
applies unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import pynvml

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.nvml.query import Query, text
from gpu_triage.exporter.backends.per_poll import PerPoll
from gpu_triage.exporter.backends.readings import InstanceMemory, Memory, Processes, ProcessReading


class MigState(Protocol):
    """What the MIG readers keep in the backend between reads (the NVML backend is one)."""

    mig_profiles: dict[int, list[Any]]
    mig_listings: PerPoll[int, list[MigDevice]]

    def process_name(self, pid: int) -> str | None: ...


B = TypeVar("B", bound=MigState)
Reader = Callable[[B, Query, Any, int], Any]  # a reader of the backend B, which keeps at least MigState
# nvml.h: "In MIG mode, if device handle is provided, the API returns aggregate information, only if the
# caller has appropriate privileges." Said once, at INFO: it is how the GPU is set up, not a fault.
MIG_AGGREGATES = (
    "in MIG mode the whole GPU's memory totals need root privileges (nvml.h); they are left out, and each "
    "MIG instance's memory and processes are exported"
)
MigDevice = tuple[MigInstance, Any]  # the instance and its NVML handle


def profile_name(attributes: Any, profiles: list[Any] | None = None) -> str:
    """A MIG device's profile, as NVML names it: `3g.40gb`, or `1c.3g.40gb` for a compute instance smaller
    than its GPU instance.

    The name is the one in the GPU's profile table (nvmlDeviceGetGpuInstanceProfileInfoV, which needs no
    privileges) whose slices and memory are the device's. The gb figure cannot be rebuilt from the
    device's own memory: an H200's 1g.18gb has 16 GiB, a B200's 1g.23gb 22. Without a table (an older
    driver), the figure is the device's memory in GiB rounded up, which is NVIDIA's name on A100 and
    H100 and only an approximation on later GPUs."""
    if attributes is None:
        return "unknown"
    slices, memory = int(attributes.gpuInstanceSliceCount), int(attributes.memorySizeMB)
    matches = [p for p in profiles or () if int(p.sliceCount) == slices and int(p.memorySizeMB) == memory]
    # "+me" profiles have the slices and memory of the plain one and the media engines besides.
    exact = [p for p in matches if int(p.ofaCount) == int(attributes.sharedOfaCount)] or matches
    if not exact and slices == 0:
        return "unknown"
    name = _table_name(exact) if exact else f"{slices}g.{math.ceil(memory / 1024)}gb"
    if 0 < attributes.computeInstanceSliceCount < slices:
        name = f"{attributes.computeInstanceSliceCount}c.{name}"
    return name


def _table_name(profiles: list[Any]) -> str:
    names = sorted((text(p.name) or "" for p in profiles), key=len)
    return names[0].removeprefix("MIG ")


def profile_table(backend: MigState, q: Query, h: Any) -> list[Any]:
    """The GPU's GPU-instance profiles, asked once per GPU (they are the board's, not the layout's)."""
    kept = backend.mig_profiles.get(q.gpu)
    if kept is not None:
        return kept
    failed = len(q.failed)
    found = []
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        # A profile this GPU does not offer is NOT_SUPPORTED: absent, not an error.
        info = q(f"mig_profile_{profile}", pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile)
        if info is not None:
            found.append(info)
    if len(q.failed) == failed:
        backend.mig_profiles[q.gpu] = found
    return found


def mig_devices(backend: MigState, q: Query, h: Any) -> list[MigDevice]:
    """The MIG devices of the GPU behind `h`; none when MIG is off or NVML has no MIG."""
    mode = q("mig_mode", pynvml.nvmlDeviceGetMigMode, h)
    if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    profiles = profile_table(backend, q, h)
    out = []
    for i in range(q("mig_device_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
        # An empty slot is NOT_FOUND (absent, not an error): later slots can still hold devices.
        mh = q(f"mig_device_{i}", pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if mh is None:
            continue
        gi = q("mig_gpu_instance_id", pynvml.nvmlDeviceGetGpuInstanceId, mh)
        ci = q("mig_compute_instance_id", pynvml.nvmlDeviceGetComputeInstanceId, mh)
        uuid = text(q("mig_uuid", pynvml.nvmlDeviceGetUUID, mh))
        if gi is None or ci is None or uuid is None:
            continue
        attributes = q("mig_attributes", pynvml.nvmlDeviceGetAttributes, mh)
        out.append((MigInstance(int(gi), int(ci), profile_name(attributes, profiles), uuid), mh))
    return out


def listed(backend: MigState, q: Query, h: Any, reader: Collector) -> list[MigDevice]:
    """`mig_devices`, shared by the reads of one poll; a listing with a failed call is not shared."""

    def ask() -> tuple[list[MigDevice], bool]:
        failed = len(q.failed)
        devices = mig_devices(backend, q, h)
        return devices, len(q.failed) == failed

    return backend.mig_listings.get(q.gpu, reader, ask)


def with_instance_memory(read_memory: Reader[B]) -> Reader[B]:
    """The NVML memory reader, plus each MIG device's memory."""

    def read(backend: B, q: Query, h: Any, gpu: int) -> Memory:
        devices = listed(backend, q, h, Collector.MEMORY)
        if devices:
            q.expect_no_permission(MIG_AGGREGATES, ("memory_v2", "memory"))
        memory: Memory = read_memory(backend, q, h, gpu)
        parts = []
        for mig, mh in devices:
            # v2, as for the whole GPU: "used" is what is allocated; v1's "used" counts the reserved memory too.
            info = q.first(
                ("mig_memory_v2", pynvml.nvmlDeviceGetMemoryInfo, (mh, pynvml.nvmlMemory_v2)),
                ("mig_memory", pynvml.nvmlDeviceGetMemoryInfo, (mh,)),
            )
            used, total = (None, None) if info is None else (int(info.used), int(info.total))
            parts.append(InstanceMemory(mig, used, total))
        return replace(memory, instances=tuple(parts)) if parts else memory

    return read


def with_instance_processes(read_processes: Reader[B]) -> Reader[B]:
    """The NVML process reader; on a MIG-enabled GPU, the processes of each MIG device instead."""

    def read(backend: B, q: Query, h: Any, gpu: int) -> Processes:
        devices = listed(backend, q, h, Collector.PROCESSES)
        if not devices:
            processes: Processes = read_processes(backend, q, h, gpu)
            return processes
        found = []
        for mig, mh in devices:
            for p in q("mig_processes", pynvml.nvmlDeviceGetComputeRunningProcesses, mh) or []:
                pid = int(p.pid)
                used = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                found.append(ProcessReading(pid, backend.process_name(pid), used, mig))
        return Processes(tuple(found), tuple(mig for mig, _ in devices))

    return read
