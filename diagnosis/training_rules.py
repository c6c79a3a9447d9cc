"""The training-log rules (data/training_rules.yaml), loaded into frozen values and checked once.

Everything that can be wrong with the file is found at load time and reported together in one
`DataError`: unknown keys, bad or unbounded regexes, unknown group names, actions or severities,
duplicate classes, playbook ids that do not follow `nccl-<class>`, examples that do not land on
their own rule (a more specific rule earlier in the file would steal them), examples the prefilter
would never see, and near misses that match something.

Order is meaning: `RuleSet.rules` is most specific first, and `RuleSet.match` returns the first
rule with a matching signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from gpu_triage.diagnosis.actions import Action, Severity
from gpu_triage.diagnosis.data_files import Problems, parse_yaml, read_data
from gpu_triage.diagnosis.log_lines import normalise


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
    "expected_size numel_in numel_out hca_index joined family driver_version nranks errno rc"
)
_STR_FIELDS = (
    "host peer hca ib_status_name opcode_name op pg reason event element call symbol path "
    "nccl_error source_file version comm size_text op_id request"
)
FIELDS: dict[str, FieldKind] = {
    **dict.fromkeys(_INT_FIELDS.split(" "), FieldKind.INT),
    **dict.fromkeys(_STR_FIELDS.split(" "), FieldKind.STR),
    "gpu": FieldKind.BUS_ID,
    "nccl_bus_id": FieldKind.NCCL_BUS_ID,
}


class ContextKind(StrEnum):
    COMM_INIT = "comm_init"  # NCCL communicator init: rank, nranks, cudaDev, busId of host:pid
    NCCL_VERSION = "nccl_version"
    FAILURE_HOST = "failure_host"  # torchrun failure summary
    FAILURE_RANK = "failure_rank"
    PROGRESS = "progress"  # last enqueued / completed NCCL work of a rank


@dataclass(frozen=True, slots=True)
class Example:
    line: str
    after: str | None = None  # the line before it, when only that line lets the prefilter see it


@dataclass(frozen=True, slots=True)
class Rule:
    class_id: str
    severity: Severity
    action: Action
    playbook: str
    title: str
    steps: tuple[str, ...]
    signatures: tuple[re.Pattern[str], ...]
    examples: tuple[Example, ...]
    specificity: int  # 0 = most specific; the position in the file
    symptom: bool = False  # usually caused by another rank's fault


@dataclass(frozen=True, slots=True)
class ContextRule:
    kind: ContextKind
    signatures: tuple[re.Pattern[str], ...]
    examples: tuple[Example, ...]


@dataclass(frozen=True, slots=True)
class Follow:
    trigger: str
    lines: int


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule
    fields: dict[str, str]  # captured groups that matched; converted later by FIELDS kind


@dataclass(frozen=True, slots=True)
class ContextMatch:
    kind: ContextKind
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    context: tuple[ContextRule, ...]
    triggers: tuple[str, ...]
    follow: tuple[Follow, ...]
    near_misses: tuple[str, ...]

    def match(self, text: str) -> Match | None:
        """The most specific rule matching the bare message `text`, with its captured fields."""
        for rule in self.rules:
            for sig in rule.signatures:
                m = sig.search(text)
                if m is not None:
                    return Match(rule, {k: v for k, v in m.groupdict().items() if v is not None})
        return None

    def match_context(self, text: str) -> ContextMatch | None:
        for ctx in self.context:
            for sig in ctx.signatures:
                m = sig.search(text)
                if m is not None:
                    return ContextMatch(ctx.kind, {k: v for k, v in m.groupdict().items() if v is not None})
        return None

    def rule(self, class_id: str) -> Rule:
        for rule in self.rules:
            if rule.class_id == class_id:
                return rule
        raise KeyError(class_id)


def playbook_id(class_id: str) -> str:
    """The runbook id of a training-log class: one playbook per class."""
    return "nccl-" + class_id.replace("_", "-")


def unbounded_repeats(pattern: str) -> list[int]:
    """Offsets of `*`, `+` or `{n,}` outside character classes: repetition without an upper bound.

    Every repeat bounded keeps a search linear in the line length with a small constant, which is
    what protects the classifier from catastrophic backtracking on hostile lines.
    """
    found: list[int] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("]", i + 1) or pattern.startswith("^]", i + 1):
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif c in "*+":
            found.append(i)
        elif c == "{" and (m := re.match(r"\{\d+,\}", pattern[i:])):
            found.append(i)
            i += m.end()
            continue
        i += 1
    return found


# Classes the diagnosis code itself names (training.py): a rules file without one of them cannot be used.
CUDA_ILLEGAL_ADDRESS = "cuda_illegal_address"  # where an application-fault XID ranks
COLLECTIVE_TIMEOUT = "collective_timeout"  # the class the straggler analysis attaches to
NCCL_LIB_MISMATCH = "nccl_lib_mismatch"  # reported when ranks print different NCCL versions
REQUIRED_CLASSES = (CUDA_ILLEGAL_ADDRESS, COLLECTIVE_TIMEOUT, NCCL_LIB_MISMATCH)

_RULE_KEYS = {"class", "severity", "action", "playbook", "title", "steps", "signatures", "examples"}
_RULE_OPTIONAL = {"symptom"}
_TOP_KEYS = {"version", "prefilter", "context", "rules", "near_misses"}


def _signatures(ck: Problems, where: str, node: object) -> tuple[re.Pattern[str], ...]:
    compiled: list[re.Pattern[str]] = []
    for i, text in enumerate(ck.strings(where, node)):
        at = f"{where}[{i}]"
        if offsets := unbounded_repeats(text):
            ck.fail(at, f"unbounded repetition at offset(s) {offsets}; use a bounded {{m,n}}")
        try:
            pattern = re.compile(text)
        except re.error as exc:
            ck.fail(at, f"bad regex: {exc}")
            continue
        for name in pattern.groupindex:
            if name not in FIELDS:
                ck.fail(at, f"unknown field (group name) {name!r}")
        compiled.append(pattern)
    return tuple(compiled)


def _examples(ck: Problems, where: str, node: object, follow: tuple[Follow, ...]) -> tuple[Example, ...]:
    if not isinstance(node, list) or not node:
        ck.fail(where, "expected a non-empty list of examples")
        return ()
    out: list[Example] = []
    for i, item in enumerate(node):
        at = f"{where}[{i}]"
        if isinstance(item, str) and item:
            out.append(Example(item))
            continue
        spec = ck.keys(at, item, {"line", "after"})
        line, after = spec.get("line"), spec.get("after")
        if not (isinstance(line, str) and line and isinstance(after, str) and after):
            ck.fail(at, "`line` and `after` must be non-empty strings")
            continue
        if not any(f.trigger in after for f in follow):
            ck.fail(at, "`after` contains no follow trigger, so it cannot lead to the line")
        out.append(Example(line, after))
    return tuple(out)


def _reachable(example: Example, triggers: tuple[str, ...]) -> bool:
    line = example.after if example.after is not None else example.line
    return any(t in line for t in triggers)


def _parse_prefilter(ck: Problems, node: object) -> tuple[tuple[str, ...], tuple[Follow, ...]]:
    pre = ck.keys("prefilter", node, {"triggers"}, {"follow"})
    triggers = tuple(ck.strings("prefilter.triggers", pre.get("triggers", [])))
    follow: list[Follow] = []
    follow_node = pre.get("follow", [])
    if not isinstance(follow_node, list):
        ck.fail("prefilter.follow", "expected a list")
        follow_node = []
    for i, item in enumerate(follow_node):
        spec = ck.keys(f"prefilter.follow[{i}]", item, {"trigger", "lines"})
        trig, lines = spec.get("trigger"), spec.get("lines")
        if isinstance(trig, str) and trig and isinstance(lines, int) and 1 <= lines <= 100:
            follow.append(Follow(trig, lines))
        elif spec:
            ck.fail(f"prefilter.follow[{i}]", "needs a non-empty `trigger` and 1 <= `lines` <= 100")
    return triggers, tuple(follow)


def _parse_context(ck: Problems, node: object, follow: tuple[Follow, ...]) -> tuple[ContextRule, ...]:
    if not isinstance(node, list):
        ck.fail("context", "expected a list")
        return ()
    contexts: list[ContextRule] = []
    kinds = {k.value for k in ContextKind}
    for i, item in enumerate(node):
        at = f"context[{i}]"
        keys = {"kind", "signatures", "examples"}
        spec = ck.keys(at, item, keys)
        kind = spec.get("kind")
        if not isinstance(kind, str) or kind not in kinds:
            ck.fail(at, f"unknown context kind {kind!r}")
            continue
        contexts.append(
            ContextRule(
                ContextKind(kind),
                _signatures(ck, f"{at}.signatures", spec.get("signatures")),
                _examples(ck, f"{at}.examples", spec.get("examples"), follow),
            )
        )
    return tuple(contexts)


def _parse_rule(ck: Problems, i: int, item: object, follow: tuple[Follow, ...]) -> Rule | None:
    spec = ck.keys(f"rules[{i}]", item, _RULE_KEYS, _RULE_OPTIONAL)
    class_id = spec.get("class")
    at = f"rules[{i}] ({class_id})"
    if not (isinstance(class_id, str) and re.fullmatch(r"[a-z][a-z0-9_]{1,60}", class_id)):
        ck.fail(at, "`class` must be a lower_snake_case id")
        return None
    severity, action = ck.severity(at, spec.get("severity")), ck.action(at, spec.get("action"))
    if spec.get("playbook") != playbook_id(class_id):
        ck.fail(at, f"playbook must be {playbook_id(class_id)!r}, got {spec.get('playbook')!r}")
    title, symptom = spec.get("title"), spec.get("symptom", False)
    if not (isinstance(title, str) and title.strip()):
        ck.fail(at, "`title` must be a non-empty string")
    if not isinstance(symptom, bool):
        ck.fail(at, "`symptom` must be true or false")
    return Rule(
        class_id=class_id,
        severity=severity or Severity.UNKNOWN,
        action=action or Action.IGNORE,
        playbook=playbook_id(class_id),
        title=str(title),
        steps=tuple(ck.strings(f"{at}.steps", spec.get("steps"))),
        signatures=_signatures(ck, f"{at}.signatures", spec.get("signatures")),
        examples=_examples(ck, f"{at}.examples", spec.get("examples"), follow),
        specificity=i,
        symptom=symptom is True,
    )


def parse_rules(doc: object, origin: str = "training_rules.yaml") -> RuleSet:
    """Validate the parsed YAML `doc`; raise DataError listing every problem."""
    ck = Problems(origin)
    top = ck.keys("", doc, _TOP_KEYS)
    if top.get("version", 1) != 1:
        ck.fail("version", f"unsupported version {top.get('version')!r}")
    triggers, follow = _parse_prefilter(ck, top.get("prefilter", {}))
    contexts = _parse_context(ck, top.get("context", []), follow)
    rules_node = top.get("rules")
    if not isinstance(rules_node, list) or not rules_node:
        ck.fail("rules", "expected a non-empty list")
        rules_node = []
    rules: list[Rule] = []
    for i, item in enumerate(rules_node):
        rule = _parse_rule(ck, i, item, follow)
        if rule is None:
            continue
        if any(r.class_id == rule.class_id for r in rules):
            ck.fail(f"rules[{i}] ({rule.class_id})", "duplicate class")
        rules.append(rule)
    if rules_node:
        present = {r.class_id for r in rules}
        for class_id in REQUIRED_CLASSES:
            if class_id not in present:
                ck.fail("rules", f"no rule for class {class_id!r}, which the diagnosis code relies on")
    near = tuple(ck.strings("near_misses", top.get("near_misses", []), allow_empty=True))
    ruleset = RuleSet(tuple(rules), contexts, triggers, follow, near)
    _check_examples(ck, ruleset)
    ck.raise_if_any(origin)
    return ruleset


def _check_examples(ck: Problems, rs: RuleSet) -> None:
    items: list[tuple[str, tuple[re.Pattern[str], ...], tuple[Example, ...]]] = [
        (r.class_id, r.signatures, r.examples) for r in rs.rules
    ] + [(f"context {c.kind}", c.signatures, c.examples) for c in rs.context]
    for name, signatures, examples in items:
        texts = [normalise(ex.line).text for ex in examples]
        for sig in signatures:
            if not any(sig.search(text) for text in texts):
                ck.fail(name, f"no example for signature {sig.pattern!r}")
    for rule in rs.rules:
        for ex in rule.examples:
            got = rs.match(normalise(ex.line).text)
            if got is None:
                ck.fail(rule.class_id, f"example matches no rule: {ex.line!r}")
            elif got.rule is not rule:
                ck.fail(rule.class_id, f"example lands on more specific {got.rule.class_id!r}: {ex.line!r}")
            if not _reachable(ex, rs.triggers):
                ck.fail(rule.class_id, f"example contains no prefilter trigger: {ex.line!r}")
    for ctx in rs.context:
        for ex in ctx.examples:
            text = normalise(ex.line).text
            if rs.match(text) is not None:
                ck.fail(f"context {ctx.kind}", f"example also matches a rule: {ex.line!r}")
            found = rs.match_context(text)
            if found is None or found.kind is not ctx.kind:
                ck.fail(f"context {ctx.kind}", f"example does not match its context: {ex.line!r}")
            if not _reachable(ex, rs.triggers):
                ck.fail(f"context {ctx.kind}", f"example contains no prefilter trigger: {ex.line!r}")
    for line in rs.near_misses:
        got = rs.match(normalise(line).text)
        if got is not None:
            ck.fail("near_misses", f"matches {got.rule.class_id!r}: {line!r}")


def parse_rules_text(text: str, origin: str = "training_rules.yaml") -> RuleSet:
    problems = Problems()
    doc = parse_yaml(text, origin, problems)
    problems.raise_if_any(origin)
    return parse_rules(doc, origin)


@cache
def load_rules() -> RuleSet:
    """The shipped rules, parsed and validated once per process."""
    return parse_rules_text(read_data("training_rules.yaml"))
