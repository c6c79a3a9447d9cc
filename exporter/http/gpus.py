"""GET /api/v1/gpus: what the last poll read from each GPU, as JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, cast

from fastapi import APIRouter, HTTPException, Path
from pydantic import JsonValue

from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.api_models import GpuReadings, Gpus
from gpu_triage.exporter.polling.snapshot import GpuState
from gpu_triage.exporter.workloads.placement import Assignment

# A bound on what a client may name: beyond it no GPU could match, and SQLite could not even store the
# number. Checked by the API (422), never left to fail deeper down (500).
MAX_GPU_INDEX = 4095
GpuIndex = Annotated[int, Path(ge=0, le=MAX_GPU_INDEX, description="NVML index")]


def _plain(value: object) -> JsonValue:
    if isinstance(value, Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return cast(JsonValue, value)


def gpu_json(state: GpuState, workloads: Sequence[Assignment] = ()) -> GpuReadings:
    identity = state.identity
    readings = {collector.value: _plain(dataclasses.asdict(reading)) for collector, reading in state.readings.items()}
    return GpuReadings.model_validate(
        {
            "gpu": identity.index,
            "uuid": identity.uuid,
            "pci_bus_id": identity.pci_bus_id,
            "status": state.status,
            "problems": {c.value: p for c, p in state.problems.items()},
            "workloads": [a.workload.to_json() for a in workloads],  # the pods and Slurm jobs using it
            **readings,  # one key per collector that answered; the model writes them in its order (sorted)
        }
    )


def gpu_or_404(daemon: Daemon, gpu: int) -> GpuState:
    """The GPU with NVML index `gpu`, or a 404 that says which indexes there are."""
    snapshot = daemon.snapshot
    state = snapshot.gpu(gpu)
    if state is None:
        raise HTTPException(404, f"no GPU {gpu}: this node has {len(snapshot.gpus)} GPUs")
    return state


def gpus_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["gpus"])

    @router.get("/gpus", summary="Every GPU with its latest readings", response_model_exclude_unset=True)
    async def gpus() -> Gpus:
        snapshot = daemon.snapshot
        return Gpus(
            backend=snapshot.backend,
            backend_reason=daemon.backend.why,
            backend_problem=snapshot.backend_problem,
            taken_at=snapshot.taken_at or None,
            workload_sources=daemon.workloads.status(),
            gpus=[gpu_json(g, daemon.gpu_workloads.get(g.identity.uuid, ())) for g in snapshot.gpus],
        )

    @router.get("/gpus/{gpu}", summary="One GPU by NVML index", response_model_exclude_unset=True)
    async def gpu(gpu: GpuIndex) -> GpuReadings:
        state = gpu_or_404(daemon, gpu)
        return gpu_json(state, daemon.gpu_workloads.get(state.identity.uuid, ()))

    return router
