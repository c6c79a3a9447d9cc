"""The HTTP app: /metrics from the cache, the landing page, health probes, and the JSON API."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gpu_triage import __version__
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.diagnosis import DIAGNOSE_PATH, diagnose_router, diagnosis_router
from gpu_triage.exporter.http.errors import error
from gpu_triage.exporter.http.gpus import gpus_router
from gpu_triage.exporter.http.guard import BodyLimit, HeadAsGet, WriteGuard, own_host_names
from gpu_triage.exporter.http.landing import landing_page
from gpu_triage.exporter.http.runbooks import runbooks_router
from gpu_triage.exporter.http.web_config import WebConfig, WebConfigMiddleware

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.sim import SimBackend

log = logging.getLogger(__name__)


def create_app(daemon: Daemon, web: WebConfig | None = None) -> FastAPI:
    app = FastAPI(
        title="gpu-triage",
        version=__version__,
        description="GPU telemetry, XID and training-log diagnosis, remediation playbooks.",
        docs_url=None,  # Swagger UI loads from a CDN, which GPU nodes often cannot reach
        redoc_url=None,
    )
    _add_error_handlers(app)
    settings = daemon.settings
    # The last added runs first: HEAD as GET, basic auth, then the write checks, then the body's size and time.
    app.add_middleware(
        BodyLimit,
        timeout=settings.web_read_timeout,
        streamed={DIAGNOSE_PATH: (settings.diagnose_max_bytes, " (--diagnose.max-bytes); send less")},
    )
    app.add_middleware(
        WriteGuard,
        read_only=settings.web_read_only,
        not_writes=frozenset({DIAGNOSE_PATH}),
        host_names=own_host_names(settings.web_listen_address, settings.web_allowed_hosts),
    )
    if web is not None and (web.users or web.headers):
        # kubelet's probes cannot send credentials, and say no more than "alive" and "ready".
        app.add_middleware(WebConfigMiddleware, config=web, open_paths=frozenset({"/healthz", "/readyz"}))
    app.add_middleware(HeadAsGet)
    telemetry_path = settings.web_telemetry_path

    @app.get(telemetry_path, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        accept, encoding = request.headers.get("accept"), request.headers.get("accept-encoding")
        # The first scrape of a change builds the page: in the thread pool, so the event loop keeps answering.
        scrape = daemon.metrics.cached(accept, encoding)
        if scrape is None:
            scrape = await run_in_threadpool(daemon.metrics.get, accept, encoding)
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if scrape.gzipped else None
        return Response(scrape.body, media_type=scrape.content_type, headers=headers)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def landing() -> HTMLResponse:  # a journal query: run in the thread pool, not on the event loop
        return landing_page(daemon)

    @app.get("/healthz", summary="Liveness: the daemon's poll loop is turning")
    async def healthz() -> Response:
        if daemon.alive():
            return JSONResponse({"status": "ok"})
        return error(503, "the poll loop has stopped turning")

    @app.get("/readyz", summary="Readiness: a backend is up and the snapshot is fresh")
    async def readyz() -> Response:
        reason = daemon.readiness()
        if reason is None:
            return JSONResponse({"status": "ready"})
        return error(503, f"not ready: {reason}")

    app.include_router(gpus_router(daemon))
    app.include_router(diagnosis_router(daemon))
    app.include_router(diagnose_router(daemon))
    app.include_router(
        runbooks_router(
            daemon.verdicts.open_findings,
            lambda: {g.identity.pci_bus_id: g.identity.index for g in daemon.snapshot.gpus},
        )
    )
    if daemon.backend.name == "sim":
        # Imported here: the simulator's scenario and fault models are no load for a daemon on real GPUs.
        from gpu_triage.exporter.http.sim_faults import shown_by, sim_router

        app.include_router(sim_router(cast("SimBackend", daemon.backend), shown_by(daemon)))
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {request.url.path}"
            if request.url.path.startswith("/api/v1/sim"):
                message += " (fault injection needs the simulator: run gpu-triage with --backend sim)"
        return error(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"] if p != "body") or "body"
            problems.append(f"{where}: {str(err['msg']).removeprefix('Value error, ')}")
        return error(422, "invalid request: " + "; ".join(problems), problems=problems)

    @app.exception_handler(ClientDisconnect)
    async def hung_up(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client's doing (a slow upload given up): nothing to log, and no one to read the answer.
        return error(400, "the client hung up before its request arrived")

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed", extra={"path": request.url.path})
        return error(500, f"internal error: {type(exc).__name__}")
