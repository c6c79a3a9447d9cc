"""What the fake DCGM host engine reports for a GPU: DCGM field id -> type, source and value in DCGM's units.

Written from DCGM's field documentation (dcgm_fields.h): MHz, MiB, W, mJ, percent, ratios and bytes/s
for the profiling fields, 1/0 for flags; the deprecated PCIe throughput fields (200, 201) answer "not
supported", as DcgmCacheManager.cpp does. The simulator's "not
supported" (None) becomes DCGM's blank sentinel in tests/dcgm_fake.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import ClockDomain, ThresholdKind

MIB = 1024 * 1024
PROF_ACTIVITY = {
    1001: "graphics_engine_active", 1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active",
    1005: "dram_active", 1006: "fp64_active", 1007: "fp32_active", 1008: "fp16_active",
}  # fmt: skip
_PROF_BUSES = {1009: "pcie_tx_bytes_per_second", 1010: "pcie_rx_bytes_per_second"}
_LINK_FIELDS = {  # per link (0..17): replay, recovery, CRC-flit counter ids
    "replay_errors": (420, 421, 422, 423, 424, 425, 463, 464, 465, 466, 467, 468, 426, 427, 428, 487, 488, 489),
    "recovery_errors": (430, 431, 432, 433, 434, 435, 469, 470, 471, 472, 473, 474, 436, 437, 438, 491, 492, 493),
    "crc_errors": (400, 401, 402, 403, 404, 405, 451, 452, 453, 454, 455, 456, 406, 407, 408, 481, 482, 483),
}


def _mhz(domain: ClockDomain, current: bool = True) -> Callable[[Any, Any], Any]:
    return lambda r, _: _scaled((r.current_hz if current else r.max_hz).get(domain), 1e-6)


def _flag(name: str) -> Callable[[Any, Any], Any]:
    return lambda r, _: None if getattr(r, name) is None else int(getattr(r, name))


def _attr(name: str, factor: float | None = None) -> Callable[[Any, Any], Any]:
    return lambda r, _: getattr(r, name) if factor is None else _scaled(getattr(r, name), factor)


def _scaled(value: float | None, factor: float) -> Any:
    return None if value is None else round(value * factor)


def _bus(bus_id: str) -> str:
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"  # NVML's (and DCGM's) form


def _cuda(version: str) -> int:
    major, minor = version.split(".")
    return int(major) * 1000 + int(minor) * 10


def _link(n: int, name: str) -> Callable[[Any, Any], Any]:
    return lambda r, _: getattr(r.links[n], name) if n < len(r.links) else None


def _link_bytes(n: int, name: str) -> Callable[[Any, Any], Any]:
    def get(r: Any, _: Any) -> Any:
        links = {link.link: link for link in r.gpu.nvlink_links}
        return _scaled(getattr(links[n], name), 1) if n in links else None

    return get


_C = Collector
# Field id -> (DCGM type, the collector that has it, its value in DCGM's units from (reading, (engine, index))).
GPU_FIELDS: dict[int, tuple[str, Collector | None, Callable[[Any, Any], Any]]] = {
    1: ("s", None, lambda _, ctx: ctx[0].sim.scenario.node.driver_version),
    5: ("i", None, lambda _, ctx: _cuda(ctx[0].sim.scenario.node.cuda_driver_version)),
    50: ("s", _C.INVENTORY, _attr("name")),
    52: ("i", None, lambda _, ctx: ctx[1]),
    53: ("s", _C.INVENTORY, _attr("serial")),
    54: ("s", None, lambda _, ctx: ctx[0].sim.discover()[ctx[1]].uuid),
    57: ("s", None, lambda _, ctx: _bus(ctx[0].sim.discover()[ctx[1]].pci_bus_id)),
    67: ("i", _C.INVENTORY, _flag("mig_enabled")),
    85: ("s", _C.INVENTORY, _attr("vbios_version")),
    100: ("i", _C.CLOCKS, _mhz(ClockDomain.SM)),
    101: ("i", _C.CLOCKS, _mhz(ClockDomain.MEMORY)),
    102: ("i", _C.CLOCKS, _mhz(ClockDomain.VIDEO)),
    112: ("i", _C.CLOCKS, _attr("event_reasons")),
    113: ("i", _C.CLOCKS, _mhz(ClockDomain.SM, current=False)),
    114: ("i", _C.CLOCKS, _mhz(ClockDomain.MEMORY, current=False)),
    115: ("i", _C.CLOCKS, _mhz(ClockDomain.VIDEO, current=False)),
    140: ("i", _C.THERMAL, _attr("memory_celsius", 1)),
    150: ("i", _C.THERMAL, _attr("gpu_celsius", 1)),
    155: ("d", _C.POWER, _attr("usage_watts")),
    156: ("i", _C.POWER, _attr("energy_joules", 1000)),
    163: ("d", _C.POWER, _attr("default_limit_watts")),  # DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF
    164: ("d", _C.POWER, _attr("limit_watts")),
    190: ("i", _C.CLOCKS, _attr("performance_state")),
    191: ("i", _C.THERMAL, _attr("fan_ratio", 100)),
    # 200, 201: DcgmCacheManager answers the deprecated PCIe throughput fields "not supported" (absent here).
    157: ("d", _C.POWER, _attr("instant_watts")),
    158: ("i", _C.THERMAL, lambda r, _: _scaled(r.thresholds.get(ThresholdKind.SLOWDOWN), 1)),
    159: ("i", _C.THERMAL, lambda r, _: _scaled(r.thresholds.get(ThresholdKind.SHUTDOWN), 1)),
    206: ("i", _C.UTILIZATION, _attr("encoder_ratio", 100)),
    207: ("i", _C.UTILIZATION, _attr("decoder_ratio", 100)),
    202: ("i", _C.PCIE, _attr("replay_errors")),
    203: ("i", _C.UTILIZATION, _attr("gpu_ratio", 100)),
    204: ("i", _C.UTILIZATION, _attr("memory_controller_ratio", 100)),
    235: ("i", _C.PCIE, _attr("max_link_generation")),
    236: ("i", _C.PCIE, _attr("max_link_width")),
    237: ("i", _C.PCIE, _attr("link_generation")),
    238: ("i", _C.PCIE, _attr("link_width")),
    250: ("i", _C.MEMORY, _attr("total_bytes", 1 / MIB)),
    252: ("i", _C.MEMORY, _attr("used_bytes", 1 / MIB)),
    253: ("i", _C.MEMORY, _attr("reserved_bytes", 1 / MIB)),
    300: ("i", _C.ECC, _flag("enabled")),
    310: ("i", _C.ECC, _attr("corrected_volatile")),
    311: ("i", _C.ECC, _attr("uncorrected_volatile")),
    312: ("i", _C.ECC, _attr("corrected_aggregate")),
    313: ("i", _C.ECC, _attr("uncorrected_aggregate")),
    390: ("i", _C.ECC, _attr("retired_pages_single_bit")),
    391: ("i", _C.ECC, _attr("retired_pages_double_bit")),
    392: ("i", _C.ECC, _flag("retired_pages_pending")),
    393: ("i", _C.REMAPPING, _attr("uncorrectable_rows")),
    394: ("i", _C.REMAPPING, _attr("correctable_rows")),
    395: ("i", _C.REMAPPING, _flag("failure")),
    396: ("i", _C.REMAPPING, _flag("pending")),
    1523: ("i", _C.RECOVERY, _attr("action")),
    **{i: ("d", _C.PROFILING, lambda r, _, n=name: getattr(r.gpu, n)) for i, name in PROF_ACTIVITY.items()},
    **{i: ("i", _C.PROFILING, lambda r, _, n=name: _scaled(getattr(r.gpu, n), 1)) for i, name in _PROF_BUSES.items()},
    **{ids[n]: ("i", _C.NVLINK, _link(n, name)) for name, ids in _LINK_FIELDS.items() for n in range(18)},
    **{1040 + 2 * n: ("i", _C.PROFILING, _link_bytes(n, "tx_bytes_per_second")) for n in range(18)},
    **{1041 + 2 * n: ("i", _C.PROFILING, _link_bytes(n, "rx_bytes_per_second")) for n in range(18)},
}
