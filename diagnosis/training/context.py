"""Lines that say no fault but tell who is who, how far a rank got, or how a launcher's report is laid
out: what each kind of context line (rules/model.ContextKind) does to the job's state, as one table.

A kind that changes nothing here (a message's first line, `--local_rank=N`) has no entry: the line is
taken apart where it is met (diagnosis/training/diagnose.py) rather than here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.job import Job
from gpu_triage.diagnosis.training.place.source_state import SourceState
from gpu_triage.diagnosis.training.rules.fields import convert
from gpu_triage.diagnosis.training.rules.model import ContextKind, ContextMatch


@dataclass(frozen=True, slots=True)
class ContextLine:
    src: SourceState
    number: int
    line: LogLine
    fields: dict[str, str | int]  # typed (rules/fields.convert)
    gpu: str | None  # the bus id the fields name
    raw: dict[str, str]  # as the signature captured them


def _comm_init(job: Job, c: ContextLine) -> None:
    line = c.line
    if line.host is None or line.pid is None:
        return
    job.retries.completed(c.src.index, line.host, line.pid)
    rank, nranks = int(c.fields["rank"]), int(c.fields["nranks"])
    job.identity.comm_init(c.src.index, line.host, line.pid, rank=rank, nranks=nranks, gpu=c.gpu)
    if line.local_rank is not None and line.rank is None:  # torchrun's `[default3]:` tag
        job.identity.local(c.src.index, line.host, line.local_rank, rank, line.task)
    if line.task is not None and line.task != rank:  # a task that holds several ranks
        job.identity.tasks_not_ranks(c.src.index)


def _node_layout(job: Job, c: ContextLine) -> None:
    line, f = c.line, c.fields
    if line.host is not None and line.pid is not None:
        rank, nranks, local_rank = int(f["rank"]), int(f["nranks"]), int(f["local_rank"])
        job.identity.layout(c.src.index, line.host, line.pid, rank=rank, nranks=nranks, local_rank=local_rank)


def _failure_rank(job: Job, c: ContextLine) -> None:
    local = c.fields.get("local_rank")
    c.src.table_rank(c.number, int(c.fields["rank"]), local if isinstance(local, int) else None)


Handler = Callable[[Job, ContextLine], None]

HANDLERS: Mapping[ContextKind, Handler] = MappingProxyType(
    {
        ContextKind.COMM_INIT: _comm_init,
        ContextKind.NODE_LAYOUT: _node_layout,
        ContextKind.STOPPING: lambda job, c: c.src.stop(int(c.fields["pid"])),
        ContextKind.NCCL_VERSION: lambda job, c: job.version(c.src, c.number, c.line, str(c.fields["version"])),
        ContextKind.FAILURE_HOST: lambda job, c: c.src.table_host(c.number, str(c.fields["host"])),
        ContextKind.FAILURE_RANK: _failure_rank,
        ContextKind.TABLE_END: lambda job, c: c.src.table_end(),
        ContextKind.PROGRESS: lambda job, c: job.report_progress(c.src, c.number, c.line, c.fields),
        ContextKind.IGNORED_EXCEPTION: lambda job, c: c.src.ignore(c.number, c.line),
        ContextKind.CONNECT_RETRY: lambda job, c: job.retries.hold(c.src, c.number, c.line, c.raw),
        ContextKind.TRACEBACK: lambda job, c: c.src.traceback(c.number, c.line),
        ContextKind.EXCEPTION: lambda job, c: c.src.exception(c.number, c.line),
    }
)


def take(job: Job, src: SourceState, number: int, line: LogLine, ctx: ContextMatch) -> None:
    """What context line `number` of `src` tells the job, by its kind."""
    handler = HANDLERS.get(ctx.kind)
    if handler is not None:
        fields, gpu = convert(ctx.fields)
        handler(job, ContextLine(src, number, line, fields, gpu, ctx.fields))
