"""One reader per collector for the DCGM backend: DCGM field values in, readings in base units out.

DCGM's units: MHz, MiB, W, mJ, percent; its profiling fields are ratios 0..1 and bytes/s already (PCIe
traffic comes only from those: DCGM's own PCIe throughput fields are deprecated and answer "not
supported"). A field that is absent (blank, not supported, not watched yet) is None; one that failed
otherwise is named in the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_triage.exporter.backends import field_table
from gpu_triage.exporter.backends.base import GpuBackend, GpuIdentity, GpuLostError
from gpu_triage.exporter.backends.collectors import Collector, require_every_collector
from gpu_triage.exporter.backends.dcgm import fields as fid
from gpu_triage.exporter.backends.dcgm.fields import Entity
from gpu_triage.exporter.backends.dcgm.health import HealthBook
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


class DcgmState(Protocol):
    """What the readers take from the DCGM backend (backend.py, which imports them): NVML beside it, for
    the process list, and the health watches' book."""

    @property
    def companion(self) -> GpuBackend | None: ...
    @property
    def health(self) -> HealthBook: ...


MIB = 1024 * 1024
MHZ = 1e6
_LINK_UP, _LINK_NOT_SUPPORTED = 3, 0  # DcgmNvLinkLinkState*: 0 not supported, 1 disabled, 2 down, 3 up
_LINK_COUNTERS = (fid.LINK_REPLAY, fid.LINK_RECOVERY, fid.LINK_CRC_FLIT)


@dataclass
class Read:
    """One collector's read of one GPU: where to ask, and the fields that failed."""

    backend: DcgmState
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


def _plain(e: Entity, reading: str) -> dict[str, Any]:
    """The reading's plain attributes that field_table.py reads from a DCGM field, in base units."""
    out: dict[str, Any] = {}
    for spec in field_table.of(reading):
        if (how := spec.dcgm) is None:
            continue
        if spec.kind is float:
            out[spec.attr] = e.number(how.field, how.scale)
            continue
        number = e.integer(how.field)
        if number is not None and how.scale != 1:
            number = int(number * how.scale)
        out[spec.attr] = _flag(number) if spec.kind is bool else number
    return out


def _fields(r: Read, reading: str, *more: int) -> Entity:
    return r.fields((*field_table.dcgm_ids(reading), *more))


def _inventory(r: Read) -> Reading:
    e = _fields(r, "Inventory", fid.NAME, fid.SERIAL, fid.VBIOS_VERSION, fid.DRIVER_VERSION, fid.CUDA_DRIVER_VERSION)
    return Inventory(
        name=e.text(fid.NAME),
        serial=e.text(fid.SERIAL),
        vbios_version=e.text(fid.VBIOS_VERSION),
        driver_version=e.text(fid.DRIVER_VERSION),
        cuda_driver_version=cuda_version(e.integer(fid.CUDA_DRIVER_VERSION)),
        **_plain(e, "Inventory"),
    )


def _utilization(r: Read) -> Reading:
    return Utilization(**_plain(_fields(r, "Utilization"), "Utilization"))


def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * MIB


def _memory(r: Read) -> Reading:
    e = _fields(r, "Memory")
    parts = []
    for m in r.session.migs.get(r.gpu_id, []):
        ci = r.fields((fid.FB_USED, fid.FB_TOTAL), fid.FE_GPU_CI, m.compute_instance_entity)
        parts.append(InstanceMemory(m.instance, _bytes(ci.integer(fid.FB_USED)), _bytes(ci.integer(fid.FB_TOTAL))))
    return Memory(**_plain(e, "Memory"), instances=tuple(parts))


def _power(r: Read) -> Reading:
    return Power(**_plain(_fields(r, "Power"), "Power"))


def _thermal(r: Read) -> Reading:
    e = _fields(r, "Thermal", fid.SLOWDOWN_TEMP, fid.SHUTDOWN_TEMP)
    limits = {ThresholdKind.SHUTDOWN: fid.SHUTDOWN_TEMP, ThresholdKind.SLOWDOWN: fid.SLOWDOWN_TEMP}
    found = {kind: c for kind, i in limits.items() if (c := e.number(i)) is not None}
    return Thermal(thresholds=found, **_plain(e, "Thermal"))


_CLOCKS = {  # DCGM has no graphics-clock field
    Domain.SM: (fid.SM_CLOCK, fid.MAX_SM_CLOCK),
    Domain.MEMORY: (fid.MEM_CLOCK, fid.MAX_MEM_CLOCK),
    Domain.VIDEO: (fid.VIDEO_CLOCK, fid.MAX_VIDEO_CLOCK),
}


def _clocks(r: Read) -> Reading:
    e = _fields(r, "Clocks", *(i for pair in _CLOCKS.values() for i in pair), fid.CLOCK_EVENT_REASONS)
    current = {d: v for d, (now, _) in _CLOCKS.items() if (v := e.number(now, MHZ)) is not None}
    maximum = {d: v for d, (_, top) in _CLOCKS.items() if (v := e.number(top, MHZ)) is not None}
    return Clocks(current, maximum, e.integer(fid.CLOCK_EVENT_REASONS), **_plain(e, "Clocks"))


def _pcie(r: Read) -> Reading:
    return Pcie(
        **_plain(_fields(r, "Pcie"), "Pcie"),
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
    return Ecc(**_plain(_fields(r, "Ecc"), "Ecc"))


def _remapping(r: Read) -> Reading:
    return Remapping(**_plain(_fields(r, "Remapping"), "Remapping"))


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
