"""A dead job never reads "no problem"; a process's end is told once, with the failure that caused it.

Signs that a process died are findings of class `job_failed_unclassified` from the rules (a launcher's
non-zero exit report, ChildFailedError, `terminate called`, Slurm's CANCELLED, …) and, from
`source_state`, Python tracebacks that were not caught: printed by PyTorch's excepthook
(`[rank3]: Traceback …`), or followed by nothing but what a process prints as it exits (PyTorch's and
NCCL's teardown lines, wandb's summary, blank lines) or by a launcher's exit report. A SIGABRT
(`process_segfault` with an `abort` field) is a death too: PyTorch ends a process that way on purpose
once its watchdog has seen a timeout or an NCCL or CUDA error (TORCH_NCCL_ASYNC_ERROR_HANDLING:
`terminate called after throwing … DistBackendError`, `Terminating the process after attempting to dump
debug info`), as does libstdc++ for any C++ exception nobody caught.

A death another finding explains is folded into that finding as evidence (the line that tells how the
process ended), not reported on its own, whose playbook (core dumps, compute-sanitizer for an abort)
would send the reader the wrong way. A death is explained by a finding at the same place: the same
rank, local rank or pid; for a death that names only a host (a launcher's `host: tasks 0-7: Aborted`,
Slurm's `STEP … ON host CANCELLED`), a finding on that host; for one that names no place, another
finding of its input. Besides, any finding of a specific class (an OOM, a CUDA or network error, a
hardware XID…) explains every `job_failed_unclassified` death: the job died of that. What remains is
a process that died of something the logs do not name: a SIGABRT stays a `process_segfault`, and a
generic death ranks before the symptoms it causes on the other ranks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.core.line_scan import strip_ansi
from gpu_triage.diagnosis.training.findings.root_cause import Ranked, order
from gpu_triage.diagnosis.training.place.source_state import SourceState, Traceback
from gpu_triage.diagnosis.training.rules.model import HOST_OOM_KILLED, JOB_FAILED, PROCESS_SEGFAULT

MAX_EVIDENCE = 6  # evidence lines a finding keeps when deaths fold into it
ENDS = frozenset({JOB_FAILED, PROCESS_SEGFAULT, HOST_OOM_KILLED})  # classes that report a process's end


# What a dying Python process may still print after the exception that ends it, from its exit handlers:
# PyTorch's ProcessGroupNCCL destructor (`WARNING: destroy_process_group() was not called before program
# exit`, 2.4 on; `process group has NOT been destroyed before we destruct ProcessGroupNCCL`, 2.2-2.3), NCCL
# tearing its communicators down (`comm %p rank %d nranks %d cudaDev %d busId %lx - Destroy COMPLETE`, or
# `Abort COMPLETE`; `[Service thread] Connection closed by localRank %d`), and wandb's run summary, each of
# whose lines it prints as `wandb: …`. Anything else after a traceback (an NCCL init, a training step)
# means the process went on.
_AT_EXIT = re.compile(
    r"destroy_process_group\(\) was not called before program exit|process group has NOT been destroyed before"
    r"| - (?:Destroy|Abort) COMPLETE|\[Service thread\] Connection closed by localRank|(?:^|[\s:\]])wandb: "
)
# How much of an input's end is kept to read what follows its last traceback: wandb's summary of a large
# run (every metric twice) and a node's NCCL teardown fit many times over.
TAIL_BYTES = 256 * 1024


class TextEnd:
    """How an input ends: its last `TAIL_BYTES`, numbered, to tell whether a traceback is followed only by
    what a process prints while it exits.

    Only the lines a signature flags reach the classifier, so the tail is kept from the chunks as they
    pass (`watch`); the line scanner, which counts every line anyway, says how many there were (`ended`).
    """

    def __init__(self) -> None:
        self.lines = 0
        self._tail = b""

    def watch(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            data = chunk if isinstance(chunk, bytes) else bytes(chunk)
            self._tail = data[-TAIL_BYTES:] if len(data) >= TAIL_BYTES else (self._tail + data)[-TAIL_BYTES:]
            yield data

    def ended(self, lines: int) -> None:
        """The input had `lines` lines (a last one without a newline counts)."""
        self.lines = lines

    def lines_after(self, line: int, wrap_width: int | None = None) -> list[str] | None:
        """The non-blank lines numbered after `line` (1-based, as the line scanner numbers them), a hard-wrapped
        one joined back (a piece exactly `wrap_width` long goes on in the next); None when `line` is further
        back than the kept tail."""
        pieces = self._tail.split(b"\n")
        if self._tail.endswith(b"\n"):
            pieces.pop()  # what follows the last newline is no line
        first = self.lines - len(pieces) + 1  # the number of the tail's first (maybe partial) line
        if line < first:
            return None
        texts: list[str] = []
        cut = False
        for piece in pieces[line - first + 1 :]:
            text = strip_ansi(piece.rstrip(b"\r")).decode("utf-8", "replace")
            if cut and texts:
                texts[-1] += text
            else:
                texts.append(text)
            cut = wrap_width is not None and len(text) == wrap_width
        return [text.strip() for text in texts if text.strip()]


def uncaught(
    state: SourceState, *, exit_reported: bool, end: TextEnd, wrap_width: int | None = None
) -> list[Traceback]:
    """The tracebacks of one input that killed their process.

    Certain: PyTorch's excepthook printed it. Otherwise only the last traceback, and only when a launcher
    reported a process's end or nothing follows its exception but blank lines and what a process prints as
    it exits (`_AT_EXIT`). A handled exception logged with its traceback is followed by more output, if
    only by "Checkpoint saved"; a count of lines after it would take one printed just before a clean exit
    for a death.
    """
    # One whose exception line a rule classified is told by that finding.
    traces = [t for t in state.tracebacks if not t.classified]
    out = [t for t in traces if t.hooked]
    last = traces[-1] if traces else None
    if last is not None and not last.hooked:
        # A hard-wrapped input numbers a joined line by its first piece; its last piece may end the text.
        pieces = (len(last.text) - 1) // wrap_width + 1 if wrap_width else 1
        after = end.lines_after(last.line + pieces - 1, wrap_width)
        if exit_reported or (after is not None and all(_AT_EXIT.search(text) for text in after)):
            out.append(last)
    return out


def is_death(f: Finding) -> bool:
    """A finding that only says a process ended: a generic death, or a SIGABRT."""
    return f.class_id == JOB_FAILED or (f.class_id == PROCESS_SEGFAULT and f.aborted)


def _has_place(f: Finding) -> bool:
    return (f.host, f.rank, f.local_rank) != (None, None, None) or "pid" in f.details


def _same_place(death: Finding, other: Finding) -> bool:
    if death.rank is not None and (other.rank == death.rank or death.rank in other.ranks):
        return True
    if (
        death.local_rank is not None
        and other.local_rank == death.local_rank
        and None in (death.rank, other.rank)
        and (death.host is None or other.host in (None, death.host))
    ):
        return True
    pid = death.details.get("pid")
    if pid is not None and pid == other.details.get("pid"):
        return True
    # A launcher's report on a whole node names the host alone: what happened on that host explains it.
    return _host_only(death) and other.host == death.host


def _host_only(f: Finding) -> bool:
    return f.host is not None and (f.rank, f.local_rank, f.details.get("pid")) == (None, None, None)


def _generic(r: Ranked) -> bool:
    return r.finding.class_id == JOB_FAILED


def _sources(f: Finding) -> set[str | None]:
    return {e.source for e in f.evidence}


def _fold_into(cause: Finding, death: Finding) -> None:
    """`death` told as part of `cause`: its first line becomes evidence of how the process ended, unless
    `cause` reports that end itself (a kill, a crash)."""
    if cause.class_id in (PROCESS_SEGFAULT, HOST_OOM_KILLED):
        return
    known = {(e.source, e.line) for e in cause.evidence}
    for e in death.evidence[:1]:
        if (e.source, e.line) not in known and len(cause.evidence) < MAX_EVIDENCE:
            cause.evidence.append(e)


def settle(ranked: Iterable[Ranked], is_symptom: Callable[[Finding], bool]) -> list[Ranked]:
    """`ranked` with the deaths something else explains folded into it (see the module docstring)."""
    items = list(ranked)
    causes = [r.finding for r in order(items) if not is_death(r.finding)]  # the most specific first
    specific = any(not is_symptom(f) for f in causes)
    keep = [r for r in items if not is_death(r.finding)]
    told: list[tuple[Finding, Finding]] = []  # (a death, the finding that tells it: its cause, or itself)
    # Deaths with a place first, a crash before a generic death: a later one may be the same death.
    deaths = sorted((r for r in items if is_death(r.finding)), key=lambda r: (not _has_place(r.finding), _generic(r)))
    for r in deaths:
        death = r.finding
        cause = None
        if _has_place(death):
            same = (f for f in (*causes, *(d for d, teller in told if d is teller)) if _same_place(death, f))
            cause = next(same, None)
        if cause is None and (not _has_place(death) or (_generic(r) and _host_only(death))):
            # A death that names no process is the same death as another finding of its input.
            shared = _sources(death)
            known = [*causes, *(teller for d, teller in told if _sources(d) & shared)]
            cause = next((f for f in known if _sources(f) & shared), None)
        if cause is not None:
            _fold_into(cause, death)
            told.append((death, cause))
        elif not (death.class_id == JOB_FAILED and specific):
            keep.append(r)
            told.append((death, death))
    return keep
