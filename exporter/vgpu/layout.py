"""The scalar part of a virtual GPU's record, declared once for both sides of the state file.

tools/gen_vgpu_layout.py writes it out as the C members of struct vgpu_gpu (vgpu/scalars.h, included
by vgpu/state.h) and as the Python struct format and packer (scalars.py, used by records.py),
and derives the layout version from it and vgpu/state.h: whatever changes the file's layout changes
the version both sides check. `make lint` fails while the generated files are stale.

Each slot is a member of struct vgpu_gpu in NVML's own units (nvml.h: mW, mJ, KB/s, MHz, °C, percent)
and the `Gpu` (node.py) expression the writer puts there. The values themselves are set by
image.py, written from nvml.h's terms and never from gpu-triage's field table: the pair checks
the backends' conversions rather than repeating them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

FORMAT: Final = {"uint32_t": "I", "int32_t": "i", "uint64_t": "Q"}
SIZE: Final = {"uint32_t": 4, "int32_t": 4, "uint64_t": 8}


@dataclass(frozen=True, slots=True)
class Slot:
    name: str  # the C member
    ctype: str
    source: str  # the value from `gpu`; with count > 1 a sequence of `count` values
    count: int = 1
    comment: str = ""


_U32, _I32 = "uint32_t", "int32_t"

# struct vgpu_gpu from retired_count (offset 912) to reserved0, in record order.
SCALARS_OFFSET: Final = 912
SCALARS: tuple[Slot, ...] = (
    Slot("retired_count", _U32, "(len(gpu.retired_sbe), len(gpu.retired_dbe))", 2, "[nvmlPageRetirementCause]"),
    Slot("retired_pending", _U32, "int(gpu.retired_pending)"),
    Slot("minor_number", _U32, "gpu.minor_number"),
    Slot("brand", _U32, "gpu.brand", comment="nvmlBrandType_t"),
    Slot("architecture", _U32, "gpu.architecture", comment="nvmlDeviceArchitecture_t"),
    Slot("cuda_cc_major", _U32, "gpu.cuda_compute_capability[0]"),
    Slot("cuda_cc_minor", _U32, "gpu.cuda_compute_capability[1]"),
    Slot("pci_domain", _U32, "gpu.pci_domain"),
    Slot("pci_bus", _U32, "gpu.pci_bus"),
    Slot("pci_device", _U32, "gpu.pci_device"),
    Slot("pci_device_id", _U32, "gpu.pci_device_id"),
    Slot("pci_subsystem_id", _U32, "gpu.pci_subsystem_id"),
    Slot("pci_base_class", _U32, "gpu.pci_base_class"),
    Slot("pci_sub_class", _U32, "gpu.pci_sub_class"),
    Slot("util_gpu", _U32, "gpu.utilization_gpu", comment="percent"),
    Slot("util_memory", _U32, "gpu.utilization_memory"),
    Slot("util_encoder", _U32, "gpu.utilization_encoder"),
    Slot("util_decoder", _U32, "gpu.utilization_decoder"),
    Slot("power_mw", _U32, "gpu.power_mw", comment="mW, as every power member"),
    Slot("power_limit_enforced_mw", _U32, "gpu.power_limit_enforced_mw"),
    Slot("power_limit_mw", _U32, "gpu.power_limit_mw", comment="the management (requested) limit"),
    Slot("power_limit_min_mw", _U32, "gpu.power_limit_min_mw"),
    Slot("power_limit_max_mw", _U32, "gpu.power_limit_max_mw"),
    Slot("power_limit_default_mw", _U32, "gpu.power_limit_default_mw"),
    Slot("temperature_gpu", _I32, "gpu.temperature_gpu", comment="degrees C"),
    Slot("temperature_memory", _I32, "gpu.temperature_memory"),
    Slot("temperature_threshold", _U32, "gpu.temperature_thresholds", 8, "[nvmlTemperatureThresholds]; 0: none"),
    Slot("clock_mhz", _U32, "gpu.clocks_mhz", 4, "[nvmlClockType]"),
    Slot("clock_max_mhz", _U32, "gpu.max_clocks_mhz", 4),
    Slot("clock_app_mhz", _U32, "gpu.app_clocks_mhz", 4),
    Slot("clock_app_default_mhz", _U32, "gpu.default_app_clocks_mhz", 4),
    Slot("pstate", _U32, "gpu.pstate"),
    Slot("pcie_tx_kbs", _U32, "gpu.pcie_tx_kbs", comment="KB/s"),
    Slot("pcie_rx_kbs", _U32, "gpu.pcie_rx_kbs"),
    Slot("pcie_gen", _U32, "gpu.pcie_link_gen"),
    Slot("pcie_gen_max", _U32, "gpu.pcie_link_gen_max"),
    Slot("pcie_width", _U32, "gpu.pcie_link_width"),
    Slot("pcie_width_max", _U32, "gpu.pcie_link_width_max"),
    Slot("pcie_replay", _U32, "gpu.pcie_replay_count"),
    Slot("ecc_mode", _U32, "int(gpu.ecc_mode)"),
    Slot("ecc_mode_pending", _U32, "int(gpu.ecc_mode_pending)"),
    Slot("remapped_correctable", _U32, "gpu.remapped_correctable"),
    Slot("remapped_uncorrectable", _U32, "gpu.remapped_uncorrectable"),
    Slot("remap_pending", _U32, "int(gpu.remap_pending)"),
    Slot("remap_failure", _U32, "int(gpu.remap_failure)"),
    Slot("fan_speed", _U32, "gpu.fan_speed", comment="percent"),
    Slot("compute_mode", _U32, "gpu.compute_mode"),
    Slot("persistence_mode", _U32, "int(gpu.persistence_mode)"),
    Slot("display_mode", _U32, "int(gpu.display_mode)"),
    Slot("display_active", _U32, "int(gpu.display_active)"),
    Slot("recovery_action", _U32, "gpu.recovery_action", comment="nvmlDeviceGpuRecoveryAction_t"),
    Slot("mig_mode", _U32, "int(gpu.mig_mode)"),
    Slot("mig_mode_pending", _U32, "int(gpu.mig_mode_pending)"),
    Slot("mig_max", _U32, "gpu.max_mig_devices"),
    Slot("mig_count", _U32, "len(gpu.mig_instances)"),
    Slot("nvlink_count", _U32, "len(gpu.nvlinks)"),
    Slot("nvlink_version", _U32, "gpu.nvlink_version"),
    Slot("proc_count", _U32, "len(gpu.processes)"),
    Slot("override_count", _U32, "len(gpu.field_overrides)"),
    Slot("reserved0", _U32, "0", comment="keeps the strings and arrays after it 8-byte aligned"),
)
