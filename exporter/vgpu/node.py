"""The virtual GPUs as the simulator describes them to the vGPU library: dataclasses in NVML's units.

records.py encodes them into the state file's records; state.py writes the file. The three
use the stdlib and one another only, so they can move together wherever the package layout puts the
simulator.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

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
NVLINK_VERSION_3_0: Final = 4  # nvmlNvlinkVersion_t: A100 (NVML_NVLINK_VERSION_3_0)
NVLINK_VERSION_4_0: Final = 6  # H100, H200, GH200
NVLINK_VERSION_5_0: Final = 7  # B200
ARCH_AMPERE: Final = 7
ARCH_ADA: Final = 8
ARCH_HOPPER: Final = 9
ARCH_BLACKWELL: Final = 10
FABRIC_NOT_SUPPORTED: Final = 0  # NVML_GPU_FABRIC_STATE_*
FABRIC_NOT_STARTED: Final = 1
FABRIC_IN_PROGRESS: Final = 2
FABRIC_COMPLETED: Final = 3
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
    FABRIC = 32
    GSP_FIRMWARE = 33
    MIG_PROFILES = 34


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
    # NVLink5 (Blackwell) counters, NVML_FI_DEV_NVLINK_COUNT_*: the library answers them on Blackwell only
    recovery_successful: int = 0
    recovery_failed: int = 0
    recovery_events: int = 0
    effective_errors: int = 0
    symbol_errors: int = 0


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
    # nvmlDeviceGetAttributes_v2: slices, SMs, shared engines, memory in MiB
    gpu_instance_slices: int = 0
    compute_instance_slices: int = 0
    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    memory_mb: int = 0


@dataclass
class MigProfile:
    """A GPU instance profile as nvmlDeviceGetGpuInstanceProfileInfoV answers it (by its `profile` index)."""

    profile: int  # NVML_GPU_INSTANCE_PROFILE_* index
    id: int
    name: str  # "MIG 1g.18gb"
    slices: int
    memory_mb: int  # MiB
    instances: int = 1
    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass
class Fabric:
    """nvmlDeviceGetGpuFabricInfoV: an NVSwitch or NVL system's view of the GPU."""

    state: int = FABRIC_COMPLETED  # NVML_GPU_FABRIC_STATE_*
    status: int = 0  # nvmlReturn_t of the probe
    clique_id: int = 0
    cluster_uuid: bytes = bytes(16)
    health_mask: int = 0
    health_summary: int = 0  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*


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
    # since layout 3
    pcie_tx_bytes: int = 0  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES: the byte counters, which wrap
    pcie_rx_bytes: int = 0
    pcie_errors: list[int] = field(default_factory=lambda: [0] * 11)  # NVML_FI_DEV_PCIE_COUNT_* (173-183)
    pcie_l0_recovery: int = 0  # NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER
    # clock-event durations in ns: SW power cap (74), sync boost (76), SW thermal (269), HW thermal (270),
    # HW power brake (271)
    clock_event_ns: list[int] = field(default_factory=lambda: [0] * 5)
    power_instant_mw: int = 69000  # NVML_FI_DEV_POWER_INSTANT
    reset_generation: int = 0  # bumped when a reset completes: MIG handles from before it go invalid
    fabric: Fabric | None = None  # None: nvmlDeviceGetGpuFabricInfoV answers NOT_SUPPORTED
    gsp_firmware: tuple[bool, bool] = (True, True)  # nvmlDeviceGetGspFirmwareMode: enabled, default
    mig_profiles: list[MigProfile] = field(default_factory=list)
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
        power_instant_mw=69000 + 500 * index,
        fabric=Fabric(),
        temperature_gpu=30 + index % 4,
        temperature_memory=28 + index % 4,
    )


def h100_node() -> list[Gpu]:
    """The library's default node: eight idle, healthy H100 80GB HBM3 GPUs."""
    return [h100(i) for i in range(len(_H100_UUIDS))]
