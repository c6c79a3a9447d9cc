"""A 64-GPU fleet (four simulated 16-GPU nodes) in a real Prometheus with the shipped rules: the namespace and user
energy and idle-cost recording rules agree with what the nodes' own series say, and GpuIdleAllocated fires as a
ticket (severity warning) for exactly the GPUs a pod holds idle.

Each node runs a training pod of team-a on GPUs 0-7, a notebook pod of team-idle holding GPUs 8 and 9 with
memory allocated and nothing running, and Slurm job 9000 of alice on GPUs 10-15. The daemons judge on a 5 s base
window (idle: 15 s). In the rules Prometheus loads, the alert's `for` is shortened to 2 s and the rate windows to
20 s (rate() over 5 minutes of a fleet a minute old would read a fifth of the truth); nothing else changes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.servers import Server, gpu_triage, prometheus, query, wait_for

pytestmark = pytest.mark.e2e

NODES, PER_NODE = 4, 16
IDLE = (8, 9)
SCENARIO = """name: fleet-node-{n}
seed: {seed}
node: {{gpus: {{count: 16, product: h100-sxm}}}}
workloads:
  - {{kind: pod, namespace: team-a, name: train-{n}, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}}
  - {{kind: pod, namespace: team-idle, name: notebook-{n}, gpus: [8, 9]}}
  - {{kind: slurm_job, name: "9000", user: alice, gpus: [10, 11, 12, 13, 14, 15]}}
workload:
  - duration_seconds: 3600
    utilization: 0.9
    memory_used_ratio: 0.8
    jitter: 0.03
    hold_memory: true
    gpus: {{8: {{utilization: 0.0}}, 9: {{utilization: 0.0}}}}
"""


def _rules(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "alerts" / "gpu-triage.rules.yml").read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GpuIdleAllocated":
                rule["for"] = "2s"
            rule["expr"] = str(rule["expr"]).replace("[5m]", "[20s]")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _value(prom: Server, expr: str) -> dict[str, float]:
    """Each series' value by its namespace or user ("" when it has neither)."""
    out = {}
    for r in query(prom, expr):
        labels = r["metric"]
        out[labels.get("namespace") or labels.get("user") or ""] = float(r["value"][1])
    return out


def test_a_64_gpu_fleet_costs_by_namespace_and_tickets_the_idle_gpus(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        daemons = []
        for n in range(NODES):
            home = tmp_path / f"node{n}"
            home.mkdir()
            (home / "s.yaml").write_text(SCENARIO.format(n=n, seed=40 + n))
            daemons.append(
                stack.enter_context(gpu_triage(home, "--performance.window", "5s", scenario=str(home / "s.yaml")))
            )
        targets = [d.url.removeprefix("http://") for d in daemons]
        prom = stack.enter_context(prometheus(tmp_path, targets, rule_files=[_rules(tmp_path)]))
        wait_for(lambda: len(query(prom, "nvidia_gpu_up == 1")) == NODES * PER_NODE, what="64 GPUs up", timeout=60)

        firing = 'ALERTS{alertname="GpuIdleAllocated",alertstate="firing"}'
        wait_for(lambda: len(query(prom, firing)) == NODES * len(IDLE), what="the idle GPUs' tickets", timeout=90)
        alerts = query(prom, firing)
        assert {(a["metric"]["instance"], a["metric"]["gpu"]) for a in alerts} == {
            (t, str(g)) for t in targets for g in IDLE
        }
        assert {a["metric"]["severity"] for a in alerts} == {"warning"}  # routed to the ticket queue, never paged

        # Held idle: two GPUs a node, each all the time; worked: about none of theirs, all of the others'.
        idle = "namespace:nvidia_gpu_workload_idle_allocated_gpus:rate5m"
        wait_for(lambda: _value(prom, idle).get("team-idle", 0) > 0.9 * NODES * len(IDLE), what=idle, timeout=60)
        assert _value(prom, idle)["team-idle"] == pytest.approx(NODES * len(IDLE), rel=0.1)
        assert _value(prom, idle)["team-a"] == pytest.approx(0.0, abs=0.05)
        held = _value(prom, "namespace:nvidia_gpu_workload_allocated_gpus:rate5m")
        assert held["team-a"] == pytest.approx(NODES * 8, rel=0.1)
        assert _value(prom, "user:nvidia_gpu_workload_allocated_gpus:rate5m")["alice"] == pytest.approx(
            NODES * 6, rel=0.1
        )

        # The namespace's power from its workloads' energy counters against the GPUs' own power readings, joined
        # to the pods the nodes name: two ways to the same watts.
        power = _value(prom, "namespace:nvidia_gpu_workload_power_watts:rate5m")
        gpus = _value(
            prom,
            "sum by (namespace) (avg_over_time(nvidia_gpu_power_watts[1m])"
            " * on(instance, uuid) group_left(namespace) nvidia_gpu_pod_info)",
        )
        for namespace in ("team-a", "team-idle"):
            assert power[namespace] == pytest.approx(gpus[namespace], rel=0.15), namespace
        assert power["team-a"] > 10 * power["team-idle"]  # busy H100s against idle ones

        cost = _value(prom, "namespace:nvidia_gpu_workload_idle_cost_per_hour:rate5m")
        price = _value(prom, "gpu_triage:price_per_gpu_hour")[""]
        assert cost["team-idle"] == pytest.approx(_value(prom, idle)["team-idle"] * price, rel=0.05)
        energy_cost = _value(prom, "namespace:nvidia_gpu_workload_energy_cost_per_hour:rate5m")
        kwh = _value(prom, "gpu_triage:price_per_kwh")[""]
        assert energy_cost["team-a"] == pytest.approx(power["team-a"] / 1000 * kwh, rel=0.05)
