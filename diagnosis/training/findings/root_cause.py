"""Which finding explains the others: ordering training-log findings root cause first.

NCCL reports the layer where it gave up, not the layer that failed: when rank 3 runs out of GPU
memory, ranks 0-2 and 4-7 report closed sockets and collective timeouts minutes later. So the order
is decided by *what* a signal is before *when* it was seen:

1. Specificity tier, most specific first. A training-log class's tier is its position in
   data/training_rules.yaml (hardware faults, then host and GPU memory, CUDA, InfiniBand, shared
   memory, P2P, fabric, configuration, and last the symptoms: timeouts, watchdog, closed peers,
   bare NCCL errors). A kernel-log XID whose catalog action is a hardware action (reset, reboot,
   RMA, links, cooling, diagnostics) ranks before every training-log class: it names the failing
   GPU, and it is the root cause of whatever its node's ranks report. An XID that the catalog
   blames on the application ranks with the CUDA illegal-address class; an ignorable one ranks last.
   An XID that is the root cause of its GPU's burst and calls for an action ranks, besides, before every
   training-log finding on the same GPU (or rank): the CUDA error a rank prints (`uncorrectable ECC
   error encountered`, `unspecified launch failure`) is that GPU's fault seen from the application,
   and the XID names the GPU and what it needs.
2. Within a tier, the earliest signal first: by timestamp when every finding of the tier carries one
   of the same kind (ISO date-time, or glog/syslog month-day-time), otherwise by input and line.

Which rank a collective timeout waited for is worked out in diagnosis/training/findings/collectives.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.core.log_stamps import Stamp


@dataclass(frozen=True, slots=True)
class Timing:
    """When a finding was first seen: its first evidence line."""

    stamp: Stamp | None
    source: int
    line: int


@dataclass(frozen=True, slots=True)
class Ranked:
    finding: Finding
    tier: float  # lower is more specific
    timing: Timing


def _tier_key(group: Sequence[Ranked]) -> list[Ranked]:
    stamps = [r.timing.stamp for r in group]
    kinds = {s.kind for s in stamps if s is not None}
    if len(kinds) == 1 and all(s is not None for s in stamps):
        return sorted(
            group,
            key=lambda r: (r.timing.stamp.value if r.timing.stamp else 0.0, r.timing.source, r.timing.line),
        )
    return sorted(group, key=lambda r: (r.timing.source, r.timing.line))


def _on_gpu(xid: Finding, other: Finding) -> bool:
    """Whether `other` happened on the XID's GPU. Every node has a GPU at 3b:00: a bus id (or a rank) names
    the same GPU only on the same host, or where one of the two does not say its host."""
    if None not in (xid.host, other.host) and xid.host != other.host:
        return False
    return (xid.gpu is not None and other.gpu == xid.gpu) or (xid.rank is not None and other.rank == xid.rank)


def kernel_first(items: Iterable[Ranked], is_root_xid: Callable[[Finding], bool]) -> list[Ranked]:
    """`items` with each root-cause XID's tier just ahead of the training-log findings on its GPU."""
    items = list(items)
    logs = [r for r in items if not r.finding.from_kernel]
    out = []
    for r in items:
        tiers = [o.tier for o in logs if _on_gpu(r.finding, o.finding)] if is_root_xid(r.finding) else []
        out.append(replace(r, tier=min(tiers) - 0.25) if tiers and min(tiers) <= r.tier else r)
    return out


def order(items: Iterable[Ranked]) -> list[Ranked]:
    """`items` root cause first (see the module docstring)."""
    tiers: dict[float, list[Ranked]] = {}
    for item in items:
        tiers.setdefault(item.tier, []).append(item)
    out: list[Ranked] = []
    for tier in sorted(tiers):
        out.extend(_tier_key(tiers[tier]))
    return out


def link_symptoms(findings: list[Finding], is_symptom: Callable[[Finding], bool]) -> None:
    """Point each symptom at the root cause (`details.likely_caused_by`), unless it is a symptom too.

    When the root cause is an XID, whatever else went wrong on that GPU (a CUDA error of its rank) is
    its consequence too; but not another XID there, which the GPU's incidents judged already: one of
    its burst is a symptom, one of another burst (hours apart) is a fault of its own.
    """
    if not findings or is_symptom(findings[0]):
        return
    root = findings[0]
    xid = root.xid is not None
    for finding in findings[1:]:
        if is_symptom(finding) or (xid and finding.xid is None and _on_gpu(root, finding)):
            finding.details["likely_caused_by"] = root.id
