"""XIDs in context: bursts, root causes, symptoms, and what history changes (table-driven)."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.code_findings import findings
from gpu_triage.diagnosis.xid.incidents import Occurrence, decide, incidents
from tests.diagnosis.catalog_data import build, documents

BURST_GAP_SECONDS = load_catalog().context.burst_gap_seconds

XID154_REBOOT = (
    "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
)
XID154_RESET = (
    "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
)


def occ(code: int, ts: float | None, boot: str = "b1", text: str | None = None, **details: str) -> Occurrence:
    return Occurrence(
        code=code,
        text=text or f"NVRM: Xid (PCI:0000:18:00): {code}, pid=1, name=x",
        ts=ts,
        boot_id=boot,
        details=details,
    )


def test_bursts_split_on_a_three_minute_gap() -> None:
    bursts = incidents([occ(13, 0.0), occ(31, 100.0), occ(13, 100.0 + BURST_GAP_SECONDS), occ(79, 1000.0)])
    assert [[o.code for o in b] for b in bursts] == [[13, 31], [13], [79]]
    assert len(incidents([occ(13, None), occ(31, None)])) == 1, "no times: one incident, in input order"


# Each case: the GPU's XIDs -> (root code, its action, its severity), and what the others become.
CASES = {
    "79 alone": ([occ(79, 0)], 79, Action.REBOOT_NODE, Severity.CRITICAL),
    "45 after 79 is sympathetic": ([occ(79, 0), occ(45, 1)], 79, Action.REBOOT_NODE, Severity.CRITICAL),
    "45 before 79 is still only a symptom": ([occ(45, 0), occ(79, 1)], 79, Action.REBOOT_NODE, Severity.CRITICAL),
    "48 alone: reset": ([occ(48, 0)], 48, Action.RESET_GPU, Severity.CRITICAL),
    "48 with 63: drain and reset": ([occ(48, 0), occ(63, 1)], 48, Action.DRAIN_AND_RESET, Severity.CRITICAL),
    "63 logged first, 48 is still the cause": ([occ(63, 0), occ(48, 1)], 48, Action.DRAIN_AND_RESET, Severity.CRITICAL),
    "94 with 63: the contained error stays the cause": (
        [occ(94, 0), occ(63, 1)],
        94,
        Action.DRAIN_AND_RESET,
        Severity.WARNING,
    ),
    "95 with 63: the uncontained error, drain and reset": (
        [occ(63, 0), occ(95, 1)],
        95,
        Action.DRAIN_AND_RESET,
        Severity.CRITICAL,
    ),
    "48, 94 and 63: the DBE leads": ([occ(94, 0), occ(48, 0), occ(63, 1)], 48, Action.DRAIN_AND_RESET, None),
    "94 alone: restart the application": ([occ(94, 0)], 94, Action.RESTART_APP, Severity.WARNING),
    "48 with 64: the failed remap is an RMA": ([occ(48, 0), occ(64, 1)], 64, Action.CONTACT_SUPPORT, Severity.CRITICAL),
    "154 names the action for 48": (
        [occ(48, 0), occ(154, 1, text=XID154_REBOOT)],
        48,
        Action.REBOOT_NODE,
        Severity.CRITICAL,
    ),
    "154 for an app fault escalates it": (
        [occ(31, 0), occ(154, 1, text=XID154_RESET)],
        31,
        Action.RESET_GPU,
        Severity.CRITICAL,
    ),
    "caused-by lines are symptoms": ([occ(149, 0), occ(45, 1, caused_by_xid="149")], 149, None, None),
    "13 alone is the application's": ([occ(13, 0)], 13, Action.CHECK_APP, Severity.WARNING),
    "unknown code: unknown severity": ([occ(999, 0)], 999, Action.RUN_DIAGNOSTICS, Severity.UNKNOWN),
    "most urgent wins over earliest": ([occ(13, 0), occ(74, 60)], 74, None, Severity.CRITICAL),
}


@pytest.mark.parametrize("case", CASES)
def test_root_cause_and_symptoms(case: str) -> None:
    xids, root_code, action, severity = CASES[case]
    decisions = decide(xids)
    roots = [d for d in decisions if d.root]
    assert [d.occurrence.code for d in roots] == [root_code]
    if action is not None:
        assert roots[0].action is action
    if severity is not None:
        assert roots[0].severity is severity
    for d in decisions:
        if not d.root:
            assert (d.action, d.severity) == (Action.IGNORE, Severity.INFO)
            assert d.note and d.note.startswith(f"symptom of Xid {root_code}")


def test_recovery_action_read_now_applies_to_the_latest_incident() -> None:
    decisions = decide([occ(31, 0), occ(31, 10_000)], recovery_now=2)
    assert [d.action for d in decisions] == [Action.CHECK_APP, Action.REBOOT_NODE]


def test_repeated_13_on_one_gpu_points_at_the_hardware() -> None:
    day = [occ(13, 0), occ(13, 4000), occ(13, 8000)]
    assert [d.action for d in decide(day)] == [Action.CHECK_APP, Action.CHECK_APP, Action.RUN_DIAGNOSTICS]
    spread = [occ(13, 0), occ(13, 90_000), occ(13, 180_000)]  # a day apart each: still the application's
    assert {d.action for d in decide(spread)} == {Action.CHECK_APP}
    same_spot = [occ(13, 0, gpc="2", tpc="1"), occ(13, 4000, gpc="2", tpc="1")]
    assert decide(same_spot)[1].action is Action.RUN_DIAGNOSTICS
    other_spot = [occ(13, 0, gpc="2", tpc="1"), occ(13, 4000, gpc="5", tpc="0")]
    assert decide(other_spot)[1].action is Action.CHECK_APP


def test_a_code_that_returns_after_a_reboot_escalates_to_rma() -> None:
    decisions = decide([occ(79, 0, boot="b1"), occ(79, 9000, boot="b2")])
    assert [d.action for d in decisions] == [Action.REBOOT_NODE, Action.CONTACT_SUPPORT]
    assert decisions[1].note and "after a reboot" in decisions[1].note
    same_boot = decide([occ(79, 0, boot="b1"), occ(79, 9000, boot="b1")])
    assert [d.action for d in same_boot] == [Action.REBOOT_NODE, Action.REBOOT_NODE]


def test_findings_collapse_repeats_and_put_the_root_first() -> None:
    xids = [occ(45, 0), occ(48, 1), occ(63, 2), occ(45, 3), occ(45, 4)]
    found = findings(decide(xids), "0000:18:00.0")
    assert [f.class_id for f in found] == ["xid_48", "xid_45", "xid_63"]
    root, sympathetic, _ = found
    assert (root.action, root.gpu, root.playbook) == (Action.DRAIN_AND_RESET, "0000:18:00.0", "xid-48")
    assert root.details["mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE" and "row remapper" in str(root.details["note"])
    assert sympathetic.count == 3 and len(sympathetic.evidence) == 2, "first and last line of the repeats"
    assert sympathetic.id == "xid_45:0000:18:00.0"


def test_the_context_policy_comes_from_the_data() -> None:
    """Changing the `classifier` section of xid_policy.yaml changes the verdicts: nothing is pinned in code."""
    docs = documents()
    section = docs["xid_policy.yaml"]["classifier"]
    section["burst_gap_seconds"] = 60
    section["repeats"]["incidents"] = 2
    section["sympathetic"] = [43]
    docs["xid_policy.yaml"]["xids"][43]["context"] = ["co_occurrence"]
    catalog = build(docs)
    assert [len(b) for b in incidents([occ(13, 0.0), occ(31, 100.0)], catalog=catalog)] == [1, 1]
    second = decide([occ(13, 0.0), occ(13, 1000.0)], catalog=catalog)[1]
    assert (second.action, second.note) == (Action.RUN_DIAGNOSTICS, "Xid 13 in 2 incidents within 24 h")
    now_sympathetic, no_longer = decide([occ(43, 0.0), occ(45, 1.0)], catalog=catalog)
    assert (now_sympathetic.root, no_longer.root) == (False, True)
