"""A real node's `nvidia-smi -q -x` (XML) or `nvidia-smi -q` (text) output, read into plain values.

Both forms print what NVML answered, in nvidia-smi's words: "81559 MiB", "67.74 W", "Active", "N/A".
They are read here into one `CapturedGpu` per GPU, each value a string as printed (None where the
capture does not have it), under one name whatever the form or the driver version; capture_image.py
turns those into the vGPU's record in NVML's units. Versions name things differently (clocks
"throttle" reasons before 535, "event" reasons after; power_readings, gpu_power_readings); each name a
value has gone by is listed below. The input is bounded and parsed without entities or DTDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.etree import ElementTree

MAX_BYTES = 16 * 1024 * 1024  # a 64-GPU node prints a few MB


class CaptureError(ValueError):
    """Not an nvidia-smi capture this reader understands; the message says why."""


@dataclass
class CapturedMig:
    values: dict[str, str]  # gpu_instance_id, compute_instance_id, sms, ..., memory_total (as printed)


@dataclass
class CapturedGpu:
    bus_id: str  # as the capture names the GPU: "00000000:19:00.0"
    values: dict[str, str] = field(default_factory=dict)  # canonical name -> printed value; N/A left out
    reasons: dict[str, bool] = field(default_factory=dict)  # clock-event reason -> active
    reason_time: dict[str, str] = field(default_factory=dict)  # reason -> "25483012608 us"
    mig: list[CapturedMig] = field(default_factory=list)
    processes: list[dict[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        return self.values.get(name)


@dataclass
class Capture:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[CapturedGpu]


# canonical name -> (XML paths under <gpu>, text paths: sections, then the key)
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "name": (("product_name",), (("Product Name",),)),
    "architecture": (("product_architecture",), (("Product Architecture",),)),
    "uuid": (("uuid",), (("GPU UUID",),)),
    "serial": (("serial",), (("Serial Number",),)),
    "vbios": (("vbios_version",), (("VBIOS Version",),)),
    "board_part_number": (("board_part_number",), (("Board Part Number",),)),
    "minor_number": (("minor_number",), (("Minor Number",),)),
    "persistence_mode": (("persistence_mode",), (("Persistence Mode",),)),
    "mig_mode": (("mig_mode/current_mig",), (("MIG Mode", "Current"),)),
    "gsp_firmware": (("gsp_firmware_version",), (("GSP Firmware Version",),)),
    "recovery_action": (("gpu_recovery_action",), (("GPU Recovery Action",),)),
    "device_id": (("pci/pci_device_id",), (("PCI", "Device Id"),)),
    "subsystem_id": (("pci/pci_sub_system_id",), (("PCI", "Sub System Id"),)),
    "pcie_gen_max": (
        ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
        (("PCI", "GPU Link Info", "PCIe Generation", "Max"),),
    ),
    "pcie_gen": (
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
        (("PCI", "GPU Link Info", "PCIe Generation", "Current"),),
    ),
    "pcie_width_max": (
        ("pci/pci_gpu_link_info/link_widths/max_link_width",),
        (("PCI", "GPU Link Info", "Link Width", "Max"),),
    ),
    "pcie_width": (
        ("pci/pci_gpu_link_info/link_widths/current_link_width",),
        (("PCI", "GPU Link Info", "Link Width", "Current"),),
    ),
    "pcie_replays": (("pci/replay_counter",), (("PCI", "Replays Since Reset"),)),
    "pcie_tx": (("pci/tx_util",), (("PCI", "Tx Throughput"),)),
    "pcie_rx": (("pci/rx_util",), (("PCI", "Rx Throughput"),)),
    "fan": (("fan_speed",), (("Fan Speed",),)),
    "pstate": (("performance_state",), (("Performance State",),)),
    "memory_total": (("fb_memory_usage/total",), (("FB Memory Usage", "Total"),)),
    "memory_reserved": (("fb_memory_usage/reserved",), (("FB Memory Usage", "Reserved"),)),
    "memory_used": (("fb_memory_usage/used",), (("FB Memory Usage", "Used"),)),
    "bar1_total": (("bar1_memory_usage/total",), (("BAR1 Memory Usage", "Total"),)),
    "bar1_used": (("bar1_memory_usage/used",), (("BAR1 Memory Usage", "Used"),)),
    "util_gpu": (("utilization/gpu_util",), (("Utilization", "Gpu"),)),
    "util_memory": (("utilization/memory_util",), (("Utilization", "Memory"),)),
    "util_encoder": (("utilization/encoder_util",), (("Utilization", "Encoder"),)),
    "util_decoder": (("utilization/decoder_util",), (("Utilization", "Decoder"),)),
    "ecc_mode": (("ecc_mode/current_ecc",), (("ECC Mode", "Current"),)),
    **{
        f"ecc_{counter}_{kind}": ((f"ecc_errors/{counter}/{kind}",), (("ECC Errors", counter.title(), label),))
        for counter in ("volatile", "aggregate")
        for kind, label in (
            ("sram_correctable", "SRAM Correctable"),
            ("sram_uncorrectable", "SRAM Uncorrectable"),
            ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity"),
            ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED"),
            ("dram_correctable", "DRAM Correctable"),
            ("dram_uncorrectable", "DRAM Uncorrectable"),
        )
    },
    "retired_sbe": (
        ("retired_pages/multiple_single_bit_retirement/retired_count",),
        (("Retired Pages", "Single Bit ECC"),),
    ),
    "retired_dbe": (("retired_pages/double_bit_retirement/retired_count",), (("Retired Pages", "Double Bit ECC"),)),
    "retired_pending": (("retired_pages/pending_retirement",), (("Retired Pages", "Pending Page Blacklist"),)),
    "remapped_correctable": (("remapped_rows/remapped_row_corr",), (("Remapped Rows", "Correctable Error"),)),
    "remapped_uncorrectable": (("remapped_rows/remapped_row_unc",), (("Remapped Rows", "Uncorrectable Error"),)),
    "remap_pending": (("remapped_rows/remapped_row_pending",), (("Remapped Rows", "Pending"),)),
    "remap_failure": (("remapped_rows/remapped_row_failure",), (("Remapped Rows", "Remapping Failure Occurred"),)),
    "temperature": (("temperature/gpu_temp",), (("Temperature", "GPU Current Temp"),)),
    "memory_temperature": (("temperature/memory_temp",), (("Temperature", "Memory Current Temp"),)),
    "threshold_shutdown": (("temperature/gpu_temp_max_threshold",), (("Temperature", "GPU Shutdown Temp"),)),
    "threshold_slowdown": (("temperature/gpu_temp_slow_threshold",), (("Temperature", "GPU Slowdown Temp"),)),
    "threshold_gpu_max": (("temperature/gpu_temp_max_gpu_threshold",), (("Temperature", "GPU Max Operating Temp"),)),
    "threshold_memory_max": (
        ("temperature/gpu_temp_max_mem_threshold",),
        (("Temperature", "Memory Max Operating Temp"),),
    ),
    "power_draw": (
        ("gpu_power_readings/average_power_draw", "gpu_power_readings/power_draw", "power_readings/power_draw"),
        (
            ("GPU Power Readings", "Average Power Draw"),
            ("GPU Power Readings", "Power Draw"),
            ("Power Readings", "Power Draw"),
        ),
    ),
    "power_instant": (
        ("gpu_power_readings/instant_power_draw",),
        (("GPU Power Readings", "Instantaneous Power Draw"),),
    ),
    "power_limit": (
        ("gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit"),
        (("GPU Power Readings", "Current Power Limit"), ("Power Readings", "Enforced Power Limit")),
    ),
    "power_limit_requested": (
        ("gpu_power_readings/requested_power_limit", "power_readings/power_limit"),
        (("GPU Power Readings", "Requested Power Limit"), ("Power Readings", "Power Limit")),
    ),
    "power_limit_default": (
        ("gpu_power_readings/default_power_limit", "power_readings/default_power_limit"),
        (("GPU Power Readings", "Default Power Limit"), ("Power Readings", "Default Power Limit")),
    ),
    "power_limit_min": (
        ("gpu_power_readings/min_power_limit", "power_readings/min_power_limit"),
        (("GPU Power Readings", "Min Power Limit"), ("Power Readings", "Min Power Limit")),
    ),
    "power_limit_max": (
        ("gpu_power_readings/max_power_limit", "power_readings/max_power_limit"),
        (("GPU Power Readings", "Max Power Limit"), ("Power Readings", "Max Power Limit")),
    ),
    **{
        f"clock_{domain}": ((f"clocks/{xml}_clock",), (("Clocks", text),))
        for domain, xml, text in (
            ("graphics", "graphics", "Graphics"),
            ("sm", "sm", "SM"),
            ("memory", "mem", "Memory"),
            ("video", "video", "Video"),
        )
    },
    **{
        f"max_clock_{domain}": ((f"max_clocks/{xml}_clock",), (("Max Clocks", text),))
        for domain, xml, text in (
            ("graphics", "graphics", "Graphics"),
            ("sm", "sm", "SM"),
            ("memory", "mem", "Memory"),
            ("video", "video", "Video"),
        )
    },
    "app_clock_graphics": (("applications_clocks/graphics_clock",), (("Applications Clocks", "Graphics"),)),
    "app_clock_memory": (("applications_clocks/mem_clock",), (("Applications Clocks", "Memory"),)),
    "fabric_state": (("fabric/state",), (("Fabric", "State"),)),
    "fabric_status": (("fabric/status",), (("Fabric", "Status"),)),
}
# Clock-event reasons: XML tag suffix (after clocks_event_reason_ / clocks_throttle_reason_), text label.
_REASONS = {
    "gpu_idle": ("gpu_idle", "Idle"),
    "applications_clocks_setting": ("applications_clocks_setting", "Applications Clocks Setting"),
    "sw_power_cap": ("sw_power_cap", "SW Power Cap"),
    "hw_slowdown": ("hw_slowdown", "HW Slowdown"),
    "hw_thermal_slowdown": ("hw_thermal_slowdown", "HW Thermal Slowdown"),
    "hw_power_brake_slowdown": ("hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    "sync_boost": ("sync_boost", "Sync Boost"),
    "sw_thermal_slowdown": ("sw_thermal_slowdown", "SW Thermal Slowdown"),
    "display_clock_setting": ("display_clocks_setting", "Display Clock Setting"),
}
_REASON_TIMES = {  # clocks_event_reasons_counters (us)
    "sw_power_cap": ("sw_power_cap", "SW Power Capping"),
    "sync_boost": ("sync_boost", "Sync Boost"),
    "sw_thermal_slowdown": ("sw_therm_slowdown", "SW Thermal Slowdown"),
    "hw_thermal_slowdown": ("hw_therm_slowdown", "HW Thermal Slowdown"),
    "hw_power_brake_slowdown": ("hw_power_brake", "HW Power Braking"),
}
_MIG_XML = {
    "gpu_instance_id": "gpu_instance_id",
    "compute_instance_id": "compute_instance_id",
    "sms": "device_attributes/shared/multiprocessor_count",
    "copy_engines": "device_attributes/shared/copy_engine_count",
    "encoders": "device_attributes/shared/encoder_count",
    "decoders": "device_attributes/shared/decoder_count",
    "ofas": "device_attributes/shared/ofa_count",
    "jpegs": "device_attributes/shared/jpg_count",
    "memory_total": "fb_memory_usage/total",
    "memory_reserved": "fb_memory_usage/reserved",
    "memory_used": "fb_memory_usage/used",
}
_ABSENT = (
    "n/a",
    "not supported",
    "[n/a]",
    "[not supported]",
    "unknown error",
    "requested functionality has been deprecated",
)


def _present(value: str | None) -> str | None:
    if value is None:
        return None
    value = " ".join(value.split())
    return None if not value or value.lower() in _ABSENT else value


def parse_capture(text: str) -> Capture:
    """A capture in either form; CaptureError when it is neither, or too large."""
    if len(text.encode(errors="replace")) > MAX_BYTES:
        raise CaptureError(f"larger than {MAX_BYTES // 2**20} MiB: not one node's nvidia-smi -q")
    head = text.lstrip()[:200]
    if head.startswith("<"):
        return _xml(text)
    if "NVSMI LOG" in head or re.search(r"^GPU [0-9A-Fa-f]{4,8}:", text, re.M):
        return _text(text)
    raise CaptureError("neither nvidia-smi -q -x (XML) nor nvidia-smi -q (text) output")


# -- XML ----------------------------------------------------------------------------------------------


def _xml(text: str) -> Capture:
    # nvidia-smi declares a DTD it does not ship; nothing is fetched or expanded, and a capture that
    # declares entities of its own is refused rather than trusted.
    if re.search(r"<!ENTITY", text, re.I):
        raise CaptureError("the XML declares entities: not nvidia-smi output")
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as e:
        raise CaptureError(f"not well-formed XML: {e}") from e
    if root.tag != "nvidia_smi_log":
        raise CaptureError(f"the XML's root is <{root.tag}>, not <nvidia_smi_log>")
    gpus = [_xml_gpu(g) for g in root.findall("gpu")]
    if not gpus:
        raise CaptureError("the capture lists no GPU")
    return Capture(_present(root.findtext("driver_version")), _present(root.findtext("cuda_version")), gpus)


def _xml_gpu(g: ElementTree.Element) -> CapturedGpu:
    out = CapturedGpu(bus_id=g.get("id") or _present(g.findtext("pci/pci_bus_id")) or "")
    for name, (paths, _) in _FIELDS.items():
        for path in paths:
            if (value := _present(g.findtext(path))) is not None:
                out.values[name] = value
                break
    for prefix in ("clocks_event_reasons/clocks_event_reason_", "clocks_throttle_reasons/clocks_throttle_reason_"):
        for reason, (tag, _) in _REASONS.items():
            if (value := _present(g.findtext(prefix + tag))) is not None:
                out.reasons[reason] = value.lower() == "active"
    for reason, (tag, _) in _REASON_TIMES.items():
        if (
            value := _present(g.findtext(f"clocks_event_reasons_counters/clocks_event_reasons_counters_{tag}"))
        ) is not None:
            out.reason_time[reason] = value
    for m in g.findall("mig_devices/mig_device"):
        out.mig.append(CapturedMig({k: v for k, p in _MIG_XML.items() if (v := _present(m.findtext(p))) is not None}))
    for p in g.findall("processes/process_info"):
        out.processes.append(
            {k: v for k in ("pid", "used_memory", "type") if (v := _present(p.findtext(k))) is not None}
        )
    return out


# -- text ---------------------------------------------------------------------------------------------


def _text(text: str) -> Capture:
    driver = cuda = None
    gpus: list[CapturedGpu] = []
    stack: list[tuple[int, str]] = []  # (indent, label) of the sections the line is in
    current: CapturedGpu | None = None
    tree: dict[tuple[str, ...], str] = {}
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        if m := re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", raw):
            if current is not None:
                gpus.append(_text_gpu(current, tree))
            current, tree, stack = CapturedGpu(bus_id=m[1]), {}, []
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        key = key.strip()
        if current is None:
            if key == "Driver Version":
                driver = _present(value)
            elif key == "CUDA Version":
                cuda = _present(value)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(label for _, label in stack), key)
        if sep and (v := _present(value)) is not None:
            tree[path] = v
        stack.append((indent, key))
    if current is not None:
        gpus.append(_text_gpu(current, tree))
    if not gpus:
        raise CaptureError("the capture lists no GPU")
    return Capture(driver, cuda, gpus)


def _text_gpu(out: CapturedGpu, tree: dict[tuple[str, ...], str]) -> CapturedGpu:
    for name, (_, paths) in _FIELDS.items():
        for path in paths:
            if path in tree:
                out.values[name] = tree[path]
                break
    for section in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
        for reason, (_, label) in _REASONS.items():
            # HW thermal and power-brake slowdowns are printed under HW Slowdown.
            value = tree.get((section, label)) or tree.get((section, "HW Slowdown", label))
            if value is not None:
                out.reasons[reason] = value.lower() == "active"
    for reason, (_, label) in _REASON_TIMES.items():
        if (value := tree.get(("Clocks Event Reasons Counters", label))) is not None:
            out.reason_time[reason] = value
    return out
