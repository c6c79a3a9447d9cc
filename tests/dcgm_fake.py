"""A fake DCGM host engine, answering from the simulator, behind the fake bindings in tests/dcgm_bindings.

It behaves as DCGM's documentation says a host engine does, for what gpu-triage uses:
- it listens on a real loopback TCP port (so the backend's socket check sees it), and is reached with
  `dcgmConnect_v2`; when killed, the port closes and every call on an old handle fails with
  DCGM_ST_CONNECTION_NOT_VALID; restarted, it forgets every group, field group and watch, and numbers
  its GPUs differently (gpuIds only hold for one host engine lifetime);
- a field nobody watches reads as NOT_WATCHED, a watched one as NO_DATA until an update cycle, unless
  asked for live data; values are in DCGM's units; what the GPU does not have is a blank sentinel;
  a lost GPU's fields have the status GPU_IS_LOST;
- health watches report what the simulator's telemetry shows (ECC, remapping, NVLink, thermal and
  power slowdowns), plus incidents a test injects, which are reported once, as DCGM reports events.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_triage.exporter.backends.base import GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import (
    ClockEventReason,
    Clocks,
    Ecc,
    NvLink,
    Profiling,
    Reading,
    Remapping,
)
from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.backends.sim.mig import SimInstance, instances
from tests.dcgm_fake_fields import GPU_FIELDS, MIB, PROF_ACTIVITY

OK, NOT_SUPPORTED, UNKNOWN_FIELD, NO_DATA, NOT_WATCHED = 0, -6, -13, -14, -16
GPU_IS_LOST, CONNECTION_NOT_VALID, LIBRARY_NOT_FOUND, BADPARAM, NOT_CONFIGURED = -18, -21, -25, -1, -5
FE_GPU, FE_GPU_I, FE_GPU_CI = 1, 4, 5
_BLANK = {"i": 0x7FFFFFFFFFFFFFF0, "d": 140737488355328.0, "s": "<<<NULL>>>"}
_NOT_SUPPORTED = {"i": 0x7FFFFFFFFFFFFFF2, "d": 140737488355330.0, "s": "<<<NOT_SUPPORTED>>>"}
_THERMAL = ClockEventReason.HW_THERMAL_SLOWDOWN.bit | ClockEventReason.SW_THERMAL_SLOWDOWN.bit

_engines: list[FakeHostEngine] = []


def current() -> FakeHostEngine:
    """The host engine the fake bindings talk to."""
    assert _engines, "no fake DCGM host engine is running (use tests.dcgm_fake.running)"
    return _engines[-1]


@contextmanager
def running(sim: SimBackend, **options: Any) -> Iterator[FakeHostEngine]:
    engine = FakeHostEngine(sim, **options)
    engine.start()
    _engines.append(engine)
    try:
        yield engine
    finally:
        _engines.remove(engine)
        engine.stop()


class _Readings:
    """One GPU's readings from the simulator, each read once, when a field first needs it."""

    def __init__(self, engine: FakeHostEngine, index: int) -> None:
        self.engine, self.index = engine, index
        self._got: dict[Collector, Reading] = {}

    def __getitem__(self, collector: Collector) -> Reading:
        if collector not in self._got:
            self._got[collector] = self.engine._read(self.index, collector)
        return self._got[collector]


@dataclass
class Incident:
    gpu: int  # NVML index
    system: int  # DCGM_HEALTH_WATCH_* bit
    result: int  # 10 warn, 20 fail
    code: int
    message: str


@dataclass
class FakeHostEngine:
    sim: SimBackend
    has_library: bool = True
    unknown_fields: set[int] = field(default_factory=set)  # an older host engine: ids it does not know
    profiling_error: int | None = None  # what watching the profiling fields answers (a DCGM_ST_* code)
    blanks: dict[int, str] = field(default_factory=dict)  # field id -> "blank" | "not_supported", on every GPU
    injected: list[Incident] = field(default_factory=list)  # reported once, at the next health check
    field_errors: dict[int, int] = field(default_factory=dict)  # field id -> the status it reads with
    unix_path: str | None = None  # listen on this unix socket (nv-hostengine -d) instead of a TCP port
    calls: Counter[str] = field(default_factory=Counter)
    generation: int = 0
    connects: int = 0
    up: bool = False
    port: int = 0
    _listener: socket.socket | None = None
    _handles: set[int] = field(default_factory=set)
    _next_id: Iterator[int] = field(default_factory=lambda: iter(range(1000, 1_000_000)))
    _groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    _field_groups: dict[int, list[int]] = field(default_factory=dict)
    _watched: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    _updated: set[tuple[int, int, int]] = field(default_factory=set)
    _health: dict[int, int] = field(default_factory=dict)

    # -- the process: listen, die, come back -----------------------------------------------------

    def start(self) -> None:
        if self.unix_path is not None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            Path(self.unix_path).unlink(missing_ok=True)
            listener.bind(self.unix_path)
        else:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restarted on the same port
            listener.bind(("127.0.0.1", self.port))
            self.port = listener.getsockname()[1]
        listener.listen(16)
        self._listener, self.up = listener, True
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    def stop(self) -> None:
        self.up = False
        self._handles.clear()
        if self._listener is not None:
            # shutdown() first: close() alone leaves a socket that a thread blocks in accept() on listening.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def kill(self) -> None:
        """nv-hostengine dies: its port closes, every connection is gone."""
        self.stop()

    def restart(self) -> None:
        """A new nv-hostengine on the same port: nothing of the old one's groups or watches, new gpuIds."""
        self.generation += 1
        self._groups.clear(), self._field_groups.clear(), self._watched.clear(), self._updated.clear()
        self._health.clear()
        self.start()

    @property
    def address(self) -> str:
        return f"unix://{self.unix_path}" if self.unix_path is not None else f"127.0.0.1:{self.port}"

    def count(self, name: str) -> None:
        self.calls[name] += 1

    # -- identities ------------------------------------------------------------------------------

    def gpu_id(self, index: int) -> int:
        n = self.sim.scenario.node.gpus.count
        return (index + 3 * self.generation) % n

    def index(self, gpu_id: int) -> int:
        n = self.sim.scenario.node.gpus.count
        return (gpu_id - 3 * self.generation) % n

    def _migs(self, index: int) -> tuple[SimInstance, ...]:
        shape = self.sim.scenario.node.gpus
        return instances(self.sim.scenario.seed, index, shape.mig_instances.get(index, []), shape.spec)

    def _mig_entities(self) -> Iterator[tuple[int, int, int, SimInstance]]:
        """(GPU index, GPU instance entity, compute instance entity, instance) for every MIG device."""
        for index in range(self.sim.scenario.node.gpus.count):
            for n, inst in enumerate(self._migs(index)):
                base = self.gpu_id(index) * 16
                yield index, base + n, base + 8 + n, inst

    # -- the API ---------------------------------------------------------------------------------

    def load_library(self) -> int:
        return OK if self.has_library else LIBRARY_NOT_FOUND

    def init(self) -> int:
        return OK if self.has_library else LIBRARY_NOT_FOUND

    def connect(self, address: bytes, params: Any) -> tuple[int, Any]:
        wanted = self.unix_path if self.unix_path is not None else self.address
        if (
            not self.up
            or address.decode() != wanted
            or bool(params.addressIsUnixSocket) != (self.unix_path is not None)
        ):
            return CONNECTION_NOT_VALID, None
        handle = next(self._next_id)
        self._handles.add(handle)
        self.connects += 1
        return OK, ctypes.c_void_p(handle)

    def _live(self, handle: Any) -> int:
        return OK if self.up and handle.value in self._handles else CONNECTION_NOT_VALID

    def disconnect(self, handle: Any) -> int:
        ret = self._live(handle)
        self._handles.discard(handle.value)
        return ret

    def supported_devices(self, handle: Any) -> tuple[int, Any]:
        return self._live(handle), [self.gpu_id(i) for i in range(self.sim.scenario.node.gpus.count)]

    def hierarchy(self, handle: Any) -> tuple[int, Any]:
        import dcgm_structs

        out = dcgm_structs.c_dcgmMigHierarchy_v2()
        rows = []
        for index, gi, ci, inst in self._mig_entities():
            parent = (FE_GPU, self.gpu_id(index))
            rows.append(((FE_GPU_I, gi), parent, inst))
            rows.append(((FE_GPU_CI, ci), (FE_GPU_I, gi), inst))
        for slot, (entity, parent, inst) in zip(out.entityList, rows, strict=False):
            slot.entity.entityGroupId, slot.entity.entityId = entity
            slot.parent.entityGroupId, slot.parent.entityId = parent
            slot.info.nvmlInstanceId = inst.mig.gpu_instance
            slot.info.nvmlComputeInstanceId = inst.mig.compute_instance
            slot.info.nvmlProfileSlices = inst.slices
        out.count = len(rows)
        return self._live(handle), out

    def nvlink_status(self, handle: Any) -> tuple[int, Any]:
        import dcgm_structs

        out = dcgm_structs.c_dcgmNvLinkStatus_v3()
        n = self.sim.scenario.node.gpus.count
        out.numGpus = n
        for index in range(n):
            slot = out.gpus[index]
            slot.entityId = self.gpu_id(index)
            try:
                links = self._read(index, Collector.NVLINK)
            except GpuLostError:
                continue
            assert isinstance(links, NvLink)
            for link in links.links:
                slot.linkState[link.link] = 3 if link.up else 2
        return self._live(handle), out

    def group_create(self, handle: Any, kind: int, name: bytes) -> tuple[int, Any]:
        group = next(self._next_id)
        self._groups[group] = []
        return self._live(handle), ctypes.c_void_p(group)

    def group_add(self, handle: Any, group: Any, entity_group: int, entity: int) -> tuple[int, int]:
        if group.value not in self._groups:
            return NOT_CONFIGURED, NOT_CONFIGURED
        self._groups[group.value].append((entity_group, entity))
        return self._live(handle), OK

    def group_destroy(self, handle: Any, group: Any) -> tuple[int, int]:
        return (self._live(handle) if self._groups.pop(group.value, None) is not None else NOT_CONFIGURED), OK

    def field_group_create(self, handle: Any, ids: list[int], name: bytes) -> tuple[int, Any]:
        if len(ids) > 128 or not ids:
            return BADPARAM, None
        if set(ids) & self.unknown_fields:
            return UNKNOWN_FIELD, None
        fg = next(self._next_id)
        self._field_groups[fg] = list(ids)
        return self._live(handle), ctypes.c_void_p(fg)

    def field_group_destroy(self, handle: Any, fg: Any) -> tuple[int, int]:
        return (self._live(handle) if self._field_groups.pop(fg.value, None) is not None else NOT_CONFIGURED), OK

    def watch(self, handle: Any, group: Any, fg: Any, every_us: int, keep: float, samples: int) -> tuple[int, int]:
        if (ret := self._live(handle)) != OK:
            return ret, ret
        if group.value not in self._groups or fg.value not in self._field_groups:
            return NOT_CONFIGURED, NOT_CONFIGURED
        ids = self._field_groups[fg.value]
        if self.profiling_error is not None and any(i >= 1001 for i in ids):
            return self.profiling_error, self.profiling_error
        assert every_us > 0 and keep > 0
        for entity in self._groups[group.value]:
            self._watched.setdefault(entity, set()).update(ids)
        return OK, OK

    def watched_by_another_client(self, ids: list[int]) -> None:
        """dcgm-exporter, say, watches these fields on every GPU: watches are the host engine's, not a client's."""
        for index in range(self.sim.scenario.node.gpus.count):
            entity = (FE_GPU, self.gpu_id(index))
            self._watched.setdefault(entity, set()).update(ids)
            self._updated.update((*entity, i) for i in ids)

    def update_all(self, handle: Any, wait: int) -> tuple[int, int]:
        for entity, ids in self._watched.items():
            self._updated.update((*entity, i) for i in ids)
        return self._live(handle), OK

    def latest_values(self, handle: Any, entities: list[Any], ids: list[int], flags: int) -> tuple[int, Any]:
        import dcgm_structs

        out = (dcgm_structs.c_dcgmFieldValue_v2 * (len(entities) * len(ids)))()
        slots = iter(out)
        for pair in entities:
            entity = (int(pair.entityGroupId), int(pair.entityId))
            readings = _Readings(self, self._index_of(entity))
            for field_id in ids:
                slot = next(slots)
                slot.entityGroupId, slot.entityId, slot.fieldId = *entity, field_id
                if field_id in self.field_errors:
                    slot.status = self.field_errors[field_id]
                elif not flags & 1 and field_id not in self._watched.get(entity, ()):
                    slot.status = NOT_WATCHED
                elif not flags & 1 and (*entity, field_id) not in self._updated:
                    slot.status = NO_DATA
                else:
                    try:
                        self._fill(slot, field_id, self._value(entity, readings, field_id))
                    except GpuLostError:
                        slot.status = GPU_IS_LOST
        return self._live(handle), out

    def health_set(self, handle: Any, group: Any, systems: int) -> tuple[int, int]:
        self._health[group.value] = systems
        return self._live(handle), OK

    def health_check(self, handle: Any, group: Any) -> tuple[int, Any]:
        import dcgm_structs

        out = dcgm_structs.c_dcgmHealthResponse_v5()
        systems = self._health.get(group.value, 0)
        found = [i for i in self._conditions() + self.injected if i.system & systems]
        self.injected = []
        for slot, incident in zip(out.incidents, found, strict=False):
            slot.system, slot.health = incident.system, incident.result
            slot.error.msg, slot.error.code = incident.message.encode(), incident.code
            slot.entityInfo.entityGroupId, slot.entityInfo.entityId = FE_GPU, self.gpu_id(incident.gpu)
        out.incidentCount = len(found)
        out.overallHealth = max((i.result for i in found), default=0)
        return self._live(handle), out

    # -- what the simulator says, in DCGM's terms ------------------------------------------------

    def _read(self, index: int, collector: Collector) -> Reading:
        return self.sim.read(self.sim.discover()[index], collector).reading

    def _index_of(self, entity: tuple[int, int]) -> int:
        group, eid = entity
        if group == FE_GPU:
            return self.index(eid)
        return next(i for i, gi, ci, _ in self._mig_entities() if eid in (gi, ci))

    def _conditions(self) -> list[Incident]:
        out = []
        for index in range(self.sim.scenario.node.gpus.count):
            try:
                ecc, remap, clocks, links = (
                    self._read(index, c)
                    for c in (Collector.ECC, Collector.REMAPPING, Collector.CLOCKS, Collector.NVLINK)
                )
            except GpuLostError:
                continue
            assert isinstance(ecc, Ecc) and isinstance(remap, Remapping) and isinstance(clocks, Clocks)
            assert isinstance(links, NvLink)
            if ecc.uncorrected_volatile:
                out.append(
                    Incident(
                        index,
                        0x10,
                        20,
                        4,
                        f"Detected {ecc.uncorrected_volatile} volatile DBE(s) in GPU {self.gpu_id(index)}.",
                    )
                )
            if remap.pending:
                out.append(
                    Incident(index, 0x10, 10, 85, f"GPU {self.gpu_id(index)} has a pending row remap; reset it.")
                )
            down = [link.link for link in links.links if not link.up]
            if down:
                out.append(
                    Incident(index, 0x2, 20, 14, f"GPU {self.gpu_id(index)}'s NvLink link {down[0]} is currently down")
                )
            if (clocks.event_reasons or 0) & ClockEventReason.HW_POWER_BRAKE_SLOWDOWN.bit:
                out.append(
                    Incident(index, 0x100, 10, 23, f"Clocks of GPU {self.gpu_id(index)} are held down by a power brake")
                )
            if (clocks.event_reasons or 0) & _THERMAL:
                out.append(
                    Incident(
                        index, 0x80, 10, 22, f"Clocks of GPU {self.gpu_id(index)} are held down by a thermal violation"
                    )
                )
        return out

    def _value(self, entity: tuple[int, int], r: _Readings, field_id: int) -> tuple[str, Any]:
        """(DCGM field type, value in DCGM's units; None when the GPU does not have it)."""
        group, eid = entity
        if field_id in self.unknown_fields:
            return "i", None
        if group != FE_GPU:
            return self._mig_value(group, eid, r, field_id)
        if field_id not in GPU_FIELDS:
            return "i", None
        kind, collector, get = GPU_FIELDS[field_id]
        return kind, get(None if collector is None else r[collector], (self, r.index))

    def _mig_value(self, group: int, eid: int, r: _Readings, field_id: int) -> tuple[str, Any]:
        *_, inst = next(row for row in self._mig_entities() if eid in row[1:3])
        memory = next(m for m in r[Collector.MEMORY].instances if m.instance == inst.mig)  # type: ignore[attr-defined]
        profiling = r[Collector.PROFILING]
        assert isinstance(profiling, Profiling)
        activity = next(p.activity for p in profiling.instances if p.instance == inst.mig)
        table: dict[int, tuple[str, Callable[[], Any]]] = {
            50: ("s", lambda: inst.mig.profile if group == FE_GPU_I else "NVIDIA H100 80GB HBM3 MIG"),
            54: ("s", lambda: inst.mig.uuid),
            250: ("i", lambda: memory.total_bytes // MIB),
            252: ("i", lambda: round(memory.used_bytes / MIB)),
            **{i: ("d", lambda name=name: getattr(activity, name)) for i, name in PROF_ACTIVITY.items()},
        }
        if field_id == 1005 and group != FE_GPU_I:
            return "d", None  # DRAM activity is the GPU instance's
        kind, get = table.get(field_id, ("i", lambda: None))
        return kind, get()

    def _fill(self, slot: Any, field_id: int, typed: tuple[str, Any]) -> None:
        kind, value = typed
        slot.status, slot.fieldType, slot.ts = OK, ord(kind), int(time.time() * 1e6)
        if field_id in self.blanks:
            value = (_BLANK if self.blanks[field_id] == "blank" else _NOT_SUPPORTED)[kind]
        elif value is None:
            value = _NOT_SUPPORTED[kind]
        if kind == "s":
            slot.value.str = str(value).encode()
        elif kind == "d":
            slot.value.dbl = float(value)
        else:
            slot.value.i64 = int(value)
