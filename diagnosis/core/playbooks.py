"""The playbooks (diagnosis/playbooks/<id>.md): Markdown runbooks with a small YAML front-matter.

A playbook is what an on-call engineer reads after an alert: four sections in a fixed order (Meaning,
Impact, Diagnosis, Mitigation), the same shape as the kube-prometheus runbooks. Every problem with the
files is collected and raised at once, as a `DataError`, the first time they are loaded. Whether every
id the other data names has a page is checked with the rest of the data (diagnosis/knowledge/check.py).
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

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import PLAYBOOK_ID, Problems, adopted

SECTIONS = ("Meaning", "Impact", "Diagnosis", "Mitigation")
_REQUIRED = {"id", "title", "summary", "action", "severity"}
_OPTIONAL = {"applies_to"}
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_NUMBERED = re.compile(r"^\s{0,3}1[.)]\s", re.MULTILINE)


def action_playbook(action: Action) -> str:
    """The playbook that says how to carry out `action` (IGNORE's page is `no-action`)."""
    return "no-action" if action is Action.IGNORE else action.value.lower().replace("_", "-")


ACTION_PLAYBOOKS: Mapping[str, Action] = MappingProxyType({action_playbook(a): a for a in Action})


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


def _split_front_matter(text: str, where: str, p: Problems) -> tuple[dict[str, Any], str] | None:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        p.fail(where, "must start with a '---' line opening the front-matter")
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---"), None)
    if end is None:
        p.fail(where, "front-matter is not closed by a '---' line")
        return None
    import yaml

    try:
        meta = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError as exc:
        p.fail(where, f"front-matter is not valid YAML: {exc}")
        return None
    if not isinstance(meta, dict):
        p.fail(where, f"front-matter must be a mapping, got {type(meta).__name__}")
        return None
    return meta, "".join(lines[end + 1 :])


def _sections(body: str, where: str, p: Problems) -> dict[str, str]:
    """Split the body on its level-2 headings, ignoring '#' lines inside code fences (shell comments)."""
    found: list[tuple[str, list[str]]] = []
    preamble: list[str] = []
    fence: str | None = None
    for line in body.splitlines():
        if m := _FENCE.match(line):
            fence = None if fence == m.group(1) else (fence or m.group(1))
        heading = _HEADING.match(line) if fence is None else None
        if heading and len(heading.group(1)) == 1:
            p.fail(where, f"level-1 heading {heading.group(2)!r}: the title comes from the front-matter")
        if heading and len(heading.group(1)) == 2:
            found.append((heading.group(2), []))
        else:
            (found[-1][1] if found else preamble).append(line)
    if fence is not None:
        p.fail(where, f"a code fence ({fence}) is never closed")
    if any(line.strip() for line in preamble):
        p.fail(where, f"text before the first section; the body starts with '## {SECTIONS[0]}'")
    names = [name for name, _ in found]
    if names != list(SECTIONS):
        p.fail(where, f"sections must be exactly {', '.join(SECTIONS)} in this order, got {names}")
    out = {name: "\n".join(text).strip() + "\n" for name, text in found if name in SECTIONS}
    for name in SECTIONS:
        if name in out and not out[name].strip():
            p.fail(where, f"section {name!r} is empty")
    if out.get("Mitigation", "").strip() and not _NUMBERED.search(out["Mitigation"]):
        p.fail(where, "Mitigation must give numbered steps (a list starting at '1.')")
    return out


def _text(meta: dict[str, Any], key: str, where: str, p: Problems) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value.strip():
        p.fail(where, f"{key!r} must be a non-empty string")
        return ""
    if "\n" in value.strip():
        p.fail(where, f"{key!r} must be one line")
    return value.strip()


def _applies_to(meta: dict[str, Any], where: str, p: Problems) -> tuple[str, ...]:
    value = meta.get("applies_to", [])
    if not isinstance(value, list):
        p.fail(where, "'applies_to' must be a list of XID codes or class ids")
        return ()
    out: list[str] = []
    for item in value:
        # bool is an int to Python; a YAML `yes` here is a typo, not XID 1
        if isinstance(item, bool) or not isinstance(item, int | str) or not str(item).strip():
            p.fail(where, f"'applies_to' entry {item!r} is neither an XID code nor a class id")
        elif str(item) in out:
            p.fail(where, f"'applies_to' lists {item!r} twice")
        else:
            out.append(str(item))
    return tuple(out)


def parse_playbook(text: str, name: str) -> tuple[Playbook | None, Problems]:
    """One file's playbook (None when it is unusable) and every problem found in it.

    `name` is the file name without `.md`; the front-matter's `id` must equal it, so that a URL and
    the file behind it can never disagree.
    """
    where = f"{name}.md"
    p = Problems()
    split = _split_front_matter(text, where, p)
    if split is None:
        return None, p
    meta, body = split
    p.keys(where, meta, _REQUIRED, _OPTIONAL)
    pid = meta.get("id")
    if pid != name:
        p.fail(where, f"id {pid!r} must equal the file name {name!r}")
    if not PLAYBOOK_ID.fullmatch(name):
        p.fail(where, "file name must be lower-case words joined by dashes")
    title, summary = _text(meta, "title", where, p), _text(meta, "summary", where, p)
    action = p.action(where, meta.get("action"))
    if action is not None and name in ACTION_PLAYBOOKS and ACTION_PLAYBOOKS[name] is not action:
        p.fail(where, f"the playbook of action {ACTION_PLAYBOOKS[name]} must carry it out, not {action}")
    severity = p.severity(where, meta.get("severity"))
    applies_to = _applies_to(meta, where, p)
    sections = _sections(body, where, p)
    if p or action is None or severity is None:
        return None, p
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
    return playbook, p


def load_playbook_dir(directory: Traversable) -> dict[str, Playbook]:
    """Every `*.md` playbook in `directory`, by id; raises `DataError` listing all problems."""
    problems = Problems()
    out: dict[str, Playbook] = {}
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".md"):
            continue
        playbook, found = parse_playbook(entry.read_text(encoding="utf-8"), entry.name.removesuffix(".md"))
        problems += found
        if playbook is not None:
            out[playbook.id] = playbook
    if not out and not problems:
        problems.fail(directory.name, "no playbooks (*.md) found")
    problems.raise_if_any("invalid playbooks")
    return out


@functools.cache
def load_playbooks() -> Mapping[str, Playbook]:
    """The shipped playbooks, each file checked once per process."""
    if isinstance(known := adopted("playbooks"), dict):
        return MappingProxyType(dict(known))
    return MappingProxyType(load_playbook_dir(resources.files("gpu_triage.diagnosis").joinpath("playbooks")))
