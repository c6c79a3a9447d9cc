"""render(): runbook links rewritten to a published base, everything else left exactly as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_triage.exporter.cli.alert_rules import render, runbook_ids
from tests.alerts.rules import RULES, alert_rules
from tests.conftest import require_tool

BASE = "https://wiki.example.com/gpu-runbooks"


def _shipped() -> str:
    return RULES.read_text(encoding="utf-8")


def test_no_base_keeps_the_daemon_links() -> None:
    assert render(_shipped(), None) == _shipped()


def test_every_runbook_url_points_at_the_base_with_the_same_id() -> None:
    before = alert_rules()
    after = alert_rules(render(_shipped(), BASE))
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        rid = old.annotations["runbook_url"].rsplit("/", 1)[-1]
        assert new.annotations["runbook_url"] == f"{BASE}/{rid}"
        # Nothing else about the rule changed.
        assert {**new.body, "annotations": {**new.annotations, "runbook_url": None}} == {
            **old.body,
            "annotations": {**old.annotations, "runbook_url": None},
        }
    assert runbook_ids(render(_shipped(), BASE)) == runbook_ids(_shipped())


def test_only_the_runbook_lines_change() -> None:
    old_lines = _shipped().splitlines()
    new_lines = render(_shipped(), BASE + "/").splitlines()  # a trailing slash is not doubled
    assert len(new_lines) == len(old_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert changed and all("runbook_url:" in a and b.endswith(f"{BASE}/{a.rsplit('/', 1)[-1]}") for a, b in changed)
    assert len(changed) == len(runbook_ids(_shipped()))


def test_dashboard_base_makes_relative_dashboard_links_absolute() -> None:
    text = render(_shipped(), None, dashboard_base="https://grafana.example.com/")
    for rule in alert_rules(text):
        assert rule.annotations["dashboard_url"].startswith("https://grafana.example.com/d/gpu-triage-")
        assert rule.annotations["runbook_url"].startswith("http://{{ $labels.instance }}/runbooks/")


def test_absolute_dashboard_links_are_left_alone() -> None:
    text = 'annotations:\n  dashboard_url: "https://grafana.example.com/d/x"\n'
    assert render(text, None, dashboard_base="https://other.example.com") == text


def test_other_quoting_styles_and_a_prometheusrule_wrapper() -> None:
    text = (
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "spec:\n"
        "  groups:\n"
        "    - name: g\n"
        "      rules:\n"
        "        - alert: A\n"
        "          expr: vector(1)\n"
        "          annotations:\n"
        "            runbook_url: 'http://{{ $labels.instance }}/runbooks/reboot-node'  \n"
        "            summary: runbook_url is mentioned here, but this is not the key\n"
        "        - alert: B\n"
        "          expr: vector(1)\n"
        "          annotations: {summary: x}\n"
        "          # runbook_url: http://commented/out/xid-79\n"
        "        - alert: C\n"
        "          expr: vector(1)\n"
        "          annotations:\n"
        "            runbook_url: https://old.example.com/runbooks/xid-79\n"
    )
    out = render(text, "https://new.example.com/rb")
    doc = yaml.safe_load(out)
    urls = [r.get("annotations", {}).get("runbook_url") for r in doc["spec"]["groups"][0]["rules"]]
    assert urls == ["https://new.example.com/rb/reboot-node", None, "https://new.example.com/rb/xid-79"]
    assert "# runbook_url: http://commented/out/xid-79" in out


@pytest.mark.parametrize("base", ["", "   ", "https://x.example.com/\nevil: 1"])
def test_a_bad_base_is_refused(base: str) -> None:
    with pytest.raises(ValueError, match="runbook base"):
        render(_shipped(), base)


@pytest.mark.parametrize(
    "line",
    [
        "runbook_url: https://example.com/runbooks/",
        "runbook_url: https://example.com/runbooks/Reboot_Node",
        "runbook_url: >-",
        "runbook_url:",
    ],
)
def test_a_runbook_url_without_an_id_is_an_error(line: str) -> None:
    with pytest.raises(ValueError):
        render(f"annotations:\n  {line}\n", BASE)


def test_a_runbook_url_it_cannot_rewrite_is_refused() -> None:
    # A flow mapping keeps its old link if the line rewrite misses it: an error, never a silent stale link.
    text = "annotations: {summary: x, runbook_url: 'http://h/runbooks/xid-79'}\n"
    with pytest.raises(ValueError, match="left unchanged"):
        render(text, BASE)


def test_quotes_in_the_base_stay_valid_yaml() -> None:
    out = render(_shipped(), 'https://wiki.example.com/a "quoted" path')
    assert alert_rules(out)[0].annotations["runbook_url"].startswith('https://wiki.example.com/a "quoted" path/')


def test_the_rendered_file_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rendered = tmp_path / "rules.yml"
    rendered.write_text(render(_shipped(), BASE, dashboard_base="https://grafana.example.com"), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(rendered)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
