"""The XID catalog's four data files, checked as a whole and joined into an `XidCatalog`.

`xid_nvidia.yaml` and `xid_nvlink5.yaml` are generated from NVIDIA's catalog by tools/gen_xid_catalog.py;
`xid_policy.yaml` and `action_mappings.yaml` are ours. Every problem in them is reported at once, as a
`DataError`, the first time the catalog is loaded, so a bad file stops the daemon at start-up instead of
failing a request.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import Problems, adopted, parse_yaml, read_data
from gpu_triage.diagnosis.xid.catalog import (
    CONTEXTS,
    ActionMappings,
    Bits,
    Nvlink5Rule,
    XidCatalog,
    XidEntry,
    parse_hex,
    unit_key,
)
from gpu_triage.diagnosis.xid.context_data import build_context

DATA_FILES = ("xid_nvidia.yaml", "xid_policy.yaml", "action_mappings.yaml", "xid_nvlink5.yaml")
_FACT_KEYS = {"mnemonic", "description", "applies_to", "immediate", "investigatory", "xid154_linkage"}
_POLICY_KEYS = {"title", "causes", "action", "severity", "playbook"}
_POLICY_OPTIONAL = {"deviation", "context"}
_RULE_KEYS = {"xid", "units", "intr_info", "error_status", "immediate", "action2"}
_RULE_OPTIONAL = {"investigatory", "severity", "origin"}
_INVALID = Action.CONTACT_SUPPORT  # stands in for a bad value; the catalog is rejected anyway


def _text(p: Problems, where: str, value: Any) -> str:
    """Non-empty text, its runs of blanks (YAML folding) made single spaces."""
    if not isinstance(value, str) or not value.strip():
        p.fail(where, f"expected non-empty text, got {value!r}")
        return ""
    return " ".join(value.split())


def _bucket(p: Problems, where: str, value: Any, mappings: ActionMappings) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in mappings.buckets:
        p.fail(where, f"unknown resolution bucket {value!r} (map it in action_mappings.yaml)")
    return str(value)


def _section(doc: Any, key: str, p: Problems, where: str) -> dict[Any, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, dict):
        p.fail(where, f"`{key}` must be a mapping")
        return {}
    return value


def _fallback(doc: Any, key: str, p: Problems) -> Action:
    row: Any = doc.get(key) if isinstance(doc, dict) else None
    where = f"action_mappings.yaml: {key}"
    if p.complete(where, row, {"action"}, {"why"}):
        return p.action(where, row["action"]) or _INVALID
    return _INVALID


def _peer(doc: Any, peer: str, p: Problems) -> dict[Action, str]:
    where = f"action_mappings.yaml: {peer}"
    section = _section(doc, peer, p, "action_mappings.yaml")
    p.keys(where, section, {"vocabulary", "from_action"})
    vocabulary = set(map(str, section.get("vocabulary") or ()))
    out: dict[Action, str] = {}
    for name, row in _section(section, "from_action", p, where).items():
        if p.complete(f"{where} {name}", row, {"to"}, {"why"}):
            if str(row["to"]) not in vocabulary:
                p.fail(f"{where} {name}", f"{row['to']!r} is not in its vocabulary")
            if (action := p.action(f"{where} {name}", name)) is not None:
                out[action] = str(row["to"])
    if missing := [a.value for a in Action if a not in out]:
        p.fail(where, f"no counterpart for {missing}")
    return out


def _build_mappings(doc: Any, p: Problems) -> ActionMappings:
    where = "action_mappings.yaml"
    fallbacks = {"unknown_bucket", "unknown_recovery_action"}
    p.keys(where, doc, fallbacks | {"nvidia_buckets", "nvml_recovery_actions", "xid154_labels", "gpud", "nvsentinel"})
    buckets: dict[str, Action] = {}
    for name, row in _section(doc, "nvidia_buckets", p, where).items():
        if p.complete(f"{where}: bucket {name}", row, {"action"}, {"why"}):
            buckets[str(name)] = p.action(f"{where}: bucket {name}", row["action"]) or _INVALID
    recovery: dict[int, Action] = {}
    names: dict[int, str] = {}
    for value, row in _section(doc, "nvml_recovery_actions", p, where).items():
        at = f"{where}: recovery action {value}"
        if not isinstance(value, int):
            p.fail(where, f"recovery action {value!r} is not an integer")
        elif p.complete(at, row, {"name", "action"}, {"why"}):
            recovery[value] = p.action(at, row["action"]) or _INVALID
            names[value] = _text(p, at, row["name"])
    if missing := sorted(set(range(8)) - set(recovery)):
        p.fail(where, f"NVML recovery actions {missing} are not mapped")
    labels = _section(doc, "xid154_labels", p, where)
    return ActionMappings(
        buckets=buckets,
        unknown_bucket=_fallback(doc, "unknown_bucket", p),
        recovery=recovery,
        recovery_names=names,
        unknown_recovery=_fallback(doc, "unknown_recovery_action", p),
        xid154_labels={str(k): p.action(f"{where}: xid154 label {k!r}", v) or _INVALID for k, v in labels.items()},
        gpud=_peer(doc, "gpud", p),
        nvsentinel=_peer(doc, "nvsentinel", p),
    )


def _bits(pattern: Any, where: str, p: Problems) -> tuple[Bits, ...]:
    if pattern is None:
        return ()
    if not isinstance(pattern, str) or not re.fullmatch(r"[01-]{32}", pattern):
        p.fail(where, f"{pattern!r} is not a 32-bit IntrInfo pattern")
        return ()
    return ((int(pattern.replace("0", "1").replace("-", "0"), 2), int(pattern.replace("-", "0"), 2)),)


def _build_rule(row: Any, where: str, p: Problems, mappings: ActionMappings) -> Nvlink5Rule | None:
    if not p.complete(where, row, _RULE_KEYS, _RULE_OPTIONAL):
        return None
    intr: dict[str, Any] = row["intr_info"] if isinstance(row["intr_info"], dict) else {}
    action2: dict[str, Any] = row["action2"] if isinstance(row["action2"], dict) else {}
    action2_intr: dict[str, Any] = action2["intr_info"] if isinstance(action2.get("intr_info"), dict) else {}
    statuses = [parse_hex(str(s)) for s in row["error_status"] or ()]
    if None in statuses or not isinstance(row["xid"], int):
        p.fail(where, "xid must be an integer and error_status hex values")
    severity = str(row.get("severity") or "")
    if row["immediate"] is None:
        p.fail(where, "missing the recovery bucket")
    return Nvlink5Rule(
        xid=row["xid"] if isinstance(row["xid"], int) else 0,
        units=frozenset(unit_key(str(u)) for u in row["units"] or ()),
        patterns=_bits(intr.get("v1"), where, p) + _bits(intr.get("v2"), where, p),
        error_status=frozenset(s for s in statuses if s is not None),
        immediate=_bucket(p, where, row["immediate"], mappings) or "",
        action2_patterns=_bits(action2_intr.get("v1"), where, p) + _bits(action2_intr.get("v2"), where, p),
        action2=_bucket(p, where, action2.get("bucket"), mappings),
        investigatory=_bucket(p, where, row.get("investigatory"), mappings),
        fatal=bool(severity) and not severity.lower().startswith("non"),
    )


def _build_entry(code: int, fact: Any, rule: Any, p: Problems, mappings: ActionMappings) -> XidEntry | None:
    facts, policy = f"xid_nvidia.yaml: xid {code}", f"xid_policy.yaml: xid {code}"
    ok = p.complete(facts, fact, _FACT_KEYS)
    if not (p.complete(policy, rule, _POLICY_KEYS, _POLICY_OPTIONAL) and ok):
        return None
    immediate = _bucket(p, facts, fact["immediate"], mappings)
    nvidia_action = mappings.buckets.get(immediate) if immediate else None
    action = p.action(policy, rule["action"])
    deviation = rule.get("deviation")
    if action is None:
        pass  # an unknown action: comparing it with NVIDIA's would only add noise
    elif nvidia_action is not None and action != nvidia_action and not deviation:
        p.fail(policy, f"{action} differs from {immediate} ({nvidia_action}); say why in `deviation`")
    elif deviation is not None and action == nvidia_action:
        p.fail(policy, "`deviation` given, but the action is what NVIDIA's bucket says")
    severity = p.severity(policy, rule["severity"])
    playbook = p.playbook(policy, rule["playbook"])
    causes = rule["causes"] if isinstance(rule["causes"], list) and rule["causes"] else [None]
    # A comma inside brackets in a YAML flow list silently splits one cause in two: quote such causes.
    for cause in causes:
        if isinstance(cause, str) and cause.count("(") != cause.count(")"):
            p.fail(policy, f"cause {cause!r} has unbalanced brackets (quote causes that contain commas)")
    context = rule.get("context") if isinstance(rule.get("context"), list) else [rule.get("context")]
    context = [c for c in context if c is not None]
    if unknown := sorted(set(map(str, context)) - CONTEXTS):
        p.fail(policy, f"unknown context {unknown}")
    return XidEntry(
        code=code,
        mnemonic=_text(p, f"{facts}: mnemonic", fact["mnemonic"]),
        nvidia_description=_text(p, f"{facts}: description", fact["description"]),
        title=_text(p, f"{policy}: title", rule["title"]),
        causes=tuple(_text(p, f"{policy}: causes", c) for c in causes),
        immediate_bucket=immediate,
        investigatory_bucket=_bucket(p, facts, fact["investigatory"], mappings),
        action=action or _INVALID,
        severity=severity or Severity.UNKNOWN,
        playbook=playbook,
        deviation=_text(p, f"{policy}: deviation", deviation) if deviation is not None else None,
        context=frozenset(map(str, context)),
        applies_to=tuple(map(str, fact["applies_to"] or ())),
        nvidia_action=nvidia_action,
        xid154_linkage=fact["xid154_linkage"],
    )


def _code_order(code: Any) -> tuple[int, int, str]:
    return (0, code, "") if isinstance(code, int) else (1, 0, str(code))


def build_catalog(facts: Any, policy: Any, mappings: Any, nvlink5: Any, problems: Problems | None = None) -> XidCatalog:
    """Join the four parsed documents; raises DataError listing every problem (`problems` first)."""
    p = problems if problems is not None else Problems()
    p.keys("xid_nvidia.yaml", facts, {"source", "xids"})
    p.keys("xid_policy.yaml", policy, {"classifier", "xids"})
    p.keys("xid_nvlink5.yaml", nvlink5, {"source", "rules"})
    action_mappings = _build_mappings(mappings, p)
    fact_rows = _section(facts, "xids", p, "xid_nvidia.yaml")
    policy_rows = _section(policy, "xids", p, "xid_policy.yaml")
    if only_facts := sorted(set(fact_rows) - set(policy_rows), key=_code_order):
        p.fail("xid_policy.yaml", f"no policy for codes {only_facts}")
    if only_policy := sorted(set(policy_rows) - set(fact_rows), key=_code_order):
        p.fail("xid_policy.yaml", f"policy for codes NVIDIA does not list {only_policy}")
    entries: dict[int, XidEntry] = {}
    for code in sorted(set(fact_rows) & set(policy_rows), key=_code_order):
        if not isinstance(code, int) or isinstance(code, bool):
            p.fail("xid_policy.yaml", f"xid code {code!r} is not an integer")
        elif (entry := _build_entry(code, fact_rows[code], policy_rows[code], p, action_mappings)) is not None:
            entries[code] = entry
    rows = nvlink5.get("rules") if isinstance(nvlink5, dict) else None
    if not isinstance(rows, list):
        p.fail("xid_nvlink5.yaml", "`rules` must be a list")
    built = [_build_rule(r, f"xid_nvlink5.yaml: rule {i}", p, action_mappings) for i, r in enumerate(rows or ())]
    rules = tuple(r for r in built if r is not None)
    context = build_context(policy.get("classifier") if isinstance(policy, dict) else None, entries, p)
    if stray := sorted({r.xid for r in rules} - context.decoded):
        p.fail("xid_nvlink5.yaml", f"rules for codes the classifier does not decode (classifier.decoded): {stray}")
    if undecodable := sorted(context.decoded - {r.xid for r in rules}):
        p.fail("xid_policy.yaml: classifier: decoded", f"no rows in xid_nvlink5.yaml for {undecodable}")
    p.raise_if_any("invalid XID catalog data")
    return XidCatalog(entries, action_mappings, rules, context)


@functools.cache
def load_catalog() -> XidCatalog:
    """The shipped catalog, loaded and checked once."""
    if isinstance(known := adopted("catalog"), XidCatalog):
        return known
    problems = Problems()
    facts, policy, mappings, nvlink5 = (parse_yaml(read_data(name), name, problems) for name in DATA_FILES)
    return build_catalog(facts, policy, mappings, nvlink5, problems=problems)
