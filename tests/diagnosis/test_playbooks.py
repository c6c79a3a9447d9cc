"""The playbooks: every shipped file is valid, every referenced id exists, none is orphaned, bad files fail."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gpu_triage.diagnosis.core.actions import Action, Severity, most_urgent
from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.core.playbooks import (
    ACTION_PLAYBOOKS,
    SECTIONS,
    Playbook,
    action_playbook,
    load_playbook_dir,
    load_playbooks,
    parse_playbook,
)
from gpu_triage.diagnosis.knowledge.check import missing_playbooks, references
from gpu_triage.diagnosis.training.findings.kernel import SXID_PLAYBOOK
from gpu_triage.diagnosis.training.hang.specs import load_hang_specs
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.conditions import load_conditions

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK_DIR = ROOT / "diagnosis" / "playbooks"


def alert_runbook_ids() -> dict[str, list[str]]:
    """Runbook ids named by `runbook_url` annotations under alerts/ (none while that folder is absent)."""
    out: dict[str, list[str]] = {}
    alerts = ROOT / "alerts"
    files = sorted([*alerts.rglob("*.yml"), *alerts.rglob("*.yaml")]) if alerts.is_dir() else []
    for path in files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in (doc or {}).get("groups", []) if isinstance(doc, dict) else []:
            for rule in group.get("rules", []):
                url = (rule.get("annotations") or {}).get("runbook_url")
                if url:
                    pid = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".md")
                    out.setdefault(pid, []).append(f"{path.relative_to(ROOT)}: {rule.get('alert')}")
    return out


def referrers() -> dict[str, list[tuple[str, Action | None, Severity]]]:
    """Non-action referrers of each playbook: (applies_to key, action, severity)."""
    out: dict[str, list[tuple[str, Action | None, Severity]]] = {}
    for entry in load_catalog():
        out.setdefault(entry.playbook, []).append((str(entry.code), entry.action, entry.severity))
    for cid, c in load_conditions().items():
        out.setdefault(c.playbook, []).append((cid, c.action, c.severity))
    for rule in load_rules().rules:
        out.setdefault(rule.playbook, []).append((rule.class_id, rule.action, rule.severity))
    for hang in load_hang_specs().values():
        out.setdefault(hang.playbook, []).append((hang.class_id, hang.action, hang.severity))
    # diagnose's NVSwitch findings: fatal ones restart Fabric Manager, non-fatal ones watch the links.
    out.setdefault(SXID_PLAYBOOK, []).extend(
        [("sxid", Action.RESTART_FABRIC_MANAGER, Severity.CRITICAL), ("sxid", Action.CHECK_LINKS, Severity.WARNING)]
    )
    return out


def test_every_shipped_file_loads() -> None:
    playbooks = load_playbooks()
    assert sorted(playbooks) == sorted(p.stem for p in PLAYBOOK_DIR.glob("*.md"))
    for p in playbooks.values():
        assert [name for name, _ in p.sections] == list(SECTIONS)
        assert all(text.strip() for _, text in p.sections)


def test_load_is_cached_and_read_only() -> None:
    playbooks = load_playbooks()
    assert load_playbooks() is playbooks
    with pytest.raises(TypeError):
        playbooks["x"] = playbooks["reset-gpu"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("source", "ids"),
    [
        ("XID catalog", lambda: {e.playbook for e in load_catalog()}),
        ("telemetry conditions", lambda: {c.playbook for c in load_conditions().values()}),
        ("training-log rules", lambda: {r.playbook for r in load_rules().rules}),
        ("unknown XID codes", lambda: {UNKNOWN_XID.playbook}),
        ("actions", lambda: {action_playbook(a) for a in Action}),
        ("alert rules", lambda: set(alert_runbook_ids())),
    ],
)
def test_every_referenced_id_has_a_playbook(source: str, ids: Callable[[], set[str]]) -> None:
    missing = sorted(ids() - set(load_playbooks()))
    assert not missing, f"{source} names playbooks that do not exist: {missing}"


def test_every_training_class_has_its_own_playbook() -> None:
    for rule in load_rules().rules:
        assert rule.playbook == "nccl-" + rule.class_id.replace("_", "-")


def test_no_playbook_is_orphaned() -> None:
    used = set(referrers()) | set(ACTION_PLAYBOOKS) | {UNKNOWN_XID.playbook} | set(alert_runbook_ids())
    assert sorted(set(load_playbooks()) - used) == []


def test_action_playbooks_carry_out_their_action() -> None:
    playbooks = load_playbooks()
    for action in Action:
        assert playbooks[action_playbook(action)].action is action
    assert action_playbook(Action.IGNORE) == "no-action"


def test_applies_to_is_true_and_complete() -> None:
    """`applies_to` names only what really points at the page; a dedicated page names all of it."""
    refs = referrers()
    for pid, p in load_playbooks().items():
        named = {key for key, _, _ in refs.get(pid, [])}
        assert set(p.applies_to) <= named, f"{pid}: applies_to lists {sorted(set(p.applies_to) - named)}"
        if pid not in ACTION_PLAYBOOKS:
            assert set(p.applies_to) == named, f"{pid}: applies_to misses {sorted(named - set(p.applies_to))}"


def test_dedicated_pages_agree_with_the_data() -> None:
    """A page for one XID / class takes the most urgent action and severity of what points at it."""
    for pid, found in referrers().items():
        if pid in ACTION_PLAYBOOKS:
            continue
        p = load_playbooks()[pid]
        assert p.action is most_urgent([a for _, a, _ in found if a is not None]), pid
        assert p.severity is min((s for _, _, s in found), key=lambda s: s.rank), pid


def test_links_between_playbooks_resolve() -> None:
    playbooks = load_playbooks()
    for pid, p in playbooks.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", p.body):
            if "://" not in target and not target.startswith("#"):
                assert target in playbooks, f"{pid} links to unknown playbook {target!r}"


def test_missing_references_are_named_with_who_needs_them() -> None:
    refs = references(load_catalog(), load_conditions(), load_rules())
    problems = missing_playbooks({}, refs)
    assert any(p.startswith("xid-79: ") and "XID 79" in p and "condition gpu_lost" in p for p in problems)
    assert any(p.startswith("run-diagnostics: ") and "missing from the catalog" in p for p in problems)
    assert missing_playbooks(load_playbooks(), refs) == []


GOOD = """---
id: good
title: A good page
summary: One line.
action: RESET_GPU
severity: critical
applies_to: [79, gpu_lost]
---

## Meaning

What it is.

## Impact

What breaks.

## Diagnosis

```sh
# a shell comment, not a heading
## nor this
nvidia-smi -q
```

## Mitigation

1. First.
2. Second.
"""


def write(directory: Path, name: str, text: str) -> None:
    (directory / f"{name}.md").write_text(text, encoding="utf-8")


def test_a_good_file_parses_into_sections() -> None:
    p, problems = parse_playbook(GOOD, "good")
    assert problems == []
    assert isinstance(p, Playbook)
    assert (p.id, p.action, p.severity, p.applies_to) == (
        "good",
        Action.RESET_GPU,
        Severity.CRITICAL,
        ("79", "gpu_lost"),
    )
    assert p.meaning == "What it is.\n"
    assert "# a shell comment" in p.diagnosis and "nvidia-smi -q" in p.diagnosis
    assert p.mitigation.startswith("1. First.")
    assert p.source == GOOD and p.body.startswith("## Meaning")


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    bad = (
        GOOD.replace("id: good", "id: other")
        .replace("action: RESET_GPU", "action: PANIC")
        .replace("severity: critical", "severity: unknown\nowner: me")
        .replace("## Impact\n\nWhat breaks.\n\n", "")
    )
    write(tmp_path, "bad", bad)
    write(tmp_path, "also-bad", "no front-matter here\n")
    write(tmp_path, "good", GOOD)
    (tmp_path / "notes.txt").write_text("ignored", encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_playbook_dir(tmp_path)
    problems = "\n".join(info.value.problems)
    for expected in (
        "bad.md: unknown key 'owner'",
        "bad.md: id 'other' must equal the file name 'bad'",
        "bad.md: action 'PANIC' is not one of",
        "bad.md: severity 'unknown' is not one of",
        "bad.md: sections must be exactly Meaning, Impact, Diagnosis, Mitigation",
        "also-bad.md: must start with a '---' line",
    ):
        assert expected in problems
    assert "good.md" not in problems
    assert str(info.value).count("\n  ") == len(info.value.problems)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: t.replace("title: A good page\n", ""), "missing key 'title'"),
        (lambda t: t.replace("summary: One line.", "summary: ''"), "'summary' must be a non-empty string"),
        (lambda t: t.replace("---\n\n## Meaning", "\n## Meaning", 1), "front-matter is not closed"),
        (lambda t: t.replace("id: good", "id: [good"), "front-matter is not valid YAML"),
        (lambda t: "---\n- a list\n---\n" + t.split("---\n", 2)[2], "front-matter must be a mapping"),
        (lambda t: t.replace("What breaks.", ""), "section 'Impact' is empty"),
        (
            lambda t: t.replace("## Meaning\n\nWhat it is.\n\n## Impact", "## Impact\n\nx\n\n## Meaning"),
            "in this order",
        ),
        (lambda t: t.replace("## Meaning", "Intro.\n\n## Meaning"), "text before the first section"),
        (lambda t: t.replace("## Meaning", "# Title\n\n## Meaning"), "level-1 heading 'Title'"),
        (
            lambda t: t.replace("## Mitigation", "## Mitigation\n\n## Extra\n\nx"),
            "got ['Meaning', 'Impact', 'Diagnosis', 'Mitigation', 'Extra']",
        ),
        (lambda t: t.replace("1. First.\n2. Second.", "- first\n- second"), "Mitigation must give numbered steps"),
        (lambda t: t.replace("nvidia-smi -q\n```", "nvidia-smi -q"), "code fence (```) is never closed"),
        (lambda t: t.replace("[79, gpu_lost]", "79"), "'applies_to' must be a list"),
        (lambda t: t.replace("[79, gpu_lost]", "[79, yes]"), "entry True is neither"),
        (lambda t: t.replace("[79, gpu_lost]", "[79, 79]"), "'applies_to' lists 79 twice"),
    ],
)
def test_bad_files_are_rejected(tmp_path: Path, change: Callable[[str], str], expected: str) -> None:
    write(tmp_path, "good", change(GOOD))
    with pytest.raises(DataError) as info:
        load_playbook_dir(tmp_path)
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_an_action_playbook_must_carry_out_its_action(tmp_path: Path) -> None:
    write(tmp_path, "reboot-node", GOOD.replace("id: good", "id: reboot-node"))
    with pytest.raises(DataError, match="the playbook of action REBOOT_NODE must carry it out, not RESET_GPU"):
        load_playbook_dir(tmp_path)


def test_file_names_must_be_ids(tmp_path: Path) -> None:
    write(tmp_path, "Bad_Name", GOOD.replace("id: good", "id: Bad_Name"))
    with pytest.raises(DataError, match="lower-case words joined by dashes"):
        load_playbook_dir(tmp_path)


def test_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no playbooks \(\*\.md\) found"):
        load_playbook_dir(tmp_path)


def test_a_directory_of_good_files_loads(tmp_path: Path) -> None:
    write(tmp_path, "good", GOOD)
    write(tmp_path, "second", GOOD.replace("id: good", "id: second"))
    assert sorted(load_playbook_dir(tmp_path)) == ["good", "second"]
