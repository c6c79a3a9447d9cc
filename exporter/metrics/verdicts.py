"""Metric families of the verdict: each GPU's health and recommended action, and the node's health."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpu_triage.diagnosis.core.actions import Action, Health
from gpu_triage.diagnosis.xid.node_verdict import NodeVerdict
from gpu_triage.exporter.polling.snapshot import Snapshot


def verdict_families(snapshot: Snapshot, node: NodeVerdict) -> Iterator[Metric]:
    """nvidia_gpu_health{status} and nvidia_gpu_recommended_action{action}, as state sets (one 1, rest 0)."""
    by_bus = {v.gpu: v for v in node.gpus}
    health = GaugeMetricFamily(
        "nvidia_gpu_health",
        "1 for the GPU's current health (healthy, degraded, unhealthy, unknown), 0 for the others.",
        labels=["gpu", "uuid", "status"],
    )
    action = GaugeMetricFamily(
        "nvidia_gpu_recommended_action",
        "1 for the one action the GPU needs now (IGNORE when none), 0 for the others; see /api/v1/diagnosis.",
        labels=["gpu", "uuid", "action"],
    )
    for state in snapshot.gpus:
        g = state.identity
        verdict = by_bus.get(g.pci_bus_id)
        labels = [str(g.index), g.uuid]
        for h in Health:
            health.add_metric([*labels, h.value], 1.0 if verdict and verdict.health is h else 0.0)
        for a in Action:
            action.add_metric([*labels, a.value], 1.0 if verdict and verdict.action is a else 0.0)
    yield health
    yield action
    node_health = GaugeMetricFamily(
        "gpu_triage_node_health",
        "1 for the node's health (its worst GPU or NVSwitch), 0 for the others.",
        labels=["status"],
    )
    for h in Health:
        node_health.add_metric([h.value], 1.0 if node.health is h else 0.0)
    yield node_health
