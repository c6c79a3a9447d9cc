"""Next steps that start from what the diagnosis found, not from what any finding of its class might need.

A step of a rule (diagnosis/data/training_rules.yaml) may name what a finding knows in braces: `{host}`,
`{straggler_where}`, `{likely_caused_by}`, `{xid}`. Such a step is shown only when every name it uses is
known for the finding, with the values filled in; a step written `{unless: name, text: …}` in the rules
file is shown only when that name is not known (the generic advice, for when the specific one cannot be
given). The rules file's loader keeps the second form as a leading `{!name}`, so a step stays one string.

`values` gathers what a finding knows: its fields, its place, and what the whole-job analysis added
(the straggler, the root cause a symptom points at, the performance conditions of the job).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_triage.diagnosis.core.findings import Finding, rank_ranges

_NAME = re.compile(r"\{(!?)([a-z][a-z0-9_]{0,40})\}")

# What a step may name besides the rules' fields (rules/model.FIELDS): a finding's place, and what the report
# adds to it (diagnosis/training/report.py, diagnosis/training/findings/root_cause.py, diagnosis/training/diagnose.py).
PLACE_NAMES = frozenset({"host", "rank", "gpu", "local_rank", "ranks"})
REPORT_NAMES = frozenset(
    {
        "straggler_rank",
        "straggler_host",
        "straggler_where",
        "straggler_lag",
        "likely_caused_by",
        "cause",
        "performance",
        "reported_by",
    }
)


def names(step: str) -> list[str]:
    """The names a step uses, with or without `!`."""
    return [m[2] for m in _NAME.finditer(step)]


def unless(name: str, text: str) -> str:
    """The stored form of `{unless: name, text: text}`."""
    return "{!" + name + "}" + text


def fill(steps: Iterable[str], values: Mapping[str, Any]) -> list[str]:
    """The steps that apply, their names filled in (see the module docstring)."""
    out: list[str] = []
    for step in steps:
        applies = True

        def value(m: re.Match[str]) -> str:
            nonlocal applies
            negated, name = m[1], m[2]
            known = values.get(name)
            if negated:
                applies = applies and known in (None, "")
                return ""
            if known in (None, ""):
                applies = False
                return ""
            return str(known)

        text = _NAME.sub(value, step)
        if applies:
            out.append(text)
    return out


def values(finding: Finding) -> dict[str, Any]:
    """What `finding` knows, by the names steps use."""
    known: dict[str, Any] = dict(finding.details)
    known.update(host=finding.host, rank=finding.rank, gpu=finding.gpu, local_rank=finding.local_rank)
    if finding.ranks:
        known["ranks"] = rank_ranges(finding.ranks)
    return {k: v for k, v in known.items() if v is not None}
