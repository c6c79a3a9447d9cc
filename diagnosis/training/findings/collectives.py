"""What the ranks' own reports of a collective timeout say about each other.

The straggler: from the per-rank progress PyTorch prints (SeqNum of the timed-out work, "last
enqueued/completed NCCL work"), within the process group with the most reporting ranks, the rank
whose (last completed, last enqueued) pair is strictly lowest. A rank stuck on the GPU completed less
than the others; a rank stuck outside NCCL (data loading, checkpoint) enqueued less. A tie names
nobody. The outliers are every rank whose pair differs from what most ranks report.

A collective mismatch: ranks that time out at the same SeqNum of the same process group in different
collectives (OpType), or in the same fixed-size collective with different sizes (NumelIn), called
different things at the same point: the timeout is the symptom, the mismatch the cause.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpu_triage.diagnosis.core.log_stamps import Stamp

MAX_ENTRIES = 65536
MAX_NAMED = 16  # outliers named in a finding
# Collectives whose input size is the same on every rank; for the others (all-to-all, gather of
# uneven parts) a different size is normal.
_SAME_SIZE = frozenset({"ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "_ALLGATHER_BASE", "REDUCE_SCATTER"})


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
    others_enqueued: int = 0  # the highest last-enqueued SeqNum among the other ranks

    def lag(self) -> str:
        """How the straggler's numbers differ from the others', in the terms PyTorch prints them."""
        p = self.progress
        if p.completed < self.others_completed:
            return f"last completed SeqNum {p.completed}, the others {self.others_completed}"
        return f"last enqueued SeqNum {p.enqueued}, the others {self.others_enqueued}"

    def meaning(self) -> str:
        """What the numbers say about where the straggler was stuck."""
        if self.progress.completed < self.others_completed:
            return (
                f"it completed SeqNum {self.progress.completed} and the others {self.others_completed}: it was "
                "stuck inside the collective (its GPU, its NIC or its link)"
            )
        return (
            f"it enqueued SeqNum {self.progress.enqueued} and the others {self.others_enqueued}: it never reached "
            "the collective (stuck outside NCCL: data loading, a checkpoint, evaluation, an exception)"
        )


class ProgressTracker:
    """Keeps the lowest progress reported per (process group, rank); bounded by the job's size."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], Progress] = {}

    def report(self, pg: str | None, rank: int, progress: Progress) -> None:
        # Lines without a PG tag come from PyTorch versions that only had the default group.
        key = (pg or "0", rank)
        old = self._seen.get(key)
        if old is None:
            if len(self._seen) < MAX_ENTRIES:
                self._seen[key] = progress
        elif progress.key < old.key:
            self._seen[key] = progress

    def _group(self) -> tuple[str, dict[int, Progress]] | None:
        groups: dict[str, dict[int, Progress]] = {}
        for (pg, rank), progress in self._seen.items():
            groups.setdefault(pg, {})[rank] = progress
        if not groups:
            return None
        return max(groups.items(), key=lambda item: (len(item[1]), item[0] == "0"))

    def straggler(self) -> Straggler | None:
        found = self._group()
        if found is None or len(found[1]) < 2:
            return None
        pg, ranks = found
        ordered = sorted(ranks.items(), key=lambda item: item[1].key)
        (rank, lowest), (_, runner_up) = ordered[0], ordered[1]
        if lowest.key == runner_up.key:
            return None
        others = [p for r, p in ranks.items() if r != rank]
        completed, enqueued = max(p.completed for p in others), max(p.enqueued for p in others)
        return Straggler(rank, pg, lowest, completed, len(ranks), enqueued)

    def outliers(self) -> list[int]:
        """Ranks whose progress differs from what most ranks of the group report (numerically sorted)."""
        found = self._group()
        if found is None or len(found[1]) < 3:
            return []
        ranks = found[1]
        common, _ = Counter(p.key for p in ranks.values()).most_common(1)[0]
        return sorted(r for r, p in ranks.items() if p.key != common)


@dataclass(frozen=True, slots=True)
class Work:
    """One rank's timed-out collective."""

    rank: int
    op: str
    numel: int | None
    source: int
    line: int
    text: str
    stamp: Stamp | None


@dataclass(frozen=True, slots=True)
class Mismatch:
    pg: str
    seq: int
    works: tuple[Work, ...]  # one per rank, numerically by rank
    odd: tuple[Work, ...]  # the ranks in the minority


class WorkTracker:
    """The collective each rank timed out in, by (process group, SeqNum)."""

    def __init__(self) -> None:
        self._works: dict[tuple[str, int], dict[int, Work]] = {}
        self._size = 0

    def report(self, pg: str | None, seq: int, work: Work) -> None:
        ranks = self._works.setdefault((pg or "0", seq), {})
        if work.rank not in ranks and self._size < MAX_ENTRIES:
            ranks[work.rank] = work
            self._size += 1

    def mismatches(self) -> list[Mismatch]:
        out: list[Mismatch] = []
        for (pg, seq), by_rank in sorted(self._works.items()):
            if len(by_rank) < 2:
                continue
            works = [by_rank[r] for r in sorted(by_rank)]
            shape = Counter(_shape(w) for w in works)
            if len(shape) < 2:
                continue
            common, _ = shape.most_common(1)[0]
            out.append(Mismatch(pg, seq, tuple(works), tuple(w for w in works if _shape(w) != common)))
        return out


def _shape(work: Work) -> tuple[str, int | None]:
    return (work.op, work.numel if work.op in _SAME_SIZE else None)
