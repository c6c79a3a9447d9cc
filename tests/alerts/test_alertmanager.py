"""The example Alertmanager config: valid for amtool, routes each severity, and inhibits what it says it does."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.alerts.rules import ALERTMANAGER, alert_names, alert_rules, load
from tests.conftest import require_tool

RECEIVER = {"critical": "pager", "warning": "ticket", "info": "null"}
INSTANCE = "instance=gpu-node-01:9481"


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("amtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def _routes_to(receiver: str, *labels: str) -> subprocess.CompletedProcess[str]:
    return _amtool(
        "config", "routes", "test", f"--config.file={ALERTMANAGER}", f"--verify.receivers={receiver}", *labels
    )


def test_amtool_check_config_is_clean() -> None:
    result = _amtool("check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("severity", "receiver"), sorted(RECEIVER.items()))
def test_each_severity_routes_to_its_receiver(severity: str, receiver: str) -> None:
    result = _routes_to(receiver, "alertname=GpuSomething", f"severity={severity}", INSTANCE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_receiver_is_caught() -> None:
    # The check above would be worthless if amtool accepted any receiver.
    result = _routes_to("ticket", "alertname=GpuLost", "severity=critical", INSTANCE)
    assert result.returncode != 0


def test_an_alert_without_severity_still_reaches_a_human() -> None:
    result = _routes_to("ticket", "alertname=SomethingElse", INSTANCE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_shipped_alert_routes_by_its_severity() -> None:
    failures = []
    for rule in alert_rules():
        severity = rule.labels["severity"]
        result = _routes_to(
            RECEIVER[severity], f"alertname={rule.alert}", f"severity={severity}", INSTANCE, "gpu=3", "uuid=GPU-3"
        )
        if result.returncode != 0:
            failures.append(f"{rule.alert}: {result.stdout.strip()} {result.stderr.strip()}")
    assert not failures, "\n".join(failures)


def _inhibition(source: str) -> dict[str, object]:
    rules = load(ALERTMANAGER)["inhibit_rules"]
    (rule,) = [r for r in rules if r["source_matchers"] == [f'alertname="{source}"']]
    return dict(rule)


def _target_pattern(rule: dict[str, object]) -> re.Pattern[str]:
    matchers = rule["target_matchers"]
    assert isinstance(matchers, list) and len(matchers) == 1, matchers
    m = re.fullmatch(r'alertname=~"(.*)"', str(matchers[0]))
    assert m, matchers
    return re.compile(m.group(1))


def test_a_reboot_inhibits_exactly_the_gpu_alerts_it_cures_on_the_same_node() -> None:
    rule = _inhibition("GpuNodeRebootRequired")
    assert rule["equal"] == ["instance"]
    target = _target_pattern(rule)
    inhibited = {name for name in alert_names() if target.fullmatch(name)}
    assert inhibited == {
        "GpuResetRequired",
        "GpuDrainAndResetRequired",
        "GpuEccUncorrectable",
        "GpuRowRemapPending",
        "GpuRetiredPagesPending",
    }
    # What happened stays visible next to the reboot page, and so does an RMA: a reboot does not fix hardware.
    for kept in ("GpuXidCritical", "GpuLost", "GpuRowRemapFailure", "GpuRmaRequired", "GpuNodeRebootRequired"):
        assert not target.fullmatch(kept)
    # Every name in the pattern is a real alert: a typo would silently inhibit nothing.
    assert set(target.pattern.split("|")) <= set(alert_names())


def test_exporter_down_inhibits_every_other_gpu_triage_alert_of_the_node() -> None:
    rule = _inhibition("GpuTriageDown")
    assert rule["equal"] == ["instance"]
    target = _target_pattern(rule)
    assert all(target.fullmatch(name) for name in alert_names())  # itself too: Alertmanager never self-inhibits
    assert not target.fullmatch("NodeFilesystemAlmostOutOfSpace")


def test_receivers_send_resolved_and_placeholders_are_marked() -> None:
    config = load(ALERTMANAGER)
    text = ALERTMANAGER.read_text(encoding="utf-8")
    names = {r["name"] for r in config["receivers"]}
    assert names == set(RECEIVER.values())
    for receiver in config["receivers"]:
        for key, value in receiver.items():
            if key.endswith("_configs"):
                assert all(c.get("send_resolved") is True for c in value), receiver["name"]
    assert "REPLACE" in text
    assert config["route"]["group_by"] == ["instance"]
