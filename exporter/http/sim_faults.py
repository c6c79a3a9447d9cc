"""/api/v1/sim/faults: inject and clear simulator faults (mounted with --backend sim, and by `gpu-triage vgpu`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Response

from gpu_triage.exporter.backends.sim import FaultError, FaultSpec, SimBackend


def sim_router(sim: SimBackend, changed: Callable[[], None]) -> APIRouter:
    """`changed` is called after each change, to show its effect now rather than at the next poll."""
    router = APIRouter(prefix="/api/v1/sim", tags=["simulator"])

    @router.get("/faults", summary="Faults in effect on the simulated node")
    async def list_faults() -> dict[str, Any]:
        return {"faults": [f.to_json() for f in sim.faults()]}

    @router.post("/faults", status_code=201, summary="Inject a fault")
    async def inject(spec: FaultSpec) -> dict[str, Any]:
        try:
            fault = sim.inject(spec)
        except FaultError as e:
            raise HTTPException(422, str(e)) from e
        changed()
        return fault.to_json()

    @router.delete("/faults/{fault_id}", status_code=204, summary="Clear one fault")
    async def clear(fault_id: str) -> Response:
        if not sim.clear_fault(fault_id):
            raise HTTPException(404, f"no active fault {fault_id!r}")
        changed()
        return Response(status_code=204)

    @router.delete("/faults", summary="Clear every fault")
    async def clear_all() -> dict[str, int]:
        cleared = sim.clear_faults()
        changed()
        return {"cleared": cleared}

    return router
