"""A line a rule names becomes a finding's line: placed (who printed it, or whom it reports on), fed to
the job's progress and work tables where it reports a collective, and counted into its tally."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_triage.diagnosis.training.findings.collapse import Collapser, Spec
from gpu_triage.diagnosis.training.findings.collectives import Work
from gpu_triage.diagnosis.training.findings.deaths import ENDS
from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.job import Job, seen_at
from gpu_triage.diagnosis.training.place.facts import Who
from gpu_triage.diagnosis.training.place.source_state import SourceState
from gpu_triage.diagnosis.training.rules.fields import convert
from gpu_triage.diagnosis.training.rules.model import COLLECTIVE_TIMEOUT, PROCESS_SEGFAULT, ContextKind, Match, RuleSet


@dataclass(slots=True)
class _Place:
    host: str | None
    rank: int | None
    local: int | None
    gpu: str | None
    pid: int | None
    task: int | None = None


@dataclass(frozen=True, slots=True)
class _Named:
    """What a line's captured fields say about where, typed: the fields are shown, these decide."""

    host: str | None  # a worker a launcher reports on: the place is the worker's
    rank: int | None  # the printer's, where its prefix does not say
    reported_rank: int | None  # the one rank a report names (the lagging rank), not the reporter
    local_rank: int | None
    task: int | None
    pid: int | None

    @staticmethod
    def take(details: dict[str, str | int]) -> _Named:
        """The place fields of `details`, `host` taken out of them (it is the place, not a detail)."""
        host = details.pop("host", None)
        rank, local, task, pid = (details.get(k) for k in ("rank", "local_rank", "task", "pid"))
        tasks, ranks = details.get("tasks"), details.get("ranks")
        if isinstance(tasks, str) and tasks.isdigit():
            task = int(tasks)
        reported = int(ranks) if isinstance(ranks, str) and ranks.strip().isdigit() else None
        return _Named(
            str(host) if host is not None else None,
            rank if isinstance(rank, int) else None,
            reported,
            local if isinstance(local, int) else None,
            task if isinstance(task, int) else None,
            pid if isinstance(pid, int) else None,
        )


class Recorder:
    """Turns the matched lines of one diagnosis into tallies of `collapser`, learning into `job`."""

    def __init__(self, rules: RuleSet, specs: dict[str, Spec], collapser: Collapser, job: Job) -> None:
        self.rules, self.specs, self.collapser, self.job = rules, specs, collapser, job
        # A SIGABRT ends a process after its own error: it ranks after the symptoms, and is one.
        self.abort_spec = replace(specs[PROCESS_SEGFAULT], tier=len(rules.rules) - 0.5, symptom=True)

    def _place(self, src: SourceState, line: LogLine, named: _Named, gpu: str | None) -> _Place:
        rank = line.rank if line.rank is not None else named.rank
        if named.reported_rank is not None:
            rank = named.reported_rank
        local = line.local_rank if line.local_rank is not None else named.local_rank
        if named.host is not None and named.task is not None:
            # A launcher's report names a task and its host together (srun's `gpu07: task 3`, mpirun's
            # `process rank 3 … on node gpu07`); whether the task is a rank is decided at the end.
            self.job.identity.task_on(src.index, named.task, named.host)
        place = _Place(
            named.host if named.host is not None else line.host,
            rank,
            local,
            gpu,
            named.pid,
            named.task if named.task is not None else line.task,
        )
        entry = src.table_place(line)
        if entry is not None:  # an indented line of torchrun's failure table: the entry's worker
            place.host, place.rank, place.local = entry.host, entry.rank, entry.local_rank
            if place.pid is not None and entry.pid is None:
                entry.pid = place.pid
                self.job.identity.bind_pid(place.pid, entry.host, entry.rank, entry.local_rank)
        return place

    def finding(self, src: SourceState, number: int, line: LogLine, match: Match) -> None:
        details, gpu = convert(match.fields)
        if match.rule.class_id in ENDS and "local_rank" not in details and "--local" in line.text:
            # A launcher's report of a worker's end names the worker by its command line.
            argv = self.rules.context_fields(ContextKind.LAUNCHER_ARGV, line.text)
            if argv is not None:
                details["local_rank"] = int(argv["local_rank"])
        place = self._place(src, line, _Named.take(details), gpu)
        spec = self.specs[match.rule.class_id]
        # The rules mark a SIGABRT's report by an `abort` field: from here on it is the typed `aborted`.
        aborted = spec.class_id == PROCESS_SEGFAULT and "abort" in details
        if aborted:
            spec = self.abort_spec
        if line.cuda_dev is not None:
            details.setdefault("cuda_dev", line.cuda_dev)
        if place.rank is not None and (spec.class_id == COLLECTIVE_TIMEOUT or "last_completed" in details):
            self._collective(src, number, replace(line, rank=place.rank), details)
        if spec.class_id in ENDS:
            if "pid" not in details and line.pid is not None:
                details["pid"] = line.pid  # a process's own report of its end (UCX, Open MPI): its pid
            src.exit_reported = True
            if place.pid is not None and isinstance(local := details.get("local_rank"), int):
                src.failed(place.pid, local)  # torchrun's agent: `failed (exitcode: …) local_rank: N (pid: P)`
        who = Who(src.index, place.host, line.pid, place.rank, place.local, place.gpu, place.pid, place.task)
        self.collapser.add(who, spec, seen_at(src, number, line, match.signature + 1), details, aborted)

    def _collective(self, src: SourceState, number: int, line: LogLine, details: dict[str, str | int]) -> None:
        """A rank's report of a collective (a timeout's SeqNum and op): its progress, and the work it ran."""
        self.job.report_progress(src, number, line, details)
        seq, op = details.get("seq"), details.get("op")
        if line.rank is not None and isinstance(seq, int) and isinstance(op, str):
            numel = details.get("numel_in")
            seen = seen_at(src, number, line)
            work = Work(
                line.rank, op, numel if isinstance(numel, int) else None, src.index, number, seen.text, seen.stamp
            )
            self.job.works.report(line.pg, seq, work)
