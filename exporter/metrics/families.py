"""The metric families the readings become, declared in the order they appear on /metrics.

A family is per GPU: every series carries `gpu` and `uuid`, then the family's own labels. MIG
instances add theirs (`MIG_LABELS`) on the same families (see exporter/backends/readings.py for why).
The backends fill them (exporter/backends/field_table.py); they live here, with the rest of /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    """A per-GPU metric family: every series carries `gpu` and `uuid`, then `labels`."""

    name: str
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    counter: bool = False


# Declared in the order they appear on /metrics.
UP = Family("nvidia_gpu_up", "1 if the GPU answered the last poll; 0 if it is lost or a call to it hung.")
UTILIZATION = Family("nvidia_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (0-1).", "ratio")
MEMORY_CONTROLLER = Family(
    "nvidia_gpu_memory_controller_utilization_ratio",
    "Fraction of time the memory controller was busy reading or writing (0-1).",
    "ratio",
)
ENCODER_UTILIZATION = Family(
    "nvidia_gpu_encoder_utilization_ratio", "Fraction of time the video encoder was busy (0-1).", "ratio"
)
DECODER_UTILIZATION = Family(
    "nvidia_gpu_decoder_utilization_ratio", "Fraction of time the video decoder was busy (0-1).", "ratio"
)
MEMORY_USED = Family("nvidia_gpu_memory_used_bytes", "GPU memory in use, in bytes.", "bytes")
MEMORY_TOTAL = Family("nvidia_gpu_memory_total_bytes", "GPU memory installed, in bytes.", "bytes")
MEMORY_RESERVED = Family(
    "nvidia_gpu_memory_reserved_bytes", "GPU memory reserved by the driver and firmware, in bytes.", "bytes"
)
POWER = Family(
    "nvidia_gpu_power_watts",
    "Power drawn by the board, in watts: NVML's 1-second average on Ampere and later GPUs (A100's GA100 "
    "and older ones report the instant reading), the value dcgm-exporter's DCGM_FI_DEV_POWER_USAGE shows.",
    "watts",
)
POWER_INSTANT = Family(
    "nvidia_gpu_power_instant_watts", "Power drawn by the board at the moment of the read, in watts.", "watts"
)
POWER_LIMIT = Family("nvidia_gpu_power_limit_watts", "Enforced power limit, in watts.", "watts")
POWER_DEFAULT_LIMIT = Family(
    "nvidia_gpu_power_default_limit_watts",
    "The power limit the board ships with, in watts; an enforced limit below it was lowered by an administrator "
    "or another limiter.",
    "watts",
)
ENERGY = Family(
    "nvidia_gpu_energy_joules", "Energy used since the driver was loaded, in joules.", "joules", counter=True
)
TEMPERATURE = Family("nvidia_gpu_temperature_celsius", "GPU core temperature, in degrees Celsius.", "celsius")
MEMORY_TEMPERATURE = Family(
    "nvidia_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature, in degrees Celsius.", "celsius"
)
FAN = Family("nvidia_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (0-1).", "ratio")
TEMPERATURE_THRESHOLD = Family(
    "nvidia_gpu_temperature_threshold_celsius",
    "The GPU's own temperature limits, in degrees Celsius: slowdown (hardware slowdown begins), shutdown, "
    "gpu_max (throttled below base clock), memory_max (memory temperature slowdown).",
    "celsius",
    ("threshold",),
)
# Profiling: averages over the collection interval, from NVML GPM or DCGM's profiling fields.
GRAPHICS_ENGINE_ACTIVE = Family(
    "nvidia_gpu_graphics_engine_active_ratio",
    "Fraction of time the graphics or compute engine was busy, from profiling (0-1).",
    "ratio",
)
SM_ACTIVE = Family(
    "nvidia_gpu_sm_active_ratio", "Fraction of cycles the SMs had at least one warp assigned, averaged (0-1).", "ratio"
)
SM_OCCUPANCY = Family(
    "nvidia_gpu_sm_occupancy_ratio", "Warps resident on the SMs as a fraction of the most they can hold (0-1).", "ratio"
)
TENSOR_ACTIVE = Family(
    "nvidia_gpu_tensor_active_ratio", "Fraction of cycles a tensor core pipe was busy (0-1).", "ratio"
)
DRAM_ACTIVE = Family(
    "nvidia_gpu_dram_active_ratio", "Fraction of cycles the device memory was sending or receiving data (0-1).", "ratio"
)
FP64_ACTIVE = Family(
    "nvidia_gpu_fp64_active_ratio", "Fraction of cycles the FP64 pipe was busy, tensor cores aside (0-1).", "ratio"
)
FP32_ACTIVE = Family(
    "nvidia_gpu_fp32_active_ratio", "Fraction of cycles the FP32 pipe was busy, tensor cores aside (0-1).", "ratio"
)
FP16_ACTIVE = Family(
    "nvidia_gpu_fp16_active_ratio", "Fraction of cycles the FP16 pipe was busy, tensor cores aside (0-1).", "ratio"
)
CLOCK = Family("nvidia_gpu_clock_hertz", "Current clock of each clock domain, in hertz.", "hertz", ("clock",))
CLOCK_MAX = Family("nvidia_gpu_clock_max_hertz", "Maximum clock of each clock domain, in hertz.", "hertz", ("clock",))
CLOCK_EVENT = Family(
    "nvidia_gpu_clock_event_reason_active",
    "1 while this reason holds the clocks down (NVML clocks-event / throttle reasons), else 0.",
    labels=("reason",),
)
CLOCK_EVENT_SECONDS = Family(
    "nvidia_gpu_clock_event_duration_seconds",
    "Time this reason has held the clocks down since the driver was loaded, in seconds (NVML's throttle "
    "duration counters; dcgm-exporter's *_VIOLATION).",
    "seconds",
    ("reason",),
    counter=True,
)
PSTATE = Family("nvidia_gpu_performance_state", "Performance state (0 = P0, fastest, .. 15 = P15).")
PCIE_GEN = Family("nvidia_gpu_pcie_link_generation", "Current PCIe link generation.")
PCIE_MAX_GEN = Family(
    "nvidia_gpu_pcie_link_max_generation", "Highest PCIe link generation the GPU and the slot support."
)
PCIE_WIDTH = Family("nvidia_gpu_pcie_link_width", "Current PCIe link width, in lanes.")
PCIE_MAX_WIDTH = Family("nvidia_gpu_pcie_link_max_width", "Widest PCIe link the GPU and the slot support, in lanes.")
PCIE_REPLAYS = Family("nvidia_gpu_pcie_replay_errors", "PCIe replays since the driver was loaded.", counter=True)
PCIE_THROUGHPUT = Family(
    "nvidia_gpu_pcie_throughput_bytes_per_second",
    "PCIe throughput in bytes per second, averaged over the last poll: from profiling where there is "
    "profiling, else from NVML's byte counters; over NVML's 20 ms window only where neither exists.",
    labels=("direction",),
)
PCIE_BYTES = Family(
    "nvidia_gpu_pcie_bytes",
    "Bytes the GPU has sent (tx) and received (rx) over PCIe, as NVML counts them; the counter may wrap.",
    "bytes",
    ("direction",),
    counter=True,
)
PCIE_ERRORS = Family(
    "nvidia_gpu_pcie_errors",
    "PCIe link errors by kind, as the GPU counts them (correctable, nak_received, receiver, bad_tlp, nak_sent, "
    "bad_dllp, non_fatal, fatal, unsupported_request, lcrc; l0_to_recovery: link recoveries).",
    labels=("error",),
    counter=True,
)
NVLINK_STATE = Family(
    "nvidia_gpu_nvlink_state",
    "NVLink link state as NVML reports it: 0 inactive, 1 active, 2 sleep, 3 active with traffic disabled.",
    labels=("link",),
)
NVLINK_UP = Family(
    "nvidia_gpu_nvlink_up",
    "1 if the NVLink link is trained (active, asleep or active with traffic disabled), 0 if it is inactive. "
    "A link that was never up is usually not cabled.",
    labels=("link",),
)
NVLINK_ERRORS = Family(
    "nvidia_gpu_nvlink_errors",
    "NVLink errors by kind: replay, recovery, crc (NVLink 4 and older); recovery (every recovery), "
    "recovery_failed, recovery_successful, effective, symbol (NVLink5, Blackwell and later).",
    labels=("link", "error"),
    counter=True,
)
NVLINK_BYTES = Family(
    "nvidia_gpu_nvlink_data_bytes",
    "Data the link has sent (tx) and received (rx) since the driver was loaded, in bytes.",
    "bytes",
    ("link", "direction"),
    counter=True,
)
NVLINK_THROUGHPUT = Family(
    "nvidia_gpu_nvlink_throughput_bytes_per_second",
    "NVLink throughput in bytes per second: from profiling where there is profiling, else from NVML's data "
    "counters over the last poll; per link (a link label) where the source reports links, else the GPU's total.",
    labels=("direction",),
)
ECC_ENABLED = Family("nvidia_gpu_ecc_enabled", "1 if ECC is enabled, else 0.")
ECC_ERRORS = Family(
    "nvidia_gpu_ecc_errors",
    "ECC errors since the driver was loaded (volatile), by error: corrected or uncorrected.",
    labels=("error",),
    counter=True,
)
ECC_AGGREGATE = Family(
    "nvidia_gpu_ecc_aggregate_errors",
    "ECC errors over the GPU's lifetime (aggregate), by error: corrected or uncorrected.",
    labels=("error",),
    counter=True,
)
ECC_LOCATION = Family(
    "nvidia_gpu_ecc_location_errors",
    "ECC errors since the driver was loaded by where they happened: dram (device memory) or sram (on-chip "
    "memories), by error: corrected or uncorrected.",
    labels=("error", "location"),
    counter=True,
)
RETIRED_PAGES = Family(
    "nvidia_gpu_retired_pages", "Memory pages retired (pre-Ampere GPUs), by cause.", labels=("cause",)
)
RETIRED_PENDING = Family("nvidia_gpu_retired_pages_pending", "1 if a page retirement waits for a GPU reset, else 0.")
REMAPPED_ROWS = Family(
    "nvidia_gpu_remapped_rows", "Memory rows remapped (Ampere and later), by cause.", labels=("cause",)
)
REMAP_PENDING = Family("nvidia_gpu_row_remap_pending", "1 if a row remap waits for a GPU reset to take effect, else 0.")
REMAP_FAILURE = Family("nvidia_gpu_row_remap_failure", "1 if a row remap failed (an RMA criterion), else 0.")
MIG_ENABLED = Family("nvidia_gpu_mig_enabled", "1 if MIG mode is enabled, else 0.")
PERSISTENCE_MODE = Family(
    "nvidia_gpu_persistence_mode", "1 if persistence mode is on (the driver stays loaded with no client), else 0."
)
GSP_FIRMWARE = Family("nvidia_gpu_gsp_firmware_enabled", "1 if the driver runs on the GPU's GSP firmware, else 0.")
RECOVERY_ACTION = Family(
    "nvidia_gpu_recovery_action",
    "Recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
    "5 recover the IMEX domain, 6 PCIe bus reset, 7 system reboot.",
)
RECOVERY_ACTION_STATE = Family(
    "nvidia_gpu_recovery_action_state",
    "1 for the recovery action the driver asks for, 0 for the others (nvidia_gpu_recovery_action, one series "
    "per action).",
    labels=("action",),
)
FABRIC_STATE = Family(
    "nvidia_gpu_fabric_state",
    "1 for the GPU's state of registration with its NVSwitch fabric (not_started, in_progress, completed), 0 for "
    "the others; absent on a GPU in no fabric.",
    labels=("state",),
)
FABRIC_PROBE_FAILED = Family(
    "nvidia_gpu_fabric_probe_failed", "1 if the fabric registration completed with an error, else 0."
)
FABRIC_HEALTH = Family(
    "nvidia_gpu_fabric_health",
    "1 for the fabric's health as NVML sums it up (healthy, unhealthy, limited_capacity), 0 for the others; "
    "absent where the driver does not say.",
    labels=("state",),
)
PROCESSES = Family("nvidia_gpu_processes", "Compute processes running on the GPU.")
PROCESS_MEMORY = Family(
    "nvidia_gpu_process_memory_used_bytes",
    "GPU memory used by each compute process, in bytes.",
    "bytes",
    ("pid", "process"),
)

FAMILIES: tuple[Family, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Family))
MIG_LABELS = ("gpu_instance", "compute_instance", "mig_profile", "mig_uuid")
