"""A real Prometheus scrapes a real gpu-triage on the simulator and sees every GPU."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import Server, gpu_triage, prometheus, query, wait_for

pytestmark = pytest.mark.e2e


GPUS = {str(i) for i in range(8)}
LOST = "4"


def _gpus(prom: Server, expr: str) -> set[str]:
    return {r["metric"]["gpu"] for r in query(prom, expr)}


def test_prometheus_sees_every_gpu_and_a_lost_one(tmp_path: Path) -> None:
    with gpu_triage(tmp_path) as daemon, prometheus(tmp_path, [daemon.url.removeprefix("http://")]) as prom:
        wait_for(lambda: _gpus(prom, "nvidia_gpu_up == 1") == GPUS, what="all 8 GPUs up in Prometheus")
        assert _gpus(prom, "nvidia_gpu_power_watts") == GPUS
        assert query(prom, 'up{job="gpu-triage"}')[0]["value"][1] == "1"
        httpx.post(f"{daemon.url}/api/v1/sim/faults", json={"gpu": int(LOST), "kind": "gpu_lost"}).raise_for_status()
        wait_for(lambda: _gpus(prom, "nvidia_gpu_up == 0") == {LOST}, what=f"GPU {LOST} down in Prometheus")
        assert _gpus(prom, "nvidia_gpu_up == 1") == GPUS - {LOST}
        # A lost GPU has no power reading: its series goes stale, the other seven keep theirs.
        wait_for(lambda: _gpus(prom, "nvidia_gpu_power_watts") == GPUS - {LOST}, what="power of the 7 GPUs left")
