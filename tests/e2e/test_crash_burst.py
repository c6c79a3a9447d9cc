"""One crash, one finding, no drain: a job that dies makes every GPU it ran on log Xid 13, 31, 43 and 45 at once.

Peers have drained whole racks on such a burst. Here the simulated node gets it on all eight GPUs, three times in
a day (a crash-looping job); its verdict must blame the application, once, and never ask for a drain, a reset or
a reboot. Then what the node exports is replicated across a 64-node fleet and run through the shipped alert rules
with `promtool test rules`: no alert may fire that pages (severity critical) or asks for a drain.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend
from gpu_triage.exporter.cli.check import reason
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST
from tests.alerts.rules import RULES, alert_rules
from tests.conftest import FakeClock, require_tool
from tests.daemon_proc import wait_for

CRASH = (13, 31, 43, 45)  # what a job's death leaves on each of its GPUs, in the order the driver logs them
DRAINS = {Action.CONTACT_SUPPORT, Action.REBOOT_NODE, Action.DRAIN_AND_RESET, Action.RESET_GPU}
NODES = 64


def crash(daemon: Daemon, clock: FakeClock) -> None:
    sim = daemon.backend
    assert isinstance(sim, SimBackend)
    before = len(daemon.journal.events(limit=10_000))
    for code in CRASH:
        for gpu in range(8):
            sim.inject(FaultSpec(gpu=gpu, kind="xid", xid=code))
        clock.advance(1)
    wait_for(lambda: len(daemon.journal.events(limit=10_000)) == before + 8 * len(CRASH), what="the burst journaled")
    daemon.refresh()


def test_a_crash_on_every_gpu_is_one_finding_and_no_drain(daemon: Daemon, clock: FakeClock, tmp_path: Path) -> None:
    for n in range(3):  # a job that crash-loops: three incidents within a day, each on every GPU
        if n:
            clock.advance(4 * 3600)
            daemon.poller.poll(FAST)  # fresh readings, as the poll loop would have taken meanwhile
        crash(daemon, clock)
    typed = daemon.diagnosis()
    body = typed.body()
    node = body["node"]
    assert (node["health"], node["action"]) == ("degraded", "CHECK_APP"), node["summary"]
    assert all(Action(g["action"]) not in DRAINS and g["health"] != "unhealthy" for g in body["gpus"])
    assert node["summary"] == "8 GPUs, 8 up; node degraded: CHECK_APP: GPUs 0-7 Xid 13"
    assert reason(typed) == "CHECK_APP: GPUs 0-7 Xid 13"
    # One finding per code for the whole node, naming every GPU; each GPU keeps its own in its row.
    [app] = [f for f in body["findings"] if f["class"] == "xid_13"]
    assert app["gpu"] is None and len(app["details"]["gpus"].split(", ")) == 8 and app["count"] == 8
    assert len([f for f in body["findings"] if f["action"] != "IGNORE"]) == 1
    # Three crashes a day on one GPU would point at the GPU; on every GPU at once they point at the job.
    assert not any(f["action"] == "RUN_DIAGNOSTICS" for g in body["gpus"] for f in g["findings"])

    fleet = fleet_series(daemon.metrics.text.decode())
    paging = sorted({r.alert for r in alert_rules() if r.labels.get("severity") == "critical"})
    drains = sorted(
        {r.alert for r in alert_rules() if r.alert.endswith(("RebootRequired", "ResetRequired", "RmaRequired"))}
    )
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": fleet,
                "alert_rule_test": [
                    {"eval_time": minute, "alertname": name, "exp_alerts": []}
                    for minute in ("12m", "25m")
                    for name in sorted({*paging, *drains})
                ],
            }
        ],
    }
    path = tmp_path / "burst.test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def fleet_series(page: str) -> list[dict[str, str]]:
    """The series of the node's /metrics that the rules read, as promtool input series for NODES instances, half
    an hour long: each sample holds its value, and each `*_timestamp_seconds` says 10 minutes into the test (the
    burst, as the rules' clock sees it)."""
    read = set(re.findall(r"\b(?:nvidia_gpu|gpu_triage)_\w+", RULES.read_text(encoding="utf-8")))
    series = []
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name not in read or "link" in sample.labels:  # NVLink's per-link series: no XID moves them
                continue
            value = 600.0 if sample.name.endswith("_timestamp_seconds") else sample.value
            for node in range(NODES):
                labels = {**sample.labels, "job": "gpu-triage", "instance": f"gpu{node:02d}:9481"}
                selector = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                series.append({"series": f"{sample.name}{{{selector}}}", "values": f"{value}+0x30"})
    return series


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
