"""A dead job never reads "no problem": deaths nothing more specific explains become a finding.

Signs that a process died are findings of class `job_failed_unclassified` from the rules (a launcher's
non-zero exit report, ChildFailedError, `terminate called`, Slurm's CANCELLED, …) and, from
`source_state`, Python tracebacks that were not caught: printed by PyTorch's excepthook
(`[rank3]: Traceback …`), or followed within a few lines by the end of their input or by a
launcher's exit report there.

Such a finding stays only while nothing more specific explains it:
* any finding of a specific class (an OOM, a CUDA or network error, a hardware XID…) explains every
  death: the job died of that;
* a symptom (timeout, closed peer, aborted communicator…) at the same place (rank, local rank, pid or
  host) explains that place's death; one that names no place is explained by any other finding of
  its input;
* what remains is a rank that died of something the logs do not name, and it ranks before the
  symptoms it causes on the other ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpu_triage.diagnosis.findings import Finding
from gpu_triage.diagnosis.root_cause import Ranked
from gpu_triage.diagnosis.rule_model import JOB_FAILED
from gpu_triage.diagnosis.source_state import SourceState, Traceback

TAIL_LINES = 5  # an exception this close to the end of its input ended the process


def uncaught(state: SourceState, *, exit_reported: bool) -> list[Traceback]:
    """The tracebacks of one input that killed their process."""
    out = [t for t in state.tracebacks if t.hooked]
    last = state.tracebacks[-1] if state.tracebacks else None
    if last is not None and not last.hooked and (exit_reported or state.lines - last.line <= TAIL_LINES):
        out.append(last)
    return out


def _place(f: Finding) -> tuple[str | None, int | None, int | None]:
    return (f.host, f.rank, f.local_rank)


def _same_place(death: Finding, other: Finding) -> bool:
    if death.rank is not None:
        return other.rank == death.rank or death.rank in other.ranks
    if death.local_rank is not None:
        return other.local_rank == death.local_rank and (death.host is None or other.host in (None, death.host))
    pid = death.details.get("pid")
    return pid is not None and pid == other.details.get("pid")


def _sources(f: Finding) -> set[str | None]:
    return {e.source for e in f.evidence}


def settle(ranked: Iterable[Ranked], is_symptom: Callable[[Finding], bool]) -> list[Ranked]:
    """`ranked` without the deaths something more specific explains (see the module docstring)."""
    items = list(ranked)
    others = [r.finding for r in items if r.finding.class_id != JOB_FAILED]
    if any(not is_symptom(f) for f in others):
        return [r for r in items if r.finding.class_id != JOB_FAILED]
    placed = [r.finding for r in items if r.finding.class_id == JOB_FAILED and _has_place(r.finding)]
    keep: list[Ranked] = []
    kept_placeless: list[Finding] = []
    for r in items:
        death = r.finding
        if death.class_id != JOB_FAILED:
            keep.append(r)
        elif _has_place(death):
            if not any(_same_place(death, f) for f in others):
                keep.append(r)
        elif not any(_sources(f) & _sources(death) for f in (*others, *placed, *kept_placeless)):
            # A death that names no place is the same death as another finding of its input.
            keep.append(r)
            kept_placeless.append(death)
    return keep


def _has_place(f: Finding) -> bool:
    return _place(f) != (None, None, None) or "pid" in f.details
