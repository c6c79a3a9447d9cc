"""Reading and checking diagnosis/data/training_rules.yaml (the model is in diagnosis/training/rules/model.py).

Everything wrong with the file is found at load time and reported together in one `DataError`:
unknown keys, bad regexes (unbounded repetition, look-around and the other constructs rules/regex.py
refuses), signatures without distinctive literal text, unknown group names, actions or severities,
duplicate classes, playbook ids that do not follow `nccl-<class>`, signatures without an example,
examples that do not land on their own rule (a more specific rule earlier in the file would steal
them), context examples that a rule would take, and near misses that match a rule.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import Problems, adopted, parse_yaml, read_data
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.rules import next_steps
from gpu_triage.diagnosis.training.rules.model import (
    FIELDS,
    REQUIRED_CLASSES,
    ContextKind,
    ContextRule,
    Example,
    Fallback,
    Rule,
    RuleSet,
    Signature,
    playbook_id,
)
from gpu_triage.diagnosis.training.rules.regex import (
    MIN_LITERAL,
    literal_needles,
    required_literals,
    scan_pattern,
    unsupported,
)

# The model (RuleSet, Example, the class ids …) is imported from diagnosis/training/rules/model.py, not from here.
__all__ = ["load_rules", "parse_rules", "parse_rules_text"]

_RULE_KEYS = {"class", "severity", "action", "playbook", "title", "steps", "signatures", "examples"}
_RULE_OPTIONAL = {"symptom", "performance"}
_TOP_KEYS = {"version", "context", "rules", "near_misses", "fallback"}
_FALLBACK_KEYS = {"signatures", "examples", "benign", "benign_examples"}


def signature(ck: Problems, at: str, text: str) -> Signature | None:
    """One signature, checked; None (with the problems recorded) when it cannot be used."""
    problems = unsupported(text)
    for problem in problems:
        ck.fail(at, problem)
    if problems:
        return None
    pattern = re.compile(text, re.ASCII)
    for name in pattern.groupindex:
        if name not in FIELDS:
            ck.fail(at, f"unknown field (group name) {name!r}")
    literals = required_literals(text)
    if not literals or min(map(len, literals)) < MIN_LITERAL:
        ck.fail(at, f"no literal text of {MIN_LITERAL}+ characters that every match holds: key it on the message")
        return None
    return Signature(text, literals, scan_pattern(text), [pattern])


def _signatures(ck: Problems, where: str, node: object) -> tuple[Signature, ...]:
    out = []
    for i, text in enumerate(ck.strings(where, node)):
        sig = signature(ck, f"{where}[{i}]", text)
        if sig is not None:
            out.append(sig)
    return tuple(out)


def _examples(ck: Problems, where: str, node: object) -> tuple[Example, ...]:
    if not isinstance(node, list) or not node:
        ck.fail(where, "expected a non-empty list of examples")
        return ()
    out: list[Example] = []
    for i, item in enumerate(node):
        at = f"{where}[{i}]"
        if isinstance(item, str) and item:
            out.append(Example(item))
            continue
        spec = ck.keys(at, item, {"line"}, {"shape"})
        line, shape = spec.get("line"), spec.get("shape")
        if not (isinstance(line, str) and line) or not (shape is None or (isinstance(shape, str) and shape)):
            ck.fail(at, "`line` must be a non-empty string and `shape` one too when given")
            continue
        out.append(Example(line, shape))
    return tuple(out)


def _steps(ck: Problems, where: str, node: object) -> tuple[str, ...]:
    """A rule's next steps: strings, or `{unless: name, text: …}` for the advice given when a name is unknown."""
    if not isinstance(node, list) or not node:
        ck.fail(where, "expected a non-empty list of steps")
        return ()
    out: list[str] = []
    for i, item in enumerate(node):
        at = f"{where}[{i}]"
        if isinstance(item, dict):
            spec = ck.keys(at, item, {"unless", "text"})
            name, text = spec.get("unless"), spec.get("text")
            if not (isinstance(name, str) and isinstance(text, str) and text):
                ck.fail(at, "`unless` must name a field and `text` be a non-empty string")
                continue
            step = next_steps.unless(name, text)
        elif isinstance(item, str) and item:
            step = item
        else:
            ck.fail(at, "a step is a non-empty string or a mapping of `unless` and `text`")
            continue
        for name in next_steps.names(step):
            if name not in FIELDS and name not in next_steps.PLACE_NAMES | next_steps.REPORT_NAMES:
                ck.fail(at, f"unknown name {{{name}}}: a step may name the fields of a finding and its place")
        out.append(step)
    return tuple(out)


def _parse_context(ck: Problems, node: object) -> tuple[ContextRule, ...]:
    if not isinstance(node, list):
        ck.fail("context", "expected a list")
        return ()
    contexts: list[ContextRule] = []
    kinds = {k.value for k in ContextKind}
    for i, item in enumerate(node):
        at = f"context[{i}]"
        spec = ck.keys(at, item, {"kind", "signatures", "examples"})
        kind = spec.get("kind")
        if not isinstance(kind, str) or kind not in kinds:
            ck.fail(at, f"unknown context kind {kind!r}")
            continue
        contexts.append(
            ContextRule(
                ContextKind(kind),
                _signatures(ck, f"{at}.signatures", spec.get("signatures")),
                _examples(ck, f"{at}.examples", spec.get("examples")),
            )
        )
    return tuple(contexts)


def _parse_fallback(ck: Problems, node: object) -> Fallback:
    spec = ck.keys("fallback", node, set(), _FALLBACK_KEYS)
    if not spec:
        return Fallback()
    benign = "benign" in spec or "benign_examples" in spec
    return Fallback(
        _signatures(ck, "fallback.signatures", spec.get("signatures")),
        _signatures(ck, "fallback.benign", spec.get("benign")) if benign else (),
        _examples(ck, "fallback.examples", spec.get("examples")),
        _examples(ck, "fallback.benign_examples", spec.get("benign_examples")) if benign else (),
    )


def _parse_rule(ck: Problems, i: int, item: object) -> Rule | None:
    spec = ck.keys(f"rules[{i}]", item, _RULE_KEYS, _RULE_OPTIONAL)
    class_id = spec.get("class")
    at = f"rules[{i}] ({class_id})"
    if not (isinstance(class_id, str) and re.fullmatch(r"[a-z][a-z0-9_]{1,60}", class_id)):
        ck.fail(at, "`class` must be a lower_snake_case id")
        return None
    severity, action = ck.severity(at, spec.get("severity")), ck.action(at, spec.get("action"))
    if spec.get("playbook") != playbook_id(class_id):
        ck.fail(at, f"playbook must be {playbook_id(class_id)!r}, got {spec.get('playbook')!r}")
    title, symptom, performance = spec.get("title"), spec.get("symptom", False), spec.get("performance", False)
    if not (isinstance(title, str) and title.strip()):
        ck.fail(at, "`title` must be a non-empty string")
    if not isinstance(symptom, bool) or not isinstance(performance, bool):
        ck.fail(at, "`symptom` and `performance` must be true or false")
    if performance is True and (symptom is True or severity is Severity.CRITICAL):
        ck.fail(at, "a performance condition slows a job, it does not end one: severity info or warning, no symptom")
    return Rule(
        class_id=class_id,
        severity=severity or Severity.UNKNOWN,
        action=action or Action.IGNORE,
        playbook=playbook_id(class_id),
        title=str(title),
        steps=_steps(ck, f"{at}.steps", spec.get("steps")),
        signatures=_signatures(ck, f"{at}.signatures", spec.get("signatures")),
        examples=_examples(ck, f"{at}.examples", spec.get("examples")),
        specificity=i,
        symptom=symptom is True,
        performance=performance is True,
    )


def parse_rules(doc: object, origin: str = "training_rules.yaml") -> RuleSet:
    """Validate the parsed YAML `doc`; raise DataError listing every problem."""
    ck = Problems(origin)
    top = ck.keys("", doc, _TOP_KEYS)
    if top.get("version", 1) != 1:
        ck.fail("version", f"unsupported version {top.get('version')!r}")
    contexts = _parse_context(ck, top.get("context", []))
    rules_node = top.get("rules")
    if not isinstance(rules_node, list) or not rules_node:
        ck.fail("rules", "expected a non-empty list")
        rules_node = []
    rules: list[Rule] = []
    for i, item in enumerate(rules_node):
        rule = _parse_rule(ck, i, item)
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
    ruleset = RuleSet(tuple(rules), contexts, near, _parse_fallback(ck, top.get("fallback", {})))
    literals = [lit for sig in ruleset.signatures() for lit in sig.literals]
    ruleset = replace(ruleset, needles=literal_needles(literals))
    _check_examples(ck, ruleset)
    ck.raise_if_any(origin)
    return ruleset


def _check_examples(ck: Problems, rs: RuleSet) -> None:
    items: list[tuple[str, tuple[Signature, ...], tuple[Example, ...]]] = [
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
    for ctx in rs.context:
        for ex in ctx.examples:
            text = normalise(ex.line).text
            if rs.match(text) is not None:
                ck.fail(f"context {ctx.kind}", f"example also matches a rule: {ex.line!r}")
            found = rs.match_context(text)
            if found is None or found.kind is not ctx.kind:
                ck.fail(f"context {ctx.kind}", f"example does not match its context: {ex.line!r}")
    for line in rs.near_misses:
        got = rs.match(normalise(line).text)
        if got is not None and not got.rule.performance:
            ck.fail("near_misses", f"matches {got.rule.class_id!r}: {line!r}")
        elif got is None and rs.match_context(normalise(line).text) is None and rs.fallback.match(line):
            ck.fail("near_misses", f"an error-level line no rule names, not a benign one: {line!r}")
    _check_fallback(ck, rs)


def _check_fallback(ck: Problems, rs: RuleSet) -> None:
    fb = rs.fallback
    raws = [normalise(ex.line).raw for ex in fb.examples]
    benign = [normalise(ex.line).raw for ex in fb.benign_examples]
    for sig in fb.signatures:
        if not any(sig.search(raw) for raw in raws):
            ck.fail("fallback", f"no example for signature {sig.pattern!r}")
    for sig in fb.benign:
        if not any(sig.search(raw) for raw in benign):
            ck.fail("fallback", f"no benign example for signature {sig.pattern!r}")
    for ex, raw in zip(fb.examples, raws, strict=True):
        text = normalise(ex.line).text
        ctx = rs.match_context(text)
        if rs.match(text) is not None or (ctx is not None and ctx.kind is not ContextKind.EXCEPTION):
            ck.fail("fallback", f"example a rule or a context takes first: {ex.line!r}")
        elif fb.match(raw) is None:
            ck.fail("fallback", f"example is no error-level line, or a benign one: {ex.line!r}")
    for ex, raw in zip(fb.benign_examples, benign, strict=True):
        if not any(sig.search(raw) for sig in fb.signatures) or fb.match(raw) is not None:
            ck.fail("fallback", f"benign example is not an error-level line the benign list excuses: {ex.line!r}")


def parse_rules_text(text: str, origin: str = "training_rules.yaml") -> RuleSet:
    problems = Problems()
    doc = parse_yaml(text, origin, problems)
    problems.raise_if_any(origin)
    return parse_rules(doc, origin)


@cache
def load_rules() -> RuleSet:
    """The shipped rules, parsed and validated once per process."""
    if isinstance(known := adopted("rules"), RuleSet):
        return known
    return parse_rules_text(read_data("training_rules.yaml"))
