"""The writer of the virtual GPU's state file, which build/vgpu/libnvidia-ml.so.1 maps.

The simulator describes its GPUs with the dataclasses here and hands them to
`StateWriter.write` each tick; every process that has loaded the library with
GPU_TRIAGE_VGPU_STATE pointing at the file sees the new values on its next NVML call.
vgpu/README.md documents the layout; vgpu/state.h is its C side.

The file is updated in place, through a shared mapping, under a seqlock: readers keep the
file mapped, so replacing it (write a temporary, rename) would leave them reading the old
inode forever. It is created with a rename, though, so that no reader ever opens a file that
is not whole yet. Stdlib only, and no imports from the project, so it can move with the
simulator wherever the package layout puts it.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import mmap
import os
import struct
import sys
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Self

MAGIC: Final = b"GTVGPUST"
LAYOUT_VERSION: Final = 2  # 2: room for 64 GPUs (a 64-GPU bench), 1 had 16
MAX_GPUS: Final = 64
MAX_LINKS: Final = 36
MAX_MIG: Final = 7
MAX_PROCESSES: Final = 32
MAX_OVERRIDES: Final = 16
MAX_RETIRED: Final = 16
GPM_SLOTS: Final = 128
EVENT_CAPACITY: Final = 256
FIELD_MASK_BITS: Final = 512

DRIVER_VERSION: Final = "580.82.07"
NVML_VERSION: Final = "13.580.82.07"
CUDA_DRIVER_VERSION: Final = 13000  # 1000 * major + 10 * minor
HANG_MAX_MS: Final = 10_000

NO_INSTANCE: Final = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG
NOT_AVAILABLE: Final = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long

# NVML constants the records carry (nvml.h 13.3 values).
NVLINK_INACTIVE: Final = 0
NVLINK_ACTIVE: Final = 1
NVLINK_SLEEP: Final = 2
NVLINK_ACTIVE_TRAFFIC_DISABLED: Final = 3
NVLINK_VERSION_4_0: Final = 6
ARCH_HOPPER: Final = 9
BRAND_NVIDIA: Final = 14
EVENT_SINGLE_BIT_ECC: Final = 0x1
EVENT_DOUBLE_BIT_ECC: Final = 0x2
EVENT_PSTATE: Final = 0x4
EVENT_XID: Final = 0x8
EVENT_MIG_CONFIG_CHANGE: Final = 0x100
ECC_CORRECTED: Final = 0  # nvmlMemoryErrorType_t
ECC_UNCORRECTED: Final = 1
ECC_VOLATILE: Final = 0  # nvmlEccCounterType_t
ECC_AGGREGATE: Final = 1
LOCATION_DEVICE_MEMORY: Final = 2  # nvmlMemoryLocation_t; 0 L1, 1 L2, 3 register file, 4 texture, 6 CBU, 7 SRAM
CLOCKS_GPU_IDLE: Final = 0x1


class Query(enum.IntEnum):
    """Query kinds a GPU can refuse with NVML_ERROR_NOT_SUPPORTED (`Gpu.unsupported`)."""

    UTILIZATION = 0
    MEMORY = 1
    BAR1 = 2
    POWER_USAGE = 3
    ENERGY = 4
    POWER_LIMIT = 5
    TEMPERATURE = 6
    TEMPERATURE_THRESHOLD = 7
    CLOCKS = 8
    CLOCK_EVENT_REASONS = 9
    PERFORMANCE_STATE = 10
    PCIE_THROUGHPUT = 11
    PCIE_LINK = 12
    PCIE_REPLAY = 13
    ECC = 14
    REMAPPED_ROWS = 15
    RETIRED_PAGES = 16
    FAN_SPEED = 17
    COMPUTE_MODE = 18
    PERSISTENCE_MODE = 19
    DISPLAY = 20
    PROCESSES = 21
    EVENTS = 22
    MIG = 23
    GPM = 24
    NVLINK = 25
    FIELD_VALUES = 26
    SERIAL = 27
    BOARD_PART_NUMBER = 28
    VBIOS_VERSION = 29
    INFOROM_VERSION = 30
    ENCODER_DECODER = 31


class ValueType(enum.IntEnum):
    """nvmlValueType_t: which member of nvmlValue_t a field value is in."""

    DOUBLE = 0
    UNSIGNED_INT = 1
    UNSIGNED_LONG = 2
    UNSIGNED_LONG_LONG = 3
    SIGNED_LONG_LONG = 4
    SIGNED_INT = 5
    UNSIGNED_SHORT = 6


@dataclass
class NvLink:
    """One NVLink. Counters are cumulative; throughput in KiB since the driver loaded."""

    state: int = NVLINK_ACTIVE
    speed_mbps: int = 26562
    replay_errors: int = 0
    recovery_errors: int = 0
    crc_flit_errors: int = 0  # also what NVML_FI_DEV_NVLINK_ERROR_DL_CRC reads
    crc_data_errors: int = 0
    ecc_data_errors: int = 0
    data_tx_kib: int = 0
    data_rx_kib: int = 0
    raw_tx_kib: int = 0
    raw_rx_kib: int = 0


@dataclass
class MigInstance:
    """A MIG device: one compute instance of one GPU instance."""

    gpu_instance_id: int
    compute_instance_id: int
    name: str
    uuid: str
    memory_total: int  # bytes
    memory_reserved: int = 0
    memory_used: int = 0
    gpm: dict[int, float] = field(default_factory=dict)  # GPM metric id -> value


@dataclass
class Process:
    pid: int
    used_memory: int | None  # bytes; None reads as NVML_VALUE_NOT_AVAILABLE
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE
    compute: bool = True
    graphics: bool = False


@dataclass
class FieldOverride:
    """Answers one (field id, scope id) with any value type and return code, ahead of the library's own table."""

    field_id: int
    value: int | float = 0
    scope_id: int = 0
    value_type: ValueType = ValueType.UNSIGNED_LONG_LONG
    nvml_return: int = 0


@dataclass
class RetiredPage:
    address: int
    timestamp: int


def _h100_gpm() -> dict[int, float]:
    """The GPM metric ids an H100 reports: utilisation (1-13), PCIe (20, 21), NVLink total and per link (60-97)."""
    return dict.fromkeys([*range(1, 14), 20, 21, *range(60, 98)], 0.0)


@dataclass
class Gpu:
    """One GPU as NVML reports it, in NVML's units. The defaults are an idle H100 80GB HBM3 (SXM5).

    Strings given as bytes are written as they are: a name or serial that is not UTF-8, as a corrupt
    InfoROM reads."""

    uuid: str | bytes
    pci_bus: int
    minor_number: int = 0
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    serial: str | bytes = ""
    board_part_number: str = "692-2G520-0200-000"
    vbios_version: str = "96.00.99.00.01"
    inforom_image_version: str = "G520.0200.00.05"
    brand: int = BRAND_NVIDIA
    architecture: int = ARCH_HOPPER
    cuda_compute_capability: tuple[int, int] = (9, 0)
    pci_domain: int = 0
    pci_device: int = 0
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    pci_base_class: int = 0x3
    pci_sub_class: int = 0x2
    # utilisation, percent
    utilization_gpu: int = 0
    utilization_memory: int = 0
    utilization_encoder: int = 0
    utilization_decoder: int = 0
    # memory, bytes; free is what total leaves after reserved and used
    memory_total: int = 81559 * 2**20
    memory_reserved: int = 567 * 2**20
    memory_used: int = 0
    bar1_total: int = 131072 * 2**20
    bar1_used: int = 2**20
    # power, milliwatts and millijoules
    power_mw: int = 69000
    energy_mj: int = 6_000_000_000
    power_limit_enforced_mw: int = 700_000
    power_limit_mw: int = 700_000
    power_limit_min_mw: int = 200_000
    power_limit_max_mw: int = 700_000
    power_limit_default_mw: int = 700_000
    # thermals, degrees C; thresholds by nvmlTemperatureThresholds_t, 0 for not supported
    temperature_gpu: int = 30
    temperature_memory: int = 28
    temperature_thresholds: list[int] = field(default_factory=lambda: [92, 89, 95, 87, 0, 0, 0, 0])
    fan_speed: int = 0  # percent
    # clocks, MHz, by nvmlClockType_t (graphics, SM, memory, video)
    clocks_mhz: list[int] = field(default_factory=lambda: [345, 345, 2619, 765])
    max_clocks_mhz: list[int] = field(default_factory=lambda: [1980, 1980, 2619, 1545])
    app_clocks_mhz: list[int] = field(default_factory=lambda: [1755, 1755, 2619, 1545])
    default_app_clocks_mhz: list[int] = field(default_factory=lambda: [1755, 1755, 2619, 1545])
    clocks_event_reasons: int = CLOCKS_GPU_IDLE  # nvmlClocksEventReason* bits
    pstate: int = 0
    # PCIe: throughput in KB/s, link generation and width
    pcie_tx_kbs: int = 512
    pcie_rx_kbs: int = 1024
    pcie_link_gen: int = 5
    pcie_link_gen_max: int = 5
    pcie_link_width: int = 16
    pcie_link_width_max: int = 16
    pcie_replay_count: int = 0
    # memory health
    ecc_mode: bool = True
    ecc_mode_pending: bool = True
    ecc: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (error type, counter type, location) -> count
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_sbe: list[RetiredPage] = field(default_factory=list)
    retired_dbe: list[RetiredPage] = field(default_factory=list)
    retired_pending: bool = False
    recovery_action: int = 0  # nvmlDeviceGpuRecoveryAction_t
    # modes
    compute_mode: int = 0
    persistence_mode: bool = True
    display_mode: bool = False
    display_active: bool = False
    # MIG
    mig_mode: bool = False
    mig_mode_pending: bool = False
    max_mig_devices: int = 7
    mig_instances: list[MigInstance] = field(default_factory=list)
    # NVLink, processes, events, GPM
    nvlink_version: int = NVLINK_VERSION_4_0
    nvlinks: list[NvLink] = field(default_factory=lambda: [NvLink() for _ in range(18)])
    processes: list[Process] = field(default_factory=list)
    supported_events: int = (
        EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_MIG_CONFIG_CHANGE
    )
    gpm: dict[int, float] = field(default_factory=_h100_gpm)  # GPM metric id -> value
    # faults
    lost: bool = False  # every device call: NVML_ERROR_GPU_IS_LOST
    hung: bool = False  # device calls block until cleared (or hang_max_ms, then NVML_ERROR_UNKNOWN)
    invalid_handle: bool = False  # device calls: NVML_ERROR_INVALID_ARGUMENT; handles work again once cleared
    # An SXM board has no fan, and Hopper remaps rows instead of retiring pages: NOT_SUPPORTED on real H100s.
    unsupported: set[Query] = field(default_factory=lambda: {Query.FAN_SPEED, Query.RETIRED_PAGES})
    unsupported_fields: set[int] = field(default_factory=lambda: {29, 30, 31, 92, 93})  # the retired-page fields
    field_overrides: list[FieldOverride] = field(default_factory=list)


_H100_UUIDS: Final = (
    "GPU-87751d4c-a850-4e2c-84dc-da6a797d76de",
    "GPU-61b339ff-2481-44e5-998b-88dbaa99e079",
    "GPU-7b87a9e2-5fef-4911-bf22-a27b02c7bff2",
    "GPU-75d0dd66-cf72-4858-a4b6-6f8c462804db",
    "GPU-3a46e6b0-99f9-46b1-9d45-af1cb0caae1c",
    "GPU-9fcdb9e1-a94c-46b9-806d-2cc78ee58b06",
    "GPU-5e1ea978-70a7-4e49-ba60-dbd625329041",
    "GPU-35d30d74-e7ed-4867-96f5-47ab298a59f8",
)
_H100_BUSES: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def h100(index: int) -> Gpu:
    """GPU `index` of the node the library presents when GPU_TRIAGE_VGPU_STATE is unset (indices 0-7)."""
    return Gpu(
        uuid=_H100_UUIDS[index],
        pci_bus=_H100_BUSES[index],
        minor_number=index,
        serial=f"16549220{100 + index:05d}",
        energy_mj=6_000_000_000 + 7_000_000 * index,
        power_mw=69000 + 500 * index,
        temperature_gpu=30 + index % 4,
        temperature_memory=28 + index % 4,
    )


def h100_node() -> list[Gpu]:
    """The library's default node: eight idle, healthy H100 80GB HBM3 GPUs."""
    return [h100(i) for i in range(len(_H100_UUIDS))]


# -- encoding -----------------------------------------------------------------------------------

_HEADER_FIXED = struct.Struct("<8sIIIIIIQ")  # magic .. seq: written once, at creation
_HEADER_BODY = struct.Struct("<QIIiI80s80s24x")  # event_total .. end: covered by the header CRC
_GPU_HEAD = struct.Struct("<IIQ8QQ7Q32Q32Q32Q")  # crc .. retired_timestamp
_GPU_SCALARS = struct.Struct("<25I2i8I16I29I")  # retired_count .. reserved0
_GPU_STRINGS = struct.Struct("<96s96s32s80s32s16s")
_LINK = struct.Struct("<9Q2I")
_PROC = struct.Struct("<Q4I")
_OVERRIDE = struct.Struct("<Q4I")
_GPM = struct.Struct(f"<2Q{GPM_SLOTS}d")
_MIG_HEAD = struct.Struct("<3Q2I96s96s")
_EVENT = struct.Struct("<QQQIII")  # then the CRC of these 36 bytes

HEADER_SIZE: Final = 256
GPU_SIZE: Final = (
    _GPU_HEAD.size
    + _GPU_SCALARS.size
    + _GPU_STRINGS.size
    + MAX_LINKS * _LINK.size
    + (MAX_PROCESSES + MAX_OVERRIDES) * _PROC.size
    + _GPM.size
    + MAX_MIG * (_MIG_HEAD.size + _GPM.size)
)
EVENT_SIZE: Final = _EVENT.size + 4
FILE_SIZE: Final = HEADER_SIZE + MAX_GPUS * GPU_SIZE + EVENT_CAPACITY * EVENT_SIZE
_SEQ_OFFSET: Final = 32
_CRC_OFFSET: Final = 40
_BODY_OFFSET: Final = 48
_EVENTS_OFFSET: Final = HEADER_SIZE + MAX_GPUS * GPU_SIZE

if _HEADER_FIXED.size + 8 + _HEADER_BODY.size != HEADER_SIZE or GPU_SIZE != 15504:  # pragma: no cover
    raise AssertionError("vgpu_state.py disagrees with vgpu/state.h")


def _text(value: str | bytes, size: int, what: str) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode()  # bytes as they are: a corrupt InfoROM
    if len(raw) >= size:
        raise ValueError(f"{what} is longer than {size - 1} bytes: {value!r}")
    return raw


def _mask(bits: Sequence[int] | set[int], width: int, what: str) -> list[int]:
    words = [0] * (width // 64)
    for bit in bits:
        if not 0 <= bit < width:
            raise ValueError(f"{what}: {bit} is outside 0..{width - 1}")
        words[bit // 64] |= 1 << (bit % 64)
    return words


def _gpm(values: dict[int, float]) -> bytes:
    return _GPM.pack(*_mask(list(values), GPM_SLOTS, "GPM metric id"), *(values.get(i, 0.0) for i in range(GPM_SLOTS)))


def _limit(items: Sequence[object], most: int, what: str) -> None:
    if len(items) > most:
        raise ValueError(f"at most {most} {what}, not {len(items)}")


def _override(o: FieldOverride) -> bytes:
    if o.value_type is ValueType.DOUBLE:
        (bits,) = struct.unpack("<Q", struct.pack("<d", float(o.value)))
    else:
        bits = int(o.value) & 0xFFFFFFFFFFFFFFFF  # two's complement for the signed types
    return _OVERRIDE.pack(bits, o.field_id, o.scope_id, int(o.value_type), o.nvml_return)


def _mig(m: MigInstance) -> bytes:
    head = _MIG_HEAD.pack(
        m.memory_total,
        m.memory_reserved,
        m.memory_used,
        m.gpu_instance_id,
        m.compute_instance_id,
        _text(m.name, 96, "MIG name"),
        _text(m.uuid, 96, "MIG UUID"),
    )
    return head + _gpm(m.gpm)


def _ecc(gpu: Gpu) -> list[int]:
    counts = [0] * 32
    for (error_type, counter_type, location), n in gpu.ecc.items():
        if not (0 <= error_type < 2 and 0 <= counter_type < 2 and 0 <= location < 8):
            raise ValueError(f"ECC key out of range: {(error_type, counter_type, location)}")
        counts[error_type * 16 + counter_type * 8 + location] = n
    return counts


def _retired(pages: list[RetiredPage], attr: str) -> list[int]:
    values = [getattr(p, attr) for p in pages]
    return values + [0] * (MAX_RETIRED - len(values))


def encode_gpu(gpu: Gpu) -> bytes:
    """The GPU's record, CRC included, exactly as vgpu/state.h lays out struct vgpu_gpu."""
    _limit(gpu.nvlinks, MAX_LINKS, "NVLinks")
    _limit(gpu.mig_instances, MAX_MIG, "MIG instances")
    _limit(gpu.processes, MAX_PROCESSES, "processes")
    _limit(gpu.field_overrides, MAX_OVERRIDES, "field overrides")
    _limit(gpu.retired_sbe, MAX_RETIRED, "retired SBE pages")
    _limit(gpu.retired_dbe, MAX_RETIRED, "retired DBE pages")
    if gpu.max_mig_devices > MAX_MIG:
        raise ValueError(f"max_mig_devices is at most {MAX_MIG}")
    for what, values in (
        ("temperature_thresholds", gpu.temperature_thresholds),
        ("clocks_mhz", gpu.clocks_mhz),
        ("max_clocks_mhz", gpu.max_clocks_mhz),
        ("app_clocks_mhz", gpu.app_clocks_mhz),
        ("default_app_clocks_mhz", gpu.default_app_clocks_mhz),
    ):
        if len(values) != (8 if what == "temperature_thresholds" else 4):
            raise ValueError(f"{what} needs one value per NVML enum member, not {len(values)}")
    flags = (1 if gpu.lost else 0) | (2 if gpu.hung else 0) | (4 if gpu.invalid_handle else 0)
    unsupported = 0
    for q in gpu.unsupported:
        unsupported |= 1 << int(q)
    head = _GPU_HEAD.pack(
        0,  # crc, filled in below
        flags,
        unsupported,
        *_mask(sorted(gpu.unsupported_fields), FIELD_MASK_BITS, "field id"),
        gpu.supported_events,
        gpu.memory_total,
        gpu.memory_reserved,
        gpu.memory_used,
        gpu.bar1_total,
        gpu.bar1_used,
        gpu.energy_mj,
        gpu.clocks_event_reasons,
        *_ecc(gpu),
        *_retired(gpu.retired_sbe, "address"),
        *_retired(gpu.retired_dbe, "address"),
        *_retired(gpu.retired_sbe, "timestamp"),
        *_retired(gpu.retired_dbe, "timestamp"),
    )
    scalars = _GPU_SCALARS.pack(
        len(gpu.retired_sbe),
        len(gpu.retired_dbe),
        int(gpu.retired_pending),
        gpu.minor_number,
        gpu.brand,
        gpu.architecture,
        *gpu.cuda_compute_capability,
        gpu.pci_domain,
        gpu.pci_bus,
        gpu.pci_device,
        gpu.pci_device_id,
        gpu.pci_subsystem_id,
        gpu.pci_base_class,
        gpu.pci_sub_class,
        gpu.utilization_gpu,
        gpu.utilization_memory,
        gpu.utilization_encoder,
        gpu.utilization_decoder,
        gpu.power_mw,
        gpu.power_limit_enforced_mw,
        gpu.power_limit_mw,
        gpu.power_limit_min_mw,
        gpu.power_limit_max_mw,
        gpu.power_limit_default_mw,
        gpu.temperature_gpu,
        gpu.temperature_memory,
        *gpu.temperature_thresholds,
        *gpu.clocks_mhz,
        *gpu.max_clocks_mhz,
        *gpu.app_clocks_mhz,
        *gpu.default_app_clocks_mhz,
        gpu.pstate,
        gpu.pcie_tx_kbs,
        gpu.pcie_rx_kbs,
        gpu.pcie_link_gen,
        gpu.pcie_link_gen_max,
        gpu.pcie_link_width,
        gpu.pcie_link_width_max,
        gpu.pcie_replay_count,
        int(gpu.ecc_mode),
        int(gpu.ecc_mode_pending),
        gpu.remapped_correctable,
        gpu.remapped_uncorrectable,
        int(gpu.remap_pending),
        int(gpu.remap_failure),
        gpu.fan_speed,
        gpu.compute_mode,
        int(gpu.persistence_mode),
        int(gpu.display_mode),
        int(gpu.display_active),
        gpu.recovery_action,
        int(gpu.mig_mode),
        int(gpu.mig_mode_pending),
        gpu.max_mig_devices,
        len(gpu.mig_instances),
        len(gpu.nvlinks),
        gpu.nvlink_version,
        len(gpu.processes),
        len(gpu.field_overrides),
        0,  # reserved0
    )
    strings = _GPU_STRINGS.pack(
        _text(gpu.name, 96, "name"),
        _text(gpu.uuid, 96, "UUID"),
        _text(gpu.serial, 32, "serial"),
        _text(gpu.board_part_number, 80, "board part number"),
        _text(gpu.vbios_version, 32, "VBIOS version"),
        _text(gpu.inforom_image_version, 16, "inforom image version"),
    )
    links = [
        _LINK.pack(
            k.replay_errors,
            k.recovery_errors,
            k.crc_flit_errors,
            k.crc_data_errors,
            k.ecc_data_errors,
            k.data_tx_kib,
            k.data_rx_kib,
            k.raw_tx_kib,
            k.raw_rx_kib,
            k.state,
            k.speed_mbps,
        )
        for k in gpu.nvlinks
    ]
    procs = [
        _PROC.pack(
            NOT_AVAILABLE if p.used_memory is None else p.used_memory,
            p.pid,
            p.gpu_instance_id,
            p.compute_instance_id,
            (1 if p.compute else 0) | (2 if p.graphics else 0),
        )
        for p in gpu.processes
    ]
    empty_mig = bytes(_MIG_HEAD.size + _GPM.size)
    record = b"".join(
        [
            head,
            scalars,
            strings,
            *links,
            bytes(_LINK.size * (MAX_LINKS - len(links))),
            *procs,
            bytes(_PROC.size * (MAX_PROCESSES - len(procs))),
            *(_override(o) for o in gpu.field_overrides),
            bytes(_OVERRIDE.size * (MAX_OVERRIDES - len(gpu.field_overrides))),
            _gpm(gpu.gpm),
            *(_mig(m) for m in gpu.mig_instances),
            empty_mig * (MAX_MIG - len(gpu.mig_instances)),
        ]
    )
    return struct.pack("<I", zlib.crc32(record[4:])) + record[4:]


def _record(gpu: Gpu | bytes) -> bytes:
    if isinstance(gpu, Gpu):
        return encode_gpu(gpu)
    if len(gpu) != GPU_SIZE:
        raise ValueError(f"a GPU record is {GPU_SIZE} bytes, not {len(gpu)}")
    return gpu


# -- the file -----------------------------------------------------------------------------------


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
        _text(system.driver_version, 80, "driver version"),
        _text(system.nvml_version, 80, "NVML version"),
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
        total, count = struct.unpack_from("<QI", self._map, _BODY_OFFSET)
        self._event_total: int = total
        self._gpu_count = int(count)
        if gpus is not None and not created:
            self.write(gpus)

    def _create(self, gpus: Sequence[Gpu | bytes]) -> None:
        _limit(gpus, MAX_GPUS, "GPUs")
        image = bytearray(FILE_SIZE)
        image[: _HEADER_FIXED.size] = _fixed_header()
        image[_CRC_OFFSET:HEADER_SIZE] = _header_section(self._system, 0, len(gpus))
        for i, gpu in enumerate(gpus):
            image[HEADER_SIZE + i * GPU_SIZE : HEADER_SIZE + (i + 1) * GPU_SIZE] = _record(gpu)
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

    def write(self, gpus: Sequence[Gpu | bytes]) -> None:
        """Publish the GPUs' state: readers see all of it or, until it is done, all of the previous one.

        A GPU may also be given as its record from encode_gpu(), for a caller that keeps the
        records of GPUs that did not change.
        """
        _limit(gpus, MAX_GPUS, "GPUs")
        records = b"".join(_record(g) for g in gpus)  # encoded before the seqlock: readers wait less
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
        self._map.close()
        os.close(self._fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
