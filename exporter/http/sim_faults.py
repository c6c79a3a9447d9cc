"""/api/v1/sim/faults: inject and clear simulator faults (mounted with --backend sim, and by `gpu-triage vgpu`).

Each change answers once `shown` says its effect is visible: the daemon's waits until a poll has read the
GPUs since and /metrics and the verdict show it (a hung call makes that poll wait out its deadline), so
`curl -XPOST ...; curl .../metrics` sees the effect. XIDs come through the event path instead, as they
do from NVML, and show a moment later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import Field, ValidationError
from starlette.concurrency import run_in_threadpool

from gpu_triage.exporter.backends.sim import FaultError, FaultSpec, SimBackend
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.api_models import ApiModel


class FaultOut(ApiModel):
    """An active fault: the spec as posted (keys it did not give are absent), and when it started and ends."""

    id: str
    gpu: int
    kind: str = Field(description="as posted: xid, gpu_lost, hung_call...")
    xid: int | None = None
    message: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    count: int | None = None
    link: int | None = None
    collector: str | None = None
    duration_seconds: float | None = None
    started_at: float
    ends_at: float | None
    source: str


class Faults(ApiModel):
    faults: list[FaultOut]


class Cleared(ApiModel):
    cleared: int


def shown_by(daemon: Daemon) -> Callable[[], Awaitable[None]]:
    """Wait, for a poll's deadline at most, for a snapshot taken after now, then render it."""

    async def shown() -> None:
        before = daemon.snapshot
        daemon.poll_soon()
        deadline = time.monotonic() + daemon.settings.read_timeout + 1.0
        while daemon.snapshot is before and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # The poll renders its snapshot too, but may not have finished: render once more, in order after it.
        await run_in_threadpool(daemon.refresh)

    return shown


def sim_router(sim: SimBackend, shown: Callable[[], Awaitable[None]]) -> APIRouter:
    router = APIRouter(prefix="/api/v1/sim", tags=["simulator"])

    @router.get("/faults", summary="Faults in effect on the simulated node", response_model_exclude_unset=True)
    async def list_faults() -> Faults:
        return Faults(faults=[FaultOut.model_validate(f.to_json()) for f in sim.faults()])

    @router.post("/faults", status_code=201, summary="Inject a fault", response_model_exclude_unset=True)
    async def inject(spec: FaultSpec, request: Request) -> FaultOut:
        # Strict types on top of the model's checks: JSON's true is no GPU 1, and "3" or 3.0 no GPU 3.
        try:
            spec = FaultSpec.model_validate_json(await request.body(), strict=True)
        except ValidationError as e:
            raise RequestValidationError(e.errors(include_url=False, include_context=False)) from e
        try:
            fault = sim.inject(spec)
        except FaultError as e:
            raise HTTPException(422, str(e)) from e
        await shown()
        return FaultOut.model_validate(fault.to_json())

    @router.delete("/faults/{fault_id}", status_code=204, summary="Clear one fault")
    async def clear(fault_id: str) -> Response:
        if not sim.clear_fault(fault_id):
            raise HTTPException(404, f"no active fault {fault_id!r}")
        await shown()
        return Response(status_code=204)

    @router.delete("/faults", summary="Clear every fault")
    async def clear_all() -> Cleared:
        cleared = sim.clear_faults()
        await shown()
        return Cleared(cleared=cleared)

    return router
