"""Big jobs on one screen: 63 collective timeouts behind one GPU's Xid 48, and the same with 512 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.exporter.cli.report_text import render
from tests.diagnosis.job_logs import bus_id, host_of, write_job

SCREEN = 60


def _diagnose(paths: list[Path]) -> dict[str, object]:
    return diagnose([(str(p), [p.read_bytes()]) for p in paths]).to_json()


@pytest.mark.parametrize("ranks", [64, 512])
def test_the_xid_is_the_root_cause_and_the_timeouts_one_finding(tmp_path: Path, ranks: int) -> None:
    report = _diagnose(write_job(tmp_path, ranks, failed=27))
    findings = report["findings"]
    assert isinstance(findings, list)
    root = findings[0]
    assert report["root_cause"] == root["id"]
    assert (root["class"], root["host"], root["rank"], root["gpu"]) == ("xid_48", "node-c04", 27, bus_id(27))
    assert host_of(27) == "node-c04"
    [timeouts] = [f for f in findings if f["class"] == "collective_timeout"]
    assert timeouts["ranks"] == [r for r in range(ranks) if r != 27]
    assert timeouts["count"] == ranks - 1
    assert f"ranks 0\u201326, 28\u2013{ranks - 1} ({ranks - 1})" in timeouts["title"]
    assert timeouts["details"]["likely_caused_by"] == root["id"]
    # Per-rank detail stays in the JSON, numerically ordered.
    members = timeouts["members"]
    assert [m["rank"] for m in members] == timeouts["ranks"]
    assert members[28]["host"] == host_of(29) and members[28]["gpu"] == bus_id(29)
    assert len(findings) <= 5


@pytest.mark.parametrize("ranks", [64, 512])
def test_the_plain_report_fits_on_one_screen(tmp_path: Path, ranks: int) -> None:
    text = render(_diagnose(write_job(tmp_path, ranks, failed=27)))
    lines = text.splitlines()
    assert len(lines) <= SCREEN
    assert lines[0].startswith("Root cause: XID 48")
    assert "host node-c04, rank 27, GPU 0000:5d:00.0" in lines[1]
    assert sum("Collective operation timed out" in line for line in lines) == 1
