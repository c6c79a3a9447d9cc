"""Everything gpu-triage sets up on one connection to a DCGM host engine, and reads through it.

On connecting: the GPUs (DCGM's gpuIds are its own and only hold for one host engine lifetime, so
GPUs are matched by UUID), the MIG hierarchy, a group of the GPUs and one of the MIG devices, field
groups, watches and health watches. The host engine drops all of these when the connection closes
(persistAfterDisconnect=0), so a crashed daemon leaves nothing behind and a reconnect builds a
new Session from scratch.

Profiling fields get a field group of their own and are watched at the slow interval: a GPU or a
DCGM that cannot profile (DCGM_ST_PROFILING_*, not supported) only loses those, and says why.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.diagnosis.core.pci import canonical_bus_id
from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.dcgm import fields
from gpu_triage.exporter.backends.dcgm.bindings import Bindings
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.per_poll import PerPoll

log = logging.getLogger(__name__)

LIVE = 1  # DCGM_FV_FLAG_LIVE_DATA: read the driver now, for values nobody watches (discovery)
HEALTH_SYSTEMS = {  # DCGM_HEALTH_WATCH_* bit -> our name
    0x1: "pcie",
    0x2: "nvlink",
    0x10: "memory",
    0x40: "inforom",
    0x80: "thermal",
    0x100: "power",
    0x200: "driver",
}
_GROUP_EMPTY = 1  # DCGM_GROUP_EMPTY


@dataclass(frozen=True, slots=True)
class MigEntity:
    instance: MigInstance
    gpu_instance_entity: int  # DCGM entity ids (FE_GPU_I, FE_GPU_CI)
    compute_instance_entity: int


@dataclass
class Session:
    b: Bindings
    handle: Any
    gpu_ids: dict[str, int] = field(default_factory=dict)  # GPU UUID -> DCGM gpuId
    identities: list[GpuIdentity] = field(default_factory=list)
    migs: dict[int, list[MigEntity]] = field(default_factory=dict)  # gpuId -> its MIG devices
    profiling: str | None = None  # why DCGM cannot give profiling here; None when it can
    recovery: bool = True  # the host engine knows the recovery-action field (DCGM 4.5 and later)
    _groups: list[Any] = field(default_factory=list)
    _field_groups: list[Any] = field(default_factory=list)
    gpu_group: Any = None
    _link_states: PerPoll[str, dict[int, list[int]]] = field(default_factory=PerPoll)

    # -- setting up ------------------------------------------------------------------------------

    def start(self, interval: float, slow_interval: float) -> None:
        """Find the GPUs and MIG devices, then watch what the readers read."""
        self._discover()
        self._hierarchy()
        a, name = self.b.agent, f"gpu-triage-{os.getpid()}"
        self.gpu_group = a.dcgmGroupCreate(self.handle, _GROUP_EMPTY, name)
        self._groups.append(self.gpu_group)
        for gpu_id in self.gpu_ids.values():
            a.dcgmGroupAddEntity(self.handle, self.gpu_group, fields.FE_GPU, gpu_id)
        fast, slow = int(interval * 1e6), int(slow_interval * 1e6)
        keep = max(3 * slow_interval, 60.0)  # seconds of samples the host engine keeps
        self._watch(self.gpu_group, "device", fields.DEVICE, fast, keep)
        self._watch(self.gpu_group, "nvlink", fields.NVLINK, fast, keep)
        if (e := self._try_watch(self.gpu_group, "recovery", fields.RECOVERY, fast, keep)) is not None:
            self.recovery = False
            log.info("DCGM has no recovery-action field (DCGM 4.5 and later)", extra={"dcgm": self.b.describe(e)})
        mig_group = None
        if any(self.migs.values()):
            mig_group = a.dcgmGroupCreate(self.handle, _GROUP_EMPTY, f"{name}-mig")
            self._groups.append(mig_group)
            for m in (m for ms in self.migs.values() for m in ms):
                a.dcgmGroupAddEntity(self.handle, mig_group, fields.FE_GPU_I, m.gpu_instance_entity)
                a.dcgmGroupAddEntity(self.handle, mig_group, fields.FE_GPU_CI, m.compute_instance_entity)
            self._watch(mig_group, "mig-memory", fields.INSTANCE_MEMORY, fast, keep)
        e = self._try_watch(self.gpu_group, "profiling", fields.PROFILING, slow, keep)
        if e is None and mig_group is not None:
            e = self._try_watch(mig_group, "mig-profiling", tuple(fields.PROF_ACTIVITY), slow, keep)
        if e is not None:
            self.profiling = f"DCGM cannot watch the profiling fields here: {self.b.describe(e)}"
            log.warning("no profiling from DCGM", extra={"dcgm": self.b.describe(e)})
        a.dcgmHealthSet(self.handle, self.gpu_group, sum(HEALTH_SYSTEMS))
        a.dcgmUpdateAllFields(self.handle, 1)  # so that the first reads find values, not NO_DATA

    def _try_watch(self, group: Any, what: str, ids: tuple[int, ...], every_us: int, keep: float) -> Exception | None:
        """Watch what this host engine or GPU may refuse (a newer field, profiling); the refusal, if any."""
        try:
            self._watch(group, what, ids, every_us, keep)
        except self.b.structs.DCGMError as e:
            if self.b.code(e) in fields.DISCONNECTED:
                raise
            return e  # type: ignore[no-any-return]
        return None

    def _watch(self, group: Any, what: str, ids: tuple[int, ...], every_us: int, keep: float) -> None:
        fg = self.b.agent.dcgmFieldGroupCreate(self.handle, list(ids), f"gpu-triage-{os.getpid()}-{what}")
        self._field_groups.append(fg)
        self.b.agent.dcgmWatchFields(self.handle, group, fg, every_us, keep, 0)

    def _discover(self) -> None:
        ids = list(self.b.agent.dcgmGetAllSupportedDevices(self.handle))
        values = self.latest(
            [(fields.FE_GPU, i) for i in ids], (fields.NVML_INDEX, fields.UUID, fields.PCI_BUS_ID), live=True
        )
        for gpu_id in ids:
            gpu = values.of(fields.FE_GPU, gpu_id)
            index, uuid, bus = gpu.integer(fields.NVML_INDEX), gpu.text(fields.UUID), gpu.text(fields.PCI_BUS_ID) or ""
            if index is None or uuid is None:
                log.warning("DCGM GPU without NVML index or UUID: left out", extra={"gpu_id": gpu_id})
                continue
            self.gpu_ids[uuid] = gpu_id
            self.identities.append(GpuIdentity(index, uuid, canonical_bus_id(bus) or bus.lower()))
        self.identities.sort(key=lambda g: g.index)

    def _hierarchy(self) -> None:
        """MIG devices: each compute instance with its GPU instance, named as NVML names them."""
        hierarchy = self.b.agent.dcgmGetGpuInstanceHierarchy(self.handle)
        entries = list(hierarchy.entityList[: hierarchy.count])
        parent_of_gi = {
            e.entity.entityId: e.parent.entityId for e in entries if e.entity.entityGroupId == fields.FE_GPU_I
        }
        pairs = [(fields.FE_GPU_I, gi) for gi in parent_of_gi]
        pairs += [(fields.FE_GPU_CI, e.entity.entityId) for e in entries if e.entity.entityGroupId == fields.FE_GPU_CI]
        if not pairs:
            return
        names = self.latest(pairs, (fields.NAME, fields.UUID), live=True)
        for e in entries:
            if e.entity.entityGroupId != fields.FE_GPU_CI or e.parent.entityId not in parent_of_gi:
                continue
            gi_entity, ci_entity = e.parent.entityId, e.entity.entityId
            info = e.info
            mig = MigInstance(
                int(info.nvmlInstanceId),
                int(info.nvmlComputeInstanceId),
                names.of(fields.FE_GPU_I, gi_entity).text(fields.NAME) or "unknown",
                names.of(fields.FE_GPU_CI, ci_entity).text(fields.UUID)
                or f"MIG-{info.nvmlGpuIndex}-{info.nvmlInstanceId}",
            )
            self.migs.setdefault(parent_of_gi[gi_entity], []).append(MigEntity(mig, gi_entity, ci_entity))

    def close(self) -> None:
        """Give the host engine back what we made; a host engine that is gone has dropped it already."""
        a = self.b.agent
        for fg in self._field_groups:
            with contextlib.suppress(Exception):
                a.dcgmFieldGroupDestroy(self.handle, fg)
        for group in self._groups:
            with contextlib.suppress(Exception):
                a.dcgmGroupDestroy(self.handle, group)
        with contextlib.suppress(Exception):
            a.dcgmDisconnect(self.handle)

    # -- reading -----------------------------------------------------------------------------------

    def link_states(self, gpu_id: int) -> list[int]:
        """The DCGM link states (DcgmNvLinkLinkState*) of each NVLink of `gpu_id`. One call answers for
        every GPU, so it is asked once per poll, not once per GPU (per_poll.py)."""

        def ask() -> tuple[dict[int, list[int]], bool]:
            status = self.b.agent.dcgmGetNvLinkLinkStatus(self.handle)
            return {int(g.entityId): [int(s) for s in g.linkState] for g in status.gpus[: status.numGpus]}, True

        return self._link_states.get("nvlink", gpu_id, ask).get(gpu_id, [])

    def latest(
        self, entities: list[tuple[int, int]], ids: tuple[int, ...], *, live: bool = False
    ) -> fields.FieldValues:
        """The latest values of `ids` for each entity: from the watches, or read from the driver (`live`)."""
        pairs = [self.b.structs.c_dcgmGroupEntityPair_t(group, entity) for group, entity in entities]
        return fields.FieldValues(
            self.b.agent.dcgmEntitiesGetLatestValues(self.handle, pairs, list(ids), LIVE if live else 0)
        )
