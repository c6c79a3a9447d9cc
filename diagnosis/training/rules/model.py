"""The training-log rules (diagnosis/data/training_rules.yaml) as the classifier uses them.

A `Rule` is one class: what to say about it (severity, action, playbook, steps) and the signatures
that recognise it. A `ContextRule` recognises a line that carries identity, progress or a launcher's
report structure instead of a fault. Each `Signature` is the regex of the rules file plus the two
forms the whole-block scan uses (diagnosis/training/rules/regex.py): the literals every match holds, which also
gate the regex here (a line without any of them is not searched), and the Hyperscan form.

Order is meaning: `RuleSet.rules` is most specific first, and `RuleSet.match` returns the first rule
with a matching signature. diagnosis/training/rules/load.py reads and checks the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from gpu_triage.diagnosis.core.actions import Action, Severity


class FieldKind(StrEnum):
    INT = "int"
    STR = "str"
    BUS_ID = "bus_id"  # a PCI bus id in any NVML/kernel spelling
    NCCL_BUS_ID = "nccl_bus_id"  # NCCL's packed hex busId, e.g. 3b000


# The named groups a signature may capture. A closed list, so that a typo in the YAML is an error
# instead of a field nobody reads.
_INT_FIELDS = (
    "rank peer_rank local_rank pid cuda_dev port nccl_code ib_status vendor_err opcode length seq "
    "last_enqueued last_completed timeout_ms ran_ms seconds count ring found expected size "
    "expected_size numel_in numel_out hca_index joined family driver_version nranks errno rc exitcode "
    "gid_index index task xid"
)
_STR_FIELDS = (
    "host peer hca ib_status_name opcode_name op pg reason event element call symbol path "
    "nccl_error source_file version comm size_text op_id request signal abort tasks ranks process lib "
    "state net timeout_text time message exc attribute node"
)
FIELDS: dict[str, FieldKind] = {
    **dict.fromkeys(_INT_FIELDS.split(" "), FieldKind.INT),
    **dict.fromkeys(_STR_FIELDS.split(" "), FieldKind.STR),
    "gpu": FieldKind.BUS_ID,
    "nccl_bus_id": FieldKind.NCCL_BUS_ID,
}


class ContextKind(StrEnum):
    COMM_INIT = "comm_init"  # NCCL communicator init: rank, nranks, cudaDev, busId of host:pid
    STOPPING = "stopping"  # torchrun's agent stopping a worker: `Sending process P closing signal SIGTERM`
    NODE_LAYOUT = "node_layout"  # NCCL 2.20+: a communicator's rank, nRanks and localRank of host:pid
    NCCL_VERSION = "nccl_version"
    PROGRESS = "progress"  # last enqueued / completed NCCL work of a rank
    FAILURE_HOST = "failure_host"  # torchrun's failure table: one entry per failed worker
    FAILURE_RANK = "failure_rank"
    TABLE_END = "table_end"  # the table's borders close an entry
    CONTINUES = "continues"  # the first line of a message printed over two lines
    CONTINUED = "continued"  # ... and its second line
    IGNORED_EXCEPTION = "ignored_exception"  # Python: `Exception ignored in: …` (the next traceback is harmless)
    TRACEBACK = "traceback"  # Python: `Traceback (most recent call last):`
    EXCEPTION = "exception"  # the `SomeError: message` line that ends a traceback
    LAUNCHER_ARGV = "launcher_argv"  # `--local_rank=N` in the command line a launcher reports a worker's end with
    CONNECT_RETRY = "connect_retry"  # NCCL retrying a connect: a socket_connect_error unless its init completes


@dataclass(frozen=True, slots=True)
class Example:
    line: str
    shape: str | None = None  # which versions / launchers print the line this way


@dataclass(frozen=True, slots=True)
class Signature:
    pattern: str  # the regex of the rules file, matched (ASCII) against the bare message
    literals: tuple[str, ...]  # every match holds one of these (rules/regex.required_literals)
    scan: str  # the Hyperscan form (rules/regex.scan_pattern)
    # Compiled when a line first holds one of the literals: a one-shot command that loads the rules from
    # the knowledge cache (diagnosis/knowledge/cache.py) compiles only the few its input needs.
    _compiled: list[re.Pattern[str]] = field(default_factory=list, compare=False, repr=False)

    @property
    def regex(self) -> re.Pattern[str]:
        if not self._compiled:
            self._compiled.append(re.compile(self.pattern, re.ASCII))
        return self._compiled[0]

    def search(self, text: str) -> re.Match[str] | None:
        for literal in self.literals:
            if literal in text:
                return self.regex.search(text)
        return None

    def __getstate__(self) -> tuple[str, tuple[str, ...], str]:
        return self.pattern, self.literals, self.scan  # the compiled form is this process's own

    def __setstate__(self, state: tuple[str, tuple[str, ...], str]) -> None:
        for name, value in zip(("pattern", "literals", "scan", "_compiled"), (*state, []), strict=True):
            object.__setattr__(self, name, value)


@dataclass(frozen=True, slots=True)
class Rule:
    class_id: str
    severity: Severity
    action: Action
    playbook: str
    title: str
    steps: tuple[str, ...]
    signatures: tuple[Signature, ...]
    examples: tuple[Example, ...]
    specificity: int  # 0 = most specific; the position in the file
    symptom: bool = False  # usually caused by another rank's fault
    performance: bool = False  # slows or stalls a job without ending it: reported beside the findings


@dataclass(frozen=True, slots=True)
class ContextRule:
    kind: ContextKind
    signatures: tuple[Signature, ...]
    examples: tuple[Example, ...]


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule
    fields: dict[str, str]  # captured groups that matched; converted later by FIELDS kind
    signature: int = 0  # which of the rule's signatures matched


@dataclass(frozen=True, slots=True)
class ContextMatch:
    kind: ContextKind
    fields: dict[str, str]


def _groups(m: re.Match[str]) -> dict[str, str]:
    return {k: v for k, v in m.groupdict().items() if v}


@dataclass(frozen=True, slots=True)
class Fallback:
    """Error-level lines of a known printer that no rule names (an `NCCL WARN`, a CUDA error, a crash
    signal, c10d's `E`-level glog): each still tells of a failure, `job_failed_unclassified`, unless it
    is one of the `benign` ones healthy jobs print. Both are matched against the whole line, prefixes
    and all, since the glog level is part of the prefix."""

    signatures: tuple[Signature, ...] = ()
    benign: tuple[Signature, ...] = ()
    examples: tuple[Example, ...] = ()
    benign_examples: tuple[Example, ...] = ()

    def match(self, raw: str, only: Iterable[int] | None = None) -> tuple[int, dict[str, str]] | None:
        """(which signature, its fields) for an error-level line `raw` that is not a benign one; `only`:
        the signatures to try (by their index here), when the block scan said which may match."""
        for i in sorted(only) if only is not None else range(len(self.signatures)):
            if i >= len(self.signatures):
                break
            sig = self.signatures[i]
            m = sig.search(raw)
            if m is not None:
                if any(b.search(raw) for b in self.benign):
                    return None
                return i, _groups(m)
        return None


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    context: tuple[ContextRule, ...]
    near_misses: tuple[str, ...]
    fallback: Fallback = Fallback()
    needles: tuple[str, ...] = ()  # what the literal search looks for (block_scan.literal_needles)
    # Every rule's and context's signature in `signatures()` order, with its owner and its place there:
    # the block scan names signatures by that order (`only`), and asking only those it names gives the
    # same answer as asking all of them, since it names every one that can match.
    _by_rule: tuple[tuple[Rule, int, Signature], ...] = field(default=(), compare=False, repr=False)
    _by_context: tuple[tuple[ContextRule, Signature], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        by_rule = tuple((r, i, sig) for r in self.rules for i, sig in enumerate(r.signatures))
        object.__setattr__(self, "_by_rule", by_rule)
        object.__setattr__(self, "_by_context", tuple((c, sig) for c in self.context for sig in c.signatures))

    def match(self, text: str, only: Iterable[int] | None = None) -> Match | None:
        """The most specific rule matching the bare message `text`, with its captured fields. `only`: the
        signatures (by their place in `signatures()`) the block scan saw match the line; None: all."""
        for at in sorted(only) if only is not None else range(len(self._by_rule)):
            if at >= len(self._by_rule):
                break
            rule, i, sig = self._by_rule[at]
            m = sig.search(text)
            if m is not None:
                return Match(rule, _groups(m), i)
        return None

    def match_context(self, text: str, only: Iterable[int] | None = None) -> ContextMatch | None:
        first = len(self._by_rule)
        places = (a - first for a in sorted(only) if a >= first) if only is not None else range(len(self._by_context))
        for at in places:
            if at >= len(self._by_context):
                break
            ctx, sig = self._by_context[at]
            m = sig.search(text)
            if m is not None:
                return ContextMatch(ctx.kind, _groups(m))
        return None

    def fallback_match(self, raw: str, only: Iterable[int] | None = None) -> tuple[int, dict[str, str]] | None:
        """`Fallback.match`, `only` by place in `signatures()` as for `match`."""
        first = len(self._by_rule) + len(self._by_context)
        return self.fallback.match(raw, None if only is None else (a - first for a in only if a >= first))

    def context_fields(self, kind: ContextKind, text: str) -> dict[str, str] | None:
        """The fields of `text` as a line of context `kind`, or None (a line a rule classified may be one too)."""
        for ctx in self.context:
            if ctx.kind is kind:
                for sig in ctx.signatures:
                    if (m := sig.search(text)) is not None:
                        return _groups(m)
        return None

    def rule(self, class_id: str) -> Rule:
        for rule in self.rules:
            if rule.class_id == class_id:
                return rule
        raise KeyError(class_id)

    def signatures(self) -> tuple[Signature, ...]:
        """Every signature, rules first, then contexts and fallbacks: what the block scan must flag."""
        rules = tuple(s for r in self.rules for s in r.signatures)
        return rules + tuple(s for c in self.context for s in c.signatures) + self.fallback.signatures


def playbook_id(class_id: str) -> str:
    """The runbook id of a training-log class: one playbook per class."""
    return "nccl-" + class_id.replace("_", "-")


# Classes the diagnosis code itself names: a rules file without one of them cannot be used.
CUDA_ILLEGAL_ADDRESS = "cuda_illegal_address"  # where an application-fault XID ranks
COLLECTIVE_TIMEOUT = "collective_timeout"  # the class the straggler analysis attaches to
COLLECTIVE_MISMATCH = "collective_mismatch"  # reported when ranks time out in different collectives
NCCL_LIB_MISMATCH = "nccl_lib_mismatch"  # reported when ranks print different NCCL versions
PROCESS_SEGFAULT = "process_segfault"  # a SIGABRT of it ranks after the symptoms
JOB_FAILED = "job_failed_unclassified"  # a death nothing more specific explains
HOST_OOM_KILLED = "host_oom_killed"  # a SIGKILL: reports the end of a process, like the two above
SOCKET_CONNECT_ERROR = "socket_connect_error"  # what NCCL's connect retries are when its init never completes
REQUIRED_CLASSES = (
    CUDA_ILLEGAL_ADDRESS,
    COLLECTIVE_TIMEOUT,
    COLLECTIVE_MISMATCH,
    NCCL_LIB_MISMATCH,
    PROCESS_SEGFAULT,
    JOB_FAILED,
    HOST_OOM_KILLED,
    SOCKET_CONNECT_ERROR,
)
