"""Training-log diagnosis: many ranks' logs in, one ordered list of findings out.

`diagnose` reads each input as a stream of byte chunks. `input_lines` rejoins hard-wrapped text and
the block scan (`block_scan`: every signature over every line) picks out the few lines worth a
look; each is cleaned and split into message and identity by `log_lines`. Lines with `NVRM` or
`Xid (` go to the kernel-log parser (`training_kernel`: XIDs, NVSwitch SXids), the rest to the rules
of `training_rules` (first matching rule wins, most specific first). Nothing else is kept: repeated
lines collapse into one finding per (class, place) with a count and a few evidence lines
(`collapse`), so memory does not grow with the input.

Who printed a line is pieced together across lines and inputs (`identity`): NCCL's `host:pid
[cudaDev]` header, launcher tags, PyTorch's `[rankN]:` and `[PG … Rank N]` tags, NCCL's communicator
init line (host:pid to rank and GPU), torchrun's failure table (pid to host, rank and local rank,
`source_state`). Identity is resolved at the end, when everything that can be learnt has been.

The report orders the findings root cause first (`root_cause`), names the straggler and the
collective mismatch a timeout hides (`collectives`), keeps a death only while nothing more specific
explains it (`deaths`), and folds what many ranks share into one finding (`fold`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.data_files import BlobStore
from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.training.findings.collapse import Collapser, Seen, Spec, build
from gpu_triage.diagnosis.training.findings.collectives import Progress, ProgressTracker, Work, WorkTracker
from gpu_triage.diagnosis.training.findings.deaths import ENDS, TextEnd, settle, uncaught
from gpu_triage.diagnosis.training.findings.fold import fold
from gpu_triage.diagnosis.training.findings.kernel import EVIDENCE_CHARS, KernelFindings
from gpu_triage.diagnosis.training.findings.root_cause import kernel_first, link_symptoms, order
from gpu_triage.diagnosis.training.findings.workers import bind_to_failed_worker, name_stopped_workers
from gpu_triage.diagnosis.training.hang.report import Decoder, HangInputs
from gpu_triage.diagnosis.training.input.log_lines import LogLine, normalise
from gpu_triage.diagnosis.training.input.wrapped import InputLines
from gpu_triage.diagnosis.training.place.facts import Who
from gpu_triage.diagnosis.training.place.identity import IdentityBook
from gpu_triage.diagnosis.training.place.retries import Retries
from gpu_triage.diagnosis.training.place.source_state import SourceState
from gpu_triage.diagnosis.training.report import Report, Reporter
from gpu_triage.diagnosis.training.rules import next_steps
from gpu_triage.diagnosis.training.rules.fields import convert
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.model import (
    COLLECTIVE_TIMEOUT,
    JOB_FAILED,
    PROCESS_SEGFAULT,
    SOCKET_CONNECT_ERROR,
    ContextKind,
    ContextMatch,
    Match,
    RuleSet,
)
from gpu_triage.diagnosis.training.scan.block_scan import HyperscanFinder, engine_name, finder_for, skip_test_for
from gpu_triage.diagnosis.xid.kernel_log import has_trigger
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser

__all__ = ["CACHE_ENTRIES", "Report", "diagnose"]

CACHE_ENTRIES = 4096  # recent lines and messages whose classification is remembered


def _rule_specs(rules: RuleSet) -> dict[str, Spec]:
    return {
        r.class_id: Spec(
            class_id=r.class_id,
            severity=r.severity,
            action=r.action,
            title=r.title,
            playbook=r.playbook,
            steps=r.steps,
            tier=float(r.specificity),
            symptom=r.symptom,
            performance=r.performance,
        )
        for r in rules.rules
    }


@dataclass(slots=True)
class _Place:
    host: str | None
    rank: int | None
    local: int | None
    gpu: str | None
    pid: int | None
    task: int | None = None


class _Diagnosis:
    """The state of one `diagnose` call."""

    def __init__(
        self, rules: RuleSet, engine: str | None = None, store: BlobStore | None = None, parallel: bool = False
    ) -> None:
        self.rules = rules
        self.store = store
        self.parallel = parallel
        self.specs = _rule_specs(rules)
        # A SIGABRT ends a process after its own error: it ranks after the symptoms, and is one.
        self.abort_spec = replace(self.specs[PROCESS_SEGFAULT], tier=len(rules.rules) - 0.5, symptom=True)
        self.engine = engine_name(engine)
        self.job_failed = rules.rule(JOB_FAILED)
        signatures = rules.signatures()
        self.patterns = tuple(s.scan for s in signatures)
        self.literals = tuple(lit for s in signatures for lit in s.literals)
        self.collapser = Collapser()
        self.identity = IdentityBook()
        self.kernel = KernelFindings(rules, self.collapser)
        self.versions: dict[str, Seen] = {}
        self.progress = ProgressTracker()
        self.works = WorkTracker()
        self.retries = Retries()
        self.sources: list[SourceState] = []
        self.text_ends: list[tuple[TextEnd, int | None]] = []  # per input: how it ends, its wrap width
        self._lines: dict[str, tuple[LogLine, Match | None, ContextMatch | None]] = {}
        self._verdicts: dict[str, tuple[Match | None, ContextMatch | None]] = {}

    # -- reading ------------------------------------------------------------------------------

    def read(self, name: str | None, chunks: Iterable[bytes]) -> tuple[int, int]:
        src = SourceState(self.identity.add_source(), name)
        self.sources.append(src)
        needles = self.rules.needles or None
        finder = finder_for(self.patterns, self.literals, self.engine, self.store, needles, self.parallel)
        self.engine = "hyperscan" if isinstance(finder, HyperscanFinder) else "python"
        reader = InputLines(finder, skip_test=skip_test_for(self.literals, needles))
        kernel = KernelLogParser(strict=False)  # a pasted line may carry any prefix (kernel_log_parser)
        end = TextEnd()
        try:
            for cand in reader.read(end.watch(chunks)):
                self._line(src, kernel, cand.line, cand.data.decode("utf-8", "replace"), cand.hits)
        finally:
            if isinstance(finder, HyperscanFinder):
                finder.close()
        for event in kernel.finish():
            self.kernel.add(src.index, normalise(event.text), event)
        src.lines = reader.lines
        end.ended(reader.lines)
        self.text_ends.append((end, reader.width))
        return reader.lines, reader.skipped

    def _line(
        self, src: SourceState, kernel: KernelLogParser, number: int, text: str, hits: frozenset[int] | None
    ) -> None:
        text = text.rstrip("\r")
        # A progress bar redraws itself with bare CRs; each redraw is a line of its own.
        for segment in text.split("\r") if "\r" in text else (text,):
            if segment.strip():
                self._segment(src, kernel, number, segment, hits)

    def _segment(
        self, src: SourceState, kernel: KernelLogParser, number: int, text: str, hits: frozenset[int] | None = None
    ) -> None:
        line = normalise(text) if has_trigger(text) else None
        if line is not None:
            own = False
            for event in kernel.feed(line.raw, number):
                # The parser may hand back an event it held from an earlier line: that line's time and
                # host are the event's, not this one's.
                here = event.line == number
                own = own or here
                self.kernel.add(src.index, line if here else normalise(event.text), event)
            if own:
                self.identity.learn(src.index, line)
                return
        line, match, ctx = self._classify(text, line, hits)
        if ctx is not None and ctx.kind is ContextKind.CONTINUED and (joined := src.joined(number, line)):
            first, whole = joined
            match = self.rules.match(whole)
            line, number = replace(line, text=whole), first
        elif ctx is not None and ctx.kind is ContextKind.CONTINUES:
            src.continues = (number, line)
        if match is not None:
            self.identity.learn(src.index, line)
            ends_traceback = self.rules.context_fields(ContextKind.EXCEPTION, line.text) is not None
            if src.open_tracebacks and ends_traceback:
                src.exception(number, line, classified=True)  # where the traceback ends (training/findings/workers.py)
            if "NCCL version" in line.text:  # PyTorch's NCCL errors end with the version the process runs
                fields = self.rules.context_fields(ContextKind.NCCL_VERSION, line.text)
                if fields is not None:
                    self._version(src, number, line, fields["version"])
            self._finding(src, number, line, match)
        elif ctx is not None:
            self.identity.learn(src.index, line)
            self._context(src, number, line, ctx)

    def _classify(
        self, text: str, line: LogLine | None = None, hits: frozenset[int] | None = None
    ) -> tuple[LogLine, Match | None, ContextMatch | None]:
        """Normalise (unless `line` is `text` normalised already) and match `text`, remembering recent answers.
        `hits`: the signatures the block scan saw match the line (it sees every one that can); only those
        are tried, so a line that holds every literal and matches nothing costs no regex.

        A failing job repeats itself: the same WARN from the same process thousands of times, or the
        same message from every rank behind a different prefix. Both caches are bounded and are
        simply emptied when full.
        """
        known = self._lines.get(text)
        if known is not None:
            return known
        if line is None:
            line = normalise(text)
        verdict = self._verdicts.get(line.text)
        if verdict is None:
            match = self.rules.match(line.text, hits)
            verdict = (match, None if match is not None else self.rules.match_context(line.text, hits))
            if len(self._verdicts) >= CACHE_ENTRIES:
                self._verdicts.clear()
            self._verdicts[line.text] = verdict
        unnamed = verdict[0] is None and (verdict[1] is None or verdict[1].kind is ContextKind.EXCEPTION)
        if unnamed and (error := self.rules.fallback_match(line.raw, hits)) is not None:
            # An error-level line no rule names (the whole line decides: a glog level is a prefix); an
            # exception's line too (`RuntimeError: CUDA error: …`): a paste may hold no traceback with it.
            which, fields = error
            verdict = (Match(self.job_failed, fields, len(self.job_failed.signatures) + which), None)
        if len(self._lines) >= CACHE_ENTRIES:
            self._lines.clear()
        self._lines[text] = (line, *verdict)
        return line, *verdict

    def _seen(self, src: SourceState, number: int, line: LogLine, kind: int = 0) -> Seen:
        return Seen(src.index, number, line.raw[:EVIDENCE_CHARS], line.stamp, kind)

    def _context(self, src: SourceState, number: int, line: LogLine, ctx: ContextMatch) -> None:
        fields, gpu = convert(ctx.fields)
        kind = ctx.kind
        if kind is ContextKind.COMM_INIT:
            if line.host is not None and line.pid is not None:
                self.retries.completed(src.index, line.host, line.pid)
                rank, nranks = int(fields["rank"]), int(fields["nranks"])
                self.identity.comm_init(src.index, line.host, line.pid, rank=rank, nranks=nranks, gpu=gpu)
                if line.local_rank is not None and line.rank is None:  # torchrun's `[default3]:` tag
                    self.identity.local(src.index, line.host, line.local_rank, rank, line.task)
                if line.task is not None and line.task != rank:  # a task that holds several ranks
                    self.identity.tasks_not_ranks(src.index)
        elif kind is ContextKind.NODE_LAYOUT:
            if line.host is not None and line.pid is not None:
                self.identity.layout(
                    src.index,
                    line.host,
                    line.pid,
                    rank=int(fields["rank"]),
                    nranks=int(fields["nranks"]),
                    local_rank=int(fields["local_rank"]),
                )
        elif kind is ContextKind.STOPPING:
            src.stop(int(fields["pid"]))
        elif kind is ContextKind.NCCL_VERSION:
            self._version(src, number, line, str(fields["version"]))
        elif kind is ContextKind.FAILURE_HOST:
            src.table_host(number, str(fields["host"]))
        elif kind is ContextKind.FAILURE_RANK:
            local = fields.get("local_rank")
            src.table_rank(number, int(fields["rank"]), local if isinstance(local, int) else None)
        elif kind is ContextKind.TABLE_END:
            src.table_end()
        elif kind is ContextKind.PROGRESS:
            self._progress(src, number, line, fields)
        elif kind is ContextKind.IGNORED_EXCEPTION:
            src.ignore(number, line)
        elif kind is ContextKind.CONNECT_RETRY:
            self.retries.hold(src, number, line, ctx.fields)
        elif kind is ContextKind.TRACEBACK:
            src.traceback(number, line)
        elif kind is ContextKind.EXCEPTION:
            src.exception(number, line)

    def _version(self, src: SourceState, number: int, line: LogLine, version: str) -> None:
        if len(self.versions) < 32:
            self.versions.setdefault(version, self._seen(src, number, line))

    def _progress(self, src: SourceState, number: int, line: LogLine, fields: dict[str, str | int]) -> None:
        rank = line.rank if line.rank is not None else fields.get("rank")
        if not isinstance(rank, int):
            return
        completed, enqueued = fields.get("last_completed"), fields.get("last_enqueued")
        seq = fields.get("seq")
        if not isinstance(completed, int) and isinstance(seq, int):
            # The work that timed out had not completed; the one before it had.
            completed, enqueued = seq - 1, seq
        if isinstance(completed, int):
            enq = enqueued if isinstance(enqueued, int) else completed
            seen = self._seen(src, number, line)
            self.progress.report(line.pg, rank, Progress(completed, enq, src.index, number, seen.text, line.stamp))

    def _place(self, src: SourceState, line: LogLine, details: dict[str, str | int], gpu: str | None) -> _Place:
        host = details.pop("host", None)  # a worker a launcher reports on: the place is the worker's
        rank = line.rank if line.rank is not None else details.get("rank")
        local = line.local_rank if line.local_rank is not None else details.get("local_rank")
        tasks, ranks, task = details.get("tasks"), details.get("ranks"), details.get("task")
        if isinstance(tasks, str) and tasks.isdigit():
            task = int(tasks)
        if isinstance(ranks, str) and ranks.strip().isdigit():
            rank = int(ranks)  # the one rank a report names (the lagging rank), not the reporter
        if host is not None and isinstance(task, int):
            # A launcher's report names a task and its host together (srun's `gpu07: task 3`, mpirun's
            # `process rank 3 … on node gpu07`); whether the task is a rank is decided at the end.
            self.identity.task_on(src.index, task, str(host))
        pid = details.get("pid")
        place = _Place(
            str(host) if host is not None else line.host,
            rank if isinstance(rank, int) else None,
            local if isinstance(local, int) else None,
            gpu,
            pid if isinstance(pid, int) else None,
            task if isinstance(task, int) else line.task,
        )
        entry = src.table_place(line)
        if entry is not None:  # an indented line of torchrun's failure table: the entry's worker
            place.host, place.rank, place.local = entry.host, entry.rank, entry.local_rank
            if place.pid is not None and entry.pid is None:
                entry.pid = place.pid
                self.identity.bind_pid(place.pid, entry.host, entry.rank, entry.local_rank)
        return place

    def _finding(self, src: SourceState, number: int, line: LogLine, match: Match) -> None:
        details, gpu = convert(match.fields)
        if match.rule.class_id in ENDS and "local_rank" not in details and "--local" in line.text:
            # A launcher's report of a worker's end names the worker by its command line.
            argv = self.rules.context_fields(ContextKind.LAUNCHER_ARGV, line.text)
            if argv is not None:
                details["local_rank"] = int(argv["local_rank"])
        place = self._place(src, line, details, gpu)
        spec = self.specs[match.rule.class_id]
        if spec.class_id == PROCESS_SEGFAULT and "abort" in details:
            spec = self.abort_spec
        if line.cuda_dev is not None:
            details.setdefault("cuda_dev", line.cuda_dev)
        if place.rank is not None and (spec.class_id == COLLECTIVE_TIMEOUT or "last_completed" in details):
            self._progress(src, number, replace(line, rank=place.rank), details)
            seq, op = details.get("seq"), details.get("op")
            if isinstance(seq, int) and isinstance(op, str):
                numel = details.get("numel_in")
                seen = self._seen(src, number, line)
                work = Work(
                    place.rank, op, numel if isinstance(numel, int) else None, src.index, number, seen.text, seen.stamp
                )
                self.works.report(line.pg, seq, work)
        if spec.class_id in ENDS:
            if "pid" not in details and line.pid is not None:
                details["pid"] = line.pid  # a process's own report of its end (UCX, Open MPI): its pid
            src.exit_reported = True
            if place.pid is not None and isinstance(local := details.get("local_rank"), int):
                src.failed(place.pid, local)  # torchrun's agent: `failed (exitcode: …) local_rank: N (pid: P)`
        who = Who(src.index, place.host, line.pid, place.rank, place.local, place.gpu, place.pid, place.task)
        self.collapser.add(who, spec, self._seen(src, number, line, match.signature + 1), details)

    # -- the report -----------------------------------------------------------------------------

    def report(self, lines: int, skipped: int, hangs: HangInputs | None = None) -> Report:
        names = [s.name for s in self.sources]

        def label(source: int) -> str | None:
            return (names[source] or f"input-{source + 1}") if len(names) > 1 else None

        xid_symptoms = self.kernel.judge()

        def symptom(f: Finding) -> bool:
            spec = self.specs.get(f.class_id)
            if f.class_id == PROCESS_SEGFAULT:
                return "abort" in f.details
            return (spec is not None and spec.symptom) or f.class_id in xid_symptoms

        self._uncaught()
        connect = self.rules.rule(SOCKET_CONNECT_ERROR)
        for src, number, line, fields in self.retries.unanswered():
            self._finding(src, number, line, Match(connect, fields, len(connect.signatures)))
        name_stopped_workers(self.identity, self.sources)
        bind_to_failed_worker(self.collapser, self.identity, self.sources, ENDS)
        built = [build(where, tally, label) for where, tally in self.collapser.merged(self.identity.place)]
        # What slowed the job is told beside what ended it, never as its cause (findings/fold.py folds it too).
        slow = {c for c, spec in self.specs.items() if spec.performance}
        performance = fold([r.finding for r in order(r for r in built if r.finding.class_id in slow)], lambda _: True)
        ranked = [r for r in built if r.finding.class_id not in slow]
        reporter = Reporter(self.specs, self.identity, self.progress, self.works, self.versions, label)
        ranked += reporter.synthesized()
        if hangs is not None:  # Flight Recorder dumps and NCCL RAS output (diagnosis/training/hang/report.py)
            ranked += hangs.ranked(self.identity, ranked, symptom)

        def root_xid(f: Finding) -> bool:
            return f.class_id.startswith("xid_") and f.class_id not in xid_symptoms and f.action is not Action.IGNORE

        findings = fold([r.finding for r in order(kernel_first(settle(ranked, symptom), root_xid))], symptom)
        findings = reporter.straggler(findings)
        link_symptoms(findings, symptom)
        slowed = ", ".join(dict.fromkeys(f.title for f in performance))
        for f in findings:  # now that the job-wide analysis has added what it learnt
            if (spec := self.specs.get(f.class_id)) is not None:
                f.steps = next_steps.fill(spec.steps, {**next_steps.values(f), "performance": slowed})
        events = []
        for e in self.kernel.events:
            source = label(e.pop("_source"))
            if source is not None:
                e["file"] = source
            events.append(e)
        hang = hangs.to_json() if hangs is not None else None
        return Report(events, findings, names, lines, skipped, self.kernel.dropped, self.engine, performance, hang)

    def _uncaught(self) -> None:
        """Uncaught Python exceptions are deaths (see findings/deaths.py), placed like any finding."""
        for src, (end, width) in zip(self.sources, self.text_ends, strict=True):
            for trace in uncaught(src, exit_reported=src.exit_reported, end=end, wrap_width=width):
                seen = Seen(src.index, trace.line, trace.text[:EVIDENCE_CHARS], None, -1)
                who = Who(src.index, trace.host, None, trace.rank, trace.local_rank, task=trace.task)
                # The exception's type is the death's cause: ranks dying of different ones are told apart.
                fields = self.rules.context_fields(ContextKind.EXCEPTION, normalise(trace.text).text)
                cause: dict[str, str | int] = {"cause": fields["exc"]} if fields and fields.get("exc") else {}
                self.collapser.add(who, self.specs[JOB_FAILED], seen, cause)


def diagnose(
    sources: Iterable[tuple[str | None, Iterable[bytes]]],
    *,
    engine: str | None = None,
    store: BlobStore | None = None,
    parallel: bool = False,
    decode: Decoder | None = None,
) -> Report:
    """Diagnose training and kernel logs, and Flight Recorder dumps and NCCL RAS output among them.

    `sources` holds one (name or None, byte chunks) pair per input: a file, one rank's output or
    stdin; the caller decompresses. Chunks may split lines anywhere. Findings come root cause first.
    `engine` chooses the block scan ("hyperscan" or "python"; by default Hyperscan where it is
    installed, see diagnosis/training/scan/block_scan.py): both give the same findings. `store` keeps the compiled scan
    between processes (diagnosis/knowledge/cache.py); `parallel` lets the scan use a second thread (a second CPU).
    Dumps and RAS output are told by their content; `decode` reads a pickle dump (diagnosis/training/hang/report.py).
    """
    state = _Diagnosis(load_rules(), engine, store, parallel)
    hangs = HangInputs(decode)
    lines = skipped = 0
    for name, chunks in sources:
        text = hangs.take(name, chunks)
        if text is None:
            continue
        read, skip = state.read(name, text)
        lines += read
        skipped += skip
    return state.report(lines, skipped, hangs)
