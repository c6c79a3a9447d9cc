"""A simulated GPU, as NVML would answer for it: the vGPU record written from the simulator's physics.

This is the oracle side of the vGPU. It takes the model's state (view.py: watts, joules, bytes,
seconds, reasons by name) and writes what nvml.h says each call returns: milliwatts, millijoules, MHz,
percent, KiB of link data, nanoseconds of throttling, NVML's bit for each clock-event reason, its
link-state values, NOT_SUPPORTED where the product does not have a value. The constants are its
own, written from the header; it imports nothing of gpu-triage's readings or NVML backend, so a unit
or a bit that backend gets wrong is not reproduced here and the comparison of the two fails.
"""

from __future__ import annotations

from gpu_triage.exporter.backends.sim.activity import activity, memory_controller, pcie
from gpu_triage.exporter.backends.sim.view import View
from gpu_triage.exporter.vgpu.node import (
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    FABRIC_COMPLETED,
    Fabric,
    Gpu,
    MigInstance,
    MigProfile,
    NvLink,
    Process,
    Query,
)

MIB = 1024 * 1024
KIB = 1024  # nvml.h: NVML_FI_DEV_NVLINK_THROUGHPUT_* count "in KiB"
# nvmlDeviceGetPcieThroughput answers "KB/s" (nvml.h), read as 1000 bytes here. Only a fallback of the
# backend's uses this, and nothing short of a GPU settles which the driver means.
KB = 1000
NS = 1_000_000_000
# nvml.h nvmlClocksEventReason* (0x1..0x100, as the header defines them).
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# The duration counters' order in the record: fields 74, 76, 269, 270, 271.
COUNTED = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
NVML_NVLINK_STATE_INACTIVE, NVML_NVLINK_STATE_ACTIVE = 0, 1
NVLINK_VERSION = {3: 4, 4: 6, 5: 7}  # NVLink generation -> nvmlNvlinkVersion_t (NVML_NVLINK_VERSION_3_0 is 4)
ARCHITECTURE = {"ampere": ARCH_AMPERE, "ada": 8, "hopper": ARCH_HOPPER, "blackwell": ARCH_BLACKWELL}
POWER_AVERAGE_FIELD = 185  # NVML_FI_DEV_POWER_AVERAGE: not on GA100
MEMORY_TEMPERATURE_FIELD = 82
RETIRED_PAGE_FIELDS = (29, 30, 31, 92, 93)  # Ampere and later remap rows instead
THRESHOLDS = ("shutdown", "slowdown", "memory_max", "gpu_max")  # nvmlTemperatureThresholds_t 0-3
ECC_DEVICE_MEMORY, ECC_SRAM = 2, 7  # nvmlMemoryLocation_t
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE, ECC_AGGREGATE = 0, 1, 0, 1


def _milli(value: float) -> int:
    return round(value * 1000)


def _percent(ratio: float) -> int:
    return round(ratio * 100)


def _support(gpu: Gpu, query: Query, supported: bool) -> None:
    (gpu.unsupported.discard if supported else gpu.unsupported.add)(query)


def write(gpu: Gpu, v: View) -> None:
    """Everything NVML says about the GPU `v` sees, into its record (identity and faults aside)."""
    _identity(gpu, v)
    _memory(gpu, v)
    _power(gpu, v)
    _thermal(gpu, v)
    _clocks(gpu, v)
    _buses(gpu, v)
    _health(gpu, v)
    gpu.processes = _processes(v)
    gpu.gpm = _gpm(v) if v.spec.gpm else {}
    _support(gpu, Query.GPM, v.spec.gpm)


def _identity(gpu: Gpu, v: View) -> None:
    spec = v.spec
    gpu.name, gpu.serial, gpu.vbios_version = v.shape.model, v.serial, v.node.vbios_version
    gpu.board_part_number = spec.board_part_number
    gpu.architecture = ARCHITECTURE[spec.architecture]
    gpu.cuda_compute_capability = spec.cuda_capability
    gpu.pci_device_id = spec.pci_device_id
    _support(gpu, Query.MIG, bool(spec.mig))
    gpu.mig_mode = gpu.mig_mode_pending = v.mig
    gpu.persistence_mode = True
    gpu.gsp_firmware = (True, True)
    # nvml.h: utilization "not supported" on a MIG-enabled GPU.
    _support(gpu, Query.UTILIZATION, not v.mig)
    _support(gpu, Query.ENCODER_DECODER, not v.mig)
    gpu.utilization_gpu = _percent(v.state.utilization)
    gpu.utilization_memory = _percent(memory_controller(v.state.utilization, v.noise, v.state.load.dram_scale))
    gpu.utilization_encoder = gpu.utilization_decoder = 0
    gpu.fabric = Fabric(state=FABRIC_COMPLETED, status=0, health_summary=1) if spec.fabric else None


def _memory(gpu: Gpu, v: View) -> None:
    gpu.memory_total, gpu.memory_reserved = v.shape.memory_bytes, v.shape.reserved_memory_bytes
    gpu.memory_used = v.memory_used_bytes()
    gpu.mig_profiles = [
        MigProfile(
            profile=p.profile,
            id=p.id,
            name=f"MIG {p.name}",
            slices=p.slices,
            memory_mb=v.spec.profile_memory_mib(p),
            instances=7 // p.slices,
            multiprocessors=p.sms,
        )
        for p in v.spec.mig
    ]
    gpu.mig_instances = [
        MigInstance(
            gpu_instance_id=inst.mig.gpu_instance,
            compute_instance_id=inst.mig.compute_instance,
            name=f"{v.shape.model} MIG {inst.profile.name}",
            uuid=inst.mig.uuid,
            memory_total=inst.memory_bytes,
            memory_used=v.instance_used_bytes(i),
            gpu_instance_slices=inst.profile.slices,
            compute_instance_slices=inst.profile.slices,
            multiprocessors=inst.profile.sms,
            memory_mb=inst.memory_bytes // MIB,
            gpm=_instance_gpm(v, i) if v.spec.gpm else {},
        )
        for i, inst in enumerate(v.instances)
    ]


def _power(gpu: Gpu, v: View) -> None:
    gpu.power_mw = gpu.power_instant_mw = _milli(round(v.state.power_watts, 3))
    gpu.energy_mj = _milli(round(v.state.energy_joules, 3))
    limit = _milli(v.shape.power_limit_watts)
    gpu.power_limit_enforced_mw = gpu.power_limit_mw = gpu.power_limit_default_mw = gpu.power_limit_max_mw = limit
    gpu.power_limit_min_mw = _milli(v.spec.min_power_limit_watts)
    (gpu.unsupported_fields.discard if v.spec.power_average else gpu.unsupported_fields.add)(POWER_AVERAGE_FIELD)


def _thermal(gpu: Gpu, v: View) -> None:
    gpu.temperature_gpu = round(v.state.temperature_celsius)
    gpu.temperature_memory = round(v.state.memory_temperature_celsius)
    gpu.unsupported_fields.discard(MEMORY_TEMPERATURE_FIELD)
    fan = v.fan_ratio()
    _support(gpu, Query.FAN_SPEED, fan is not None)
    gpu.fan_speed = 0 if fan is None else _percent(fan)
    t = v.spec.thresholds
    values = [0] * 8 if t is None else [getattr(t, name) or 0 for name in THRESHOLDS] + [0] * 4
    gpu.temperature_thresholds = values  # 0: not supported, as the record has it


def _clocks(gpu: Gpu, v: View) -> None:
    by_type = ("graphics", "sm", "memory", "video")  # nvmlClockType_t
    current, maximum = v.clocks_mhz(), v.max_clocks_mhz()
    gpu.clocks_mhz = [round(current[d]) for d in by_type]
    gpu.max_clocks_mhz = [round(maximum[d]) for d in by_type]
    bits = 0
    for reason in v.reasons:
        bits |= REASON_BITS[reason]
    gpu.clocks_event_reasons = bits
    gpu.pstate = 0
    gpu.clock_event_ns = [round(v.state.reason_seconds.get(r, 0.0) * NS) for r in COUNTED]


def _buses(gpu: Gpu, v: View) -> None:
    tx, rx = pcie(v.state.utilization, v.noise, v.state.load)
    gpu.pcie_tx_kbs, gpu.pcie_rx_kbs = round(tx / KB), round(rx / KB)
    gpu.pcie_tx_bytes, gpu.pcie_rx_bytes = int(v.state.pcie_tx_bytes), int(v.state.pcie_rx_bytes)
    gpu.pcie_link_gen = gpu.pcie_link_gen_max = v.shape.pcie_generation
    gpu.pcie_link_width = gpu.pcie_link_width_max = v.shape.pcie_width
    gpu.pcie_replay_count = v.state.pcie_replays
    gpu.pcie_errors, gpu.pcie_l0_recovery = [0] * 11, 0
    nvlink = v.spec.nvlink
    gpu.nvlink_version = NVLINK_VERSION.get(nvlink.version, 0)
    s, down = v.state, v.links_down
    gpu.nvlinks = [
        NvLink(
            state=NVML_NVLINK_STATE_INACTIVE if i in down else NVML_NVLINK_STATE_ACTIVE,
            speed_mbps=nvlink.speed_mbps,
            replay_errors=s.nvlink_replays[i],
            recovery_errors=s.nvlink_recoveries[i],
            crc_flit_errors=s.nvlink_crcs[i],
            data_tx_kib=int(s.nvlink_tx_bytes[i]) // KIB,
            data_rx_kib=int(s.nvlink_rx_bytes[i]) // KIB,
            recovery_events=s.nvlink_recoveries[i],
            recovery_failed=s.nvlink_failed_recoveries[i],
            recovery_successful=s.nvlink_recoveries[i] - s.nvlink_failed_recoveries[i],
            symbol_errors=s.nvlink_symbol_errors[i],
        )
        for i in range(v.shape.nvlink_links)
    ]


def _health(gpu: Gpu, v: View) -> None:
    s = v.state
    gpu.ecc_mode = gpu.ecc_mode_pending = True
    gpu.ecc = {
        (ECC_CORRECTED, ECC_VOLATILE, ECC_DEVICE_MEMORY): s.ecc_corrected,
        (ECC_UNCORRECTED, ECC_VOLATILE, ECC_DEVICE_MEMORY): s.ecc_uncorrected,
        (ECC_CORRECTED, ECC_AGGREGATE, ECC_DEVICE_MEMORY): s.ecc_corrected_aggregate,
        (ECC_UNCORRECTED, ECC_AGGREGATE, ECC_DEVICE_MEMORY): s.ecc_uncorrected_aggregate,
    }
    _support(gpu, Query.RETIRED_PAGES, False)
    gpu.unsupported_fields |= set(RETIRED_PAGE_FIELDS)
    gpu.remapped_correctable, gpu.remapped_uncorrectable = s.remapped_correctable, s.remapped_uncorrectable
    gpu.remap_pending = any(k.value == "row_remap_pending" for k in v.kinds)
    gpu.remap_failure = any(k.value == "row_remap_failure" for k in v.kinds)
    gpu.recovery_action = 0


def _processes(v: View) -> list[Process]:
    if not v.held:
        return []
    if not v.mig:
        return [Process(pid=v.process_pid(), used_memory=v.memory_used_bytes())]
    return [
        Process(
            pid=v.process_pid(inst.mig.gpu_instance),
            used_memory=v.instance_used_bytes(i),
            gpu_instance_id=inst.mig.gpu_instance,
            compute_instance_id=inst.mig.compute_instance,
        )
        for i, inst in enumerate(v.instances)
    ]


# nvml.h NVML_GPM_METRIC_*: activity in percent, traffic in MiB/s; per-link NVLink from L0 RX (62), then TX.
_GPM_PERCENT = {
    1: "graphics_engine_active", 2: "sm_active", 3: "sm_occupancy", 5: "tensor_active",
    10: "dram_active", 11: "fp64_active", 12: "fp32_active", 13: "fp16_active",
}  # fmt: skip
_GPM_PCIE_TX, _GPM_PCIE_RX, _GPM_LINK_0_RX = 20, 21, 62


def _gpm(v: View) -> dict[int, float]:
    """The GPU's GPM rates in GPM's units (percent, MiB/s): what the library hands a pair of samples."""
    util = v.state.utilization
    if v.mig:  # the whole GPU: its instances' activity, weighted by their share of the SMs
        util = sum(v.instance_utilization(i) * inst.slices for i, inst in enumerate(v.instances)) / 7
    a = activity(
        util,
        v.noise,
        links=v.shape.nvlink_links,
        link_speed_mbps=v.spec.nvlink.speed_mbps,
        down=v.links_down,
        load=v.state.load,
    )
    out = {metric: getattr(a, name) * 100 for metric, name in _GPM_PERCENT.items()}
    if a.pcie_tx_bytes_per_second is not None and a.pcie_rx_bytes_per_second is not None:
        out[_GPM_PCIE_TX], out[_GPM_PCIE_RX] = a.pcie_tx_bytes_per_second / MIB, a.pcie_rx_bytes_per_second / MIB
    for link, tx, rx in a.nvlink_links:
        out[_GPM_LINK_0_RX + 2 * link] = rx / MIB
        out[_GPM_LINK_0_RX + 2 * link + 1] = tx / MIB
    return out


def _instance_gpm(v: View, i: int) -> dict[int, float]:
    a = activity(v.instance_utilization(i), v.noise, buses=False)
    return {metric: getattr(a, name) * 100 for metric, name in _GPM_PERCENT.items()}
