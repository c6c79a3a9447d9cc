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
2. Within a tier, the earliest signal first: by timestamp when every finding of the tier carries one
   of the same kind (ISO date-time, or glog/syslog month-day-time), otherwise by input and line.

For collective timeouts the straggler is named from the per-rank progress PyTorch prints (SeqNum of
the timed-out work, "last enqueued/completed NCCL work"): within the process group with the most
reporting ranks, the rank whose (last completed, last enqueued) pair is strictly lowest. A rank
stuck on the GPU completed less than the others; a rank stuck outside NCCL (data loading,
checkpoint) enqueued less. A tie names nobody.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpu_triage.diagnosis.findings import Finding
from gpu_triage.diagnosis.log_lines import Stamp


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


def order(items: Iterable[Ranked]) -> list[Ranked]:
    """`items` root cause first (see the module docstring)."""
    tiers: dict[float, list[Ranked]] = {}
    for item in items:
        tiers.setdefault(item.tier, []).append(item)
    out: list[Ranked] = []
    for tier in sorted(tiers):
        out.extend(_tier_key(tiers[tier]))
    return out


def link_symptoms(findings: list[Finding], is_symptom: Callable[[str], bool]) -> None:
    """Point each symptom at the root cause (`details.likely_caused_by`), unless it is a symptom too."""
    if not findings or is_symptom(findings[0].class_id):
        return
    root = findings[0].id
    for finding in findings[1:]:
        if is_symptom(finding.class_id):
            finding.details["likely_caused_by"] = root


@dataclass(frozen=True, slots=True)
class Progress:
    """How far one rank got in one process group, as its first report after the failure says."""

    completed: int
    enqueued: int
    source: int
    line: int
    text: str
    stamp: Stamp | None

    @property
    def key(self) -> tuple[int, int]:
        return (self.completed, self.enqueued)


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    pg: str
    progress: Progress
    others_completed: int  # the highest last-completed SeqNum among the other ranks
    reporting_ranks: int


class ProgressTracker:
    """Keeps the lowest progress reported per (process group, rank); bounded by the job's size."""

    MAX_ENTRIES = 65536

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], Progress] = {}

    def report(self, pg: str | None, rank: int, progress: Progress) -> None:
        # Lines without a PG tag come from PyTorch versions that only had the default group.
        key = (pg or "0", rank)
        old = self._seen.get(key)
        if old is None:
            if len(self._seen) < self.MAX_ENTRIES:
                self._seen[key] = progress
        elif progress.key < old.key:
            self._seen[key] = progress

    def straggler(self) -> Straggler | None:
        groups: dict[str, dict[int, Progress]] = {}
        for (pg, rank), progress in self._seen.items():
            groups.setdefault(pg, {})[rank] = progress
        if not groups:
            return None
        pg, ranks = max(groups.items(), key=lambda item: (len(item[1]), item[0] == "0"))
        if len(ranks) < 2:
            return None
        ordered = sorted(ranks.items(), key=lambda item: item[1].key)
        (rank, lowest), (_, runner_up) = ordered[0], ordered[1]
        if lowest.key == runner_up.key:
            return None
        others = max(p.completed for r, p in ranks.items() if r != rank)
        return Straggler(rank, pg, lowest, others, len(ranks))
