"""tools/gen_kubernetes.py: the checked-in PrometheusRule and dashboard ConfigMaps never drift from alerts/
and dashboards/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

TOOL = REPO / "tools/gen_kubernetes.py"
GENERATED = ["kubernetes/base/prometheusrule.yaml", "kubernetes/base/grafana-dashboards.yaml"]


def gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], check=False, capture_output=True, text=True)


def test_checked_in_copies_are_current() -> None:
    result = gen("--check")
    assert result.returncode == 0, result.stderr


def _copy(tmp_path: Path) -> Path:
    for part in ("alerts", "dashboards", "kubernetes/base"):
        shutil.copytree(REPO / part, tmp_path / part)
    return tmp_path


def test_check_names_each_stale_file_and_a_run_brings_them_back(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    rules = repo / "alerts/gpu-triage.rules.yml"
    rules.write_text(rules.read_text().replace("for: 1m", "for: 2m", 1))
    dashboard = repo / "dashboards/gpu-triage-node.json"
    dashboard.write_text(dashboard.read_text().replace('"title": ', '"title": "x" , "_": ', 1))

    result = gen("--check", "--repo", str(repo))
    assert result.returncode == 1
    for path in GENERATED:
        assert f"{path} is out of date" in result.stderr
    assert (repo / GENERATED[0]).read_text() == (REPO / GENERATED[0]).read_text()  # --check writes nothing

    assert gen("--repo", str(repo)).returncode == 0
    assert gen("--check", "--repo", str(repo)).returncode == 0
    assert "for: 2m" in (repo / GENERATED[0]).read_text()


def test_a_new_dashboard_is_picked_up_without_touching_kustomization(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    (repo / "dashboards/extra.json").write_text('{"uid": "gpu-triage-extra", "panels": []}\n')
    assert gen("--repo", str(repo)).returncode == 0
    assert "name: grafana-dashboard-gpu-triage-extra" in (repo / GENERATED[1]).read_text()


def test_a_missing_rules_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    (repo / "alerts/gpu-triage.rules.yml").unlink()
    result = gen("--check", "--repo", str(repo))
    assert result.returncode == 2
    assert "gen_kubernetes:" in result.stderr and "Traceback" not in result.stderr
