"""The start-up check: every data file loaded, then checked against the others, every problem listed at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.core.playbooks import load_playbook_dir, load_playbooks
from gpu_triage.diagnosis.knowledge import check as data_check
from gpu_triage.diagnosis.knowledge.check import applies_to_problems, check_data, missing_playbooks, references
from gpu_triage.diagnosis.training.rules.load import load_rules, parse_rules_text
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.conditions import load_conditions
from tests.conftest import REPO


@pytest.fixture
def fresh_check() -> Iterator[None]:
    """check_data runs once per process; these tests run it again on other data."""
    check_data.cache_clear()
    yield
    check_data.cache_clear()


def refs() -> dict[str, list[data_check.Reference]]:
    return references(load_catalog(), load_conditions(), load_rules())


def test_the_shipped_data_passes(fresh_check: None) -> None:
    check_data()
    assert missing_playbooks(load_playbooks(), refs()) == []
    assert applies_to_problems(load_playbooks(), refs()) == []


def test_problems_in_several_files_are_listed_together(
    fresh_check: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = (REPO / "diagnosis" / "data" / "training_rules.yaml").read_text(encoding="utf-8")
    broken_rules = rules.replace("action: RESTART_APP", "action: PANIC", 1)
    assert broken_rules != rules
    (tmp_path / "reset-gpu.md").write_text("no front-matter\n", encoding="utf-8")
    monkeypatch.setattr(data_check, "load_rules", lambda: parse_rules_text(broken_rules))
    monkeypatch.setattr(data_check, "load_playbooks", lambda: load_playbook_dir(tmp_path))
    with pytest.raises(DataError) as caught:
        check_data()
    problems = caught.value.problems
    assert any(p.startswith("training_rules.yaml: rules[") and "action 'PANIC'" in p for p in problems), problems
    assert "reset-gpu.md: must start with a '---' line opening the front-matter" in problems
    assert str(caught.value).count("\n  ") == len(problems)


def test_a_missing_playbook_fails_the_check(fresh_check: None, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = load_playbooks()
    monkeypatch.setattr(data_check, "load_playbooks", lambda: {k: v for k, v in shipped.items() if k != "xid-48"})
    with pytest.raises(DataError) as caught:
        check_data()
    (problem,) = caught.value.problems
    assert problem.startswith("xid-48: no playbook, but named by XID 48, XID 171, XID 172")


def test_applies_to_must_name_exactly_what_points_at_a_page() -> None:
    playbooks = dict(load_playbooks())
    page = playbooks["xid-13"]
    playbooks["xid-13"] = dataclasses.replace(page, applies_to=("31", "gpu_lost"))  # wrong, and 13 left out
    reset = playbooks["reset-gpu"]
    playbooks["reset-gpu"] = dataclasses.replace(reset, applies_to=())  # an action's page need not list its users
    assert applies_to_problems(playbooks, refs()) == [
        "xid-13.md: applies_to lists ['31', 'gpu_lost'], which do not name this playbook",
        "xid-13.md: applies_to leaves out ['13'], which name this playbook",
    ]
