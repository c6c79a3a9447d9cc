"""Training-log diagnosis: many ranks' logs in, one ordered list of findings out.

`diagnose` reads each input as a stream of byte chunks and runs the stages, each a sub-package:

1. input (`input/`): hard-wrapped text rejoined (`input/wrapped.py`), each line cleaned and split into
   its message and who printed it (`input/log_lines.py`);
2. scan (`scan/`): every signature over every line picks out the few lines worth a look
   (`scan/block_scan.py`), and the rules (`rules/`) say what each is (`scan/classify.py`). Lines with
   `NVRM` or `Xid (` go to the kernel-log parser (`findings/kernel.py`: XIDs, NVSwitch SXids);
3. findings (`record.py`, `findings/`): repeated lines collapse into one finding per (class, place) with
   a count and a few evidence lines (`findings/collapse.py`), so memory does not grow with the input;
   lines of context (`context.py`) feed what the job as a whole shows (`job.py`);
4. place (`place/`): who printed a line is pieced together across lines and inputs: NCCL's `host:pid
   [cudaDev]` header, launcher tags, PyTorch's `[rankN]:` and `[PG … Rank N]` tags, NCCL's communicator
   init line, torchrun's failure table (`place/source_state.py`). Identity is resolved at the end, when
   everything that can be learnt has been;
5. root cause (`findings/root_cause.py`): the findings root cause first; a death is kept only while
   nothing more specific explains it (`findings/deaths.py`), the straggler and the collective mismatch a
   timeout hides are named (`report.py`), and what many ranks share is folded into one (`findings/fold.py`);
6. report (`report.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.data_files import BlobStore
from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.training import context
from gpu_triage.diagnosis.training.findings.collapse import Collapser, Seen, Spec, build
from gpu_triage.diagnosis.training.findings.deaths import ENDS, TextEnd, settle, uncaught
from gpu_triage.diagnosis.training.findings.fold import fold
from gpu_triage.diagnosis.training.findings.kernel import EVIDENCE_CHARS, KernelFindings
from gpu_triage.diagnosis.training.findings.root_cause import kernel_first, link_symptoms, order
from gpu_triage.diagnosis.training.findings.workers import bind_to_failed_worker, name_stopped_workers
from gpu_triage.diagnosis.training.hang.report import Decoder, HangInputs
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.input.wrapped import InputLines
from gpu_triage.diagnosis.training.job import Job
from gpu_triage.diagnosis.training.place.facts import Who
from gpu_triage.diagnosis.training.place.source_state import SourceState
from gpu_triage.diagnosis.training.record import Recorder
from gpu_triage.diagnosis.training.report import Report, Reporter
from gpu_triage.diagnosis.training.rules import next_steps
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.model import (
    JOB_FAILED,
    PROCESS_SEGFAULT,
    SOCKET_CONNECT_ERROR,
    ContextKind,
    Match,
    RuleSet,
)
from gpu_triage.diagnosis.training.scan.block_scan import HyperscanFinder, engine_name, finder_for, skip_test_for
from gpu_triage.diagnosis.training.scan.classify import LineClassifier
from gpu_triage.diagnosis.xid.kernel_log import has_trigger
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser

__all__ = ["Report", "diagnose"]


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


class _Diagnosis:
    """The state of one `diagnose` call."""

    def __init__(
        self, rules: RuleSet, engine: str | None = None, store: BlobStore | None = None, parallel: bool = False
    ) -> None:
        self.rules = rules
        self.store = store
        self.parallel = parallel
        self.specs = _rule_specs(rules)
        self.engine = engine_name(engine)
        signatures = rules.signatures()
        self.patterns = tuple(s.scan for s in signatures)
        self.literals = tuple(lit for s in signatures for lit in s.literals)
        self.collapser = Collapser()
        self.job = Job()
        self.identity = self.job.identity
        self.kernel = KernelFindings(rules, self.collapser)
        self.classifier = LineClassifier(rules)
        self.recorder = Recorder(rules, self.specs, self.collapser, self.job)
        self.sources: list[SourceState] = []
        self.text_ends: list[tuple[TextEnd, int | None]] = []  # per input: how it ends, its wrap width
        self._xid_symptoms: set[str] | None = None  # set once every input is read (`_finish`)

    # -- reading ------------------------------------------------------------------------------

    def read(self, name: str | None, chunks: Iterable[bytes]) -> tuple[int, int]:
        src = SourceState(self.identity.add_source(), name)
        self.sources.append(src)
        needles = self.rules.needles or None
        finder = finder_for(self.patterns, self.literals, self.engine, self.store, needles, self.parallel)
        self.engine = "hyperscan" if isinstance(finder, HyperscanFinder) else "python"
        reader = InputLines(finder, skip_test=skip_test_for(self.literals, needles))
        kernel = KernelLogParser(strict=False)  # a pasted line may carry any prefix (xid/kernel_parser.py)
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
        line, match, ctx = self.classifier.classify(text, line, hits)
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
                    self.job.version(src, number, line, fields["version"])
            self.recorder.finding(src, number, line, match)
        elif ctx is not None:
            self.identity.learn(src.index, line)
            context.take(self.job, src, number, line, ctx)

    # -- the report -----------------------------------------------------------------------------

    def _finish(self) -> set[str]:
        """What only the end of every input tells, added to the tallies once: the XID verdicts of each
        GPU's incidents, the deaths no line reported, the connect retries never answered, the workers
        the launchers name. Returns the XID classes that were only ever symptoms."""
        if self._xid_symptoms is None:
            self._xid_symptoms = self.kernel.judge()
            self._uncaught()
            connect = self.rules.rule(SOCKET_CONNECT_ERROR)
            for src, number, line, fields in self.job.retries.unanswered():
                self.recorder.finding(src, number, line, Match(connect, fields, len(connect.signatures)))
            name_stopped_workers(self.identity, self.sources)
            bind_to_failed_worker(self.collapser, self.identity, self.sources, ENDS)
        return self._xid_symptoms

    def report(self, lines: int, skipped: int, hangs: HangInputs | None = None) -> Report:
        """The report of everything read. Pure: the state is settled once (`_finish`) and only read here,
        so a second call gives the same report."""
        names = [s.name for s in self.sources]

        def label(source: int) -> str | None:
            return (names[source] or f"input-{source + 1}") if len(names) > 1 else None

        xid_symptoms = self._finish()

        def symptom(f: Finding) -> bool:
            spec = self.specs.get(f.class_id)
            if f.class_id == PROCESS_SEGFAULT:
                return f.aborted
            return (spec is not None and spec.symptom) or f.class_id in xid_symptoms

        built = [build(where, tally, label) for where, tally in self.collapser.merged(self.identity.place)]
        # What slowed the job is told beside what ended it, never as its cause (findings/fold.py folds it too).
        slow = {c for c, spec in self.specs.items() if spec.performance}
        performance = fold([r.finding for r in order(r for r in built if r.finding.class_id in slow)], lambda _: True)
        ranked = [r for r in built if r.finding.class_id not in slow]
        reporter = Reporter(self.specs, self.identity, self.job.progress, self.job.works, self.job.versions, label)
        ranked += reporter.synthesized()
        if hangs is not None:  # Flight Recorder dumps and NCCL RAS output (hang/report.py)
            ranked += hangs.ranked(self.identity, ranked, symptom)

        def root_xid(f: Finding) -> bool:
            return f.xid is not None and f.class_id not in xid_symptoms and f.action is not Action.IGNORE

        findings = fold([r.finding for r in order(kernel_first(settle(ranked, symptom), root_xid))], symptom)
        findings = reporter.straggler(findings)
        link_symptoms(findings, symptom)
        slowed = ", ".join(dict.fromkeys(f.title for f in performance))
        for f in findings:  # now that the job-wide analysis has added what it learnt
            if (spec := self.specs.get(f.class_id)) is not None:
                f.steps = next_steps.fill(spec.steps, {**next_steps.values(f), "performance": slowed})
        events = [e.to_json(label(e.source)) for e in self.kernel.events]
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
