"""Hung jobs read from real Flight Recorder dumps: the culprit and the kind, as the recorded scenario made them.

The dumps under tests/fixtures/flight_recorder were recorded with PyTorch 2.13 on the CPU (Gloo), by
tools/record_flight_recorder.py; each scenario's truth.json says what the job did (which rank blocked,
was killed, ran another op). That, not this code, is the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.classify import classify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
SCENARIOS = sorted(p.name for p in FIXTURES.iterdir() if (p / "truth.json").is_file())
HANG_CLASSES = {
    "collective_never_joined",
    "collective_mismatch",
    "collective_stuck",
    "collective_straggler",
    "rank_missing",
    "p2p_unmatched",
}


def truth(scenario: str) -> dict[str, Any]:
    return json.loads((FIXTURES / scenario / "truth.json").read_text())


def inputs(scenario: str, form: str, logs: bool = True, order: int = 1) -> list[tuple[str, list[bytes]]]:
    folder = FIXTURES / scenario
    files = sorted((folder / form).iterdir())[::order]
    if logs:
        files += sorted((folder / "logs").iterdir())
    return [(str(f), [f.read_bytes()]) for f in files]


def hangs(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["class"] in HANG_CLASSES]


def test_every_scenario_is_recorded() -> None:
    assert len(SCENARIOS) >= 9
    for scenario in SCENARIOS:
        t = truth(scenario)
        assert t["torch"].startswith("2.") and t["backend"] == "gloo"


@pytest.mark.parametrize("form", ["pickle", "json"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_culprit_and_kind(scenario: str, form: str) -> None:
    t = truth(scenario)
    report = diagnose(inputs(scenario, form)).to_json()
    found = hangs(report)
    if t["class"] is None:
        assert found == []
        assert report["hang"]["dumps"] == t["world_size"]
        return
    assert found, report["findings"]
    root = found[0]
    assert report["findings"][0]["id"] == root["id"]  # nothing in the logs outranks the hang
    assert root["class"] == t["class"]
    if t.get("partner_in_dumps") is False:
        # Gloo records no send/recv: the waiting rank is known, the partner is not; the victim is not blamed.
        assert root["rank"] is None and root["details"]["ranks"] == []
        assert root["details"]["waiting"] == t["waiting"]
        return
    assert root["details"]["ranks"] == t["culprits"]
    assert root["rank"] == t["culprits"][0]
    if "mismatch" in t:
        assert root["details"]["mismatch"] == t["mismatch"]
    if "waiting" in t:
        assert root["details"]["waiting"] == t["waiting"]


@pytest.mark.parametrize(
    "scenario", ["never_joined", "op_mismatch", "size_mismatch", "subgroup_hang", "two_culprits_8"]
)
def test_answer_does_not_depend_on_the_order_of_the_dumps(scenario: str) -> None:
    forward = diagnose(inputs(scenario, "pickle", logs=False)).to_json()
    backward = diagnose(inputs(scenario, "pickle", logs=False, order=-1)).to_json()
    assert [f["details"]["ranks"] for f in hangs(forward)] == [f["details"]["ranks"] for f in hangs(backward)]


def test_sub_group_hang_names_the_sub_group_and_its_collective() -> None:
    report = diagnose(inputs("subgroup_hang", "pickle", logs=False)).to_json()
    root = hangs(report)[0]
    # Rank 3 blocked before the all_reduce of its sub-group [2, 3]; rank 2 waited there, and ranks 0 and 1
    # then waited in the default group for both: the sub-group's collective is the one rank 3 missed first.
    assert root["details"]["process_group"] != "0"
    assert root["details"]["waiting"] == [2]
    assert root["details"]["group_size"] == 2
    assert root["details"]["op"] == "all_reduce"
    assert root["details"]["frames"], "the pickle keeps the frames of the collective"


def test_killed_rank_is_missing_and_the_collective_is_named() -> None:
    report = diagnose(inputs("rank_killed", "json", logs=False)).to_json()
    root = hangs(report)[0]
    assert root["details"]["seq"] == 5 and root["details"]["op"] == "all_reduce"
    assert [row["rank"] for row in report["hang"]["ranks"] if row["dump"] is None] == [2]


def test_size_mismatch_reports_the_rank_gloo_aborted_as_missing_not_as_culprit() -> None:
    report = diagnose(inputs("size_mismatch", "pickle", logs=False)).to_json()
    root = hangs(report)[0]
    assert root["details"]["missing"] == [2]
    assert root["details"]["sizes"] == [[16]]  # what the majority ran
    assert len(hangs(report)) == 1


def test_p2p_without_logs_cannot_be_told_from_a_rank_that_never_came() -> None:
    # Gloo records no send/recv, so the dumps alone show rank 1 behind; its own traceback (in the log)
    # is what says it waits in a recv.
    found = hangs(diagnose(inputs("p2p_unmatched", "pickle", logs=False)).to_json())
    assert found[0]["class"] == "collective_never_joined" and found[0]["rank"] == 1
    with_logs = hangs(diagnose(inputs("p2p_unmatched", "pickle")).to_json())
    assert with_logs[0]["class"] == "p2p_unmatched" and with_logs[0]["details"]["waiting"] == [1]


def test_straggler_says_how_late() -> None:
    root = hangs(diagnose(inputs("straggler", "pickle", logs=False)).to_json())[0]
    assert root["details"]["late_seconds"] > 4.0  # the scenario's timeout


def test_per_rank_table() -> None:
    report = diagnose(inputs("two_culprits_8", "json", logs=False)).to_json()
    table = report["hang"]["ranks"]
    assert [row["rank"] for row in table] == list(range(8))
    assert {row["rank"]: row["groups"]["0"] for row in table} == {r: 4 if r in (3, 6) else 5 for r in range(8)}
    assert all(row["state"] == "unknown" for row in table)  # Gloo tracks no state


def test_pickle_and_json_of_one_rank_count_once() -> None:
    both = inputs("never_joined", "pickle", logs=False) + inputs("never_joined", "json", logs=False)
    report = diagnose(both).to_json()
    assert report["hang"]["dumps"] == 4 and report["hang"]["skipped"] == []


def test_healthy_control_gives_no_hang_from_the_dumps_alone() -> None:
    for form in ("pickle", "json"):
        dumps = []
        from gpu_triage.diagnosis.training.hang.flight_recorder import dump_kind, parse

        for name, (data,) in inputs("healthy", form, logs=False):
            kind = dump_kind(data[:8192])
            assert kind == form
            dumps.append(parse(name, data, kind))
        assert classify(dumps).hangs == []
