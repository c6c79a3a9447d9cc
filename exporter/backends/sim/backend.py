"""The simulator backend: the scenario's GPUs behind the same contract as NVML.

It fails the way NVML fails: a lost GPU raises GpuLostError from every call, a hung call blocks
until its fault is cleared or runs out, and an injected XID arrives through `wait_xids`, the
same path as NVML's XID events. What each collector reads is in readers.py.
"""

from __future__ import annotations

import bisect
import copy
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.core.pci import canonical_bus_id
from gpu_triage.exporter.backends.base import DriverXid, GpuIdentity, GpuLostError, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultBook, FaultKind, FaultSpec
from gpu_triage.exporter.backends.sim.mig import instances
from gpu_triage.exporter.backends.sim.model import NodeModel, hash_pair
from gpu_triage.exporter.backends.sim.readers import READERS
from gpu_triage.exporter.backends.sim.scenario import Scenario
from gpu_triage.exporter.backends.sim.view import View

# Where the eight GPUs of an HGX H100 baseboard usually sit on the PCI bus.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# Xid 79, "GPU has fallen off the bus": from then on the driver cannot reach the GPU, and every NVML call to it
# answers GPU_IS_LOST until the node is rebooted. A simulated one does the same: the GPU is lost until cleared.
_FALLEN_OFF_THE_BUS = 79


class FaultError(ValueError):
    """A fault that does not fit this node (no such GPU or link)."""


class SimBackend:
    name = "sim"
    why = "--backend sim"

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time) -> None:
        self.scenario = scenario
        self._clock = clock
        self._lock = threading.Lock()
        self._book = FaultBook()
        self._xids: deque[DriverXid] = deque()  # raised, not yet taken by wait_xids
        self._xid_raised = threading.Condition()
        start = clock()
        self._model = NodeModel(scenario, start)
        self._pending = sorted(scenario.faults, key=lambda f: f.at_seconds)  # not yet started
        self._pending_times = [start + f.at_seconds for f in self._pending]
        # Read without the lock, so a read with nothing due takes none: both only ever grow, so a stale value
        # only sends a read down the locked path, which decides again.
        self._next_due = self._pending_times[0] if self._pending_times else math.inf
        self._ticked = 0  # every GPU's model has reached this tick
        self._gpus = [self._identity(i) for i in range(scenario.node.gpus.count)]
        shape = scenario.node.gpus
        self._declared = self._declare()
        self._instances = [
            instances(scenario.seed, i, shape.mig_instances.get(i, []), shape.spec) for i in range(shape.count)
        ]

    # -- the GpuBackend contract ------------------------------------------------------------

    def discover(self) -> list[GpuIdentity]:
        return list(self._gpus)

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        now = self._clock()
        self._advance(now)
        faults = self._book.on(gpu.index, now)
        if faults:
            self._refuse(gpu.index, collector, faults)
        with self._lock:
            return Result(READERS[collector](self._view(gpu.index, faults)))

    def _refuse(self, index: int, collector: Collector, faults: list[ActiveFault]) -> None:
        """Fail or hang the read as the faults on the GPU make NVML's call fail or hang."""
        if any(f.spec.kind is FaultKind.GPU_LOST for f in faults):
            raise GpuLostError(f"GPU {index} is lost (simulated)")
        if any(f.spec.kind is FaultKind.GPU_RESET for f in faults):
            raise GpuLostError(f"GPU {index} is being reset (simulated)")
        if any(f.spec.kind is FaultKind.STALE_HANDLE for f in faults):
            raise GpuLostError(f"GPU {index}: its handle no longer names it (simulated)")
        hung = [f for f in faults if f.spec.kind is FaultKind.HUNG_CALL and f.spec.collector in (None, collector)]
        if hung:
            self._hang(hung)

    def view(self, index: int) -> View:
        """GPU `index` as it is now, whatever its faults: what the vGPU writer turns into NVML's answers.
        The model's state in it is a copy: it does not move under the caller."""
        now = self._clock()
        self._advance(now)
        with self._lock:
            view = self._view(index, self._book.on(index, now))
            return replace(view, state=copy.deepcopy(view.state))

    def _view(self, index: int, faults: list[ActiveFault]) -> View:
        return View(
            index,
            self.scenario.node,
            self._model.gpus[index],
            self.scenario.seed,
            faults,
            {f.spec.kind for f in faults},
            self._instances[index],
        )

    def close(self) -> None:
        self._book.clear()  # releases any simulated hung call

    def declared_workloads(self) -> dict[int, tuple[Workload, ...]]:
        """The scenario's pods and jobs by GPU index: who the kubelet or the cgroups would say runs there."""
        return self._declared

    def _declare(self) -> dict[int, tuple[Workload, ...]]:
        out: dict[int, tuple[Workload, ...]] = {}
        for w in self.scenario.workloads:
            workload = Workload(w.kind, w.name, namespace=w.namespace, user=w.user, step="0" if w.kind != "pod" else "")
            for gpu in w.gpus:
                out[gpu] = (*out.get(gpu, ()), workload)
        return out

    reports_xids = True

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        self._advance(self._clock())
        with self._xid_raised:
            self._xid_raised.wait_for(lambda: bool(self._xids), timeout_seconds)
            out = list(self._xids)
            self._xids.clear()
        return out

    def xids_waiting(self, timeout_seconds: float) -> bool:
        """Whether an XID is raised and not yet taken, waiting up to `timeout_seconds` for one; takes none (the
        virtual GPU's driver takes them under its own lock, in order with the state it publishes)."""
        self._advance(self._clock())
        with self._xid_raised:
            return self._xid_raised.wait_for(lambda: bool(self._xids), timeout_seconds)

    # -- fault injection ----------------------------------------------------------------------

    def inject(self, spec: FaultSpec, source: str = "api") -> ActiveFault:
        count, links = self.scenario.node.gpus.count, self.scenario.node.gpus.nvlink_links
        if spec.gpu >= count:
            raise FaultError(f"no GPU {spec.gpu}: this node has GPUs 0..{count - 1}")
        if spec.link is not None and spec.link >= links:
            raise FaultError(f"no NVLink link {spec.link}: GPUs of this node have links 0..{links - 1}")
        if spec.gpu_instance is not None and self._instance(spec) is None:
            have = ", ".join(f"{m.mig.gpu_instance}/{m.mig.compute_instance}" for m in self._instances[spec.gpu])
            wanted = f"{spec.gpu_instance}/{spec.compute_instance if spec.compute_instance is not None else '*'}"
            raise FaultError(
                f"GPU {spec.gpu} has no MIG instance {wanted} (GPU/compute instance): {have or 'MIG is off'}"
            )
        now = self._clock()
        self._advance(now)
        return self._start(spec, now, source)

    def faults(self) -> list[ActiveFault]:
        self._book.expire(self._clock())
        return self._book.all()

    def clear_fault(self, fault_id: str) -> bool:
        return self._book.remove(fault_id)

    def clear_faults(self) -> int:
        return self._book.clear()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, spec: FaultSpec, at: float, source: str) -> ActiveFault:
        fault = self._book.add(spec, at, source)
        with self._lock:
            self._model.apply_instantaneous(spec)
        if spec.kind is FaultKind.XID and spec.xid is not None:
            # An XID in a MIG instance names it, as NVML's event does; one of the whole GPU names none.
            mig = self._instance(spec)
            xid = DriverXid(
                spec.gpu,
                spec.xid,
                at,
                spec.message,
                gpu_instance=mig.gpu_instance if mig else None,
                compute_instance=mig.compute_instance if mig else None,
            )
            with self._xid_raised:
                self._xids.append(xid)
                self._xid_raised.notify_all()
            # Raised before the GPU is gone, as the driver reports it: one who sees the GPU lost finds the XID too.
            if spec.xid == _FALLEN_OFF_THE_BUS:
                lost = FaultSpec(gpu=spec.gpu, kind=FaultKind.GPU_LOST, duration_seconds=spec.duration_seconds)
                self._book.add(lost, at, f"{source}: xid {spec.xid}")
        return fault

    def _instance(self, spec: FaultSpec) -> MigInstance | None:
        """The MIG device an XID's spec names (its GPU instance's first compute instance when it names none)."""
        if spec.gpu_instance is None:
            return None
        for m in self._instances[spec.gpu]:
            gi, ci = m.mig.gpu_instance, m.mig.compute_instance
            if gi == spec.gpu_instance and spec.compute_instance in (None, ci):
                return m.mig
        return None

    def _advance(self, now: float) -> None:
        tick = int(now - self._model.start)
        if now < self._next_due and tick <= self._ticked:  # nothing to start, no tick to take: no lock
            self._book.expire(now)
            return
        with self._lock:  # reads of different GPUs advance the clock concurrently: take each fault once
            due = bisect.bisect_right(self._pending_times, now)
            started, times = self._pending[:due], self._pending_times[:due]
            if due:
                del self._pending[:due], self._pending_times[:due]
                self._next_due = self._pending_times[0] if self._pending_times else math.inf
        for fault, at in zip(started, times, strict=True):
            self._start(FaultSpec.model_validate(fault.model_dump(exclude={"at_seconds"})), at, "scenario")
        with self._lock:
            for i, state in enumerate(self._model.gpus):
                if state.tick < tick:
                    self._model.advance(i, tick, self._book.lasting(i))
            self._ticked = max(self._ticked, tick)
        # Only now: a fault that ran out since the last tick still shaped the ticks it covered.
        self._book.expire(now)

    def _hang(self, hung: list[ActiveFault]) -> None:
        """Block like a driver call stuck in the kernel, until the fault is cleared or runs out."""
        self._book.wait_until_gone({f.id for f in hung}, self._clock)

    def _identity(self, index: int) -> GpuIdentity:
        gpus = self.scenario.node.gpus
        if gpus.pci_bus_ids is not None:
            bus_id = canonical_bus_id(gpus.pci_bus_ids[index]) or gpus.pci_bus_ids[index]
        else:
            # Past eight GPUs (scale tests), each further baseboard gets its own PCI domain.
            domain, slot = divmod(index, len(_HGX_BUSES))
            bus_id = f"{domain:04x}:{_HGX_BUSES[slot]:02x}:00.0"
        seed = self.scenario.seed
        gpu_uuid = uuid.UUID(int=(hash_pair(seed, index) << 64) | hash_pair(seed, index + 1_000_003), version=4)
        return GpuIdentity(index=index, uuid=f"GPU-{gpu_uuid}", pci_bus_id=bus_id)
