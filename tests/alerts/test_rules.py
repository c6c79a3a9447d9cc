"""The alert rules: valid for promtool, unit-tested, complete, and in step with the XID catalog and playbooks."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict

from gpu_triage.diagnosis.core.actions import Severity
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.exporter.cli.alert_rules import runbook_ids, update_generated
from tests.alerts.rules import ALERTS, PLAYBOOKS, RULE_TESTS, RULES, XID_PATTERN, alert_names, alert_rules, load
from tests.conftest import REPO, require_tool

SEVERITIES = {"critical", "warning", "info"}
# Runbook ids of the daemon's own failure modes and of how GPUs are used; every other id is an action, XID or
# condition playbook.
# (kernel-log-unreadable and journal-unwritable are playbooks of the verdict's conditions too.)
EXPORTER_RUNBOOKS = {"gpu-triage-down", "gpu-triage-collection"}
# (gpu-allocated-idle, mig-on-training-node and job-slow are the performance classes' playbooks, named by their data.)
USAGE_RUNBOOKS: set[str] = set()


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules_is_clean_with_every_lint() -> None:
    # --lint=all is the duplicate-rules lint in 2.42; fatal, so a warning fails the build instead of scrolling by.
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", *(str(p) for p in RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_every_alert_is_labelled_and_annotated() -> None:
    problems = []
    for rule in alert_rules():
        where = f"{rule.alert} ({rule.group})"
        if not re.fullmatch(r"Gpu(?:[A-Z][a-z0-9]*)+", rule.alert):
            problems.append(f"{where}: the name must be CamelCase starting with Gpu")
        if rule.labels.get("severity") not in SEVERITIES:
            problems.append(f"{where}: severity {rule.labels.get('severity')!r} is not one of {sorted(SEVERITIES)}")
        for key in ("summary", "description", "runbook_url"):
            if not str(rule.annotations.get(key, "")).strip():
                problems.append(f"{where}: missing annotation {key}")
        if "{{ $labels.instance }}" not in rule.annotations.get("description", ""):
            problems.append(f"{where}: the description must name the node ({{{{ $labels.instance }}}})")
        url = rule.annotations.get("runbook_url", "")
        if not url.startswith("http://{{ $labels.instance }}/runbooks/"):
            problems.append(f"{where}: runbook_url {url!r} must point at the daemon that raised the alert")
        dashboard = rule.annotations.get("dashboard_url", "/")
        if not dashboard.startswith(("/d/gpu-triage-node", "/d/gpu-triage-fleet")):
            problems.append(f"{where}: dashboard_url {dashboard!r} must open a gpu-triage dashboard")
    assert not problems, "\n".join(problems)


def test_per_gpu_alerts_name_the_gpu() -> None:
    # Alerts on series that carry `gpu` must say which GPU in the summary: that is what the page is for.
    for rule in alert_rules():
        if rule.group in {"gpu-triage.actions", "gpu-triage.xid"} or "nvidia_gpu_up ==" in rule.body["expr"]:
            assert "$labels.gpu" in rule.annotations["summary"], rule.alert


def test_no_group_level_labels() -> None:
    # Prometheus 2.42 (Debian bookworm) rejects them: "field labels not found in type rulefmt.RuleGroup".
    assert all("labels" not in group for group in load(RULES)["groups"])


def test_every_alert_has_a_firing_unit_test_checking_its_runbook_url_and_a_quiet_one() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for group in load(path)["tests"]:
            for case in group.get("alert_rule_test", []):
                expected = case.get("exp_alerts") or []
                if not expected:
                    quiet.add(case["alertname"])
                if any("runbook_url" in (alert.get("exp_annotations") or {}) for alert in expected):
                    fired.add(case["alertname"])
    names = set(alert_names())
    assert names - fired == set(), "alerts without a firing test that checks runbook_url"
    assert names - quiet == set(), "alerts without a test that they stay quiet"
    (healthy_group,) = load(ALERTS / "tests" / "healthy.test.yml")["tests"]
    healthy = {case["alertname"] for case in healthy_group["alert_rule_test"]}
    assert names - healthy == set(), "alerts missing from healthy.test.yml"


def test_critical_xid_codes_are_the_catalogs() -> None:
    catalog = load_catalog()
    expected = sorted(e.code for e in catalog if e.severity is Severity.CRITICAL)
    assert expected, "the catalog has no critical code"
    codes_in_rules: list[int] = []
    for rule in alert_rules():
        if rule.alert != "GpuXidCritical":
            continue
        match = XID_PATTERN.search(rule.body["expr"])
        assert match, rule.body["expr"]
        codes = [int(c) for c in match.group(1).split("|")]
        codes_in_rules += codes
        # Each rule links the playbook the catalog gives its codes.
        (rid,) = runbook_ids(f"runbook_url: {rule.annotations['runbook_url']!r}")
        assert {catalog.get(c).playbook for c in codes if catalog.get(c)} == {rid}, codes  # type: ignore[union-attr]
        # ... and the one action they all call for, which its description spells out.
        (action,) = {catalog.get(c).action for c in codes if catalog.get(c)}  # type: ignore[union-attr]
        assert action.description in " ".join(rule.annotations["description"].split()), (rule.alert, codes)
        assert rule.labels["playbook"] == rid
        assert rule.labels["severity"] == "critical"
    assert sorted(codes_in_rules) == expected
    assert len(codes_in_rules) == len(set(codes_in_rules)), "a code is in two rules"


def test_generated_xid_block_is_up_to_date() -> None:
    text = RULES.read_text(encoding="utf-8")
    assert update_generated(text) == text, (
        "run: python -m gpu_triage.exporter.cli.alert_rules alerts/gpu-triage.rules.yml"
    )


def test_every_runbook_id_has_a_playbook() -> None:
    by_id: dict[str, list[str]] = defaultdict(list)
    for rule in alert_rules():
        (rid,) = runbook_ids(f"runbook_url: {rule.annotations['runbook_url']!r}")
        by_id[rid].append(rule.alert)
    missing = {rid: sorted(set(alerts)) for rid, alerts in by_id.items() if not (PLAYBOOKS / f"{rid}.md").is_file()}
    assert not missing, f"runbook ids without diagnosis/playbooks/<id>.md: {missing}"


def test_exporter_runbook_ids_are_the_documented_ones() -> None:
    # The ids that are not an action, XID or condition playbook were asked of the playbook writer by name.
    from gpu_triage.diagnosis.knowledge.check import playbook_references

    ids = set(runbook_ids(RULES.read_text(encoding="utf-8")))
    assert ids - set(playbook_references()) == EXPORTER_RUNBOOKS | USAGE_RUNBOOKS


def test_the_alerting_readme_lists_every_alert_with_its_severity() -> None:
    readme = (ALERTS / "README.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| `(Gpu\w+)` \| (\w+) \|", readme, re.M))
    shipped = {r.alert: r.labels["severity"] for r in alert_rules()}
    assert table == shipped
