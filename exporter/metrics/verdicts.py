"""Metric families of the verdict: each GPU's health and recommended action, and the node's health."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpu_triage.diagnosis.core.actions import Action, Health
from gpu_triage.diagnosis.xid.node_verdict import NodeVerdict
from gpu_triage.exporter.metrics.exposition import Preformatted, series_head
from gpu_triage.exporter.polling.snapshot import Snapshot

_HEALTH = GaugeMetricFamily(
    "nvidia_gpu_health",
    "1 for the GPU's current health (healthy, degraded, unhealthy, unknown), 0 for the others.",
    labels=["gpu", "uuid", "status"],
)
_ACTION = GaugeMetricFamily(
    "nvidia_gpu_recommended_action",
    "1 for the one action the GPU needs now (IGNORE when none), 0 for the others; see /api/v1/diagnosis.",
    labels=["gpu", "uuid", "action"],
)


@functools.lru_cache(maxsize=1 << 12)
def _heads(gpu: str, uuid: str) -> tuple[tuple[tuple[Health, str], ...], tuple[tuple[Action, str], ...]]:
    """A GPU's series of both state sets, written once: a node's GPUs are the same from one page to the next."""
    pairs = (("gpu", gpu), ("uuid", uuid))
    return (
        tuple((h, series_head(_HEALTH.name, (*pairs, ("status", h.value)))) for h in Health),
        tuple((a, series_head(_ACTION.name, (*pairs, ("action", a.value)))) for a in Action),
    )


def verdict_families(snapshot: Snapshot, node: NodeVerdict) -> Iterator[Metric]:
    """nvidia_gpu_health{status} and nvidia_gpu_recommended_action{action}, as state sets (one 1, rest 0)."""
    by_bus = {v.gpu: v for v in node.gpus}
    health: list[str] = []
    action: list[str] = []
    for state in snapshot.gpus:
        g = state.identity
        verdict = by_bus.get(g.pci_bus_id)
        healths, actions = _heads(str(g.index), g.uuid)
        now_health = verdict.health if verdict else None
        now_action = verdict.action if verdict else None
        health += [f"{head}{'1.0' if h is now_health else '0.0'}\n" for h, head in healths]
        action += [f"{head}{'1.0' if a is now_action else '0.0'}\n" for a, head in actions]
    yield Preformatted(_HEALTH, "".join(health).encode())
    yield Preformatted(_ACTION, "".join(action).encode())
    node_health = GaugeMetricFamily(
        "gpu_triage_node_health",
        "1 for the node's health (its worst GPU or NVSwitch), 0 for the others.",
        labels=["status"],
    )
    for h in Health:
        node_health.add_metric([h.value], 1.0 if node.health is h else 0.0)
    yield node_health
