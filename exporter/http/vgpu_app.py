"""`gpu-triage vgpu`: the virtual GPU's driver (exporter/vgpu/driver.py) with the simulator's fault API.

The web side of the command lives here, with the rest of the HTTP layer, so that the driver imports
nothing of it: `POST /api/v1/sim/faults` injects faults as on `gpu-triage serve --backend sim`, and
each change is written to the state file at once rather than at the next tick.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from fastapi import FastAPI

from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.vgpu.driver import VgpuDriver

log = logging.getLogger(__name__)


def driver_app(driver: VgpuDriver) -> FastAPI:
    from gpu_triage.exporter.http.sim_faults import sim_router  # the web stack loads only when serving

    async def shown() -> None:
        driver.changed()

    app = FastAPI(title="gpu-triage vgpu", summary="The simulator driving the virtual GPU's state file")
    app.include_router(sim_router(driver.sim, shown))
    return app


def run(scenario: str, state: Path, listen: str) -> int:
    """`gpu-triage vgpu`: drive the state file and serve the fault API until SIGTERM or SIGINT."""
    import uvicorn

    from gpu_triage.exporter.backends.sim import ScenarioError, load_scenario
    from gpu_triage.exporter.settings import parse_listen_address

    try:
        host, port = parse_listen_address(listen)
        driver = VgpuDriver(SimBackend(load_scenario(scenario)), state)
    except (ScenarioError, ValueError, OSError, RuntimeError) as e:
        print(f"gpu-triage vgpu: cannot start: {e}", file=sys.stderr)
        return 2
    driver.start()
    log.info(
        "driving the virtual GPU",
        extra={"state": str(state), "gpus": len(driver.gpus), "scenario": scenario, "address": listen},
    )
    try:
        uvicorn.run(driver_app(driver), host=host or "0.0.0.0", port=port, log_config=None, access_log=False)
    finally:
        driver.stop()
    return 0
