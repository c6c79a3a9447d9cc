"""The diagnosis API: the node's verdict, the XID history, what a code means, acknowledgements."""

from __future__ import annotations

import re
import threading
import time
import zlib
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from gpu_triage.diagnosis.xid_data import load_catalog
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.gpus import gpu_or_404
from gpu_triage.exporter.log_input import InputTooLargeError, decoded
from gpu_triage.exporter.settings import parse_duration

MAX_CONCURRENT_DIAGNOSES = 2


def parse_time(value: str, now: float) -> float:
    """'1767225600' (unix seconds), '2026-11-30T08:00:00Z' (ISO 8601) or '30m' (that long ago)."""
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    try:
        return float(now - parse_duration(text))
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise HTTPException(
            422, f"{value!r} is not a time: use unix seconds, ISO 8601 or a duration like 30m"
        ) from None


def xid_json(code: int) -> dict[str, Any]:
    entry = load_catalog().get(code)
    if entry is None:
        raise HTTPException(
            404, f"Xid {code} is not in NVIDIA's catalog (this version knows {len(load_catalog())} codes)"
        )
    return {
        "xid": entry.code,
        "mnemonic": entry.mnemonic,
        "nvidia_description": entry.nvidia_description,
        "title": entry.title,
        "causes": list(entry.causes),
        "severity": entry.severity.value,
        "action": entry.action.value,
        "action_description": entry.action.description,
        "nvidia_immediate_bucket": entry.immediate_bucket,
        "nvidia_investigatory_bucket": entry.investigatory_bucket,
        "deviation": entry.deviation,
        "context": sorted(entry.context),
        "xid154_linked": entry.xid154_linked,
        "applies_to": list(entry.applies_to),
        "playbook": entry.playbook,
        "runbook": f"/runbooks/{entry.playbook}",
    }


def diagnosis_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["diagnosis"])

    @router.get("/diagnosis", summary="The node's verdict: per-GPU health, findings, the one action to take")
    async def diagnosis() -> dict[str, Any]:
        return daemon.diagnosis()

    @router.get("/events", summary="Journaled XID and SXID events, oldest first, filterable")
    def events(
        gpu: Annotated[int | None, Query(description="NVML index")] = None,
        uuid: str | None = None,
        xid: Annotated[int | None, Query(description="XID code")] = None,
        kind: Annotated[str | None, Query(pattern="^(xid|sxid)$")] = None,
        since: Annotated[str | None, Query(description="unix seconds, ISO 8601, or a duration ago (1h)")] = None,
        until: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        now = time.time()
        found = daemon.journal.events(
            since=parse_time(since, now) if since else None,
            until=parse_time(until, now) if until else None,
            uuid=uuid,
            gpu_index=gpu,
            code=xid,
            kind=kind,
            limit=limit,
        )
        return {"events": [e.to_json() for e in found]}

    @router.get("/xid/{code}", summary="What an XID code means and what to do about it")
    async def explain(code: int) -> dict[str, Any]:
        return xid_json(code)

    @router.post("/gpus/{gpu}/acknowledge", summary="Mark a GPU's XID findings so far as dealt with")
    def acknowledge(gpu: int, note: Annotated[str, Body(embed=True, max_length=1000)] = "") -> dict[str, Any]:
        daemon.acknowledge(gpu_or_404(daemon, gpu).identity.uuid, note)
        gpus: list[dict[str, Any]] = daemon.diagnosis()["gpus"]
        return next(g for g in gpus if g["gpu"] == gpu)

    return router


def diagnose_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["diagnosis"])
    limit = daemon.settings.diagnose_max_bytes
    mib = f"{limit / 2**20:g} MiB"
    # Each request may hold `limit` bytes: a few at a time, so a burst of uploads cannot exhaust memory.
    slots = threading.BoundedSemaphore(MAX_CONCURRENT_DIAGNOSES)

    @router.post(
        "/diagnose",
        summary="Diagnose kernel and training logs: root cause first (text/plain body, optionally gzip)",
        responses={413: {"description": f"body over the limit ({mib} by default)"}},
    )
    async def diagnose(request: Request) -> dict[str, Any]:
        if not slots.acquire(blocking=False):
            raise HTTPException(429, f"{MAX_CONCURRENT_DIAGNOSES} diagnoses are running already; try again shortly")
        try:
            return await _diagnose(request)
        finally:
            slots.release()

    async def _diagnose(request: Request) -> dict[str, Any]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"the log is over the {mib} limit (--diagnose.max-bytes); send less")
            chunks.append(chunk)
        if size == 0:
            raise HTTPException(422, "empty body: POST the log text (text/plain, optionally gzip-compressed)")

        def run() -> dict[str, Any]:
            from gpu_triage.diagnosis.training import diagnose as diagnose_logs

            return diagnose_logs([(None, decoded(chunks, limit))]).to_json()

        try:
            report = await run_in_threadpool(run)
        except InputTooLargeError:
            raise HTTPException(
                413, f"the log decompresses to more than the {mib} limit (--diagnose.max-bytes)"
            ) from None
        except (zlib.error, EOFError) as e:
            raise HTTPException(422, f"the body looks gzip-compressed but does not decompress: {e}") from None
        if report["summary"]["lines_read"] == 0:
            raise HTTPException(422, "no log lines read: the body decompresses to nothing")
        return report

    return router
