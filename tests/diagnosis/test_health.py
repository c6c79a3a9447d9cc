"""A GPU's verdict: health, the one action, and findings that close when their cause is gone."""

from __future__ import annotations

import pytest
import yaml

from gpu_triage.diagnosis.core.actions import Action, GpuStatus, Health, Severity
from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.core.findings import Finding, urgency
from gpu_triage.diagnosis.xid.conditions import load_conditions, parse_conditions
from gpu_triage.diagnosis.xid.health import (
    APP_FINDING_SECONDS,
    DCGM_HEALTH_SYSTEMS,
    EXIT_CODES,
    GpuVerdict,
    Telemetry,
    assess_gpu,
    condition_findings,
)
from gpu_triage.diagnosis.xid.incidents import Occurrence
from gpu_triage.diagnosis.xid.node_verdict import Blind, assess_node, blind_findings, sxid_findings
from tests.conftest import REPO
from tests.diagnosis.kernel_lines import parse_line

GPU = "0000:18:00.0"


def occ(code: int, ts: float, boot: str = "b1", text: str = "") -> Occurrence:
    return Occurrence(code=code, text=text or f"NVRM: Xid (PCI:0000:18:00): {code}, pid=1, name=x", ts=ts, boot_id=boot)


QUIET = Telemetry()


def verdict(xids: list[Occurrence], t: Telemetry = QUIET, now: float = 1000.0, **kw: object) -> GpuVerdict:
    return assess_gpu(GPU, xids, t, boot_id="b1", now=now, **kw)  # type: ignore[arg-type]


def test_a_quiet_gpu_is_healthy() -> None:
    v = verdict([])
    assert (v.health, v.action, v.findings) == (Health.HEALTHY, Action.IGNORE, ())


def test_xid_79_makes_the_gpu_unhealthy_and_asks_for_a_reboot() -> None:
    v = verdict([occ(79, 900)])
    assert (v.health, v.action) == (Health.UNHEALTHY, Action.REBOOT_NODE)
    assert v.findings[0].class_id == "xid_79" and v.findings[0].gpu == GPU


def test_a_reboot_closes_the_findings_of_the_boot_before() -> None:
    assert verdict([occ(79, 900, boot="b0")]).health is Health.HEALTHY


def test_an_acknowledgement_closes_what_came_before_it() -> None:
    assert verdict([occ(79, 900)], cleared_at=950.0).health is Health.HEALTHY
    assert verdict([occ(79, 960)], cleared_at=950.0).health is Health.UNHEALTHY


def test_a_gpu_reset_closes_what_a_reset_cures_only() -> None:
    assert verdict([occ(48, 900)], resets=[950.0]).health is Health.HEALTHY
    still = verdict([occ(79, 900)], resets=[950.0])
    assert still.action is Action.REBOOT_NODE, "a reset does not cure what needs a reboot"


def test_application_faults_close_after_an_hour() -> None:
    assert verdict([occ(13, 900)], now=900 + 60).health is Health.DEGRADED
    assert verdict([occ(13, 900)], now=900 + APP_FINDING_SECONDS + 1).health is Health.HEALTHY


@pytest.mark.parametrize(
    ("telemetry", "health", "action", "classes"),
    [
        (Telemetry(status=GpuStatus.LOST), Health.UNHEALTHY, Action.REBOOT_NODE, ["gpu_lost"]),
        (Telemetry(status=GpuStatus.HUNG), Health.UNKNOWN, Action.RESET_GPU, ["gpu_unresponsive"]),
        (Telemetry(row_remap_failure=True), Health.UNHEALTHY, Action.CONTACT_SUPPORT, ["row_remap_failure"]),
        (Telemetry(row_remap_pending=True), Health.DEGRADED, Action.DRAIN_AND_RESET, ["row_remap_pending"]),
        (Telemetry(uncorrected_ecc=2), Health.UNHEALTHY, Action.RESET_GPU, ["ecc_uncorrectable"]),
        (Telemetry(recovery_action=2), Health.UNHEALTHY, Action.REBOOT_NODE, ["recovery_action"]),
        (Telemetry(recovery_action=4), Health.UNHEALTHY, Action.DRAIN_AND_RESET, ["recovery_action"]),
        (Telemetry(thermal_slowdown=True), Health.DEGRADED, Action.CHECK_COOLING, ["thermal_slowdown"]),
        (Telemetry(power_brake=True), Health.DEGRADED, Action.CHECK_MECHANICALS, ["power_brake_slowdown"]),
        (Telemetry(nvlink_down=(3, 7)), Health.DEGRADED, Action.CHECK_LINKS, ["nvlink_down"]),
        (
            Telemetry(row_remap_pending=True, row_remap_failure=True, thermal_slowdown=True),
            Health.UNHEALTHY,
            Action.CONTACT_SUPPORT,
            ["row_remap_failure", "row_remap_pending", "thermal_slowdown"],
        ),
    ],
)
def test_telemetry_conditions(telemetry: Telemetry, health: Health, action: Action, classes: list[str]) -> None:
    v = verdict([], telemetry)
    assert (v.health, v.action) == (health, action)
    assert [f.class_id for f in v.findings] == classes
    assert all(f.steps and f.playbook for f in v.findings)


def test_the_driver_recovery_action_is_one_finding_with_its_xid() -> None:
    v = verdict([occ(48, 990)], Telemetry(recovery_action=2))
    assert [f.class_id for f in v.findings] == ["xid_48"] and v.action is Action.REBOOT_NODE


def test_xids_and_conditions_together_most_urgent_first() -> None:
    v = verdict([occ(13, 990)], Telemetry(status=GpuStatus.LOST))
    assert [f.class_id for f in v.findings] == ["gpu_lost", "xid_13"]


def test_node_verdict_and_exit_codes() -> None:
    healthy = verdict([])
    sick = verdict([occ(79, 900)])
    hung = verdict([], Telemetry(status=GpuStatus.HUNG))
    assert assess_node([healthy, healthy]).health is Health.HEALTHY
    node = assess_node([healthy, sick, hung])
    assert (node.health, node.action) == (Health.UNHEALTHY, Action.REBOOT_NODE)
    assert assess_node([healthy, hung]).health is Health.UNKNOWN
    assert assess_node([]).health is Health.UNKNOWN
    assert [EXIT_CODES[h] for h in (Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY, Health.UNKNOWN)] == [0, 1, 2, 3]


def test_nvswitch_sxids_are_node_findings() -> None:
    fatal = Occurrence(
        20034,
        "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        5.0,
        "b1",
        details={"severity": "Fatal"},
    )
    minor = Occurrence(12028, "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61", 6.0, "b1")
    old = Occurrence(20034, "old boot", 1.0, "b0", details={"severity": "Fatal"})
    found = sxid_findings([fatal, minor, minor, old], boot_id="b1")
    assert [(f.class_id, f.count) for f in found] == [("sxid_fatal", 1), ("sxid_nonfatal", 2)]
    node = assess_node([verdict([])], found)
    assert (node.health, node.action) == (Health.UNHEALTHY, Action.RESTART_FABRIC_MANAGER)


@pytest.mark.parametrize(
    ("line", "fatal"),
    [
        ("nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up", True),
        ("nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, FATAL, Link 48 LTSSM Fault Up", True),
        ("nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error", False),
        ("nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, non fatal, Link 61", False),
        (
            "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Severity 0 Engine instance 61 Sub-engine instance 00",
            False,
        ),
    ],
)
def test_sxid_severity_comes_from_the_parsed_line(line: str, fatal: bool) -> None:
    event = parse_line(line)
    assert event is not None and event.code is not None
    occ = Occurrence(event.code, event.text, 5.0, "b1", details=event.details)
    [found] = sxid_findings([occ], boot_id="b1")
    assert found.class_id == ("sxid_fatal" if fatal else "sxid_nonfatal")


def test_every_condition_is_used_and_complete() -> None:
    conditions = load_conditions()
    assert {
        f.class_id
        for f in condition_findings(
            Telemetry(
                status=GpuStatus.LOST,
                recovery_action=1,
                row_remap_failure=True,
                uncorrected_ecc=1,
                row_remap_pending=True,
                retired_pages_pending=True,
                nvlink_down=(1,),
                thermal_slowdown=True,
                power_brake=True,
                health_incidents=tuple((system, True, "DCGM says so") for system in DCGM_HEALTH_SYSTEMS),
            ),
            GPU,
        )
    } | {"gpu_unresponsive", "sxid_fatal", "sxid_nonfatal"} | {
        f.class_id for f in blind_findings([Blind(s, "down") for s in ("kmsg", "nvml", "journal", "xid", "backend")])
    } == set(conditions)


def test_dcgm_health_incidents_are_findings_with_dcgms_words() -> None:
    t = Telemetry(
        health_incidents=(
            ("memory", False, "GPU 6 has a pending row remap; reset it."),
            ("memory", True, "Detected 1 volatile DBE(s) in GPU 6."),
            ("thermal", False, "Clocks of GPU 2 are held down by a thermal violation"),
        )
    )
    memory, thermal = condition_findings(t, GPU)
    assert (memory.class_id, memory.severity, memory.action, memory.playbook) == (
        "dcgm_health_memory",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "dcgm-health-memory",
    )
    assert [e.text for e in memory.evidence] == [
        "DCGM memory health: WARN: GPU 6 has a pending row remap; reset it.",
        "DCGM memory health: FAIL: Detected 1 volatile DBE(s) in GPU 6.",
    ]
    assert (thermal.class_id, thermal.severity, thermal.action) == (
        "dcgm_health_thermal",
        Severity.WARNING,
        Action.CHECK_COOLING,
    )
    warned = condition_findings(Telemetry(health_incidents=(("memory", False, "pending remap"),)), GPU)
    assert [f.severity for f in warned] == [Severity.WARNING], "a WARN alone is a warning"
    v = verdict([], t)
    assert (v.health, v.action) == (Health.UNHEALTHY, Action.RESET_GPU)


@pytest.mark.parametrize("clear", ["reset", "acknowledgement"])
def test_an_xid_after_a_clear_is_news_not_a_symptom_of_the_old_one(clear: str) -> None:
    """The reset did not fix it: the same XID a minute after the reset (or the acknowledgement) must show."""
    kw: dict[str, object] = {"resets": [960.0]} if clear == "reset" else {"cleared_at": 960.0}
    v = verdict([occ(48, 900), occ(48, 1020)], now=1030.0, **kw)
    assert (v.health, v.action) == (Health.UNHEALTHY, Action.RESET_GPU)
    assert v.findings[0].count == 1 and v.findings[0].evidence[0].text.startswith("NVRM: Xid")


def test_an_xid_after_a_reboot_is_its_own_incident() -> None:
    v = assess_gpu(GPU, [occ(48, 900, boot="b0"), occ(48, 1000, boot="b1")], QUIET, boot_id="b1", now=1010.0)
    assert (v.health, v.action) == (Health.UNHEALTHY, Action.CONTACT_SUPPORT), "back after a reboot: RMA"


def test_an_application_fault_stays_open_while_it_keeps_coming() -> None:
    every_minute = [occ(13, 60.0 * i) for i in range(120)]  # two hours of Xid 13, one incident
    assert verdict(every_minute, now=120 * 60.0).health is Health.DEGRADED
    assert verdict(every_minute, now=119 * 60.0 + APP_FINDING_SECONDS + 1).health is Health.HEALTHY


def test_urgency_orders_by_action_then_severity() -> None:
    def finding(action: Action, severity: Severity) -> Finding:
        return Finding(f"{action}/{severity}", "c", severity, action, "t", "p")

    found = [
        finding(Action.RESET_GPU, Severity.WARNING),
        finding(Action.CHECK_APP, Severity.CRITICAL),
        finding(Action.RESET_GPU, Severity.CRITICAL),
    ]
    assert [f.id for f in sorted(found, key=urgency)] == [
        "RESET_GPU/critical",
        "RESET_GPU/warning",
        "CHECK_APP/critical",
    ]


def test_a_bad_conditions_file_lists_every_problem() -> None:
    doc = yaml.safe_load((REPO / "diagnosis" / "data" / "conditions.yaml").read_text(encoding="utf-8"))
    conditions = doc["conditions"]
    conditions["gpu_lost"]["action"] = "PANIC"
    conditions["nvlink_down"]["severity"] = "unknown"  # ours to say, never the data's
    conditions["thermal_slowdown"]["playbook"] = "Check Cooling"
    del conditions["sxid_fatal"]["steps"]
    del conditions["power_brake_slowdown"]
    with pytest.raises(DataError) as caught:
        parse_conditions(doc)
    assert [p.removeprefix("conditions.yaml: ") for p in caught.value.problems] == [
        "gpu_lost: action 'PANIC' is not one of " + ", ".join(Action),
        "thermal_slowdown: playbook id 'Check Cooling' is not lower-case words joined by dashes",
        "nvlink_down: severity 'unknown' is not one of critical, warning, info",
        "sxid_fatal: missing key 'steps'",
        "no condition 'power_brake_slowdown', which the verdict code raises",
    ]
