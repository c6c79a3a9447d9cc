"""A captured node as the vGPU presents it: each value of a real `nvidia-smi -q` in NVML's own units.

nvidia-smi prints what NVML returned, converted for people: mW as "67.74 W", bytes as "81559 MiB",
bit masks as "Active" per reason, ns counters as "us". This undoes that, with constants of its own
taken from nvml.h (it shares none with gpu-triage's readers), so that an NVML client reading the vGPU
gets the numbers the real driver gave, and `/metrics` can be held to the capture's own figures. What
the capture does not print (N/A, or a section an older nvidia-smi lacks) answers NOT_SUPPORTED; what
`nvidia-smi -q` never prints (NVLink, byte counters, energy) is not invented: it answers
NOT_SUPPORTED too.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from gpu_triage.exporter.vgpu.capture import Capture, CapturedGpu, CaptureError
from gpu_triage.exporter.vgpu.node import (
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    Fabric,
    Gpu,
    MigInstance,
    Process,
    Query,
    RetiredPage,
)

MIB = 1024 * 1024
US_NS = 1000  # the capture's "us" counters; NVML's fields count ns
REASON_BITS = {  # nvml.h nvmlClocksEventReason*
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}  # fmt: skip
COUNTED = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
ARCHITECTURES = {"ampere": ARCH_AMPERE, "ada lovelace": 8, "hopper": ARCH_HOPPER, "blackwell": ARCH_BLACKWELL,
                 "turing": 6, "volta": 5}  # fmt: skip
RECOVERY = {"none": 0, "gpu reset": 1, "node reboot": 2, "drain p2p": 3, "drain and reset": 4}
FABRIC = {"not started": FABRIC_NOT_STARTED, "in progress": FABRIC_IN_PROGRESS, "completed": FABRIC_COMPLETED}
# Fields the record answers by id; those a capture cannot speak for answer NOT_SUPPORTED.
POWER_AVERAGE, POWER_INSTANT, MEMORY_TEMPERATURE = 185, 186, 82
UNCAPTURED_FIELDS = {83, 191, 197, 198, 169, *range(173, 184), 74, 76, 269, 270, 271}  # energy, bytes, PCIe errors
RETIRED_FIELDS = (29, 30, 31, 92, 93)
# GA100's MIG slices have 14 SMs each (NVIDIA's MIG user guide: 1g.5gb is 1/7 of 98 SMs).
SMS_PER_SLICE = {"A100": 14, "A30": 14}


@dataclass(frozen=True)
class Node:
    gpus: list[Gpu]
    driver_version: str
    cuda_driver_version: int  # 1000 * major + 10 * minor


def node(capture: Capture) -> Node:
    gpus = [gpu(c, i) for i, c in enumerate(capture.gpus)]
    cuda = 0
    if capture.cuda_version and (m := re.match(r"(\d+)\.(\d+)", capture.cuda_version)):
        cuda = 1000 * int(m[1]) + 10 * int(m[2])
    return Node(gpus, capture.driver_version or "", cuda)


def _number(text: str | None) -> float | None:
    """The number in "67.74 W", "81559 MiB", "16x", "P0", "0x233010DE"; None if there is none."""
    if text is None:
        return None
    if m := re.fullmatch(r"(?:0x)?([0-9A-Fa-f]{8})", text.strip()):
        return float(int(m[1], 16))
    m = re.search(r"-?\d+(?:\.\d+)?", text)
    return None if m is None else float(m[0])


def _int(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _yes(text: str | None) -> bool | None:
    return None if text is None else text.strip().lower() in ("yes", "enabled", "active")


def _bus(bus_id: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-7]", bus_id)
    if m is None:
        raise CaptureError(f"a GPU's bus id {bus_id!r} is not dddddddd:bb:dd.f")
    return int(m[1], 16), int(m[2], 16), int(m[3], 16)


def gpu(c: CapturedGpu, index: int) -> Gpu:
    domain, bus, device = _bus(c.bus_id)
    g = Gpu(uuid=c.get("uuid") or "", pci_bus=bus, pci_domain=domain, pci_device=device, minor_number=index)
    g.unsupported, g.unsupported_fields, g.gpm = set(), set(UNCAPTURED_FIELDS), {}
    g.unsupported.add(Query.GPM)  # a capture has no profiling samples
    g.minor_number = _int(c.get("minor_number")) or index
    g.name, g.serial = c.get("name") or "", c.get("serial") or ""
    g.vbios_version, g.board_part_number = c.get("vbios") or "", c.get("board_part_number") or ""
    g.architecture = ARCHITECTURES.get((c.get("architecture") or "").lower(), 0xFFFFFFFF)
    g.pci_device_id = _int(c.get("device_id")) or 0
    g.pci_subsystem_id = _int(c.get("subsystem_id")) or 0
    g.persistence_mode = bool(_yes(c.get("persistence_mode")))
    g.gsp_firmware = (c.get("gsp_firmware") is not None, c.get("gsp_firmware") is not None)
    g.nvlinks = []  # nvidia-smi -q does not print NVLink: the capture cannot say how many links there are
    _memory(g, c)
    _power(g, c)
    _thermal(g, c)
    _clocks(g, c)
    _pcie(g, c)
    _health(g, c)
    _mig(g, c)
    g.processes = [
        Process(
            pid=int(p["pid"]),
            used_memory=None if (m := _int(p.get("used_memory"))) is None else m * MIB,
            compute="C" in p.get("type", "C"),
            graphics="G" in p.get("type", ""),
        )
        for p in c.processes
        if "pid" in p
    ][:32]
    action = (c.get("recovery_action") or "").lower()
    g.recovery_action = RECOVERY.get(action, 0)
    if action not in RECOVERY:
        g.unsupported_fields.add(230)
    state = FABRIC.get((c.get("fabric_state") or "").lower())
    g.fabric = None if state is None else Fabric(state=state, status=0 if c.get("fabric_status") == "Success" else 999)
    return g


def _absent(g: Gpu, query: Query, value: object) -> bool:
    if value is None:
        g.unsupported.add(query)
        return True
    return False


def _memory(g: Gpu, c: CapturedGpu) -> None:
    total, reserved, used = (_int(c.get(k)) for k in ("memory_total", "memory_reserved", "memory_used"))
    if not _absent(g, Query.MEMORY, total):
        g.memory_total, g.memory_reserved, g.memory_used = (total or 0) * MIB, (reserved or 0) * MIB, (used or 0) * MIB
    bar1, bar1_used = _int(c.get("bar1_total")), _int(c.get("bar1_used"))
    if not _absent(g, Query.BAR1, bar1):
        g.bar1_total, g.bar1_used = (bar1 or 0) * MIB, (bar1_used or 0) * MIB
    util = _int(c.get("util_gpu"))
    if not _absent(g, Query.UTILIZATION, util):
        g.utilization_gpu, g.utilization_memory = util or 0, _int(c.get("util_memory")) or 0
    encoder = _int(c.get("util_encoder"))
    if not _absent(g, Query.ENCODER_DECODER, encoder):
        g.utilization_encoder, g.utilization_decoder = encoder or 0, _int(c.get("util_decoder")) or 0


def _mw(text: str | None) -> int | None:
    watts = _number(text)
    return None if watts is None else round(watts * 1000)


def _power(g: Gpu, c: CapturedGpu) -> None:
    draw, instant = _mw(c.get("power_draw")), _mw(c.get("power_instant"))
    if not _absent(g, Query.POWER_USAGE, draw):
        g.power_mw = draw or 0
    if instant is None:
        g.unsupported_fields.add(POWER_INSTANT)
    g.power_instant_mw = instant or 0
    if c.get("power_instant") is None:  # an older nvidia-smi prints one reading: which of the two is not said
        g.unsupported_fields.add(POWER_AVERAGE)
    g.unsupported.add(Query.ENERGY)  # nvidia-smi -q prints no energy counter
    limit = _mw(c.get("power_limit"))
    if not _absent(g, Query.POWER_LIMIT, limit):
        g.power_limit_enforced_mw = limit or 0
        g.power_limit_mw = _mw(c.get("power_limit_requested")) or g.power_limit_enforced_mw
        g.power_limit_default_mw = _mw(c.get("power_limit_default")) or g.power_limit_enforced_mw
        g.power_limit_min_mw = _mw(c.get("power_limit_min")) or 0
        g.power_limit_max_mw = _mw(c.get("power_limit_max")) or g.power_limit_enforced_mw


def _thermal(g: Gpu, c: CapturedGpu) -> None:
    temp = _int(c.get("temperature"))
    if not _absent(g, Query.TEMPERATURE, temp):
        g.temperature_gpu = temp or 0
    memory = _int(c.get("memory_temperature"))
    if memory is None:
        g.unsupported_fields.add(MEMORY_TEMPERATURE)
    g.temperature_memory = memory or 0
    names = ("threshold_shutdown", "threshold_slowdown", "threshold_memory_max", "threshold_gpu_max")
    g.temperature_thresholds = [_int(c.get(n)) or 0 for n in names] + [0] * 4  # 0: not supported
    fan = _int(c.get("fan"))
    if not _absent(g, Query.FAN_SPEED, fan):
        g.fan_speed = fan or 0


def _clocks(g: Gpu, c: CapturedGpu) -> None:
    domains = ("graphics", "sm", "memory", "video")  # nvmlClockType_t order
    now = [_int(c.get(f"clock_{d}")) for d in domains]
    if not _absent(g, Query.CLOCKS, now[1]):
        g.clocks_mhz = [v or 0 for v in now]
        g.max_clocks_mhz = [_int(c.get(f"max_clock_{d}")) or 0 for d in domains]
        app = [_int(c.get("app_clock_graphics")), None, _int(c.get("app_clock_memory")), None]
        g.app_clocks_mhz = g.default_app_clocks_mhz = [a or m for a, m in zip(app, g.max_clocks_mhz, strict=True)]
    if not _absent(g, Query.CLOCK_EVENT_REASONS, c.reasons or None):
        g.clocks_event_reasons = sum(REASON_BITS[r] for r, active in c.reasons.items() if active)
    if c.reason_time:
        g.clock_event_ns = [(_int(c.reason_time.get(r)) or 0) * US_NS for r in COUNTED]
        g.unsupported_fields -= {74, 76, 269, 270, 271}
    pstate = c.get("pstate")
    if not _absent(g, Query.PERFORMANCE_STATE, pstate):
        g.pstate = _int(pstate) or 0


def _pcie(g: Gpu, c: CapturedGpu) -> None:
    gen = _int(c.get("pcie_gen"))
    if not _absent(g, Query.PCIE_LINK, gen):
        g.pcie_link_gen, g.pcie_link_gen_max = gen or 0, _int(c.get("pcie_gen_max")) or 0
        g.pcie_link_width, g.pcie_link_width_max = _int(c.get("pcie_width")) or 0, _int(c.get("pcie_width_max")) or 0
    replays = _int(c.get("pcie_replays"))
    if not _absent(g, Query.PCIE_REPLAY, replays):
        g.pcie_replay_count = replays or 0
    tx = _int(c.get("pcie_tx"))  # nvidia-smi prints NVML's "KB/s" number as it is
    if not _absent(g, Query.PCIE_THROUGHPUT, tx):
        g.pcie_tx_kbs, g.pcie_rx_kbs = tx or 0, _int(c.get("pcie_rx")) or 0


def _health(g: Gpu, c: CapturedGpu) -> None:
    mode = _yes(c.get("ecc_mode"))
    if not _absent(g, Query.ECC, mode):
        g.ecc_mode = g.ecc_mode_pending = bool(mode)
        g.ecc = {}
        for counter, slot in (("volatile", 0), ("aggregate", 1)):
            for where, location in (("dram", 2), ("sram", 7)):  # nvmlMemoryLocation_t: device memory, SRAM
                corrected = _int(c.get(f"ecc_{counter}_{where}_correctable"))
                parts = (f"ecc_{counter}_{where}_uncorrectable{s}" for s in ("", "_parity", "_secded"))
                uncorrected = [v for p in parts if (v := _int(c.get(p))) is not None]
                if corrected is not None:
                    g.ecc[(0, slot, location)] = corrected
                if uncorrected:
                    g.ecc[(1, slot, location)] = sum(uncorrected)
    sbe, dbe = _int(c.get("retired_sbe")), _int(c.get("retired_dbe"))
    if not _absent(g, Query.RETIRED_PAGES, sbe):
        g.unsupported_fields -= set(RETIRED_FIELDS)
        g.retired_sbe = [RetiredPage(0x1000 * (i + 1), 0) for i in range(min(sbe or 0, 16))]
        g.retired_dbe = [RetiredPage(0x100000 * (i + 1), 0) for i in range(min(dbe or 0, 16))]
        g.retired_pending = bool(_yes(c.get("retired_pending")))
    else:
        g.unsupported_fields |= set(RETIRED_FIELDS)
    cor = _int(c.get("remapped_correctable"))
    if not _absent(g, Query.REMAPPED_ROWS, cor):
        g.remapped_correctable, g.remapped_uncorrectable = cor or 0, _int(c.get("remapped_uncorrectable")) or 0
        g.remap_pending, g.remap_failure = bool(_yes(c.get("remap_pending"))), bool(_yes(c.get("remap_failure")))


def _mig_uuid(gpu_uuid: str, v: dict[str, str]) -> str:
    """nvidia-smi -q prints no MIG device UUIDs: one made from the GPU's and the instance ids, stable."""
    name = f"{gpu_uuid}/{v.get('gpu_instance_id')}/{v.get('compute_instance_id')}"
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, name)}"


def _mig(g: Gpu, c: CapturedGpu) -> None:
    enabled = _yes(c.get("mig_mode"))
    if _absent(g, Query.MIG, enabled):
        return
    g.mig_mode = g.mig_mode_pending = bool(enabled)
    g.unsupported.add(Query.MIG_PROFILES)  # nvidia-smi -q lists instances, not the profile table
    product = c.get("name") or ""
    per_slice = next((n for family, n in SMS_PER_SLICE.items() if family in product), None)
    g.mig_instances = []
    for m in c.mig[:7]:
        v = m.values
        sms = _int(v.get("sms")) or 0
        total = (_int(v.get("memory_total")) or 0) * MIB
        slices = sms // per_slice if per_slice else 0  # unknown elsewhere: the profile label says "unknown"
        g.mig_instances.append(
            MigInstance(
                gpu_instance_id=_int(v.get("gpu_instance_id")) or 0,
                compute_instance_id=_int(v.get("compute_instance_id")) or 0,
                name=f"{c.get('name') or ''} MIG",
                uuid=_mig_uuid(str(g.uuid), v),
                memory_total=total,
                memory_reserved=(_int(v.get("memory_reserved")) or 0) * MIB,
                memory_used=(_int(v.get("memory_used")) or 0) * MIB,
                gpu_instance_slices=slices,
                compute_instance_slices=slices,
                multiprocessors=sms,
                copy_engines=_int(v.get("copy_engines")) or 0,
                decoders=_int(v.get("decoders")) or 0,
                encoders=_int(v.get("encoders")) or 0,
                jpegs=_int(v.get("jpegs")) or 0,
                ofas=_int(v.get("ofas")) or 0,
                memory_mb=total // MIB,
            )
        )
