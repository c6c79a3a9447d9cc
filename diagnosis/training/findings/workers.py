"""Which worker a line is about, where the line does not say: what the launchers' reports tell.

Lines that name no place, in an input where one worker failed, are that worker's. A worker's own
output often carries no rank: a single node's console under torchrun without `--tee`, `kubectl logs`
of one pod, a DeepSpeed or `torch.distributed.launch` run. What places it is the launcher's report of
its end, printed right after: torchrun's agent (`failed (exitcode: 1)
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

The agent's roll call. When a worker fails, torchrun's agent stops the ones still running, in
local-rank order (it walks its handlers, made for local ranks 0…N-1, and logs `Sending process P
closing signal SIGTERM` for each that has not exited), then reports the failed one (`failed
(exitcode: …) local_rank: L (pid: P)`); its failure table gives that worker's host and global rank,
and torchrun numbers an agent's workers base + local rank. So the stopped pids are the local ranks
that had not failed, in order, and a kernel line that names only a pid (`NVRM: Xid …, pid=590341`)
finds its rank. A roll call is used only when it fits: the failed workers the table lists on that
host and the stopped ones make a whole 0…N-1, and every stopped pid the table names sits at its place.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.diagnosis.training.findings.collapse import Collapser, Tally
from gpu_triage.diagnosis.training.place.facts import Place, Who
from gpu_triage.diagnosis.training.place.identity import IdentityBook
from gpu_triage.diagnosis.training.place.source_state import RollCall, SourceState

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
        (t.rank, t.host, t.local_rank, t.task) == (None, None, None, None)
        and t.start <= line <= t.line + EXCEPTION_TAIL
        for t in state.tracebacks
    )


@dataclass(frozen=True, slots=True)
class _Binding:
    """Moves the placeless findings of input `state` to the place of its one failed `worker`."""

    identity: IdentityBook
    state: SourceState
    worker: Place
    ends: frozenset[str]

    def __call__(self, class_id: str, who: Who, tally: Tally) -> Who | None:
        kernel = tally.spec.xid is not None or tally.spec.sxid is not None
        if who.source != self.state.index or who.pid is not None or kernel:
            return None  # a line whose printer's pid is known is that process's, whoever it is
        place, worker = self.identity.place(who), self.worker
        if (place.rank, place.local_rank, place.gpu) != (None, None, None) or place.host not in (None, worker.host):
            return None
        if tally.spec.symptom and class_id not in self.ends and not _in_traceback(self.state, tally):
            return None
        return Who(who.source, worker.host, None, worker.rank, worker.local_rank, worker.gpu)


def bind_to_failed_worker(
    collapser: Collapser, identity: IdentityBook, sources: list[SourceState], ends: frozenset[str]
) -> None:
    """Give the placeless findings of each input with one failed worker that worker's place."""
    for state in sources:
        worker = failed_worker(collapser, identity, state.index, ends)
        if worker is not None:
            collapser.rebind(_Binding(identity, state, worker, ends))


def _roll_call(identity: IdentityBook, call: RollCall) -> None:
    failed = identity.worker(call.failed_pid)
    if failed is None or failed.host is None or failed.rank is None or failed.local_rank != call.failed_local_rank:
        return
    known = identity.workers_on(failed.host)
    stopped = set(call.pids)
    gone = {w.local_rank for pid, w in known.items() if pid not in stopped} | {call.failed_local_rank}
    if None in gone or len(stopped) != len(call.pids):
        return
    order = [n for n in range(len(call.pids) + len(gone)) if n not in gone]
    if len(order) != len(call.pids):
        return  # a failed worker's local rank beyond the agent's: not its whole roll
    if any(pid in known and known[pid].local_rank != n for pid, n in zip(call.pids, order, strict=True)):
        return
    base = failed.rank - call.failed_local_rank
    for pid, n in zip(call.pids, order, strict=True):
        if pid not in known:
            identity.bind_pid(pid, failed.host, base + n, n)


def name_stopped_workers(identity: IdentityBook, sources: list[SourceState]) -> None:
    """Bind the pids of each roll call (see the module docstring) to their host, rank and local rank."""
    for state in sources:
        for call in state.roll_calls:
            _roll_call(identity, call)
