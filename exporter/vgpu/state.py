"""The writer of the virtual GPU's state file, which build/vgpu/libnvidia-ml.so.1 maps.

The simulator describes its GPUs with the dataclasses of node.py (exported here too, so that
`state` stays the one module a user of the library needs) and hands them to
`StateWriter.write` each tick; every process that has loaded the library with
GPU_TRIAGE_VGPU_STATE pointing at the file sees the new values on its next NVML call.
vgpu/README.md documents the layout; vgpu/state.h is its C side.

The file is updated in place, through a shared mapping, under a seqlock: readers keep the
file mapped, so replacing it (write a temporary, rename) would leave them reading the old
inode forever. It is created with a rename, though, so that no reader ever opens a file that
is not whole yet. Stdlib only, and no imports from the project but its siblings (node.py,
records.py and the generated scalars.py: each GPU's record), so they can move together wherever
the package layout puts them.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import platform
import struct
import sys
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

from gpu_triage.exporter.vgpu.node import (
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    BRAND_NVIDIA,
    CLOCKS_GPU_IDLE,
    CUDA_DRIVER_VERSION,
    DRIVER_VERSION,
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_MIG_CONFIG_CHANGE,
    EVENT_PSTATE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    HANG_MAX_MS,
    LOCATION_DEVICE_MEMORY,
    NO_INSTANCE,
    NOT_AVAILABLE,
    NVLINK_ACTIVE,
    NVLINK_ACTIVE_TRAFFIC_DISABLED,
    NVLINK_INACTIVE,
    NVLINK_SLEEP,
    NVLINK_VERSION_3_0,
    NVLINK_VERSION_4_0,
    NVLINK_VERSION_5_0,
    NVML_VERSION,
    Fabric,
    FieldOverride,
    Gpu,
    MigInstance,
    MigProfile,
    NvLink,
    Process,
    Query,
    RetiredPage,
    ValueType,
    h100,
    h100_node,
)
from gpu_triage.exporter.vgpu.records import (
    FIELD_MASK_BITS,
    GPM_SLOTS,
    GPU_SIZE,
    MAX_LINKS,
    MAX_MIG,
    MAX_OVERRIDES,
    MAX_PROCESSES,
    MAX_RETIRED,
    check_count,
    encode_gpu,
    encode_text,
    gpu_record,
)
from gpu_triage.exporter.vgpu.scalars import LAYOUT_VERSION

MAGIC: Final = b"GTVGPUST"
MAX_GPUS: Final = 64
EVENT_CAPACITY: Final = 256

_HEADER_FIXED = struct.Struct("<8sIIIIIIQ")  # magic .. seq: written once, at creation
_HEADER_BODY = struct.Struct("<QIIiI80s80s24x")  # event_total .. end: covered by the header CRC
_EVENT = struct.Struct("<QQQIII")  # then the CRC of these 36 bytes
HEADER_SIZE: Final = 256
EVENT_SIZE: Final = _EVENT.size + 4
FILE_SIZE: Final = HEADER_SIZE + MAX_GPUS * GPU_SIZE + EVENT_CAPACITY * EVENT_SIZE
_SEQ_OFFSET: Final = 32
_CRC_OFFSET: Final = 40
_BODY_OFFSET: Final = 48
_EVENTS_OFFSET: Final = HEADER_SIZE + MAX_GPUS * GPU_SIZE

if _HEADER_FIXED.size + 8 + _HEADER_BODY.size != HEADER_SIZE:  # pragma: no cover
    raise AssertionError("state.py disagrees with vgpu/state.h")


@dataclass(frozen=True)
class _System:
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    hang_max_ms: int


def _header_section(system: _System, event_total: int, gpu_count: int) -> bytes:
    """Bytes 40..256 of the file: the header CRC, a pad, and the body it covers."""
    body = _HEADER_BODY.pack(
        event_total,
        gpu_count,
        system.hang_max_ms,
        system.cuda_driver_version,
        0,
        encode_text(system.driver_version, 80, "driver version"),
        encode_text(system.nvml_version, 80, "NVML version"),
    )
    return struct.pack("<I4x", zlib.crc32(body)) + body


def _fixed_header() -> bytes:
    return _HEADER_FIXED.pack(MAGIC, LAYOUT_VERSION, HEADER_SIZE, GPU_SIZE, MAX_GPUS, EVENT_CAPACITY, FILE_SIZE, 0)


def _is_state_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(_HEADER_FIXED.size)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    return size >= FILE_SIZE and head[: _HEADER_FIXED.size - 8] == _fixed_header()[: _HEADER_FIXED.size - 8]


# futex(2): its syscall number by machine, and FUTEX_WAKE (not the private kind: the waiters are other processes).
_SYS_FUTEX: Final = {"x86_64": 202, "aarch64": 98}
_FUTEX_WAKE: Final = 1


class _Waker:
    """Wakes the library's nvmlEventSetWait_v2 sleepers after a write: they wait on seq's low word, as a real
    driver's waiter sleeps in the kernel. Where futex(2) cannot be reached they look again on their own."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._word: ctypes.c_uint32 | None = None
        self._syscall = None
        number = _SYS_FUTEX.get(platform.machine()) if sys.platform == "linux" else None
        if number is None:
            return
        try:
            self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            return
        self._number = number
        self._word = ctypes.c_uint32.from_buffer(mapping, _SEQ_OFFSET)

    def wake(self) -> None:
        if self._word is not None and self._syscall is not None:
            self._syscall(self._number, ctypes.byref(self._word), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def release(self) -> None:
        self._word = None  # the mapping cannot be closed while a ctypes view of it lives


class StateWriter:
    """The one writer of a state file. Holds an exclusive lock on it while open.

    `gpus`, when given, are in the file before any reader can open it (a new file) or from the
    first write on (an existing one), so a reader never sees a node without GPUs in between.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        gpus: Sequence[Gpu | bytes] | None = None,
        *,
        driver_version: str = DRIVER_VERSION,
        nvml_version: str = NVML_VERSION,
        cuda_driver_version: int = CUDA_DRIVER_VERSION,
        hang_max_ms: int = HANG_MAX_MS,
    ) -> None:
        if sys.byteorder != "little":  # the memoryview stores below are native-endian
            raise RuntimeError("the vGPU state file is little-endian; this writer needs a little-endian host")
        self.path = Path(path)
        self._system = _System(driver_version, nvml_version, cuda_driver_version, hang_max_ms)
        self._gpu_count = 0
        created = not _is_state_file(self.path)
        if created:
            self._create(gpus or [])
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"{self.path}: another StateWriter has it open") from None
            self._map = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # One aligned 8-byte store per update of seq: struct.pack_into writes byte by byte, and a
        # reader could catch seq half-written.
        self._words = memoryview(self._map).cast("Q")
        self._waker = _Waker(self._map)
        total, count = struct.unpack_from("<QI", self._map, _BODY_OFFSET)
        self._event_total: int = total
        self._gpu_count = int(count)
        if gpus is not None and not created:
            self.write(gpus)

    def _create(self, gpus: Sequence[Gpu | bytes]) -> None:
        check_count(gpus, MAX_GPUS, "GPUs")
        image = bytearray(FILE_SIZE)
        image[: _HEADER_FIXED.size] = _fixed_header()
        image[_CRC_OFFSET:HEADER_SIZE] = _header_section(self._system, 0, len(gpus))
        for i, gpu in enumerate(gpus):
            image[HEADER_SIZE + i * GPU_SIZE : HEADER_SIZE + (i + 1) * GPU_SIZE] = gpu_record(gpu)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            os.fchmod(fd, 0o644)  # the daemon reading it may run as another user than the simulator
            with os.fdopen(fd, "wb") as f:
                f.write(image)
            Path(tmp).replace(self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink()
            raise

    def _begin(self) -> int:
        seq = int(self._words[_SEQ_OFFSET // 8])
        odd = seq + 1 if seq % 2 == 0 else seq + 2  # odd already: a writer died mid-write
        self._words[_SEQ_OFFSET // 8] = odd
        return odd

    def _end(self, odd: int) -> None:
        self._words[_SEQ_OFFSET // 8] = odd + 1
        self._waker.wake()

    def write(self, gpus: Sequence[Gpu | bytes]) -> None:
        """Publish the GPUs' state: readers see all of it or, until it is done, all of the previous one.

        A GPU may also be given as its record from encode_gpu(), for a caller that keeps the
        records of GPUs that did not change.
        """
        check_count(gpus, MAX_GPUS, "GPUs")
        records = b"".join(gpu_record(g) for g in gpus)  # encoded before the seqlock: readers wait less
        header = _header_section(self._system, self._event_total, len(gpus))
        odd = self._begin()
        try:
            self._map[_CRC_OFFSET:HEADER_SIZE] = header
            self._map[HEADER_SIZE : HEADER_SIZE + len(records)] = records
        finally:
            self._end(odd)
        self._gpu_count = len(gpus)

    def push_event(
        self,
        gpu: int,
        event_type: int,
        data: int = 0,
        *,
        gpu_instance_id: int = NO_INSTANCE,
        compute_instance_id: int = NO_INSTANCE,
    ) -> int:
        """Publish an NVML event for GPU index `gpu`; returns its sequence number. The ring keeps the last 256."""
        if not 0 <= gpu < MAX_GPUS:
            raise ValueError(f"GPU index {gpu} is outside 0..{MAX_GPUS - 1}")
        n = self._event_total + 1
        fields = _EVENT.pack(n, event_type, data, gpu, gpu_instance_id, compute_instance_id)
        entry = fields + struct.pack("<I", zlib.crc32(fields))
        slot = _EVENTS_OFFSET + ((n - 1) % EVENT_CAPACITY) * EVENT_SIZE
        header = _header_section(self._system, n, self._gpu_count)
        odd = self._begin()
        try:
            self._map[slot : slot + EVENT_SIZE] = entry
            self._map[_CRC_OFFSET:HEADER_SIZE] = header
        finally:
            self._end(odd)
        self._event_total = n
        return n

    def push_xid(self, gpu: int, xid: int, **instance: int) -> int:
        """An XID critical-error event, as nvmlEventSetWait_v2 delivers it: eventData is the XID."""
        return self.push_event(gpu, EVENT_XID, xid, **instance)

    def close(self) -> None:
        """Unmaps and unlocks the file, which stays for readers to map; closing twice is harmless."""
        if self._map.closed:
            return
        self._words.release()
        self._waker.release()
        self._map.close()
        os.close(self._fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The writer's API: the node's dataclasses and constants, the record encoder, and the file.
__all__ = [
    "ARCH_AMPERE",
    "ARCH_BLACKWELL",
    "ARCH_HOPPER",
    "BRAND_NVIDIA",
    "CLOCKS_GPU_IDLE",
    "CUDA_DRIVER_VERSION",
    "DRIVER_VERSION",
    "ECC_AGGREGATE",
    "ECC_CORRECTED",
    "ECC_UNCORRECTED",
    "ECC_VOLATILE",
    "EVENT_CAPACITY",
    "EVENT_DOUBLE_BIT_ECC",
    "EVENT_MIG_CONFIG_CHANGE",
    "EVENT_PSTATE",
    "EVENT_SINGLE_BIT_ECC",
    "EVENT_SIZE",
    "EVENT_XID",
    "FABRIC_COMPLETED",
    "FABRIC_IN_PROGRESS",
    "FABRIC_NOT_STARTED",
    "FIELD_MASK_BITS",
    "FILE_SIZE",
    "GPM_SLOTS",
    "GPU_SIZE",
    "HANG_MAX_MS",
    "HEADER_SIZE",
    "LAYOUT_VERSION",
    "LOCATION_DEVICE_MEMORY",
    "MAGIC",
    "MAX_GPUS",
    "MAX_LINKS",
    "MAX_MIG",
    "MAX_OVERRIDES",
    "MAX_PROCESSES",
    "MAX_RETIRED",
    "NOT_AVAILABLE",
    "NO_INSTANCE",
    "NVLINK_ACTIVE",
    "NVLINK_ACTIVE_TRAFFIC_DISABLED",
    "NVLINK_INACTIVE",
    "NVLINK_SLEEP",
    "NVLINK_VERSION_3_0",
    "NVLINK_VERSION_4_0",
    "NVLINK_VERSION_5_0",
    "NVML_VERSION",
    "Fabric",
    "FieldOverride",
    "Gpu",
    "MigInstance",
    "MigProfile",
    "NvLink",
    "Process",
    "Query",
    "RetiredPage",
    "StateWriter",
    "ValueType",
    "encode_gpu",
    "h100",
    "h100_node",
]
