"""The diagnosis API: the node's verdict, the XID history, what a code means, acknowledgements."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.dump_inputs import ArchiveError, body_inputs
from gpu_triage.exporter.http.api_models import (
    DiagnoseReport,
    Diagnosis,
    Events,
    GpuVerdictOut,
    JournalEvent,
)
from gpu_triage.exporter.http.gpus import MAX_GPU_INDEX, GpuIndex, gpu_or_404
from gpu_triage.exporter.log_input import InputTooLargeError, scan_engine
from gpu_triage.exporter.settings import parse_duration
from gpu_triage.exporter.xid_explain import XidExplanation, unknown_xid, xid_json

log = logging.getLogger(__name__)
MAX_CONCURRENT_DIAGNOSES = 2
MAX_CONCURRENT_UPLOADS = 4
DIAGNOSE_PATH = "/api/v1/diagnose"
MAX_XID = 65535  # XIDs are 16-bit; a larger number is a client's mistake (422), not a SQLite overflow (500)


def parse_time(value: str, now: float) -> float:
    """'1767225600' (unix seconds), '2026-11-30T08:00:00Z' (ISO 8601) or '30m' (that long ago)."""
    text = value.strip()
    seconds: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    else:
        try:
            seconds = float(now - parse_duration(text))
        except ValueError:
            try:
                seconds = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            except (ValueError, OverflowError):
                seconds = None
    if seconds is None or not math.isfinite(seconds):
        raise HTTPException(422, f"{value[:100]!r} is not a time: use unix seconds, ISO 8601 or a duration like 30m")
    return seconds


def diagnosis_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["diagnosis"])

    @router.get(
        "/diagnosis",
        summary="The node's verdict: per-GPU health, findings, the one action to take",
        response_model_exclude_unset=True,
    )
    async def diagnosis() -> Diagnosis:
        return daemon.diagnosis()

    @router.get(
        "/events", summary="Journaled XID and SXID events, oldest first, filterable", response_model_exclude_unset=True
    )
    def events(
        gpu: Annotated[int | None, Query(ge=0, le=MAX_GPU_INDEX, description="NVML index")] = None,
        uuid: Annotated[str | None, Query(max_length=128)] = None,
        xid: Annotated[int | None, Query(ge=0, le=MAX_XID, description="XID code")] = None,
        kind: Annotated[str | None, Query(pattern="^(xid|sxid)$")] = None,
        since: Annotated[
            str | None, Query(max_length=64, description="unix seconds, ISO 8601, or a duration ago (1h)")
        ] = None,
        until: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> Events:
        now = time.time()
        try:
            found = daemon.journal.events(
                since=parse_time(since, now) if since else None,
                until=parse_time(until, now) if until else None,
                uuid=uuid,
                gpu_index=gpu,
                code=xid,
                kind=kind,
                limit=limit,
            )
        except sqlite3.Error as e:  # not open yet (a full disk at start), or a read that failed: no 500
            raise HTTPException(503, f"the event journal cannot be read ({e})") from e
        return Events(events=[JournalEvent.model_validate(e.to_json()) for e in found])

    @router.get("/xid/{code}", summary="What an XID code means and what to do about it")
    async def explain(code: Annotated[int, Path(ge=0, le=MAX_XID)]) -> XidExplanation:
        found = xid_json(code)
        if found is None:
            raise HTTPException(404, unknown_xid(code))
        return found

    @router.post(
        "/gpus/{gpu}/acknowledge",
        summary="Mark a GPU's XID findings so far as dealt with: its verdict after",
        response_model_exclude_unset=True,
    )
    def acknowledge(gpu: GpuIndex, note: Annotated[str, Body(embed=True, max_length=1000)] = "") -> GpuVerdictOut:
        uuid = gpu_or_404(daemon, gpu).identity.uuid
        log.info("GPU acknowledged", extra={"gpu": gpu, "uuid": uuid, "note": note})  # before the verdict it changes
        try:
            daemon.acknowledge(uuid, note)
        except sqlite3.Error as e:  # a full disk: nothing was marked, the operator must know
            raise HTTPException(503, f"not stored: the event journal refuses writes ({e})") from e
        return next(g for g in daemon.diagnosis().gpus if g.gpu == gpu)

    return router


class CpuBudgetError(Exception):
    """A diagnosis used more CPU time than its budget."""


def within_cpu(chunks: Iterable[bytes], seconds: float, start: float | None = None) -> Iterator[bytes]:
    """`chunks`, stopped with CpuBudgetError once the thread consuming them has used `seconds` of CPU time
    since `start` (its `time.thread_time()`; by default, the first chunk's). The diagnosis runs in that
    thread (it reads the chunks as it scans), so it is asked between chunks: a megabyte of input at most
    past the budget, however slow the input is to read. The inputs of one body share one `start`."""
    if start is None:
        start = time.thread_time()
    for chunk in chunks:
        if time.thread_time() - start > seconds:
            raise CpuBudgetError
        yield chunk
    if time.thread_time() - start > seconds:
        raise CpuBudgetError


def _refuse_empty(report: DiagnoseReport) -> None:
    """422 for a body with neither a log line nor a dump: an upload that went wrong, never a healthy job."""
    hang = report.hang or {}
    if report.summary.lines_read == 0 and not hang.get("dumps") and not hang.get("ras"):
        skipped = hang.get("skipped")
        why = "; ".join(map(str, skipped[:4])) if isinstance(skipped, list) else ""
        raise HTTPException(422, f"no log lines read, nor a dump: {why or 'the body decompresses to nothing'}")


def _run(daemon: Daemon, chunks: list[bytes], content_type: str, engine: str | None) -> DiagnoseReport:
    """One diagnosis, in the thread whose CPU time its budget counts."""
    from gpu_triage.diagnosis.training.diagnose import diagnose as diagnose_logs
    from gpu_triage.exporter.fr_decode import SandboxDecoder

    limit, budget = daemon.settings.diagnose_max_bytes, daemon.settings.diagnose_max_cpu
    start = time.thread_time()  # unpacking an archive is the request's CPU time too
    inputs = [(name, within_cpu(c, budget, start)) for name, c in body_inputs(chunks, content_type, limit)]
    with SandboxDecoder() as decode:
        return DiagnoseReport.model_validate(
            diagnose_logs(inputs, engine=engine, store=daemon.store, decode=decode).to_json()
        )


def diagnose_router(daemon: Daemon) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["diagnosis"])
    limit = daemon.settings.diagnose_max_bytes
    body_timeout = daemon.settings.web_read_timeout
    cpu_budget = daemon.settings.diagnose_max_cpu
    mib = f"{limit / 2**20:g} MiB"
    engine = scan_engine()
    # Each request may hold `limit` bytes, so only a few at a time: a few bodies arriving, and fewer being
    # diagnosed. A slot to diagnose is taken only once the body is here, so slow uploads cannot hold it;
    # they hold a place to upload, for the read timeout at most.
    receiving = threading.BoundedSemaphore(MAX_CONCURRENT_UPLOADS)
    slots = threading.BoundedSemaphore(MAX_CONCURRENT_DIAGNOSES)

    @router.post(
        DIAGNOSE_PATH.removeprefix("/api/v1"),
        summary="Diagnose kernel and training logs, Flight Recorder dumps and NCCL RAS output: root cause first "
        "(the text, a dump, or a tar, zip or multipart/form-data of a job's files; optionally gzip)",
        responses={413: {"description": f"body over the limit ({mib} by default), or more CPU time than allowed"}},
        response_model_exclude_unset=True,
    )
    async def diagnose(request: Request) -> DiagnoseReport:
        if not receiving.acquire(blocking=False):
            raise HTTPException(429, f"{MAX_CONCURRENT_UPLOADS} logs are being uploaded already; try again shortly")
        try:
            chunks = await _body(request)
        finally:
            receiving.release()
        if not slots.acquire(blocking=False):
            raise HTTPException(429, f"{MAX_CONCURRENT_DIAGNOSES} diagnoses are running already; try again shortly")
        try:
            return await _diagnose(chunks, request.headers.get("content-type", ""))
        finally:
            slots.release()

    async def _body(request: Request) -> list[bytes]:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPException(413, f"the log is over the {mib} limit (--diagnose.max-bytes); send less")
                    chunks.append(chunk)
        except TimeoutError:
            raise HTTPException(408, f"the log did not arrive within {body_timeout:g}s (--web.read-timeout)") from None
        if size == 0:
            raise HTTPException(422, "empty body: POST the log text (text/plain, optionally gzip-compressed)")
        return chunks

    async def _diagnose(chunks: list[bytes], content_type: str) -> DiagnoseReport:
        try:
            report = await run_in_threadpool(_run, daemon, chunks, content_type, engine)
        except CpuBudgetError:
            raise HTTPException(
                413,
                f"the log took more than {cpu_budget:g}s of CPU time to diagnose (--diagnose.max-cpu): send a part "
                "of it, or run `gpu-triage diagnose` on it where it is",
            ) from None
        except ArchiveError as e:
            raise HTTPException(422, str(e)) from None
        except InputTooLargeError:
            raise HTTPException(
                413, f"the log decompresses to more than the {mib} limit (--diagnose.max-bytes)"
            ) from None
        except (zlib.error, EOFError) as e:
            raise HTTPException(422, f"the body looks gzip-compressed but does not decompress: {e}") from None
        _refuse_empty(report)
        return report

    return router
