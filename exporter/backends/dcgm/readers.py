"""One reader per collector for the DCGM backend: DCGM field values in, readings in base units out.

DCGM's units: MHz, MiB, W, mJ, percent; its profiling fields are ratios 0..1 and bytes/s already (PCIe
traffic comes only from those: DCGM's own PCIe throughput fields are deprecated and answer "not
supported"). A field that is absent (blank, not supported, not watched yet) is None; one that failed
otherwise is named in the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_triage.exporter.backends.base import Collector, GpuIdentity, GpuLostError, require_every_collector
from gpu_triage.exporter.backends.dcgm import fields as fid
from gpu_triage.exporter.backends.dcgm.fields import Entity
from gpu_triage.exporter.backends.dcgm.session import Session
from gpu_triage.exporter.backends.readings import (
    Activity,
    Clocks,
    Ecc,
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
    Profiling,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    ThresholdKind,
    Utilization,
    cuda_version,
)
from gpu_triage.exporter.backends.readings import ClockDomain as Domain

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.dcgm.backend import DcgmBackend

MIB = 1024 * 1024
MHZ = 1e6
_LINK_UP, _LINK_NOT_SUPPORTED = 3, 0  # DcgmNvLinkLinkState*: 0 not supported, 1 disabled, 2 down, 3 up
_LINK_COUNTERS = (fid.LINK_REPLAY, fid.LINK_RECOVERY, fid.LINK_CRC_FLIT)


@dataclass
class Read:
    """One collector's read of one GPU: where to ask, and the fields that failed."""

    backend: DcgmBackend
    session: Session
    gpu: GpuIdentity
    gpu_id: int
    failed: list[str] = field(default_factory=list)

    def fields(self, ids: tuple[int, ...], group: int = fid.FE_GPU, entity: int | None = None) -> Entity:
        entity = self.gpu_id if entity is None else entity
        values = self.session.latest([(group, entity)], ids)
        if values.lost:
            raise GpuLostError(f"GPU {self.gpu.index}: DCGM says it is lost")
        self.failed += [f"dcgm_field_{f}" for f in sorted(values.failed)]
        return values.of(group, entity)


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def _inventory(r: Read) -> Reading:
    ids = (fid.NAME, fid.SERIAL, fid.VBIOS_VERSION, fid.DRIVER_VERSION, fid.CUDA_DRIVER_VERSION, fid.MIG_MODE)
    e = r.fields(ids)
    return Inventory(
        name=e.text(fid.NAME),
        serial=e.text(fid.SERIAL),
        vbios_version=e.text(fid.VBIOS_VERSION),
        driver_version=e.text(fid.DRIVER_VERSION),
        cuda_driver_version=cuda_version(e.integer(fid.CUDA_DRIVER_VERSION)),
        mig_enabled=_flag(e.integer(fid.MIG_MODE)),
    )


def _utilization(r: Read) -> Reading:
    e = r.fields((fid.GPU_UTIL, fid.MEM_COPY_UTIL, fid.ENC_UTIL, fid.DEC_UTIL))
    return Utilization(*(e.number(i, 0.01) for i in (fid.GPU_UTIL, fid.MEM_COPY_UTIL, fid.ENC_UTIL, fid.DEC_UTIL)))


def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB


def _memory(r: Read) -> Reading:
    e = r.fields((fid.FB_USED, fid.FB_TOTAL, fid.FB_RESERVED))
    parts = []
    for m in r.session.migs.get(r.gpu_id, []):
        ci = r.fields((fid.FB_USED, fid.FB_TOTAL), fid.FE_GPU_CI, m.compute_instance_entity)
        parts.append(InstanceMemory(m.instance, _bytes(ci.integer(fid.FB_USED)), _bytes(ci.integer(fid.FB_TOTAL))))
    used, total, reserved = (_bytes(e.integer(f)) for f in (fid.FB_USED, fid.FB_TOTAL, fid.FB_RESERVED))
    return Memory(used, total, reserved, instances=tuple(parts))


def _power(r: Read) -> Reading:
    e = r.fields((fid.POWER_USAGE, fid.ENFORCED_POWER_LIMIT, fid.TOTAL_ENERGY, fid.POWER_USAGE_INSTANT))
    return Power(
        e.number(fid.POWER_USAGE),
        e.number(fid.ENFORCED_POWER_LIMIT),
        e.number(fid.TOTAL_ENERGY, 0.001),
        e.number(fid.POWER_USAGE_INSTANT),
    )


def _thermal(r: Read) -> Reading:
    e = r.fields((fid.GPU_TEMP, fid.MEMORY_TEMP, fid.FAN_SPEED, fid.SLOWDOWN_TEMP, fid.SHUTDOWN_TEMP))
    limits = {ThresholdKind.SHUTDOWN: fid.SHUTDOWN_TEMP, ThresholdKind.SLOWDOWN: fid.SLOWDOWN_TEMP}
    found = {kind: c for kind, i in limits.items() if (c := e.number(i)) is not None}
    return Thermal(e.number(fid.GPU_TEMP), e.number(fid.MEMORY_TEMP), e.number(fid.FAN_SPEED, 0.01), found)


_CLOCKS = {  # DCGM has no graphics-clock field
    Domain.SM: (fid.SM_CLOCK, fid.MAX_SM_CLOCK),
    Domain.MEMORY: (fid.MEM_CLOCK, fid.MAX_MEM_CLOCK),
    Domain.VIDEO: (fid.VIDEO_CLOCK, fid.MAX_VIDEO_CLOCK),
}


def _clocks(r: Read) -> Reading:
    e = r.fields((*(i for pair in _CLOCKS.values() for i in pair), fid.CLOCK_EVENT_REASONS, fid.PSTATE))
    current = {d: v for d, (now, _) in _CLOCKS.items() if (v := e.number(now, MHZ)) is not None}
    maximum = {d: v for d, (_, top) in _CLOCKS.items() if (v := e.number(top, MHZ)) is not None}
    return Clocks(current, maximum, e.integer(fid.CLOCK_EVENT_REASONS), e.integer(fid.PSTATE))


def _pcie(r: Read) -> Reading:
    ids = (fid.PCIE_LINK_GEN, fid.PCIE_MAX_LINK_GEN, fid.PCIE_LINK_WIDTH, fid.PCIE_MAX_LINK_WIDTH)
    e = r.fields((*ids, fid.PCIE_REPLAY_COUNTER))
    return Pcie(
        link_generation=e.integer(fid.PCIE_LINK_GEN),
        max_link_generation=e.integer(fid.PCIE_MAX_LINK_GEN),
        link_width=e.integer(fid.PCIE_LINK_WIDTH),
        max_link_width=e.integer(fid.PCIE_MAX_LINK_WIDTH),
        replay_errors=e.integer(fid.PCIE_REPLAY_COUNTER),
        tx_bytes_per_second=None,  # the profiling fields have it (readings: preferred there anyway)
        rx_bytes_per_second=None,
    )


def _nvlink(r: Read) -> Reading:
    states = r.session.link_states(r.gpu_id)
    links = [i for i, s in enumerate(states) if s != _LINK_NOT_SUPPORTED]
    e = r.fields(fid.NVLINK)
    out = []
    for link in links:
        # Counters exist for links 0..17; a GPU with more reports those through link entities (DCGM 4.6).
        replay, recovery, crc = (e.integer(ids[link]) if link < len(ids) else None for ids in _LINK_COUNTERS)
        # As NVML's link states: up is active; disabled or down is inactive.
        state = LinkState.ACTIVE if states[link] == _LINK_UP else LinkState.INACTIVE
        out.append(LinkReading(link, state, replay, recovery, crc))
    return NvLink(tuple(out))


def _processes(r: Read) -> Reading:
    companion = r.backend.companion
    if companion is None:
        return Processes(None)  # DCGM has no process list; NVML is not there to ask
    result = companion.read(r.gpu, Collector.PROCESSES)
    r.failed += list(result.failed_fields)
    return result.reading


def _recovery(r: Read) -> Reading:
    if not r.session.recovery:
        return Recovery(None)
    return Recovery(r.fields(fid.RECOVERY).integer(fid.GPU_RECOVERY_ACTION))


def _ecc(r: Read) -> Reading:
    counts = (fid.ECC_SBE_VOL_TOTAL, fid.ECC_DBE_VOL_TOTAL, fid.ECC_SBE_AGG_TOTAL, fid.ECC_DBE_AGG_TOTAL)
    e = r.fields((fid.ECC_CURRENT, *counts, fid.RETIRED_SBE, fid.RETIRED_DBE, fid.RETIRED_PENDING))
    return Ecc(
        enabled=_flag(e.integer(fid.ECC_CURRENT)),
        corrected_volatile=e.integer(fid.ECC_SBE_VOL_TOTAL),
        uncorrected_volatile=e.integer(fid.ECC_DBE_VOL_TOTAL),
        corrected_aggregate=e.integer(fid.ECC_SBE_AGG_TOTAL),
        uncorrected_aggregate=e.integer(fid.ECC_DBE_AGG_TOTAL),
        retired_pages_single_bit=e.integer(fid.RETIRED_SBE),
        retired_pages_double_bit=e.integer(fid.RETIRED_DBE),
        retired_pages_pending=_flag(e.integer(fid.RETIRED_PENDING)),
    )


def _remapping(r: Read) -> Reading:
    ids = (fid.CORRECTABLE_REMAPPED_ROWS, fid.UNCORRECTABLE_REMAPPED_ROWS, fid.ROW_REMAP_PENDING, fid.ROW_REMAP_FAILURE)
    e = r.fields(ids)
    return Remapping(e.integer(ids[0]), e.integer(ids[1]), _flag(e.integer(ids[2])), _flag(e.integer(ids[3])))


def _activity(e: Entity, buses: bool, dram: Entity | None = None) -> Activity:
    values: dict[str, Any] = {name: e.number(i) for i, name in fid.PROF_ACTIVITY.items()}
    if dram is not None:  # under MIG, DRAM activity belongs to the GPU instance
        values["dram_active"] = dram.number(fid.PROF_DRAM_ACTIVE)
    if not buses:
        return Activity(**values)
    values |= {name: e.number(i) for i, name in fid.PROF_BUSES.items()}
    links = tuple(
        LinkThroughput(link, e.number(tx), e.number(tx + 1))
        for link, tx in enumerate(fid.PROF_NVLINK_LINK_TX)
        if e.number(tx) is not None or e.number(tx + 1) is not None
    )
    if links:  # per link where DCGM gives links: then the total would count twice
        values |= {"nvlink_tx_bytes_per_second": None, "nvlink_rx_bytes_per_second": None}
    return Activity(**values, nvlink_links=links)


def _profiling(r: Read) -> Reading:
    if r.session.profiling is not None:
        return Profiling(None, r.session.profiling)
    whole = _activity(r.fields(fid.PROFILING), buses=True)
    parts = []
    for m in r.session.migs.get(r.gpu_id, []):
        ci = r.fields(tuple(fid.PROF_ACTIVITY), fid.FE_GPU_CI, m.compute_instance_entity)
        gi = r.fields((fid.PROF_DRAM_ACTIVE,), fid.FE_GPU_I, m.gpu_instance_entity)
        parts.append(InstanceActivity(m.instance, _activity(ci, buses=False, dram=gi)))
    if whole.sm_active is None and whole.graphics_engine_active is None and not parts:
        return Profiling(None, "DCGM has no profiling values for this GPU (not supported, or no sample yet)")
    return Profiling("dcgm", "watching", whole, tuple(parts))


def _health(r: Read) -> Reading:
    return HealthWatch(r.backend.health.incidents(r.session, r.gpu.uuid))


READERS: dict[Collector, Callable[[Read], Reading]] = {
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
require_every_collector(READERS, "dcgm")
