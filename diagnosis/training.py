"""Training-log diagnosis: many ranks' logs in, one ordered list of findings out.

`diagnose` reads each input as a stream of byte chunks. `line_scan` picks out the few lines that
hold a trigger word; each is cleaned and split into message and identity by `log_lines`; lines
with `NVRM` go to the kernel-log XID parser, the rest to the rules of `training_rules` (first
matching rule wins, most specific first). Nothing else is kept: repeated lines collapse into one
finding per (class, host, rank, GPU) with a count and the first and last evidence lines, so memory
does not grow with the input.

Who printed a line is pieced together across lines and inputs: NCCL's `host:pid [cudaDev]` header,
torchrun's `[rankN]:` tag, PyTorch's `[PG … Rank N]` tag, NCCL's `comm … rank N nranks M cudaDev D
busId B - Init COMPLETE` line (which ties host:pid to a rank and a GPU bus id), torchrun's failure
summary, and the one host or rank an input may be limited to. Identity is resolved at the end, when
everything that can be learnt has been.

Ordering (root cause first, the straggler of a collective timeout) lives in `root_cause`; XID
findings take their verdict from the XID catalog. An XID code missing from the catalog becomes a
finding of severity UNKNOWN with the daemon's verdict for such codes (`incidents.UNKNOWN_XID`: run
diagnostics on the drained GPU), and the raw line goes with it. A GPU's XIDs are judged together as the
daemon judges them (`incidents.decide`), with the times the lines carry where they carry absolute ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_triage.diagnosis.actions import Action
from gpu_triage.diagnosis.collapse import Collapser, Seen, Spec, Tally, Where, build
from gpu_triage.diagnosis.findings import Finding
from gpu_triage.diagnosis.identity import IdentityBook, Who
from gpu_triage.diagnosis.incidents import Decision, Occurrence, decide
from gpu_triage.diagnosis.kernel_log import EventKind, KernelEvent
from gpu_triage.diagnosis.kernel_log_parser import KernelLogParser
from gpu_triage.diagnosis.line_scan import LineScanner
from gpu_triage.diagnosis.log_lines import LogLine, normalise
from gpu_triage.diagnosis.root_cause import Progress, ProgressTracker, Ranked, Straggler, link_symptoms, order
from gpu_triage.diagnosis.training_fields import convert
from gpu_triage.diagnosis.training_rules import (
    COLLECTIVE_TIMEOUT,
    CUDA_ILLEGAL_ADDRESS,
    NCCL_LIB_MISMATCH,
    ContextKind,
    ContextMatch,
    Match,
    RuleSet,
    load_rules,
)
from gpu_triage.diagnosis.xid_catalog import UNKNOWN_XID, XidEntry
from gpu_triage.diagnosis.xid_data import load_catalog

MAX_EVENTS = 10_000  # XID events listed in a report; the rest are counted
EVIDENCE_CHARS = 1000  # of each evidence line kept; bounds memory when many places fail
FAILURE_WINDOW = 8  # lines from torchrun's `rank : N` to the exit code it describes
CACHE_ENTRIES = 4096  # recent lines and messages whose classification is remembered


@dataclass(slots=True)
class _Source:
    index: int
    name: str | None
    failure: tuple[int, str | None, int | None] | None = None  # torchrun summary: (line, host, rank)


@dataclass
class Report:
    """The result of one `diagnose` call; `to_json` is what POST /api/v1/diagnose and `diagnose --json` print."""

    events: list[dict[str, Any]]
    findings: list[Finding]
    sources: list[str | None] = field(default_factory=list)
    lines_read: int = 0
    lines_skipped: int = 0  # lines holding a trigger that could not be read (over-long, binary)
    events_dropped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "events": [dict(e) for e in self.events],
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "sources": len(self.sources),
                "lines_read": self.lines_read,
                "lines_skipped": self.lines_skipped,
                "events_dropped": self.events_dropped,
            },
        }


def _rule_spec(rules: RuleSet) -> dict[str, Spec]:
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
        )
        for r in rules.rules
    }


_XID_CHECK = "On the node, read `dmesg -T | grep -i xid` and `nvidia-smi -q` for the GPU with this bus id."


def _xid_tier(action: Action, rules: RuleSet) -> float:
    """Where an XID with this action ranks among the training-log classes."""
    if action.rank <= Action.RUN_DIAGNOSTICS.rank:
        return -1.0  # a hardware verdict: the GPU it names is the root cause of its ranks' errors
    if action is Action.IGNORE:
        return float(len(rules.rules))
    return rules.rule(CUDA_ILLEGAL_ADDRESS).specificity - 0.5  # the application's own fault


def _xid_spec(code: int, entry: XidEntry | None, rules: RuleSet) -> Spec:
    """What an XID finding says: the catalog's verdict, and where it ranks among training-log classes."""
    if entry is None:
        return Spec(
            class_id=f"xid_{code}",
            severity=UNKNOWN_XID.severity,
            action=UNKNOWN_XID.action,
            title=f"XID {code}: code not in the XID catalog",
            playbook=UNKNOWN_XID.playbook,
            steps=(
                "Keep the full NVRM line for the case: the code is newer than this catalog or undocumented.",
                _XID_CHECK,
                UNKNOWN_XID.action.description,
            ),
            tier=-1.0,
        )
    return Spec(
        class_id=f"xid_{code}",
        severity=entry.severity,
        action=entry.action,
        title=f"XID {code} ({entry.mnemonic}): {entry.title}",
        playbook=entry.playbook,
        steps=(_XID_CHECK, entry.action.description),
        tier=_xid_tier(entry.action, rules),
    )


class _Diagnosis:
    """The state of one `diagnose` call."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self.specs = _rule_spec(rules)
        self.symptoms = frozenset(r.class_id for r in rules.rules if r.symptom)
        self.xid_specs: dict[int, tuple[Spec, XidEntry | None]] = {}
        self.xid_occurrences: dict[tuple[int, str | None], list[Occurrence]] = {}  # by (input, GPU)
        self._lines: dict[str, tuple[LogLine, Match | None, ContextMatch | None]] = {}
        self._verdicts: dict[str, tuple[Match | None, ContextMatch | None]] = {}
        self.collapser = Collapser()
        self.identity = IdentityBook()
        self.versions: dict[str, Seen] = {}
        self.progress = ProgressTracker()
        self.events: list[dict[str, Any]] = []
        self.events_dropped = 0
        self.sources: list[_Source] = []
        # Evidence names its input only when there are several.
        self.label: Callable[[int], str | None] = lambda source: None

    # -- reading ------------------------------------------------------------------------------

    def read(self, name: str | None, chunks: Iterable[bytes]) -> tuple[int, int]:
        src = _Source(self.identity.add_source(), name)
        self.sources.append(src)
        rules = self.rules
        scanner = LineScanner(
            [t.encode() for t in rules.triggers], [(f.trigger.encode(), f.lines) for f in rules.follow]
        )
        kernel = KernelLogParser()
        for chunk in chunks:
            for cand in scanner.feed(bytes(chunk)):
                self._line(src, kernel, cand.line, cand.data.decode("utf-8", "replace"))
        for cand in scanner.finish():
            self._line(src, kernel, cand.line, cand.data.decode("utf-8", "replace"))
        for event in kernel.finish():
            self._xid(src, normalise(event.text), event)
        return scanner.lines, scanner.skipped

    def _line(self, src: _Source, kernel: KernelLogParser, number: int, text: str) -> None:
        text = text.rstrip("\r")
        # A progress bar redraws itself with bare CRs; each redraw is a line of its own.
        for segment in text.split("\r") if "\r" in text else (text,):
            if segment.strip():
                self._segment(src, kernel, number, segment)

    def _segment(self, src: _Source, kernel: KernelLogParser, number: int, text: str) -> None:
        line = normalise(text) if "NVRM" in text else None
        if line is not None:
            own = False
            for event in kernel.feed(line.raw, number):
                # The parser may hand back an event it held from an earlier line: that line's time and
                # host are the event's, not this one's.
                here = event.line == number
                own = own or here
                self._xid(src, line if here else normalise(event.text), event)
            if own:
                self.identity.learn(src.index, line)
                return
        line, match, ctx = self._classify(text, line)
        self.identity.learn(src.index, line)
        if match is not None:
            self._finding(src, number, line, self.specs[match.rule.class_id], match.fields)
        elif ctx is not None:
            self._context(src, number, line, ctx.kind, ctx.fields)

    def _classify(self, text: str, line: LogLine | None = None) -> tuple[LogLine, Match | None, ContextMatch | None]:
        """Normalise (unless `line` is `text` normalised already) and match `text`, remembering recent answers.

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
            match = self.rules.match(line.text)
            verdict = (match, None if match is not None else self.rules.match_context(line.text))
            if len(self._verdicts) >= CACHE_ENTRIES:
                self._verdicts.clear()
            self._verdicts[line.text] = verdict
        if len(self._lines) >= CACHE_ENTRIES:
            self._lines.clear()
        self._lines[text] = (line, *verdict)
        return line, *verdict

    def _seen(self, src: _Source, number: int, line: LogLine) -> Seen:
        return Seen(src.index, number, line.raw[:EVIDENCE_CHARS], line.stamp)

    def _context(self, src: _Source, number: int, line: LogLine, kind: ContextKind, raw: dict[str, str]) -> None:
        fields, gpu = convert(raw)
        if kind is ContextKind.COMM_INIT:
            if line.host is not None and line.pid is not None:
                rank, nranks = int(fields["rank"]), int(fields["nranks"])
                self.identity.comm_init(src.index, line.host, line.pid, rank=rank, nranks=nranks, gpu=gpu)
        elif kind is ContextKind.NCCL_VERSION:
            if len(self.versions) < 32:
                self.versions.setdefault(str(fields["version"]), self._seen(src, number, line))
        elif kind is ContextKind.FAILURE_HOST:
            src.failure = (number, str(fields["host"]), None)
        elif kind is ContextKind.FAILURE_RANK:
            host = src.failure[1] if src.failure is not None else None
            rank = int(fields["rank"])
            src.failure = (number, host, rank)
            if host is not None:
                self.identity.pair(rank, host)
        elif kind is ContextKind.PROGRESS:
            self._progress(src, number, line, fields)

    def _progress(self, src: _Source, number: int, line: LogLine, fields: dict[str, str | int]) -> None:
        if line.rank is None:
            return
        completed, enqueued = fields.get("last_completed"), fields.get("last_enqueued")
        seq = fields.get("seq")
        if not isinstance(completed, int) and isinstance(seq, int):
            # The work that timed out had not completed; the one before it had.
            completed, enqueued = seq - 1, seq
        if isinstance(completed, int):
            enq = enqueued if isinstance(enqueued, int) else completed
            seen = self._seen(src, number, line)
            self.progress.report(line.pg, line.rank, Progress(completed, enq, src.index, number, seen.text, line.stamp))

    def _finding(self, src: _Source, number: int, line: LogLine, spec: Spec, raw: dict[str, str]) -> None:
        details, gpu = convert(raw)
        rank = line.rank
        if rank is None and isinstance(details.get("rank"), int):
            rank = int(details["rank"])
        host = line.host
        if src.failure is not None and number - src.failure[0] <= FAILURE_WINDOW:
            host = host or src.failure[1]
            rank = rank if rank is not None else src.failure[2]
        local = line.local_rank
        if local is None and isinstance(details.get("local_rank"), int):
            local = int(details["local_rank"])
        if line.cuda_dev is not None:
            details.setdefault("cuda_dev", line.cuda_dev)
        subject = details.get("pid")
        subject_pid = subject if isinstance(subject, int) else None
        if spec.class_id == COLLECTIVE_TIMEOUT or "last_completed" in details:
            self._progress(src, number, line, details)
        who = Who(src.index, host, line.pid, rank, local, gpu, subject_pid)
        self.collapser.add(who, spec, self._seen(src, number, line), details)

    def _xid(self, src: _Source, line: LogLine, event: KernelEvent) -> None:
        if event.kind is not EventKind.XID or event.code is None:
            return
        listed = len(self.events) < MAX_EVENTS
        if listed:
            self.events.append(
                {
                    "line": event.line,
                    "xid": event.code,
                    "pci_bus_id": event.pci_bus_id,
                    "pid": event.pid,
                    "process": event.process,
                    "timestamp": event.timestamp,
                    "text": event.text[:EVIDENCE_CHARS],
                    "_source": src.index,
                }
            )
        else:
            self.events_dropped += 1
        known = self.xid_specs.get(event.code)
        if known is None:
            entry = load_catalog().get(event.code)
            known = self.xid_specs[event.code] = (_xid_spec(event.code, entry, self.rules), entry)
        spec, entry = known
        details: dict[str, str | int] = {"xid": event.code}
        if event.process:
            details["process"] = event.process
        if event.pid is not None:
            details["pid"] = event.pid
        details.update((k, v[:200]) for k, v in event.details.items())
        if entry is not None and entry.causes:
            details.setdefault("causes", "; ".join(entry.causes)[:200])
        seen = Seen(src.index, event.line, event.text[:EVIDENCE_CHARS], line.stamp)
        self.collapser.add(Who(src.index, host=line.host, gpu=event.pci_bus_id), spec, seen, details)
        if listed:  # the same bound as the events listed
            # Only an absolute time compares across lines the way incidents.decide needs; without one
            # the XIDs keep input order and count as one burst.
            ts = line.stamp.value if line.stamp is not None and line.stamp.kind == "abs" else None
            occurrence = Occurrence(event.code, event.text, ts, ref=event.line, details=event.details)
            self.xid_occurrences.setdefault((src.index, event.pci_bus_id), []).append(occurrence)

    # -- resolving ----------------------------------------------------------------------------

    def report(self, lines: int, skipped: int) -> Report:
        names = [s.name for s in self.sources]
        if len(names) > 1:
            self.label = lambda source: names[source] or f"input-{source + 1}"
        xid_symptoms = self._xid_context()
        ranked = order(self._resolve())
        findings = self._straggler(ranked)
        link_symptoms(findings, lambda class_id: class_id in self.symptoms or class_id in xid_symptoms)
        events = []
        for e in self.events:
            source = self.label(e.pop("_source"))
            if source is not None:
                e["source"] = source
            events.append(e)
        return Report(events, findings, names, lines, skipped, self.events_dropped)

    def _xid_context(self) -> set[str]:
        """Judge each GPU's XIDs together, as the daemon does (`incidents.decide`): the root cause of a
        burst keeps the action its neighbours call for (Xid 154's recovery action, 48 with 63/64), the
        rest are symptoms. Returns the XID classes that were only ever symptoms."""
        verdicts: dict[tuple[int, str | None], dict[int, Decision]] = {}
        for key, occurrences in self.xid_occurrences.items():
            lead: dict[int, Decision] = {}
            for d in decide(occurrences):
                held = lead.get(d.occurrence.code)
                if held is None or (d.root and (not held.root or d.action.rank < held.action.rank)):
                    lead[d.occurrence.code] = d
            verdicts[key] = lead

        def change(who: Who, tally: Tally) -> tuple[Spec, dict[str, str | int]] | None:
            spec = tally.spec
            if not spec.class_id.startswith("xid_"):
                return None
            d = verdicts.get((who.source, who.gpu), {}).get(int(spec.class_id.removeprefix("xid_")))
            if d is None or (d.action, d.severity) == (spec.action, spec.severity):
                return None
            tier = _xid_tier(d.action, self.rules) if d.root else float(len(self.rules.rules))
            new = replace(spec, severity=d.severity, action=d.action, tier=tier, symptom=not d.root)
            return new, ({"note": d.note} if d.note else {})

        self.collapser.respec(change)
        roots = {f"xid_{code}" for lead in verdicts.values() for code, d in lead.items() if d.root}
        return {f"xid_{code}" for lead in verdicts.values() for code in lead} - roots

    def _resolve(self) -> list[Ranked]:
        out = [build(where, tally, self.label) for where, tally in self.collapser.merged(self.identity.place)]
        mismatch = self._version_mismatch()
        if mismatch is not None:
            out.append(mismatch)
        return out

    def _version_mismatch(self) -> Ranked | None:
        if len(self.versions) < 2:
            return None
        ordered = sorted(self.versions.items(), key=lambda kv: tuple(int(p) for p in kv[0].split(".")))
        first, last = ordered[0][1], ordered[-1][1]
        part = Tally(self.specs[NCCL_LIB_MISMATCH], first, last, len(ordered))
        part.details["versions"] = ", ".join(v for v, _ in ordered)
        return build((NCCL_LIB_MISMATCH, None, None, None), part, self.label, "versions")

    def _straggler(self, ranked: list[Ranked]) -> list[Finding]:
        findings = [r.finding for r in ranked]
        timeouts = [i for i, f in enumerate(findings) if f.class_id == COLLECTIVE_TIMEOUT]
        found = self.progress.straggler() if timeouts else None
        if found is None:
            return findings
        for i in timeouts:
            findings[i].details["straggler_rank"] = found.rank
        own = next((i for i in timeouts if findings[i].rank == found.rank), None)
        straggler = self._straggler_finding(found) if own is None else findings.pop(own)
        straggler.title += f" (straggler: rank {found.rank})"
        straggler.details.update(
            straggler_rank=found.rank,
            last_completed=found.progress.completed,
            last_enqueued=found.progress.enqueued,
            others_last_completed=found.others_completed,
            reporting_ranks=found.reporting_ranks,
            pg=found.pg,
        )
        findings.insert(timeouts[0], straggler)
        return findings

    def _straggler_finding(self, found: Straggler) -> Finding:
        p = found.progress
        seen = Seen(p.source, p.line, p.text, p.stamp)
        part = Tally(self.specs[COLLECTIVE_TIMEOUT], seen, seen)
        rank = found.rank
        where: Where = (COLLECTIVE_TIMEOUT, self.identity.host_of(rank), rank, self.identity.gpu_of(rank))
        return build(where, part, self.label).finding


def diagnose(sources: Iterable[tuple[str | None, Iterable[bytes]]]) -> Report:
    """Diagnose training and kernel logs.

    `sources` holds one (name or None, byte chunks) pair per input: a file, one rank's output or
    stdin; the caller decompresses. Chunks may split lines anywhere. Findings come root cause first.
    """
    state = _Diagnosis(load_rules())
    lines = skipped = 0
    for name, chunks in sources:
        read, skip = state.read(name, chunks)
        lines += read
        skipped += skip
    return state.report(lines, skipped)
