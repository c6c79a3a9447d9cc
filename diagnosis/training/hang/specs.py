"""The knowledge of hang findings (diagnosis/data/hang_classes.yaml), checked when it is loaded."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import Problems, parse_yaml, read_data

__all__ = ["HANG_CLASSES", "HangSpec", "load_hang_specs"]

HANG_CLASSES = (
    "collective_never_joined",
    "collective_mismatch",
    "collective_stuck",
    "collective_straggler",
    "rank_missing",
    "p2p_unmatched",
)
_FILE = "hang_classes.yaml"


@dataclass(frozen=True, slots=True)
class HangSpec:
    class_id: str
    severity: Severity
    action: Action
    playbook: str
    title: str  # a template: {ranks}, {op}, {group}, {seq}, {mismatch}, {waiting}
    steps: tuple[str, ...]


@functools.cache
def load_hang_specs() -> Mapping[str, HangSpec]:
    problems = Problems()
    doc = parse_yaml(read_data(_FILE), _FILE, problems)
    classes = problems.keys(_FILE, doc, {"classes"}).get("classes") if isinstance(doc, dict) else None
    out: dict[str, HangSpec] = {}
    if not isinstance(classes, dict):
        problems.fail(_FILE, "`classes` must map each hang class to its finding")
        classes = {}
    if sorted(classes) != sorted(HANG_CLASSES):
        problems.fail(_FILE, f"the classes must be exactly {', '.join(HANG_CLASSES)}")
    for cid, node in classes.items():
        where = f"{_FILE}: {cid}"
        if not problems.complete(where, node, {"severity", "action", "playbook", "title", "steps"}):
            continue
        severity, action = problems.severity(where, node["severity"]), problems.action(where, node["action"])
        playbook, steps = problems.playbook(where, node["playbook"]), problems.strings(where, node["steps"])
        title = node["title"]
        if not isinstance(title, str) or not title:
            problems.fail(where, "title must be text")
            continue
        if severity is not None and action is not None:
            out[str(cid)] = HangSpec(str(cid), severity, action, playbook, title, tuple(steps))
    problems.raise_if_any("invalid hang classes")
    return MappingProxyType(out)
