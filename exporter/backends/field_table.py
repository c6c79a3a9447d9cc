"""Every plain GPU field, declared once: the series it becomes and how each backend reads it.

A plain field is one number per GPU (or one per label value written here): a reading attribute,
its metric family and labels, and per backend where the value comes from and the scale to the
base unit (bytes, watts, joules, celsius, ratios 0..1):

- `Getter` / `NvmlField`: NVML's device call or `NVML_FI_*` field id, named as pynvml names them,
  and what to divide NVML's unit by (nvml.h: mW, mJ, percent);
- `Dcgm`: the DCGM field id and what to multiply DCGM's unit by (dcgm_fields.h: W, mJ, MiB, percent);
- `Sim`: the simulator view's attribute (already in base units);
- `Vgpu`: the virtual GPU's record member that answers the NVML call, and its C type.

A backend part left out (None) means that backend's reader fills the attribute by hand (a call
whose answer fans out, a fallback, a computed value) or leaves it absent. The readers read the
declared parts (nvml/plain.read_plain, dcgm/readers._plain, sim/readers._plain); readings.py
takes family and labels from here and checks, at import, that every exported plain attribute has
exactly one spec and every spec an attribute. Fields that fan out (clocks, NVLink, processes, MIG,
ECC by location, PCIe error kinds, thresholds) stay in their readers' `more_samples`.

Adding a plain field: its Family in exporter/metrics/families.py (where it sits on the page), the attribute on
its reading in readings.py, a FieldSpec here (CONTRIBUTING.md). The DCGM watch list takes the id from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_triage.exporter.metrics import families as f

Kind = type[int] | type[float] | type[bool]


@dataclass(frozen=True, slots=True)
class Getter:
    """An NVML device call answering one number: q(query, pynvml.<function>, handle)."""

    query: str  # the name a failure is reported under (failed_fields, the log)
    function: str  # pynvml's name of the call
    per: int = 1  # NVML's units per base unit: 1000 for mW -> W


@dataclass(frozen=True, slots=True)
class NvmlField:
    """An NVML field value, scope 0 (the whole GPU), read in one batch with the reading's others."""

    query: str
    field: str  # pynvml's NVML_FI_* name
    per: int = 1


@dataclass(frozen=True, slots=True)
class Dcgm:
    field: int  # DCGM field id (dcgm_fields.h); watched on the GPU entity
    name: str  # its DCGM 3 name after DCGM_FI_DEV_ (DCGM 4.6 renamed most; the ids stayed)
    scale: float = 1  # DCGM's unit -> the base unit: 0.01 for percent, MIB for MiB


@dataclass(frozen=True, slots=True)
class Sim:
    path: str  # dotted attribute of the simulator's View, in base units


@dataclass(frozen=True, slots=True)
class Vgpu:
    record: str  # member of struct vgpu_gpu (vgpu/state.h) the virtual GPU answers the NVML call from
    ctype: str


@dataclass(frozen=True, slots=True)
class FieldSpec:
    reading: str  # the reading class (readings.py) that has the attribute
    attr: str
    family: f.Family
    kind: Kind
    labels: tuple[str, ...] = ()  # the attribute's own values of family.labels
    preferred: bool = False  # see readings.Sample.preferred
    nvml: Getter | NvmlField | None = None
    dcgm: Dcgm | None = None
    sim: Sim | None = None
    vgpu: Vgpu | None = None


MIB = 1024 * 1024
_U32, _U64, _I32 = "uint32_t", "uint64_t", "int32_t"

FIELDS: tuple[FieldSpec, ...] = (
    # -- inventory
    FieldSpec("Inventory", "mig_enabled", f.MIG_ENABLED, bool, dcgm=Dcgm(67, "MIG_MODE"), vgpu=Vgpu("mig_mode", _U32)),
    FieldSpec(
        "Inventory", "persistence_mode", f.PERSISTENCE_MODE, bool,
        nvml=Getter("persistence_mode", "nvmlDeviceGetPersistenceMode"), vgpu=Vgpu("persistence_mode", _U32),
    ),
    FieldSpec("Inventory", "gsp_firmware", f.GSP_FIRMWARE, bool, vgpu=Vgpu("gsp_enabled", _U32)),
    # -- utilization: NVML answers gpu and memory in one struct (nvml/readers.py)
    FieldSpec(
        "Utilization", "gpu_ratio", f.UTILIZATION, float,
        dcgm=Dcgm(203, "GPU_UTIL", 0.01), vgpu=Vgpu("util_gpu", _U32),
    ),
    FieldSpec(
        "Utilization", "memory_controller_ratio", f.MEMORY_CONTROLLER, float,
        dcgm=Dcgm(204, "MEM_COPY_UTIL", 0.01), vgpu=Vgpu("util_memory", _U32),
    ),
    FieldSpec(
        "Utilization", "encoder_ratio", f.ENCODER_UTILIZATION, float,
        dcgm=Dcgm(206, "ENC_UTIL", 0.01), vgpu=Vgpu("util_encoder", _U32),
    ),
    FieldSpec(
        "Utilization", "decoder_ratio", f.DECODER_UTILIZATION, float,
        dcgm=Dcgm(207, "DEC_UTIL", 0.01), vgpu=Vgpu("util_decoder", _U32),
    ),
    # -- memory: NVML's versioned call with its fallback (nvml/readers.py)
    FieldSpec(
        "Memory", "used_bytes", f.MEMORY_USED, int, dcgm=Dcgm(252, "FB_USED", MIB), vgpu=Vgpu("memory_used", _U64),
    ),
    FieldSpec(
        "Memory", "total_bytes", f.MEMORY_TOTAL, int,
        dcgm=Dcgm(250, "FB_TOTAL", MIB), sim=Sim("shape.memory_bytes"), vgpu=Vgpu("memory_total", _U64),
    ),
    FieldSpec(
        "Memory", "reserved_bytes", f.MEMORY_RESERVED, int,
        dcgm=Dcgm(253, "FB_RESERVED", MIB), sim=Sim("shape.reserved_memory_bytes"), vgpu=Vgpu("memory_reserved", _U64),
    ),
    # -- power
    FieldSpec(
        "Power", "usage_watts", f.POWER, float,
        nvml=Getter("power_usage", "nvmlDeviceGetPowerUsage", per=1000),
        dcgm=Dcgm(155, "POWER_USAGE"), vgpu=Vgpu("power_mw", _U32),
    ),
    FieldSpec(
        "Power", "limit_watts", f.POWER_LIMIT, float,
        nvml=Getter("power_limit", "nvmlDeviceGetEnforcedPowerLimit", per=1000),
        dcgm=Dcgm(164, "ENFORCED_POWER_LIMIT"), sim=Sim("shape.power_limit_watts"),
        vgpu=Vgpu("power_limit_enforced_mw", _U32),
    ),
    FieldSpec(
        "Power", "default_limit_watts", f.POWER_DEFAULT_LIMIT, float,
        nvml=Getter("power_default_limit", "nvmlDeviceGetPowerManagementDefaultLimit", per=1000),
        dcgm=Dcgm(163, "POWER_MGMT_LIMIT_DEF"),  # a double in W (dcgm_fields.h)
        sim=Sim("shape.power_limit_watts"),  # the simulator's boards run at their default limit
        vgpu=Vgpu("power_limit_default_mw", _U32),
    ),
    FieldSpec(
        "Power", "energy_joules", f.ENERGY, float,
        nvml=Getter("energy", "nvmlDeviceGetTotalEnergyConsumption", per=1000),
        dcgm=Dcgm(156, "TOTAL_ENERGY_CONSUMPTION", 0.001), vgpu=Vgpu("energy_mj", _U64),
    ),
    FieldSpec(
        "Power", "instant_watts", f.POWER_INSTANT, float,
        nvml=NvmlField("power_instant", "NVML_FI_DEV_POWER_INSTANT", per=1000),
        dcgm=Dcgm(157, "POWER_USAGE_INSTANT"), vgpu=Vgpu("power_instant_mw", _U32),
    ),
    # -- thermal: the GPU temperature has a fallback call (nvml/readers.py)
    FieldSpec(
        "Thermal", "gpu_celsius", f.TEMPERATURE, float, dcgm=Dcgm(150, "GPU_TEMP"), vgpu=Vgpu("temperature_gpu", _I32),
    ),
    FieldSpec(
        "Thermal", "memory_celsius", f.MEMORY_TEMPERATURE, float,
        nvml=NvmlField("memory_temperature", "NVML_FI_DEV_MEMORY_TEMP"),
        dcgm=Dcgm(140, "MEMORY_TEMP"), vgpu=Vgpu("temperature_memory", _I32),
    ),
    FieldSpec(
        "Thermal", "fan_ratio", f.FAN, float,
        nvml=Getter("fan_speed", "nvmlDeviceGetFanSpeed", per=100),
        dcgm=Dcgm(191, "FAN_SPEED", 0.01), vgpu=Vgpu("fan_speed", _U32),
    ),
    # -- clocks: NVML_PSTATE_UNKNOWN is no P-state (nvml/readers.py)
    FieldSpec("Clocks", "performance_state", f.PSTATE, int, dcgm=Dcgm(190, "PSTATE"), vgpu=Vgpu("pstate", _U32)),
    # -- PCIe: throughput and the byte counters come from counters differenced between polls
    FieldSpec(
        "Pcie", "link_generation", f.PCIE_GEN, int,
        nvml=Getter("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
        dcgm=Dcgm(237, "PCIE_LINK_GEN"), sim=Sim("shape.pcie_generation"), vgpu=Vgpu("pcie_gen", _U32),
    ),
    FieldSpec(
        "Pcie", "max_link_generation", f.PCIE_MAX_GEN, int,
        nvml=Getter("pcie_max_link_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
        dcgm=Dcgm(235, "PCIE_MAX_LINK_GEN"), sim=Sim("shape.pcie_generation"), vgpu=Vgpu("pcie_gen_max", _U32),
    ),
    FieldSpec(
        "Pcie", "link_width", f.PCIE_WIDTH, int,
        nvml=Getter("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth"),
        dcgm=Dcgm(238, "PCIE_LINK_WIDTH"), sim=Sim("shape.pcie_width"), vgpu=Vgpu("pcie_width", _U32),
    ),
    FieldSpec(
        "Pcie", "max_link_width", f.PCIE_MAX_WIDTH, int,
        nvml=Getter("pcie_max_link_width", "nvmlDeviceGetMaxPcieLinkWidth"),
        dcgm=Dcgm(236, "PCIE_MAX_LINK_WIDTH"), sim=Sim("shape.pcie_width"), vgpu=Vgpu("pcie_width_max", _U32),
    ),
    FieldSpec(
        "Pcie", "replay_errors", f.PCIE_REPLAYS, int,
        nvml=Getter("pcie_replay", "nvmlDeviceGetPcieReplayCounter"),
        dcgm=Dcgm(202, "PCIE_REPLAY_COUNTER"), sim=Sim("state.pcie_replays"), vgpu=Vgpu("pcie_replay", _U32),
    ),
    FieldSpec("Pcie", "tx_bytes_per_second", f.PCIE_THROUGHPUT, float, ("tx",), vgpu=Vgpu("pcie_tx_kbs", _U32)),
    FieldSpec("Pcie", "rx_bytes_per_second", f.PCIE_THROUGHPUT, float, ("rx",), vgpu=Vgpu("pcie_rx_kbs", _U32)),
    FieldSpec("Pcie", "tx_bytes", f.PCIE_BYTES, int, ("tx",), vgpu=Vgpu("pcie_tx_bytes", _U64)),
    FieldSpec("Pcie", "rx_bytes", f.PCIE_BYTES, int, ("rx",), vgpu=Vgpu("pcie_rx_bytes", _U64)),
    # -- ECC and page retirement
    FieldSpec("Ecc", "enabled", f.ECC_ENABLED, bool, dcgm=Dcgm(300, "ECC_CURRENT"), vgpu=Vgpu("ecc_mode", _U32)),
    FieldSpec(
        "Ecc", "corrected_volatile", f.ECC_ERRORS, int, ("corrected",),
        nvml=NvmlField("ecc_sbe_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
        dcgm=Dcgm(310, "ECC_SBE_VOL_TOTAL"), sim=Sim("state.ecc_corrected"), vgpu=Vgpu("ecc", _U64),
    ),
    FieldSpec(
        "Ecc", "uncorrected_volatile", f.ECC_ERRORS, int, ("uncorrected",),
        nvml=NvmlField("ecc_dbe_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
        dcgm=Dcgm(311, "ECC_DBE_VOL_TOTAL"), sim=Sim("state.ecc_uncorrected"), vgpu=Vgpu("ecc", _U64),
    ),
    FieldSpec(
        "Ecc", "corrected_aggregate", f.ECC_AGGREGATE, int, ("corrected",),
        nvml=NvmlField("ecc_sbe_aggregate", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
        dcgm=Dcgm(312, "ECC_SBE_AGG_TOTAL"), sim=Sim("state.ecc_corrected_aggregate"), vgpu=Vgpu("ecc", _U64),
    ),
    FieldSpec(
        "Ecc", "uncorrected_aggregate", f.ECC_AGGREGATE, int, ("uncorrected",),
        nvml=NvmlField("ecc_dbe_aggregate", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
        dcgm=Dcgm(313, "ECC_DBE_AGG_TOTAL"), sim=Sim("state.ecc_uncorrected_aggregate"), vgpu=Vgpu("ecc", _U64),
    ),
    FieldSpec(
        "Ecc", "retired_pages_single_bit", f.RETIRED_PAGES, int, ("single_bit",),
        dcgm=Dcgm(390, "RETIRED_SBE"), vgpu=Vgpu("retired_count", _U32),
    ),
    FieldSpec(
        "Ecc", "retired_pages_double_bit", f.RETIRED_PAGES, int, ("double_bit",),
        dcgm=Dcgm(391, "RETIRED_DBE"), vgpu=Vgpu("retired_count", _U32),
    ),
    FieldSpec(
        "Ecc", "retired_pages_pending", f.RETIRED_PENDING, bool,
        nvml=Getter("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"),
        dcgm=Dcgm(392, "RETIRED_PENDING"), vgpu=Vgpu("retired_pending", _U32),
    ),
    # -- row remapping: the simulator's answers hang on MIG (sim/readers.py)
    FieldSpec(
        "Remapping", "correctable_rows", f.REMAPPED_ROWS, int, ("correctable",),
        nvml=NvmlField("remapped_correctable", "NVML_FI_DEV_REMAPPED_COR"),
        dcgm=Dcgm(394, "CORRECTABLE_REMAPPED_ROWS"), vgpu=Vgpu("remapped_correctable", _U32),
    ),
    FieldSpec(
        "Remapping", "uncorrectable_rows", f.REMAPPED_ROWS, int, ("uncorrectable",),
        nvml=NvmlField("remapped_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC"),
        dcgm=Dcgm(393, "UNCORRECTABLE_REMAPPED_ROWS"), vgpu=Vgpu("remapped_uncorrectable", _U32),
    ),
    FieldSpec(
        "Remapping", "pending", f.REMAP_PENDING, bool,
        nvml=NvmlField("remap_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
        dcgm=Dcgm(396, "ROW_REMAP_PENDING"), vgpu=Vgpu("remap_pending", _U32),
    ),
    FieldSpec(
        "Remapping", "failure", f.REMAP_FAILURE, bool,
        nvml=NvmlField("remap_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
        dcgm=Dcgm(395, "ROW_REMAP_FAILURE"), vgpu=Vgpu("remap_failure", _U32),
    ),
    # -- recovery: DCGM watches it in a group of its own, which older host engines refuse (dcgm/readers.py)
    FieldSpec(
        "Recovery", "action", f.RECOVERY_ACTION, int,
        nvml=NvmlField("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"), vgpu=Vgpu("recovery_action", _U32),
    ),
    # -- profiling: per GPU and per MIG instance, from GPM or DCGM's profiling fields (their readers)
    FieldSpec("Activity", "graphics_engine_active", f.GRAPHICS_ENGINE_ACTIVE, float),
    FieldSpec("Activity", "sm_active", f.SM_ACTIVE, float),
    FieldSpec("Activity", "sm_occupancy", f.SM_OCCUPANCY, float),
    FieldSpec("Activity", "tensor_active", f.TENSOR_ACTIVE, float),
    FieldSpec("Activity", "dram_active", f.DRAM_ACTIVE, float),
    FieldSpec("Activity", "fp64_active", f.FP64_ACTIVE, float),
    FieldSpec("Activity", "fp32_active", f.FP32_ACTIVE, float),
    FieldSpec("Activity", "fp16_active", f.FP16_ACTIVE, float),
    FieldSpec("Activity", "pcie_tx_bytes_per_second", f.PCIE_THROUGHPUT, float, ("tx",), preferred=True),
    FieldSpec("Activity", "pcie_rx_bytes_per_second", f.PCIE_THROUGHPUT, float, ("rx",), preferred=True),
)  # fmt: skip


def _by_reading() -> Mapping[str, tuple[FieldSpec, ...]]:
    out: dict[str, list[FieldSpec]] = {}
    for spec in FIELDS:
        out.setdefault(spec.reading, []).append(spec)
    return {name: tuple(specs) for name, specs in out.items()}


BY_READING = _by_reading()


def of(reading: str) -> tuple[FieldSpec, ...]:
    """The plain fields of a reading class, in declaration order."""
    return BY_READING.get(reading, ())


def dcgm_ids(reading: str) -> tuple[int, ...]:
    """The DCGM fields a reading's plain attributes are read from."""
    return tuple(s.dcgm.field for s in of(reading) if s.dcgm is not None)


# Every DCGM field a plain attribute is read from, watched on every GPU.
DCGM_DEVICE_FIELDS = tuple(dict.fromkeys(s.dcgm.field for s in FIELDS if s.dcgm is not None))
