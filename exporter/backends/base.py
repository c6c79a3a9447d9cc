"""The backend contract: what a source of GPU telemetry (NVML, DCGM, the simulator) must provide.

A backend finds the GPUs once (`discover`) and then answers `read(gpu, collector)` for one group
of fields of one GPU. The poller calls `read` from worker threads with a deadline, so a backend
may block (a sick driver does); it never has to time itself out.

Failures are reported at three sizes:
- a field the GPU does not have ("not supported") is `None` in the reading: not an error;
- a field that failed for another reason is named in `Result.failed_fields`;
- a GPU that is gone raises `GpuLostError`; a backend that is broken as a whole raises `BackendError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpu_triage.exporter.backends.collectors import Collector

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.readings import Reading


class BackendError(Exception):
    """The backend cannot work at all (library missing, driver not loaded, host engine gone)."""


class GpuLostError(Exception):
    """The GPU stopped answering the way NVML's GPU_IS_LOST / RESET_REQUIRED say it has."""


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int  # NVML index: the `gpu` label
    uuid: str  # "GPU-…": the `uuid` label
    pci_bus_id: str  # canonical "dddd:bb:dd.f"


@dataclass(frozen=True, slots=True)
class Result:
    """One collector's reading of one GPU, with the fields that failed (not merely unsupported)."""

    reading: Reading
    failed_fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DriverXid:
    """An XID reported by the driver's event API (NVML events, or the simulator's injection)."""

    gpu: int
    code: int
    timestamp: float
    message: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    # The MIG instance the driver attributes it to (NVML's gpuInstanceId, computeInstanceId); None: the whole GPU.
    gpu_instance: int | None = None
    compute_instance: int | None = None


class GpuBackend(Protocol):
    name: str
    why: str  # why this backend serves the node: the flag that named it, or what `--backend auto` found

    def discover(self) -> list[GpuIdentity]:
        """The GPUs of this node, in NVML index order."""
        ...

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        """Read one collector's fields of one GPU. May block; may raise GpuLostError or BackendError."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class XidEventSource(Protocol):
    """A backend that reports XIDs as they happen (NVML's event API, the simulator)."""

    @property
    def reports_xids(self) -> bool:
        """Whether this instance has an event source at all (DCGM without NVML beside it has none)."""
        ...

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs that arrived since the last call, waiting up to `timeout_seconds` for the first."""
        ...
