"""Where on the node a device id or a process lands: which GPU, and which of its MIG devices.

The NVIDIA device plugin names the devices it hands to pods by NVML's UUIDs:

    GPU-<uuid>                   a whole GPU
    MIG-<uuid>                   a MIG device (driver R470 and later)
    MIG-GPU-<gpu uuid>/<gi>/<ci> a MIG device on older drivers: its GPU, GPU instance and compute instance
    <any of these>::<n>          replica n of a shared device (time-slicing or MPS: several pods, one GPU)

whatever the resource is called (`nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`, a renamed `nvidia.com/gpu.shared`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.readings import Memory, Processes
from gpu_triage.exporter.polling.snapshot import Snapshot

_OLD_MIG = re.compile(r"MIG-(GPU-[0-9A-Fa-f-]+)/(\d+)/(\d+)")


@dataclass(frozen=True, slots=True)
class Assignment:
    """One workload on one GPU, or on one of its MIG devices."""

    workload: Workload
    mig: MigInstance | None = None


@dataclass(frozen=True, slots=True)
class Place:
    gpu_uuid: str
    mig: MigInstance | None = None


class DeviceIndex:
    """The snapshot's GPUs and MIG devices, by every id a device plugin may give them."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._places: dict[str, Place] = {}
        self._by_instance: dict[tuple[str, int, int], Place] = {}
        for state in snapshot.gpus:
            uuid = state.identity.uuid
            self._places[uuid] = Place(uuid)
            processes, memory = state.get(Processes), state.get(Memory)
            # Either reading lists the MIG devices; one may be missing after a failed read.
            migs = set(processes.instances if processes else ())
            migs |= {m.instance for m in (memory.instances if memory else ())}
            for mig in migs:
                place = Place(uuid, mig)
                self._places[mig.uuid] = place
                self._by_instance[(uuid, mig.gpu_instance, mig.compute_instance)] = place

    @property
    def devices(self) -> frozenset[tuple[str, Place]]:
        """Every device id and where it is: equal for two snapshots whose devices are the same."""
        return frozenset(self._places.items())

    def place(self, device_id: str) -> Place | None:
        """The GPU (and MIG device) a device plugin's id names, or None when it is none of this node's."""
        base = device_id.partition("::")[0]
        if (found := self._places.get(base)) is not None:
            return found
        if m := _OLD_MIG.fullmatch(base):
            return self._by_instance.get((m[1], int(m[2]), int(m[3])))
        return None
