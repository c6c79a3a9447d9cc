"""/api/v1/sim/faults: inject and clear simulator faults (mounted only with --backend sim)."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, HTTPException, Response

from gpu_triage.exporter.backends.sim import FaultError, FaultSpec, SimBackend
from gpu_triage.exporter.daemon import Daemon


def sim_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1/sim", tags=["simulator"])
    sim = cast(SimBackend, daemon.backend)

    @router.get("/faults", summary="Faults in effect on the simulated node")
    async def list_faults() -> dict[str, Any]:
        return {"faults": [f.to_json() for f in sim.faults()]}

    @router.post("/faults", status_code=201, summary="Inject a fault")
    async def inject(spec: FaultSpec) -> dict[str, Any]:
        try:
            fault = sim.inject(spec)
        except FaultError as e:
            raise HTTPException(422, str(e)) from e
        daemon.poll_soon()  # show its effect now rather than at the next poll
        return fault.to_json()

    @router.delete("/faults/{fault_id}", status_code=204, summary="Clear one fault")
    async def clear(fault_id: str) -> Response:
        if not sim.clear_fault(fault_id):
            raise HTTPException(404, f"no active fault {fault_id!r}")
        daemon.poll_soon()
        return Response(status_code=204)

    @router.delete("/faults", summary="Clear every fault")
    async def clear_all() -> dict[str, int]:
        cleared = sim.clear_faults()
        daemon.poll_soon()
        return {"cleared": cleared}

    return router
