"""The poller's output: an immutable picture of the node that everything downstream reads.

A new Snapshot replaces the old one in a single reference assignment, so readers (a scrape, an
API call, the diagnosis) never see a half-updated node and never wait for the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Reading

R = TypeVar("R", bound=Reading)


def gpu_status(problems: Mapping[Collector, str]) -> str:
    """Lost if any read found the GPU lost, hung if any missed its deadline, else up."""
    values = set(problems.values())
    return GpuStatus.LOST if GpuStatus.LOST in values else GpuStatus.HUNG if values else GpuStatus.UP


@dataclass(frozen=True, slots=True)
class Lost:
    """When the backend first answered that a GPU is lost, and what it answered then."""

    since: float  # wall-clock seconds
    answer: str


@dataclass(frozen=True, slots=True)
class GpuState:
    identity: GpuIdentity
    readings: Mapping[Collector, Reading] = field(default_factory=lambda: MappingProxyType({}))
    # Collectors whose last read found the GPU lost or hung; their readings are dropped.
    problems: Mapping[Collector, str] = field(default_factory=lambda: MappingProxyType({}))
    lost: Lost | None = None  # set while the GPU is lost

    @property
    def status(self) -> str:
        return gpu_status(self.problems)

    @property
    def up(self) -> bool:
        return not self.problems

    def get(self, kind: type[R]) -> R | None:
        """The latest reading of this type, if there is one."""
        for reading in self.readings.values():
            if isinstance(reading, kind):
                return reading
        return None


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    success: bool
    duration_seconds: float
    last_success: float | None  # wall-clock time of its last successful run


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float  # wall-clock time of the poll that produced it; 0 before the first poll
    backend: str
    gpus: tuple[GpuState, ...] = ()
    collectors: Mapping[Collector, CollectorStatus] = field(default_factory=lambda: MappingProxyType({}))
    backend_up: bool = True
    backend_problem: str | None = None  # what the backend said when it failed (the host engine is gone…)
    taken_monotonic: float = 0.0  # monotonic time of that poll: ages are measured with it, not the wall clock

    def gpu(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.identity.index == index), None)
