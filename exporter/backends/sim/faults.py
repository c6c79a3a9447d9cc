"""Simulator faults: what can go wrong with a simulated GPU, and the book of faults now active.

A fault is either instantaneous (an XID, a burst of ECC errors: it happens once, at injection, and
what it did stays, as on real hardware) or a condition that lasts until it is cleared or its
`duration_seconds` runs out (a lost GPU, a GPU reset, a hung driver call, a slowdown, a link down).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpu_triage.exporter.backends.collectors import Collector

# A hung call waits on a threading timeout, which overflows (every poll) far below 1e300 s; 30 days is
# longer than any fault needs to last. No node has more GPUs than MAX_GPU.
MAX_DURATION_SECONDS = 30 * 86400.0
MAX_GPU = 4095


class FaultKind(StrEnum):
    XID = "xid"
    GPU_LOST = "gpu_lost"
    GPU_RESET = "gpu_reset"  # a reset in flight: the GPU is unreachable until it ends, then answers again
    # The GPU's NVML handles stop naming it, as after an unbind and a rebind: INVALID_ARGUMENT on the vGPU
    # until the backend looks the GPU up again.
    STALE_HANDLE = "stale_handle"
    HUNG_CALL = "hung_call"
    THERMAL_SLOWDOWN = "thermal_slowdown"
    POWER_SLOWDOWN = "power_slowdown"
    ECC_CORRECTABLE = "ecc_correctable"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    NVLINK_DOWN = "nvlink_down"

    @property
    def instantaneous(self) -> bool:
        return self in _INSTANTANEOUS


_INSTANTANEOUS = frozenset({FaultKind.XID, FaultKind.ECC_CORRECTABLE, FaultKind.ECC_UNCORRECTABLE})


class FaultSpec(BaseModel):
    """A fault as written in a scenario file or posted to `POST /api/v1/sim/faults`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: int = Field(ge=0, le=MAX_GPU, description="NVML index of the GPU")
    kind: FaultKind
    xid: int | None = Field(default=None, ge=1, le=65535, description="XID code (kind xid)")
    message: str | None = Field(default=None, max_length=1024, description="XID message text (kind xid)")
    gpu_instance: int | None = Field(
        default=None, ge=0, le=14, description="the MIG GPU instance the XID is in (kind xid; absent: the whole GPU)"
    )
    compute_instance: int | None = Field(
        default=None, ge=0, le=7, description="the compute instance in it (kind xid, with gpu_instance)"
    )
    count: int = Field(default=1, ge=1, le=1_000_000, description="errors to add (kind ecc_correctable)")
    link: int | None = Field(default=None, ge=0, description="NVLink link index (kind nvlink_down)")
    collector: Collector | None = Field(default=None, description="the call that hangs (hung_call; all)")
    duration_seconds: float | None = Field(
        default=None, gt=0, le=MAX_DURATION_SECONDS, description="absent: until cleared (at most 30 days)"
    )

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> Self:
        problems = []
        if (self.kind is FaultKind.XID) != (self.xid is not None):
            problems.append("'xid' is required for kind xid and only allowed there")
        if (self.kind is FaultKind.NVLINK_DOWN) != (self.link is not None):
            problems.append("'link' is required for kind nvlink_down and only allowed there")
        if self.collector is not None and self.kind is not FaultKind.HUNG_CALL:
            problems.append("'collector' is only allowed for kind hung_call")
        if self.message is not None and self.kind is not FaultKind.XID:
            problems.append("'message' is only allowed for kind xid")
        if self.gpu_instance is not None and self.kind is not FaultKind.XID:
            problems.append("'gpu_instance' is only allowed for kind xid")
        if self.compute_instance is not None and self.gpu_instance is None:
            problems.append("'compute_instance' needs 'gpu_instance'")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ScheduledFault(FaultSpec):
    """A fault in a scenario file, starting `at_seconds` after the scenario starts."""

    at_seconds: float = Field(ge=0, le=MAX_DURATION_SECONDS)


@dataclass(frozen=True, slots=True)
class ActiveFault:
    id: str
    spec: FaultSpec
    started_at: float
    source: str  # "scenario" or "api"

    @property
    def ends_at(self) -> float | None:
        if self.spec.duration_seconds is None:
            return None
        return self.started_at + self.spec.duration_seconds

    def active_at(self, t: float) -> bool:
        end = self.ends_at
        return self.started_at <= t and (end is None or t < end)

    def to_json(self) -> dict[str, object]:
        spec = self.spec.model_dump(exclude_none=True, mode="json")
        if self.spec.kind is not FaultKind.ECC_CORRECTABLE:
            del spec["count"]
        return {
            "id": self.id,
            **spec,
            "started_at": self.started_at,
            "ends_at": self.ends_at,
            "source": self.source,
        }


@dataclass
class FaultBook:
    """The faults on the simulated node. Thread-safe: the API adds, pollers and the clock read."""

    _faults: dict[str, ActiveFault] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Set whenever a fault is removed, so a simulated hung call can stop hanging.
    changed: threading.Condition = field(init=False)
    # No fault in the book runs out before this, so the `expire` of every read takes no lock until one may have.
    # Written under the lock; a removal leaves it early, which costs one locked `expire` that sets it again.
    _next_end: float = math.inf

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self._lock)

    def add(self, spec: FaultSpec, started_at: float, source: str) -> ActiveFault:
        """The fault, with its id; kept while in effect, which an instantaneous one never is after now."""
        with self._lock:
            fault = ActiveFault(f"f{next(self._ids)}", spec, started_at, source)
            if not spec.kind.instantaneous:
                self._faults[fault.id] = fault
                if fault.ends_at is not None:
                    self._next_end = min(self._next_end, fault.ends_at)
            return fault

    def remove(self, fault_id: str) -> bool:
        with self._lock:
            found = self._faults.pop(fault_id, None) is not None
            self.changed.notify_all()
            return found

    def clear(self) -> int:
        with self._lock:
            n = len(self._faults)
            self._faults.clear()
            self.changed.notify_all()
            return n

    def expire(self, now: float) -> None:
        if now < self._next_end:
            return
        with self._lock:
            ended = [f.id for f in self._faults.values() if f.ends_at is not None and f.ends_at <= now]
            for fault_id in ended:
                del self._faults[fault_id]
            if ended:
                self.changed.notify_all()
            ends = [f.ends_at for f in self._faults.values() if f.ends_at is not None]
            self._next_end = min(ends, default=math.inf)

    def all(self) -> list[ActiveFault]:
        with self._lock:
            return list(self._faults.values())

    def lasting(self, gpu: int) -> list[ActiveFault]:
        """All lasting faults of `gpu`, whenever they are in effect."""
        with self._lock:
            return [f for f in self._faults.values() if f.spec.gpu == gpu and not f.spec.kind.instantaneous]

    def wait_until_gone(self, ids: set[str], clock: Callable[[], float]) -> None:
        """Block until none of the faults `ids` is in the book any more, or all have run out."""
        with self.changed:
            while True:
                now = clock()
                live = [f for f in self._faults.values() if f.id in ids and (f.ends_at is None or f.ends_at > now)]
                if not live:
                    return
                ends = [f.ends_at for f in live]
                self.changed.wait(None if None in ends else max(e for e in ends if e is not None) - now)

    def on(self, gpu: int, t: float) -> list[ActiveFault]:
        """The lasting faults of `gpu` in effect at time `t`."""
        if not self._faults:  # the usual case, read without the lock: a node with no fault on it
            return []
        with self._lock:
            return [
                f
                for f in self._faults.values()
                if f.spec.gpu == gpu and not f.spec.kind.instantaneous and f.active_at(t)
            ]
