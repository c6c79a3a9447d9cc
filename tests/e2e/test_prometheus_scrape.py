"""A real Prometheus scrapes a real gpu-triage on the simulator and sees every GPU."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import gpu_triage, prometheus, query, wait_for

pytestmark = pytest.mark.e2e


def test_prometheus_sees_every_gpu_and_a_lost_one(tmp_path: Path) -> None:
    with gpu_triage(tmp_path) as daemon, prometheus(tmp_path, [daemon.url.removeprefix("http://")]) as prom:
        up = wait_for(lambda: query(prom, "nvidia_gpu_up == 1"), what="8 GPUs up in Prometheus")
        wait_for(lambda: len(query(prom, "nvidia_gpu_up == 1")) == 8, what="all 8 GPUs")
        assert {r["metric"]["gpu"] for r in up} <= {str(i) for i in range(8)}
        assert query(prom, 'up{job="gpu-triage"}')[0]["value"][1] == "1"
        httpx.post(f"{daemon.url}/api/v1/sim/faults", json={"gpu": 4, "kind": "gpu_lost"}).raise_for_status()
        lost = wait_for(lambda: query(prom, "nvidia_gpu_up == 0"), what="GPU 4 down in Prometheus")
        assert [r["metric"]["gpu"] for r in lost] == ["4"]
        assert len(query(prom, "nvidia_gpu_power_watts")) >= 7
