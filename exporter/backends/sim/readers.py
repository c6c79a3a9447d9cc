"""The simulator's readers, one per collector: what a read of a simulated GPU sees (view.py: its shape,
its state now, the faults on it) turned into a reading, in base units, as the readings define them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from gpu_triage.exporter.backends import field_table
from gpu_triage.exporter.backends.collectors import Collector, require_every_collector
from gpu_triage.exporter.backends.readings import (
    Activity,
    ClockEventReason,
    Clocks,
    Ecc,
    Fabric,
    HealthWatch,
    InstanceActivity,
    InstanceMemory,
    Inventory,
    LinkReading,
    LinkState,
    LinkThroughput,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    ProcessReading,
    Profiling,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    ThresholdKind,
    Utilization,
)
from gpu_triage.exporter.backends.readings import ClockDomain as Domain
from gpu_triage.exporter.backends.sim.activity import Rates, activity, link_rate, memory_controller, pcie
from gpu_triage.exporter.backends.sim.faults import FaultKind
from gpu_triage.exporter.backends.sim.mig import COMPUTE_SLICES
from gpu_triage.exporter.backends.sim.view import View

MHZ = 1e6
_DOMAINS = {"graphics": Domain.GRAPHICS, "sm": Domain.SM, "memory": Domain.MEMORY, "video": Domain.VIDEO}
# The reasons NVML keeps a duration counter for.
COUNTED_REASONS = (
    ClockEventReason.SW_POWER_CAP,
    ClockEventReason.SYNC_BOOST,
    ClockEventReason.SW_THERMAL_SLOWDOWN,
    ClockEventReason.HW_THERMAL_SLOWDOWN,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
)
PCIE_ERROR_KINDS = ("l0_to_recovery", "correctable", "nak_received", "receiver", "bad_tlp", "nak_sent", "bad_dllp",
                    "non_fatal", "fatal", "unsupported_request", "lcrc")  # fmt: skip


@functools.cache
def _getters(reading: str) -> tuple[tuple[str, Callable[[View], Any]], ...]:
    """Each plain attribute of the reading that field_table.py takes straight from the view, with its getter."""
    return tuple((spec.attr, attrgetter(spec.sim.path)) for spec in field_table.of(reading) if spec.sim is not None)


def _plain(v: View, reading: str) -> dict[str, Any]:
    """The reading's plain attributes that field_table.py takes straight from the view."""
    return {attr: get(v) for attr, get in _getters(reading)}


def _inventory(v: View) -> Inventory:
    return Inventory(
        name=v.shape.model,
        serial=v.serial,
        vbios_version=v.node.vbios_version,
        driver_version=v.node.driver_version,
        cuda_driver_version=v.node.cuda_driver_version,
        mig_enabled=v.mig if v.spec.mig else None,  # a GPU without MIG: NVML says "not supported"
        persistence_mode=True,
        gsp_firmware=True,
    )


def _utilization(v: View) -> Utilization:
    if v.mig:  # as NVML: "not supported" on a MIG-enabled GPU; profiling has each instance's activity
        return Utilization(None, None, None, None)
    mem_ratio = memory_controller(v.state.utilization, v.noise, v.state.load.dram_scale)
    return Utilization(round(v.state.utilization, 2), round(mem_ratio, 2), 0.0, 0.0)


def _memory(v: View) -> Memory:
    parts = tuple(
        InstanceMemory(inst.mig, v.instance_used_bytes(i), inst.memory_bytes) for i, inst in enumerate(v.instances)
    )
    return Memory(used_bytes=v.memory_used_bytes(), instances=parts, **_plain(v, "Memory"))


def _power(v: View) -> Power:
    watts = round(v.state.power_watts, 3)
    return Power(
        usage_watts=watts, energy_joules=round(v.state.energy_joules, 3), instant_watts=watts, **_plain(v, "Power")
    )


def _thermal(v: View) -> Thermal:
    t = v.spec.thresholds
    limits = {} if t is None else {
        ThresholdKind.SHUTDOWN: t.shutdown, ThresholdKind.SLOWDOWN: t.slowdown,
        ThresholdKind.MEMORY_MAX: t.memory_max, ThresholdKind.GPU_MAX: t.gpu_max,
    }  # fmt: skip
    return Thermal(
        gpu_celsius=float(round(v.state.temperature_celsius)),
        memory_celsius=float(round(v.state.memory_temperature_celsius)),
        fan_ratio=v.fan_ratio(),
        thresholds={k: float(c) for k, c in limits.items() if c is not None},
    )


def _clocks(v: View) -> Clocks:
    current = {_DOMAINS[d]: mhz * MHZ for d, mhz in v.clocks_mhz().items()}
    maximum = {_DOMAINS[d]: mhz * MHZ for d, mhz in v.max_clocks_mhz().items()}
    bits = 0
    for reason in v.reasons:
        bits |= ClockEventReason(reason).bit
    held = {r: v.state.reason_seconds.get(r.value, 0.0) for r in COUNTED_REASONS}
    return Clocks(current, maximum, bits, performance_state=0, event_seconds=held)


def _pcie(v: View) -> Pcie:
    tx, rx = pcie(v.state.utilization, v.noise, v.state.load)
    return Pcie(
        **_plain(v, "Pcie"),
        tx_bytes_per_second=tx,
        rx_bytes_per_second=rx,
        tx_bytes=int(v.state.pcie_tx_bytes),
        rx_bytes=int(v.state.pcie_rx_bytes),
        errors=dict.fromkeys(PCIE_ERROR_KINDS, 0),
    )


def _nvlink(v: View) -> NvLink:
    down, s = v.links_down, v.state
    nvlink5 = v.spec.nvlink.version >= 5
    rate = link_rate(s.utilization, v.spec.nvlink.speed_mbps, s.load.nvlink_share)

    def link(i: int) -> LinkReading:
        failed = s.nvlink_failed_recoveries[i]
        return LinkReading(
            link=i,
            state=LinkState.INACTIVE if i in down else LinkState.ACTIVE,
            replay_errors=None if nvlink5 else s.nvlink_replays[i],
            recovery_errors=s.nvlink_recoveries[i],
            crc_errors=None if nvlink5 else s.nvlink_crcs[i],
            recovery_failed=failed if nvlink5 else None,
            recovery_successful=s.nvlink_recoveries[i] - failed if nvlink5 else None,
            effective_errors=0 if nvlink5 else None,
            symbol_errors=s.nvlink_symbol_errors[i] if nvlink5 else None,
            tx_bytes=int(s.nvlink_tx_bytes[i]),
            rx_bytes=int(s.nvlink_rx_bytes[i]),
            tx_bytes_per_second=0.0 if i in down else rate,
            rx_bytes_per_second=0.0 if i in down else rate,
        )

    return NvLink(tuple(link(i) for i in range(v.shape.nvlink_links)))


def _processes(v: View) -> Processes:
    migs = tuple(i.mig for i in v.instances)
    if not v.held:
        return Processes((), migs)
    if v.mig:  # one server per MIG instance
        return Processes(
            tuple(
                ProcessReading(v.process_pid(inst.mig.gpu_instance), "python3", v.instance_used_bytes(i), inst.mig)
                for i, inst in enumerate(v.instances)
            ),
            migs,
        )
    return Processes((ProcessReading(pid=v.process_pid(), name="python3", used_bytes=v.memory_used_bytes()),))


def _as_reading(r: Rates) -> Activity:
    return Activity(
        graphics_engine_active=r.graphics_engine_active,
        sm_active=r.sm_active,
        sm_occupancy=r.sm_occupancy,
        tensor_active=r.tensor_active,
        dram_active=r.dram_active,
        fp64_active=r.fp64_active,
        fp32_active=r.fp32_active,
        fp16_active=r.fp16_active,
        pcie_tx_bytes_per_second=r.pcie_tx_bytes_per_second,
        pcie_rx_bytes_per_second=r.pcie_rx_bytes_per_second,
        nvlink_links=tuple(LinkThroughput(link, tx, rx) for link, tx, rx in r.nvlink_links),
    )


def _profiling(v: View) -> Profiling:
    if not v.spec.gpm:
        return Profiling(source=None, status="GPM is not supported on this GPU")
    parts = tuple(
        InstanceActivity(inst.mig, _as_reading(activity(v.instance_utilization(i), v.noise, buses=False)))
        for i, inst in enumerate(v.instances)
    )
    utilization = v.state.utilization
    if v.mig:  # the whole GPU: its instances' activity, weighted by their share of the SMs
        utilization = (
            sum(v.instance_utilization(i) * inst.slices for i, inst in enumerate(v.instances)) / COMPUTE_SLICES
        )
    links, speed = v.shape.nvlink_links, v.spec.nvlink.speed_mbps
    whole = activity(utilization, v.noise, links=links, link_speed_mbps=speed, down=v.links_down, load=v.state.load)
    return Profiling(source="sim", status="simulated", gpu=_as_reading(whole), instances=parts)


def _health(v: View) -> HealthWatch:
    return HealthWatch(None)  # the simulator plays NVML, which has no health watches


def _recovery(v: View) -> Recovery:
    # NVML_GPU_FABRIC_STATE_COMPLETED, probe status success, health summary healthy.
    return Recovery(action=0, fabric=Fabric(3, 0, 1) if v.spec.fabric else None)


def _ecc(v: View) -> Ecc:
    s = v.state
    # Ampere and later remap rows; the pre-Ampere page-retirement calls are "not supported".
    return Ecc(
        enabled=True,
        **_plain(v, "Ecc"),
        retired_pages_single_bit=None,
        retired_pages_double_bit=None,
        retired_pages_pending=None,
        by_location={
            "dram": {"corrected": s.ecc_corrected, "uncorrected": s.ecc_uncorrected},
            "sram": {"corrected": 0, "uncorrected": 0},
        },
    )


def _remapping(v: View) -> Remapping:
    if v.mig and v.instances:  # nvml.h: the row remapper cannot be queried while MIG instances exist
        return Remapping(None, None, None, None)
    return Remapping(
        correctable_rows=v.state.remapped_correctable,
        uncorrectable_rows=v.state.remapped_uncorrectable,
        pending=FaultKind.ROW_REMAP_PENDING in v.kinds,
        failure=FaultKind.ROW_REMAP_FAILURE in v.kinds,
    )


READERS: dict[Collector, Callable[[View], Reading]] = {
    Collector.INVENTORY: _inventory,
    Collector.UTILIZATION: _utilization,
    Collector.MEMORY: _memory,
    Collector.POWER: _power,
    Collector.THERMAL: _thermal,
    Collector.CLOCKS: _clocks,
    Collector.PCIE: _pcie,
    Collector.NVLINK: _nvlink,
    Collector.PROCESSES: _processes,
    Collector.RECOVERY: _recovery,
    Collector.ECC: _ecc,
    Collector.REMAPPING: _remapping,
    Collector.PROFILING: _profiling,
    Collector.HEALTH: _health,
}
require_every_collector(READERS, "sim")
