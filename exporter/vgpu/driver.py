"""The simulator drives the virtual GPU (vgpu/, `make vgpu`): what `gpu-triage vgpu` runs.

Every tick (a second) it takes each simulated GPU as the simulator's model has it (SimBackend.view)
and writes it to the vGPU state file that build/vgpu/libnvidia-ml.so.1 maps. Any NVML client started
with LD_LIBRARY_PATH=build/vgpu and GPU_TRIAGE_VGPU_STATE=<the file> then sees the scenario's GPUs:
`gpu-triage serve --backend nvml`, nvitop, gpustat.

The values are written by image.py, in NVML's own units and meanings as nvml.h documents each
call, from the model's physical state: never from gpu-triage's readings, whose conversions the pair
exists to check. Lasting faults become the record's flags (lost, hung, a stale handle); a reset is a
GPU that answers GPU_IS_LOST while it lasts and whose MIG handles are invalid after it. XIDs go to the
file's event ring, where nvmlEventSetWait_v2 finds them. `POST /api/v1/sim/faults` injects faults, as
on `gpu-triage serve --backend sim`: exporter/http/vgpu_app.py serves it, so nothing here loads the
web stack.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from gpu_triage.exporter.backends.base import DriverXid, GpuIdentity
from gpu_triage.exporter.backends.sim.backend import SimBackend
from gpu_triage.exporter.backends.sim.faults import FaultKind
from gpu_triage.exporter.vgpu import image as vgpu_image
from gpu_triage.exporter.vgpu import state as vs

log = logging.getLogger(__name__)
TICK_SECONDS = 1.0
_FLAGS = {
    FaultKind.GPU_LOST: "lost",
    FaultKind.GPU_RESET: "lost",  # inaccessible while it lasts: nvml.h's GPU_IS_LOST
    FaultKind.HUNG_CALL: "hung",
    FaultKind.STALE_HANDLE: "invalid_handle",
}


def new_record(identity: GpuIdentity) -> vs.Gpu:
    domain, bus, rest = identity.pci_bus_id.split(":")
    return vs.Gpu(
        uuid=identity.uuid,
        pci_domain=int(domain, 16),
        pci_bus=int(bus, 16),
        pci_device=int(rest.split(".")[0], 16),
        minor_number=identity.index,
    )


class VgpuDriver:
    """Reads the simulator every tick and publishes it to the state file; forwards its XIDs."""

    def __init__(self, sim: SimBackend, state: Path) -> None:
        self.sim = sim
        self.gpus = sim.discover()
        if len(self.gpus) > vs.MAX_GPUS:
            raise ValueError(f"the vGPU state file holds at most {vs.MAX_GPUS} GPUs, the scenario has {len(self.gpus)}")
        self.records = [new_record(g) for g in self.gpus]
        self._lock = threading.Lock()  # one writer of the file: ticks and XIDs come from two threads
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._resetting: set[int] = set()
        self._read()  # the first values are in the file from its creation on
        node = sim.scenario.node
        major, minor = (int(p) for p in node.cuda_driver_version.split(".")[:2])
        self.writer = vs.StateWriter(
            state,
            self.records,
            driver_version=node.driver_version,
            nvml_version=f"{major}.{node.driver_version}",
            cuda_driver_version=1000 * major + 10 * minor,
        )

    def tick(self) -> None:
        """Read every GPU and publish the node."""
        self._read()
        with self._lock:
            # XIDs raised before the state just read go first: a driver's XID 79 comes before the GPU reads as lost.
            self._push(self.sim.wait_xids(0.0))
            self.writer.write(self.records)

    def _read(self) -> None:
        """Write every GPU as the model has it into its record; a faulty one keeps its last values."""
        faulty: dict[int, set[str]] = {}
        resetting: set[int] = set()
        for fault in self.sim.faults():
            if (flag := _FLAGS.get(fault.spec.kind)) is not None:
                faulty.setdefault(fault.spec.gpu, set()).add(flag)
            if fault.spec.kind is FaultKind.GPU_RESET:
                resetting.add(fault.spec.gpu)
        for gpu, record in zip(self.gpus, self.records, strict=True):
            flags = faulty.get(gpu.index, set())
            if not flags:
                vgpu_image.write(record, self.sim.view(gpu.index))
            if gpu.index in self._resetting and gpu.index not in resetting:
                record.reset_generation += 1  # the reset is over: handles to its old MIG instances are invalid
            record.lost, record.hung = "lost" in flags, "hung" in flags
            record.invalid_handle = "invalid_handle" in flags
        self._resetting = resetting

    def changed(self) -> None:
        """A fault was injected or cleared: publish now rather than at the next tick."""
        self._wake.set()

    def start(self) -> None:
        for target, name in ((self._ticks, "vgpu-ticks"), (self._xids, "vgpu-xids")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.sim.close()
        self.writer.close()

    def _ticks(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_SECONDS)
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # the next tick tries again; the driver never dies of one bad read
                log.exception("vGPU tick failed")

    def _xids(self) -> None:
        while not self._stop.is_set():
            if self.sim.xids_waiting(0.5):
                with self._lock:  # taken under the lock a tick publishes under, so none is published after the tick
                    self._push(self.sim.wait_xids(0.0))

    def _push(self, xids: list[DriverXid]) -> None:
        for xid in xids:
            instance = {}
            if xid.gpu_instance is not None:  # the writer's default is NVML's "the whole device"
                instance = {"gpu_instance_id": xid.gpu_instance, "compute_instance_id": xid.compute_instance or 0}
            self.writer.push_xid(xid.gpu, xid.code, **instance)
