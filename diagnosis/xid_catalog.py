"""The XID catalog: NVIDIA's facts joined with our policy and our action mappings, checked as a whole.

Four data files (diagnosis/data/): `xid_nvidia.yaml` and `xid_nvlink5.yaml` are generated from NVIDIA's
catalog by tools/gen_xid_catalog.py; `xid_policy.yaml` and `action_mappings.yaml` are ours. Every problem
in them is reported at once, as a `CatalogError`, the first time the catalog is loaded, so a bad file
stops the daemon at start-up instead of failing a request.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpu_triage.diagnosis.actions import Action, Severity, most_urgent
from gpu_triage.diagnosis.kernel_log import parse_recovery_change
from gpu_triage.diagnosis.playbooks import PLAYBOOK_ID, SEVERITIES

CONTEXTS = frozenset({"history", "co_occurrence", "recovery_text", "decode", "platform"})
_FACT_KEYS = {"mnemonic", "description", "applies_to", "immediate", "investigatory", "xid154_linkage"}
_POLICY_KEYS = {"title", "causes", "action", "severity", "playbook"}
_POLICY_OPTIONAL = {"deviation", "context"}
_RULE_KEYS = {"xid", "units", "intr_info", "error_status", "immediate", "action2"}
_RULE_OPTIONAL = {"investigatory", "severity", "origin"}


class CatalogError(ValueError):
    """The data files are inconsistent; `problems` lists every finding."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid XID catalog data:\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    nvidia_description: str  # NVIDIA's short label ("Unused" for retired codes)
    title: str  # ours
    causes: tuple[str, ...]
    immediate_bucket: str | None  # None where this catalog revision has no bucket (162-172)
    investigatory_bucket: str | None
    action: Action
    severity: Severity
    playbook: str
    deviation: str | None  # why `action` differs from `nvidia_action`
    context: frozenset[str]  # what the classifier must consider beyond the code (CONTEXTS)
    applies_to: tuple[str, ...] = ()
    nvidia_action: Action | None = None  # what NVIDIA's immediate bucket means in our vocabulary
    xid154_linkage: str | None = None  # the first driver that follows this code with an Xid 154

    @property
    def xid154_linked(self) -> bool:
        return bool(self.xid154_linkage)


@dataclass(frozen=True, slots=True)
class ActionMappings:
    buckets: Mapping[str, Action]
    unknown_bucket: Action
    recovery: Mapping[int, Action]  # nvmlDeviceGpuRecoveryAction_t value → Action
    recovery_names: Mapping[int, str]
    unknown_recovery: Action
    xid154_labels: Mapping[str, Action]
    gpud: Mapping[Action, str]
    nvsentinel: Mapping[Action, str]

    def bucket_action(self, bucket: str) -> Action:
        return self.buckets.get(bucket, self.unknown_bucket)

    def recovery_action(self, value: int) -> Action:
        return self.recovery.get(value, self.unknown_recovery)

    def recovery_named(self, value: int) -> tuple[str, Action]:
        """An NVML recovery action value → (its name, or the number where unnamed; our Action)."""
        return self.recovery_names.get(value, str(value)), self.recovery_action(value)


_Bits = tuple[int, int]  # (mask, value) of an IntrInfo pattern: `x & mask == value`


@dataclass(frozen=True, slots=True)
class Nvlink5Rule:
    """One row of NVIDIA's Xid 144-150 decode sheet."""

    xid: int
    units: frozenset[str]  # normalised names; rows name the V1 and the V2 spelling
    patterns: tuple[_Bits, ...]  # IntrInfo, V1 and V2 layouts
    error_status: frozenset[int]  # empty: any
    immediate: str
    action2_patterns: tuple[_Bits, ...]  # IntrInfo that promotes the row to `action2`
    action2: str | None
    investigatory: str | None
    fatal: bool

    def bucket_for(self, intr_info: int | None, line_fatal: bool | None) -> str:
        if self.action2 is not None and (_matches(self.action2_patterns, intr_info) or (line_fatal and not self.fatal)):
            return self.action2
        return self.immediate


@dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    unit: str
    immediate_bucket: str
    investigatory_bucket: str | None
    action: Action
    fatal: bool
    rows: int  # decode-sheet rows the line matched; more than one means the line was ambiguous


def _matches(patterns: tuple[_Bits, ...], value: int | None) -> bool:
    return value is not None and any(value & mask == bits for mask, bits in patterns)


def _unit_key(name: str) -> str:
    return "_".join(name.upper().split())


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


class XidCatalog:
    """Every catalog code with NVIDIA's facts and our policy, plus the mappings and the NVLink5 decode."""

    def __init__(
        self, entries: Mapping[int, XidEntry], mappings: ActionMappings, nvlink5: tuple[Nvlink5Rule, ...]
    ) -> None:
        self._entries = dict(sorted(entries.items()))
        self.mappings = mappings
        self.nvlink5_rules = nvlink5

    def get(self, code: int) -> XidEntry | None:
        return self._entries.get(code)

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, code: object) -> bool:
        return code in self._entries

    @property
    def codes(self) -> tuple[int, ...]:
        return tuple(self._entries)

    @property
    def playbooks(self) -> frozenset[str]:
        """Every runbook id the policy references; the playbook loader checks they exist."""
        return frozenset(entry.playbook for entry in self)

    def recovery_action_from_text(self, text: str) -> Action | None:
        """The Action Xid 154's text asks for; None when the text is not a recovery-action change."""
        change = parse_recovery_change(text)
        if change is None:
            return None
        value, label = change
        if value not in self.mappings.recovery and label and label.strip() in self.mappings.xid154_labels:
            return self.mappings.xid154_labels[label.strip()]
        return self.mappings.recovery_action(value)

    def decode_nvlink5(self, code: int, details: Mapping[str, str]) -> Nvlink5Decode | None:
        """Xid 144-150 payload (`KernelEvent.details`) → the decode sheet's verdict; None for unknown units.

        Rows are narrowed by unit, then IntrInfo pattern, error status and the line's Fatal/Nonfatal word;
        a narrowing that would leave nothing is skipped, and the most urgent of the rows left wins.
        """
        unit = details.get("unit")
        if not unit:
            return None
        rows = [r for r in self.nvlink5_rules if r.xid == code and _unit_key(unit) in r.units]
        if not rows:
            return None
        intr, status = _hex(details.get("intr_info")), _hex(details.get("error_status"))
        word = details.get("severity")
        line_fatal = None if word is None else word.lower() == "fatal"
        filters: list[Callable[[Nvlink5Rule], bool]] = [
            lambda r: _matches(r.patterns, intr) or _matches(r.action2_patterns, intr),
            lambda r: status is not None and (not r.error_status or status in r.error_status),
            lambda r: line_fatal is not None and (r.fatal == line_fatal or (line_fatal and r.action2 is not None)),
        ]
        for keep in filters:
            rows = [r for r in rows if keep(r)] or rows
        verdicts = [(self.mappings.bucket_action(r.bucket_for(intr, line_fatal)), r) for r in rows]
        action = most_urgent([a for a, _ in verdicts])
        chosen = next(r for a, r in verdicts if a == action)
        return Nvlink5Decode(
            unit=unit,
            immediate_bucket=chosen.bucket_for(intr, line_fatal),
            investigatory_bucket=chosen.investigatory,
            action=action,
            fatal=chosen.fatal or bool(line_fatal),
            rows=len(rows),
        )


class _StrictLoader(yaml.SafeLoader):
    """Records duplicate mapping keys, which plain YAML loading silently resolves to the last one."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    self.duplicates.append(f"line {key_node.start_mark.line + 1}: duplicate key {key[1]!r}")
                seen.add(key)
        return super().construct_mapping(node, deep)


def parse_data(text: str, name: str) -> tuple[Any, list[str]]:
    """A data file's YAML → (document, problems); problems name the file."""
    loader = _StrictLoader(text)
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        return None, [f"{name}: not valid YAML: {exc}"]
    finally:
        loader.dispose()
    return document, [f"{name}: {d}" for d in loader.duplicates]


_INVALID = Action.CONTACT_SUPPORT  # stands in for a bad value; the catalog is rejected anyway


class _Problems(list[str]):
    """Collects every problem instead of stopping at the first."""

    def keys(self, where: str, obj: Any, required: set[str], optional: set[str] | None = None) -> bool:
        if not isinstance(obj, dict):
            self.append(f"{where}: expected a mapping, got {type(obj).__name__}")
            return False
        names = set(map(str, obj))
        if unknown := sorted(names - required - (optional or set())):
            self.append(f"{where}: unknown keys {unknown}")
        if missing := sorted(required - names):
            self.append(f"{where}: missing keys {missing}")
        return not missing

    def action(self, where: str, value: Any) -> Action:
        if isinstance(value, str) and value in Action.__members__:
            return Action[value]
        self.append(f"{where}: {value!r} is not an Action")
        return _INVALID

    def text(self, where: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            self.append(f"{where}: expected non-empty text, got {value!r}")
            return ""
        return " ".join(value.split())

    def bucket(self, where: str, value: Any, mappings: ActionMappings) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or value not in mappings.buckets:
            self.append(f"{where}: unknown resolution bucket {value!r} (map it in action_mappings.yaml)")
        return str(value)


def _section(doc: Any, key: str, p: _Problems, where: str) -> dict[Any, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, dict):
        p.append(f"{where}: `{key}` must be a mapping")
        return {}
    return value


def _fallback(doc: Any, key: str, p: _Problems) -> Action:
    row: Any = doc.get(key) if isinstance(doc, dict) else None
    if p.keys(f"action_mappings.yaml: {key}", row, {"action"}, {"why"}):
        return p.action(f"action_mappings.yaml: {key}", row["action"])
    return Action.CONTACT_SUPPORT


def _peer(doc: Any, peer: str, p: _Problems) -> dict[Action, str]:
    where = f"action_mappings.yaml: {peer}"
    section = _section(doc, peer, p, "action_mappings.yaml")
    p.keys(where, section, {"vocabulary", "from_action"})
    vocabulary = set(map(str, section.get("vocabulary") or ()))
    out: dict[Action, str] = {}
    for name, row in _section(section, "from_action", p, where).items():
        if p.keys(f"{where} {name}", row, {"to"}, {"why"}):
            if str(row["to"]) not in vocabulary:
                p.append(f"{where} {name}: {row['to']!r} is not in its vocabulary")
            out[p.action(f"{where} {name}", name)] = str(row["to"])
    if missing := [a.value for a in Action if a not in out]:
        p.append(f"{where}: no counterpart for {missing}")
    return out


def _build_mappings(doc: Any, p: _Problems) -> ActionMappings:
    where = "action_mappings.yaml"
    fallbacks = {"unknown_bucket", "unknown_recovery_action"}
    p.keys(
        where,
        doc,
        fallbacks | {"nvidia_buckets", "nvml_recovery_actions", "xid154_labels", "gpud", "nvsentinel"},
    )
    buckets: dict[str, Action] = {}
    for name, row in _section(doc, "nvidia_buckets", p, where).items():
        if p.keys(f"{where}: bucket {name}", row, {"action"}, {"why"}):
            buckets[str(name)] = p.action(f"{where}: bucket {name}", row["action"])
    recovery: dict[int, Action] = {}
    names: dict[int, str] = {}
    for value, row in _section(doc, "nvml_recovery_actions", p, where).items():
        if not isinstance(value, int):
            p.append(f"{where}: recovery action {value!r} is not an integer")
        elif p.keys(f"{where}: recovery action {value}", row, {"name", "action"}, {"why"}):
            recovery[value] = p.action(f"{where}: recovery action {value}", row["action"])
            names[value] = p.text(f"{where}: recovery action {value}", row["name"])
    if missing := sorted(set(range(8)) - set(recovery)):
        p.append(f"{where}: NVML recovery actions {missing} are not mapped")
    labels = _section(doc, "xid154_labels", p, where)
    return ActionMappings(
        buckets=buckets,
        unknown_bucket=_fallback(doc, "unknown_bucket", p),
        recovery=recovery,
        recovery_names=names,
        unknown_recovery=_fallback(doc, "unknown_recovery_action", p),
        xid154_labels={str(k): p.action(f"{where}: xid154 label {k!r}", v) for k, v in labels.items()},
        gpud=_peer(doc, "gpud", p),
        nvsentinel=_peer(doc, "nvsentinel", p),
    )


def _bits(pattern: Any, where: str, p: _Problems) -> tuple[_Bits, ...]:
    if pattern is None:
        return ()
    if not isinstance(pattern, str) or not re.fullmatch(r"[01-]{32}", pattern):
        p.append(f"{where}: {pattern!r} is not a 32-bit IntrInfo pattern")
        return ()
    return ((int(pattern.replace("0", "1").replace("-", "0"), 2), int(pattern.replace("-", "0"), 2)),)


def _build_rule(row: Any, where: str, p: _Problems, mappings: ActionMappings) -> Nvlink5Rule | None:
    if not p.keys(where, row, _RULE_KEYS, _RULE_OPTIONAL):
        return None
    intr: dict[str, Any] = row["intr_info"] if isinstance(row["intr_info"], dict) else {}
    action2: dict[str, Any] = row["action2"] if isinstance(row["action2"], dict) else {}
    action2_intr: dict[str, Any] = action2["intr_info"] if isinstance(action2.get("intr_info"), dict) else {}
    statuses = [_hex(str(s)) for s in row["error_status"] or ()]
    if None in statuses or not isinstance(row["xid"], int):
        p.append(f"{where}: xid must be an integer and error_status hex values")
    severity = str(row.get("severity") or "")
    if row["immediate"] is None:
        p.append(f"{where}: missing the recovery bucket")
    return Nvlink5Rule(
        xid=row["xid"] if isinstance(row["xid"], int) else 0,
        units=frozenset(_unit_key(str(u)) for u in row["units"] or ()),
        patterns=_bits(intr.get("v1"), where, p) + _bits(intr.get("v2"), where, p),
        error_status=frozenset(s for s in statuses if s is not None),
        immediate=p.bucket(where, row["immediate"], mappings) or "",
        action2_patterns=_bits(action2_intr.get("v1"), where, p) + _bits(action2_intr.get("v2"), where, p),
        action2=p.bucket(where, action2.get("bucket"), mappings),
        investigatory=p.bucket(where, row.get("investigatory"), mappings),
        fatal=bool(severity) and not severity.lower().startswith("non"),
    )


def _build_entry(code: int, fact: Any, rule: Any, p: _Problems, mappings: ActionMappings) -> XidEntry | None:
    facts, policy = f"xid_nvidia.yaml: xid {code}", f"xid_policy.yaml: xid {code}"
    ok = p.keys(facts, fact, _FACT_KEYS)
    if not (p.keys(policy, rule, _POLICY_KEYS, _POLICY_OPTIONAL) and ok):
        return None
    immediate = p.bucket(facts, fact["immediate"], mappings)
    nvidia_action = mappings.buckets.get(immediate) if immediate else None
    problems_before = len(p)
    action = p.action(policy, rule["action"])
    deviation = rule.get("deviation")
    if len(p) > problems_before:
        pass  # an unknown action: comparing it with NVIDIA's would only add noise
    elif nvidia_action is not None and action != nvidia_action and not deviation:
        p.append(f"{policy}: {action} differs from {immediate} ({nvidia_action}); say why in `deviation`")
    elif deviation is not None and action == nvidia_action:
        p.append(f"{policy}: `deviation` given, but the action is what NVIDIA's bucket says")
    severity = SEVERITIES.get(rule["severity"])
    if severity is None:
        p.append(f"{policy}: severity {rule['severity']!r} is not one of {sorted(SEVERITIES)}")
    playbook = p.text(f"{policy}: playbook", rule["playbook"])
    if playbook and not PLAYBOOK_ID.fullmatch(playbook):
        p.append(f"{policy}: playbook id {playbook!r} is not lower-case-with-dashes")
    causes = rule["causes"] if isinstance(rule["causes"], list) and rule["causes"] else [None]
    # A comma inside brackets in a YAML flow list silently splits one cause in two: quote such causes.
    for cause in causes:
        if isinstance(cause, str) and cause.count("(") != cause.count(")"):
            p.append(f"{policy}: cause {cause!r} has unbalanced brackets (quote causes that contain commas)")
    context = rule.get("context") if isinstance(rule.get("context"), list) else [rule.get("context")]
    context = [c for c in context if c is not None]
    if unknown := sorted(set(map(str, context)) - CONTEXTS):
        p.append(f"{policy}: unknown context {unknown}")
    return XidEntry(
        code=code,
        mnemonic=p.text(f"{facts}: mnemonic", fact["mnemonic"]),
        nvidia_description=p.text(f"{facts}: description", fact["description"]),
        title=p.text(f"{policy}: title", rule["title"]),
        causes=tuple(p.text(f"{policy}: causes", c) for c in causes),
        immediate_bucket=immediate,
        investigatory_bucket=p.bucket(facts, fact["investigatory"], mappings),
        action=action,
        severity=severity or Severity.UNKNOWN,
        playbook=playbook,
        deviation=p.text(f"{policy}: deviation", deviation) if deviation is not None else None,
        context=frozenset(map(str, context)),
        applies_to=tuple(map(str, fact["applies_to"] or ())),
        nvidia_action=nvidia_action,
        xid154_linkage=fact["xid154_linkage"],
    )


def _code_order(code: Any) -> tuple[int, int, str]:
    return (0, code, "") if isinstance(code, int) else (1, 0, str(code))


def build_catalog(
    facts: Any, policy: Any, mappings: Any, nvlink5: Any, problems: list[str] | None = None
) -> XidCatalog:
    """Join the four parsed documents; raises CatalogError listing every problem (`problems` first)."""
    p = _Problems(problems or [])
    p.keys("xid_nvidia.yaml", facts, {"source", "xids"})
    p.keys("xid_policy.yaml", policy, {"xids"})
    p.keys("xid_nvlink5.yaml", nvlink5, {"source", "rules"})
    action_mappings = _build_mappings(mappings, p)
    fact_rows = _section(facts, "xids", p, "xid_nvidia.yaml")
    policy_rows = _section(policy, "xids", p, "xid_policy.yaml")
    if only_facts := sorted(set(fact_rows) - set(policy_rows), key=_code_order):
        p.append(f"xid_policy.yaml: no policy for codes {only_facts}")
    if only_policy := sorted(set(policy_rows) - set(fact_rows), key=_code_order):
        p.append(f"xid_policy.yaml: policy for codes NVIDIA does not list {only_policy}")
    entries: dict[int, XidEntry] = {}
    for code in sorted(set(fact_rows) & set(policy_rows), key=_code_order):
        if not isinstance(code, int) or isinstance(code, bool):
            p.append(f"xid code {code!r} is not an integer")
        elif (entry := _build_entry(code, fact_rows[code], policy_rows[code], p, action_mappings)) is not None:
            entries[code] = entry
    rows = nvlink5.get("rules") if isinstance(nvlink5, dict) else None
    if not isinstance(rows, list):
        p.append("xid_nvlink5.yaml: `rules` must be a list")
    built = [_build_rule(r, f"xid_nvlink5.yaml: rule {i}", p, action_mappings) for i, r in enumerate(rows or ())]
    rules = tuple(r for r in built if r is not None)
    if stray := sorted({r.xid for r in rules} - set(range(144, 151))):
        p.append(f"xid_nvlink5.yaml: rules for codes outside 144-150: {stray}")
    if p:
        raise CatalogError(p)
    return XidCatalog(entries, action_mappings, rules)


DATA_FILES = ("xid_nvidia.yaml", "xid_policy.yaml", "action_mappings.yaml", "xid_nvlink5.yaml")


@functools.cache
def load_catalog() -> XidCatalog:
    """The shipped catalog, loaded and checked once."""
    documents: list[Any] = []
    problems: list[str] = []
    for name in DATA_FILES:
        text = (resources.files("gpu_triage.diagnosis") / "data" / name).read_text(encoding="utf-8")
        document, found = parse_data(text, name)
        documents.append(document)
        problems += found
    facts, policy, mappings, nvlink5 = documents
    return build_catalog(facts, policy, mappings, nvlink5, problems=problems)
