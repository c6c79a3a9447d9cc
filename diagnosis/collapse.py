"""Repeated lines collapse into one finding: a count, the first and the last evidence line.

While the input streams by, one `Tally` is kept per (class, what the lines said about where);
memory grows with the number of distinct places, never with the number of lines. At the end,
tallies that turn out to name the same place once identity is resolved are merged, and each becomes
a `Finding` ranked for root-cause ordering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpu_triage.diagnosis.actions import Action, Severity
from gpu_triage.diagnosis.findings import Evidence, Finding
from gpu_triage.diagnosis.identity import Place, Who
from gpu_triage.diagnosis.log_lines import Stamp
from gpu_triage.diagnosis.root_cause import Ranked, Timing

MAX_KEYS = 10_000  # distinct (class, where) pairs before new places fold into one per class

Where = tuple[str, str | None, int | None, str | None]  # (class, host, rank, gpu)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """What a finding of one class says, whoever found it."""

    class_id: str
    severity: Severity
    action: Action
    title: str
    playbook: str
    steps: tuple[str, ...]
    tier: float  # root-cause order: lower is more specific
    symptom: bool = False


@dataclass(frozen=True, slots=True)
class Seen:
    """One evidence line."""

    source: int
    line: int
    text: str
    stamp: Stamp | None


@dataclass(slots=True)
class Tally:
    spec: Spec
    first: Seen
    last: Seen
    count: int = 1
    details: dict[str, str | int] = field(default_factory=dict)

    def absorb(self, other: Tally) -> None:
        self.count += other.count
        if (other.first.source, other.first.line) < (self.first.source, self.first.line):
            self.first = other.first
        if (other.last.source, other.last.line) > (self.last.source, self.last.line):
            self.last = other.last
        for name, value in other.details.items():
            self.details.setdefault(name, value)


class Collapser:
    def __init__(self) -> None:
        self._tallies: dict[tuple[str, Who], Tally] = {}

    def add(self, who: Who, spec: Spec, seen: Seen, details: dict[str, str | int]) -> None:
        key = (spec.class_id, who)
        tally = self._tallies.get(key)
        if tally is None and len(self._tallies) >= MAX_KEYS:
            # Too many places (garbage, or a very large job): the rest fold into one per class.
            key = (spec.class_id, Who(seen.source))
            tally = self._tallies.get(key)
        if tally is None:
            self._tallies[key] = Tally(spec, seen, seen, 1, details)
            return
        tally.count += 1
        tally.last = seen
        for name, value in details.items():
            tally.details.setdefault(name, value)

    def respec(self, change: Callable[[Who, Tally], tuple[Spec, dict[str, str | int]] | None]) -> None:
        """Let a later, wider view (an XID's incident) change what a tally says, and add details."""
        for (_, who), tally in self._tallies.items():
            new = change(who, tally)
            if new is not None:
                tally.spec = new[0]
                tally.details.update(new[1])

    def merged(self, place: Callable[[Who], Place]) -> Iterable[tuple[Where, Tally]]:
        """Tallies per resolved place, merged where several turned out to be the same."""
        out: dict[Where, Tally] = {}
        for (class_id, who), tally in self._tallies.items():
            where = place(who)
            if where.rank_is_local and where.rank is not None:
                tally.details.setdefault("local_rank", where.rank)
            key = (class_id, where.host, where.rank, where.gpu)
            into = out.get(key)
            if into is None:
                out[key] = Tally(tally.spec, tally.first, tally.last, tally.count, dict(tally.details))
            else:
                into.absorb(tally)
        return out.items()


def build(where: Where, tally: Tally, label: Callable[[int], str | None], name: str | None = None) -> Ranked:
    """The finding for `tally` at `where`; its id is `<class>:<host>/rank<N>/<gpu>` (known parts)."""
    class_id, host, rank, gpu = where
    spec = tally.spec
    if name is None:
        parts = [host, None if rank is None else f"rank{rank}", gpu]
        name = "/".join(p for p in parts if p) or "-"
    first, last = tally.first, tally.last
    evidence = [Evidence(first.line, first.text, label(first.source))]
    if tally.count > 1 and (last.source, last.line) != (first.source, first.line):
        evidence.append(Evidence(last.line, last.text, label(last.source)))
    finding = Finding(
        id=f"{class_id}:{name}",
        class_id=class_id,
        severity=spec.severity,
        action=spec.action,
        title=spec.title,
        playbook=spec.playbook,
        gpu=gpu,
        rank=rank,
        host=host,
        evidence=evidence,
        count=tally.count,
        steps=list(spec.steps),
        details=dict(tally.details),
    )
    return Ranked(finding, spec.tier, Timing(first.stamp, first.source, first.line))
