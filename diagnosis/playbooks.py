"""The playbooks (diagnosis/playbooks/<id>.md): Markdown runbooks with a small YAML front-matter.

A playbook is what an on-call engineer reads after an alert: four sections in a fixed order (Meaning,
Impact, Diagnosis, Mitigation), the same shape as the kube-prometheus runbooks. Every problem with the
files is collected and raised at once as a `PlaybookError` the first time they are loaded, and so is
every id that the XID catalog, the telemetry conditions, the training-log rules or an `Action` names
but no file provides: a bad or missing page stops the daemon at start-up instead of failing a request.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from types import MappingProxyType
from typing import Any

import yaml

from gpu_triage.diagnosis.actions import Action, Severity

SECTIONS = ("Meaning", "Impact", "Diagnosis", "Mitigation")
UNKNOWN_XID_PLAYBOOK = "run-diagnostics"  # an XID code the catalog does not know yet
PLAYBOOK_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # what a playbook id (and file name) looks like
# The severities our data files may state; UNKNOWN is for signals we cannot judge, never written down.
SEVERITIES = {s.value: s for s in (Severity.CRITICAL, Severity.WARNING, Severity.INFO)}
_REQUIRED = {"id", "title", "summary", "action", "severity"}
_OPTIONAL = {"applies_to"}
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_NUMBERED = re.compile(r"^\s{0,3}1[.)]\s", re.MULTILINE)


def action_playbook(action: Action) -> str:
    """The playbook that says how to carry out `action` (IGNORE's page is `no-action`)."""
    return "no-action" if action is Action.IGNORE else action.value.lower().replace("_", "-")


ACTION_PLAYBOOKS: Mapping[str, Action] = MappingProxyType({action_playbook(a): a for a in Action})


class PlaybookError(ValueError):
    """The playbook files are invalid or incomplete; `problems` lists every one found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"{len(problems)} playbook problem(s):\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class Playbook:
    id: str
    title: str
    summary: str
    action: Action
    severity: Severity
    applies_to: tuple[str, ...]  # XID codes (as text), training-log class ids or condition ids
    body: str  # the Markdown after the front-matter
    source: str  # the whole file, front-matter included
    meaning: str
    impact: str
    diagnosis: str
    mitigation: str

    @property
    def sections(self) -> tuple[tuple[str, str], ...]:
        """(heading, Markdown) in reading order."""
        return tuple(zip(SECTIONS, (self.meaning, self.impact, self.diagnosis, self.mitigation), strict=True))


def _split_front_matter(text: str, where: str, problems: list[str]) -> tuple[dict[str, Any], str] | None:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        problems.append(f"{where}: must start with a '---' line opening the front-matter")
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---"), None)
    if end is None:
        problems.append(f"{where}: front-matter is not closed by a '---' line")
        return None
    try:
        meta = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError as exc:
        problems.append(f"{where}: front-matter is not valid YAML: {exc}")
        return None
    if not isinstance(meta, dict):
        problems.append(f"{where}: front-matter must be a mapping, got {type(meta).__name__}")
        return None
    return meta, "".join(lines[end + 1 :])


def _sections(body: str, where: str, problems: list[str]) -> dict[str, str]:
    """Split the body on its level-2 headings, ignoring '#' lines inside code fences (shell comments)."""
    found: list[tuple[str, list[str]]] = []
    preamble: list[str] = []
    fence: str | None = None
    for line in body.splitlines():
        if m := _FENCE.match(line):
            fence = None if fence == m.group(1) else (fence or m.group(1))
        heading = _HEADING.match(line) if fence is None else None
        if heading and len(heading.group(1)) == 1:
            problems.append(f"{where}: level-1 heading {heading.group(2)!r}: the title comes from the front-matter")
        if heading and len(heading.group(1)) == 2:
            found.append((heading.group(2), []))
        else:
            (found[-1][1] if found else preamble).append(line)
    if fence is not None:
        problems.append(f"{where}: a code fence ({fence}) is never closed")
    if any(line.strip() for line in preamble):
        problems.append(f"{where}: text before the first section; the body starts with '## {SECTIONS[0]}'")
    names = [name for name, _ in found]
    if names != list(SECTIONS):
        problems.append(f"{where}: sections must be exactly {', '.join(SECTIONS)} in this order, got {names}")
    out = {name: "\n".join(text).strip() + "\n" for name, text in found if name in SECTIONS}
    problems.extend(f"{where}: section {name!r} is empty" for name in SECTIONS if name in out and not out[name].strip())
    if out.get("Mitigation", "").strip() and not _NUMBERED.search(out["Mitigation"]):
        problems.append(f"{where}: Mitigation must give numbered steps (a list starting at '1.')")
    return out


def _text(meta: dict[str, Any], key: str, where: str, problems: list[str]) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{where}: {key!r} must be a non-empty string")
        return ""
    if "\n" in value.strip():
        problems.append(f"{where}: {key!r} must be one line")
    return value.strip()


def _applies_to(meta: dict[str, Any], where: str, problems: list[str]) -> tuple[str, ...]:
    value = meta.get("applies_to", [])
    if not isinstance(value, list):
        problems.append(f"{where}: 'applies_to' must be a list of XID codes or class ids")
        return ()
    out: list[str] = []
    for item in value:
        # bool is an int to Python; a YAML `yes` here is a typo, not XID 1
        if isinstance(item, bool) or not isinstance(item, int | str) or not str(item).strip():
            problems.append(f"{where}: 'applies_to' entry {item!r} is neither an XID code nor a class id")
        elif str(item) in out:
            problems.append(f"{where}: 'applies_to' lists {item!r} twice")
        else:
            out.append(str(item))
    return tuple(out)


def parse_playbook(text: str, name: str) -> tuple[Playbook | None, list[str]]:
    """One file's playbook (None when it is unusable) and every problem found in it.

    `name` is the file name without `.md`; the front-matter's `id` must equal it, so that a URL and
    the file behind it can never disagree.
    """
    where = f"{name}.md"
    problems: list[str] = []
    split = _split_front_matter(text, where, problems)
    if split is None:
        return None, problems
    meta, body = split
    problems += [f"{where}: unknown key {k!r}" for k in sorted(set(meta) - _REQUIRED - _OPTIONAL, key=str)]
    problems += [f"{where}: missing key {k!r}" for k in sorted(_REQUIRED - set(meta))]
    pid = meta.get("id")
    if pid != name:
        problems.append(f"{where}: id {pid!r} must equal the file name {name!r}")
    if not PLAYBOOK_ID.fullmatch(name):
        problems.append(f"{where}: file name must be lower-case words joined by dashes")
    title, summary = _text(meta, "title", where, problems), _text(meta, "summary", where, problems)
    action = next((a for a in Action if a.value == meta.get("action")), None)
    if action is None:
        problems.append(f"{where}: action {meta.get('action')!r} is not one of {', '.join(Action)}")
    elif name in ACTION_PLAYBOOKS and ACTION_PLAYBOOKS[name] is not action:
        problems.append(f"{where}: the playbook of action {ACTION_PLAYBOOKS[name]} must carry it out, not {action}")
    severity = SEVERITIES.get(str(meta.get("severity")))
    if severity is None:
        problems.append(f"{where}: severity {meta.get('severity')!r} is not one of {', '.join(SEVERITIES)}")
    applies_to = _applies_to(meta, where, problems)
    sections = _sections(body, where, problems)
    if problems or action is None or severity is None:
        return None, problems
    playbook = Playbook(
        id=name,
        title=title,
        summary=summary,
        action=action,
        severity=severity,
        applies_to=applies_to,
        body=body.lstrip("\n"),
        source=text,
        meaning=sections["Meaning"],
        impact=sections["Impact"],
        diagnosis=sections["Diagnosis"],
        mitigation=sections["Mitigation"],
    )
    return playbook, []


def load_playbook_dir(directory: Traversable) -> dict[str, Playbook]:
    """Every `*.md` playbook in `directory`, by id; raises `PlaybookError` listing all problems."""
    problems: list[str] = []
    out: dict[str, Playbook] = {}
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".md"):
            continue
        playbook, found = parse_playbook(entry.read_text(encoding="utf-8"), entry.name.removesuffix(".md"))
        problems += found
        if playbook is not None:
            out[playbook.id] = playbook
    if not out and not problems:
        problems.append(f"{directory.name}: no playbooks (*.md) found")
    if problems:
        raise PlaybookError(problems)
    return out


def playbook_references() -> dict[str, list[str]]:
    """Every playbook id the diagnosis data names, with who names it (for errors and the index page)."""
    # Imported here: these loaders pull in the whole classifier, which the file checks above do not need.
    from gpu_triage.diagnosis.health import load_conditions
    from gpu_triage.diagnosis.training_rules import load_rules
    from gpu_triage.diagnosis.xid_catalog import load_catalog

    refs: dict[str, list[str]] = {}
    for action in Action:
        refs.setdefault(action_playbook(action), []).append(f"action {action}")
    refs.setdefault(UNKNOWN_XID_PLAYBOOK, []).append("XID codes missing from the catalog")
    for entry in load_catalog():
        refs.setdefault(entry.playbook, []).append(f"XID {entry.code}")
    for cid, condition in load_conditions().items():
        refs.setdefault(condition.playbook, []).append(f"condition {cid}")
    for rule in load_rules().rules:
        refs.setdefault(rule.playbook, []).append(f"training-log class {rule.class_id}")
    return refs


def missing_playbooks(playbooks: Mapping[str, Playbook]) -> list[str]:
    """One problem per referenced id that has no playbook."""
    return [
        f"{pid}: no playbook, but named by {', '.join(who)}"
        for pid, who in sorted(playbook_references().items())
        if pid not in playbooks
    ]


@functools.cache
def load_playbooks() -> Mapping[str, Playbook]:
    """The shipped playbooks, checked once per process: each file, and that no referenced id is missing."""
    playbooks = load_playbook_dir(resources.files("gpu_triage.diagnosis").joinpath("playbooks"))
    if problems := missing_playbooks(playbooks):
        raise PlaybookError(problems)
    return MappingProxyType(playbooks)
