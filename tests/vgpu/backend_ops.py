"""gpu-triage's NVML backend as a worker drives it (`ops` in the worker's scope), answering in plain data.

The worker runs `result = ops.read(2, "nvlink")` and the like, so a test reads like what it checks.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from gpu_triage.exporter.backends.base import BackendError, GpuIdentity, GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend


class _Opened:
    backend: NvmlBackend
    gpus: list[GpuIdentity]


_opened = _Opened()


_now = [0.0]  # the backend's monotonic clock, which `advance` moves (the simulator's moves with it)


def start(proc: str | None = None) -> list[list[Any]]:
    """Opens the backend and discovers; returns each GPU as [index, uuid, pci_bus_id]."""
    _opened.backend = NvmlBackend(proc=Path(proc or "/proc"), monotonic=lambda: _now[0])
    _opened.gpus = _opened.backend.discover()
    return [list(dataclasses.astuple(g)) for g in _opened.gpus]


def advance(seconds: float) -> None:
    """Moves the backend's clock, as the test moves the simulator's: counter rates are over this time."""
    _now[0] += seconds


def read(index: int, collector: str, with_series: bool = False) -> dict[str, Any]:
    """{"reading": fields, "failed": [...]} or {"lost": message}; `series` adds what /metrics shows of it."""
    try:
        result = _opened.backend.read(_opened.gpus[index], Collector(collector))
    except GpuLostError as e:
        return {"lost": str(e)}
    out = {"reading": dataclasses.asdict(result.reading), "failed": list(result.failed_fields)}
    return out | {"series": series(result.reading)} if with_series else out


def series(reading: Any) -> dict[str, Any]:
    """What /metrics shows of a reading: {"family{label values}": value}."""
    out = {}
    for s in reading.samples():
        if s.value is not None:
            labels = ",".join([*s.labels, *(f"{k}={v}" for k, v in s.extra)])
            out[f"{s.family.name}{{{labels}}}"] = float(s.value)
    return out


def xids(timeout: float) -> list[list[int]] | dict[str, str]:
    """[[gpu, code], ...] from one wait, or {"error": message}."""
    try:
        return [[x.gpu, x.code] for x in _opened.backend.wait_xids(timeout)]
    except BackendError as e:
        return {"error": str(e)}


def open_error() -> str | None:
    """What opening the backend by name says when it cannot (None: it opened)."""
    from gpu_triage.exporter.backends.select import open_backend

    try:
        open_backend("nvml").close()
    except BackendError as e:
        return str(e)
    return None


def poll() -> dict[str, Any]:
    """One poll of every collector through the daemon's poller: each GPU's status, each collector's success."""
    from gpu_triage.exporter.polling.poller import Poller

    poller = Poller(_opened.backend, interval=5, slow_interval=60, timeout=5.0)
    poller.discover()
    snapshot = poller.poll(Collector)
    poller.stop()
    return {
        "status": [str(g.status) for g in snapshot.gpus],
        "success": {c.value: s.success for c, s in snapshot.collectors.items()},
    }


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = {k: v for k, v in vars(record).items() if k in ("gpu", "field", "nvml")}
        self.records.append({"level": record.levelname, "msg": record.getMessage(), **fields})


_records = _Records()
logging.getLogger("gpu_triage").addHandler(_records)
logging.getLogger("gpu_triage").setLevel(logging.DEBUG)


def logs() -> list[dict[str, Any]]:
    """What the backend logged so far, as {"level", "msg", and its gpu/field/nvml fields}."""
    return list(_records.records)
