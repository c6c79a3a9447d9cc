"""A real daemon on a straggler node: the finding on the landing page, in /api/v1/diagnosis, on /metrics and in
`gpu-triage check --performance`, while the exit status and the drain reason stay the health verdict's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_proc import GPU_TRIAGE, Daemon, serve, wait_for

# perf-straggler without its minute of warm-up, judged on a 6 s window.
SCENARIO = """name: straggler-now
seed: 36
node: {gpus: {count: 8}}
workloads:
  - {kind: slurm_job, name: "7777", user: carol, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}
workload:
  - duration_seconds: 3600
    utilization: 0.95
    memory_used_ratio: 0.85
    jitter: 0.03
    gpus: {5: {sm_share: 0.6, temperature_offset_celsius: 12}}
"""


def _straggler(daemon: Daemon) -> dict[str, Any] | None:
    body = httpx.get(f"{daemon.url}/api/v1/diagnosis", timeout=5).json()
    return body if body["performance"]["gpus"] else None


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, Any]]]:
    home = tmp_path_factory.mktemp("straggler")
    (home / "s.yaml").write_text(SCENARIO)
    args = ["--sim.scenario", str(home / "s.yaml"), "--collector.interval", "1s", "--collector.slow-interval", "1s",
            "--performance.window", "6s"]  # fmt: skip
    with serve(home / "daemon", *args) as daemon:
        body = wait_for(lambda: _straggler(daemon), timeout=40, what="the straggler finding")
        yield daemon, body


def test_the_api_names_the_straggler_and_its_job_beside_a_healthy_verdict(node: tuple[Daemon, dict[str, Any]]) -> None:
    _, body = node
    assert body["node"]["health"] == "healthy"
    ((gpu,),) = [[g["gpu"] for g in body["performance"]["gpus"]]]
    assert gpu == 5
    (finding,) = body["performance"]["gpus"][0]["findings"]
    assert finding["class"] == "straggler_gpu" and finding["severity"] == "warning"
    assert finding["evidence"]["activity"] < 0.75 * finding["evidence"]["siblings_activity"]
    (job,) = body["performance"]["workloads"]
    assert job["workload"] == {"kind": "slurm_job", "job_id": "7777", "step": "", "user": "carol"}
    assert job["gpus"] == list(range(8)) and [f["gpu"] for f in job["findings"]] == [5]


def test_the_page_has_a_why_slow_line_for_the_gpu(node: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, _ = node
    page = httpx.get(f"{daemon.url}/", timeout=5).text
    assert "<th>Why slow</th>" in page
    rows = {row.split("</b>")[0].rsplit(">", 1)[-1]: row for row in page.split('<tr class="gpu-')[1:]}
    assert "straggler_gpu" in rows["GPU 5"] and "job 7777" in rows["GPU 5"]
    assert "straggler_gpu" not in rows["GPU 4"]


def test_the_metrics_carry_the_finding_and_the_jobs_counters(node: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, _ = node
    text = httpx.get(f"{daemon.url}/metrics", timeout=5).text
    line = next(
        x for x in text.splitlines() if x.startswith('nvidia_gpu_performance_finding{class="straggler_gpu",gpu="5"')
    )
    assert line.endswith(" 1.0")
    assert 'nvidia_gpu_workload_allocated_seconds_total{gpu="5",job_id="7777",namespace="",pod=""' in text


def test_check_performance_adds_lines_and_keeps_the_exit_status(node: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, _ = node

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [GPU_TRIAGE, "check", "--url", daemon.url, "--timeout", "5", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    plain, perf = check(), check("--performance")
    assert plain.returncode == perf.returncode == 0, perf.stdout + perf.stderr
    assert "straggler_gpu" not in plain.stdout
    assert perf.stdout.startswith(plain.stdout)
    assert "  GPU 5: straggler_gpu [warning]" in perf.stdout and "Slurm job 7777" in perf.stdout
    narrowed = check("--performance", "--gpus", "4")
    assert "performance: no finding" in narrowed.stdout and narrowed.returncode == 0
    reason = check("--format", "reason", "--performance")
    assert reason.returncode == 0 and "straggler" not in reason.stdout


def test_no_flag_means_the_documented_default(tmp_path: Path) -> None:
    help_text = subprocess.run([GPU_TRIAGE, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--performance.window" in help_text and "--performance.node-role" in help_text
