"""gpu-triage's NVML backend as a worker drives it (`ops` in the worker's scope), answering in plain data.

The worker runs `result = ops.read(2, "nvlink")` and the like, so a test reads like what it checks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpu_triage.exporter.backends.base import BackendError, Collector, GpuIdentity, GpuLostError
from gpu_triage.exporter.backends.nvml import NvmlBackend


class _Opened:
    backend: NvmlBackend
    gpus: list[GpuIdentity]


_opened = _Opened()


def start(proc: str | None = None) -> list[list[Any]]:
    """Opens the backend and discovers; returns each GPU as [index, uuid, pci_bus_id]."""
    _opened.backend = NvmlBackend(proc=Path(proc)) if proc else NvmlBackend()
    _opened.gpus = _opened.backend.discover()
    return [list(dataclasses.astuple(g)) for g in _opened.gpus]


def read(index: int, collector: str) -> dict[str, Any]:
    """{"reading": fields, "failed": [...]} or {"lost": message}."""
    try:
        result = _opened.backend.read(_opened.gpus[index], Collector(collector))
    except GpuLostError as e:
        return {"lost": str(e)}
    return {"reading": dataclasses.asdict(result.reading), "failed": list(result.failed_fields)}


def xids(timeout: float) -> list[list[int]] | dict[str, str]:
    """[[gpu, code], ...] from one wait, or {"error": message}."""
    try:
        return [[x.gpu, x.code] for x in _opened.backend.wait_xids(timeout)]
    except BackendError as e:
        return {"error": str(e)}
