"""Every diagnosis data file loaded and checked against the others: what start-up runs.

Each loader checks its own files. This checks what they say about each other: every playbook id that
an action, an XID, a telemetry condition or a training-log class names has a page, and every page's
`applies_to` names only what points at it (a page of its own for an XID or a class names all of it).
The daemon's start and the CLI commands that use the data call `check_data` first, so a bad file stops
them with every problem, from every file, listed at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.data_files import DataError, Problems, adopted
from gpu_triage.diagnosis.core.playbooks import ACTION_PLAYBOOKS, Playbook, action_playbook, load_playbooks
from gpu_triage.diagnosis.performance.data import load_performance
from gpu_triage.diagnosis.training.findings.kernel import SXID_PLAYBOOK
from gpu_triage.diagnosis.training.hang.specs import load_hang_specs
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.model import RuleSet
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID, XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.conditions import Condition, load_conditions

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reference:
    """One thing in the data that names a playbook."""

    who: str  # for people: "XID 79", "condition gpu_lost", "action RESET_GPU"
    applies_to: str | None  # how the page's `applies_to` names it; None: never (actions)


def references(catalog: XidCatalog, conditions: Mapping[str, Condition], rules: RuleSet) -> dict[str, list[Reference]]:
    """Every playbook id the data names, with what names it."""
    refs: dict[str, list[Reference]] = {}

    def add(pid: str, who: str, key: str | None) -> None:
        refs.setdefault(pid, []).append(Reference(who, key))

    for action in Action:
        add(action_playbook(action), f"action {action}", None)
    add(UNKNOWN_XID.playbook, "XID codes missing from the catalog", None)
    for entry in catalog:
        add(entry.playbook, f"XID {entry.code}", str(entry.code))
    for cid, condition in conditions.items():
        add(condition.playbook, f"condition {cid}", cid)
    for rule in rules.rules:
        add(rule.playbook, f"training-log class {rule.class_id}", rule.class_id)
    add(SXID_PLAYBOOK, "NVSwitch SXid findings of diagnose", "sxid")
    for hang in load_hang_specs().values():
        add(hang.playbook, f"hang class {hang.class_id}", hang.class_id)
    for spec in load_performance().classes.values():
        add(spec.playbook, f"performance class {spec.id}", None)
    return refs


def playbook_references() -> dict[str, list[str]]:
    """Who names each playbook id in the shipped data, in words (for errors and the runbook pages)."""
    refs = references(load_catalog(), load_conditions(), load_rules())
    return {pid: [r.who for r in found] for pid, found in refs.items()}


def missing_playbooks(playbooks: Mapping[str, Playbook], refs: Mapping[str, list[Reference]]) -> Problems:
    """One problem per referenced id that has no playbook, naming who needs it."""
    problems = Problems()
    for pid, found in sorted(refs.items()):
        if pid not in playbooks:
            problems.fail(pid, f"no playbook, but named by {', '.join(r.who for r in found)}")
    return problems


def applies_to_problems(playbooks: Mapping[str, Playbook], refs: Mapping[str, list[Reference]]) -> Problems:
    """One problem per page whose `applies_to` names what does not point at it, or, on a page of its own
    (not an action's), leaves out something that does."""
    problems = Problems()
    for pid, page in sorted(playbooks.items()):
        named = {r.applies_to for r in refs.get(pid, []) if r.applies_to is not None}
        if wrong := [key for key in page.applies_to if key not in named]:
            problems.fail(f"{pid}.md", f"applies_to lists {wrong}, which do not name this playbook")
        if pid not in ACTION_PLAYBOOKS and (left_out := sorted(named - set(page.applies_to))):
            problems.fail(f"{pid}.md", f"applies_to leaves out {left_out}, which name this playbook")
    return problems


def _load(loader: Callable[[], T], problems: Problems) -> T | None:
    try:
        return loader()
    except DataError as e:
        problems += e.problems
        return None


@functools.cache
def check_data() -> None:
    """Load every data file and check them against each other; raises one DataError listing every problem."""
    if adopted("checked"):  # a snapshot of knowledge this check passed (diagnosis/knowledge/cache.py)
        return
    problems = Problems()
    catalog, conditions = _load(load_catalog, problems), _load(load_conditions, problems)
    rules, playbooks = _load(load_rules, problems), _load(load_playbooks, problems)
    _load(load_hang_specs, problems)
    if catalog is None or conditions is None or rules is None or playbooks is None:
        raise DataError("invalid diagnosis data", problems)  # cross-checks of broken files would only add noise
    refs = references(catalog, conditions, rules)
    problems += missing_playbooks(playbooks, refs)
    problems += applies_to_problems(playbooks, refs)
    problems.raise_if_any("invalid diagnosis data")
