"""Lines that name no place, in an input where one worker failed, are that worker's.

A worker's own output often carries no rank: a single node's console under torchrun without
`--tee`, `kubectl logs` of one pod, a DeepSpeed or `torch.distributed.launch` run. What places it is
the launcher's report of its end, printed right after: torchrun's agent (`failed (exitcode: 1)
local_rank: 2 (pid: …)`) and its failure table, srun (`srun: error: gpu07: task 3: …`), DeepSpeed
(`… --local_rank=2 … exits with return code = 1`), `subprocess.CalledProcessError` naming
`--local_rank=3`. On the first failure the launcher stops the other workers (SIGTERM), which then
print nothing of their own.

So when the launchers' reports in an input name exactly one failed worker, a fault in that input
that names no place (a CUDA error, an OOM, `Fatal Python error: Segmentation fault`, Slurm's
`Detected 1 oom-kill event`, a bare `Killed`) is that worker's, and the report says the place was
inferred. A symptom (a timeout, a closed peer, a bare NCCL error) is the worker's only when it is
part of an uncaught exception's traceback there: stopped workers may print symptoms of their own
before they go. Kernel-log findings are never bound: they name their GPU or switch themselves.
"""

from __future__ import annotations

from gpu_triage.diagnosis.collapse import Collapser, Tally
from gpu_triage.diagnosis.identity import IdentityBook, Place, Who
from gpu_triage.diagnosis.source_state import SourceState

EXCEPTION_TAIL = 3  # lines after an exception line that still belong to its message (NCCL's `Last error:`)


def _worker_key(place: Place) -> int | tuple[str | None, int] | None:
    if place.rank is not None:
        return place.rank
    if place.local_rank is not None:
        return (place.host, place.local_rank)
    return None


def _known(place: Place) -> int:
    return sum(v is not None for v in (place.host, place.rank, place.local_rank, place.gpu))


def failed_worker(collapser: Collapser, identity: IdentityBook, source: int, ends: frozenset[str]) -> Place | None:
    """The one worker the launchers' reports in input `source` say failed, or None (none, or several)."""
    found: dict[int | tuple[str | None, int], Place] = {}
    for class_id, who, _ in collapser.tallies():
        if who.source != source or class_id not in ends:
            continue
        place = identity.place(who)
        key = _worker_key(place)
        if key is None:
            continue
        held = found.get(key)
        if held is None or _known(place) > _known(held):
            found[key] = place
    return next(iter(found.values())) if len(found) == 1 else None


def _in_traceback(state: SourceState, tally: Tally) -> bool:
    line = tally.first.line
    return any(
        t.rank is None and t.host is None and t.local_rank is None and t.start <= line <= t.line + EXCEPTION_TAIL
        for t in state.tracebacks
    )


def bind_to_failed_worker(
    collapser: Collapser, identity: IdentityBook, sources: list[SourceState], ends: frozenset[str]
) -> None:
    """Give the placeless findings of each input with one failed worker that worker's place."""
    for state in sources:
        worker = failed_worker(collapser, identity, state.index, ends)
        if worker is None:
            continue

        def change(class_id: str, who: Who, tally: Tally) -> Who | None:
            if who.source != state.index or class_id.startswith(("xid_", "sxid_")):
                return None
            place = identity.place(who)
            if (place.rank, place.local_rank, place.gpu) != (None, None, None) or place.host not in (None, worker.host):
                return None
            if tally.spec.symptom and class_id not in ends and not _in_traceback(state, tally):
                return None
            return Who(who.source, worker.host, None, worker.rank, worker.local_rank, worker.gpu)

        collapser.rebind(change)
