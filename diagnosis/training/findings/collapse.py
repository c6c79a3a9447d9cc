"""Repeated lines collapse into one finding: a count, the first and the last evidence line.

While the input streams by, one `Tally` is kept per (class, what the lines said about where);
memory grows with the number of distinct places, never with the number of lines. At the end,
tallies that turn out to name the same place once identity is resolved are merged, and each becomes
a `Finding` ranked for root-cause ordering. A tally keeps, besides its first and last line, the first
line of each other kind (another signature, or another input) that reported the same thing: the
kernel's OOM-killer line next to torchrun's report of the same kill, up to a few.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.findings import Evidence, Finding
from gpu_triage.diagnosis.core.log_stamps import Stamp
from gpu_triage.diagnosis.training.findings.root_cause import Ranked, Timing
from gpu_triage.diagnosis.training.place.facts import Place, Who
from gpu_triage.diagnosis.training.rules import next_steps

MAX_KEYS = 10_000  # distinct (class, where) pairs before new places fold into one per class
MAX_OTHER = 4  # first lines of other kinds kept as evidence

# (class, host, global rank, local rank (only when the global one is unknown), gpu)
Where = tuple[str, str | None, int | None, int | None, str | None]


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
    performance: bool = False  # slows a job without ending it (reported beside the findings)
    xid: int | None = None  # the XID code of a GPU, for an XID's spec
    sxid: int | None = None  # the SXid code of an NVSwitch, for an SXid's spec


@dataclass(frozen=True, slots=True)
class Seen:
    """One evidence line."""

    source: int
    line: int
    text: str
    stamp: Stamp | None
    kind: int = 0  # which signature printed it: lines of another kind are kept as evidence too


@dataclass(slots=True)
class Tally:
    spec: Spec
    first: Seen
    last: Seen
    count: int = 1
    details: dict[str, str | int] = field(default_factory=dict)
    others: list[Seen] = field(default_factory=list)  # first lines of other kinds
    inferred: bool = False
    aborted: bool = False  # a line of it was a SIGABRT's report (rules: a process_segfault's `abort` field)

    def note(self, seen: Seen) -> None:
        """`seen` is another line of this tally."""
        self.count += 1
        if (seen.source, seen.line) > (self.last.source, self.last.line):
            self.last = seen
        if (seen.source, seen.line) < (self.first.source, self.first.line):
            self.first, seen = seen, self.first
        kind = (seen.source, seen.kind)
        known = {(self.first.source, self.first.kind)} | {(o.source, o.kind) for o in self.others}
        if kind not in known and len(self.others) < MAX_OTHER:
            self.others.append(seen)

    def absorb(self, other: Tally) -> None:
        count = self.count + other.count
        for seen in (other.first, *other.others, other.last):
            self.note(seen)
        self.count = count
        for name, value in other.details.items():
            self.details.setdefault(name, value)
        self.inferred = self.inferred or other.inferred
        self.aborted = self.aborted or other.aborted  # a SIGABRT's death stays one when tallies merge


class Collapser:
    def __init__(self) -> None:
        self._tallies: dict[tuple[str, Who], Tally] = {}

    def add(self, who: Who, spec: Spec, seen: Seen, details: dict[str, str | int], aborted: bool = False) -> None:
        key = (spec.class_id, who)
        tally = self._tallies.get(key)
        if tally is None and len(self._tallies) >= MAX_KEYS:
            # Too many places (garbage, or a very large job): the rest fold into one per class.
            key = (spec.class_id, Who(seen.source))
            tally = self._tallies.get(key)
        if tally is None:
            self._tallies[key] = Tally(spec, seen, seen, 1, details, aborted=aborted)
            return
        tally.note(seen)
        tally.aborted = tally.aborted or aborted
        for name, value in details.items():
            tally.details.setdefault(name, value)

    def respec(self, change: Callable[[Who, Tally], tuple[Spec, dict[str, str | int]] | None]) -> None:
        """Let a later, wider view (an XID's incident) change what a tally says, and add details."""
        for (_, who), tally in self._tallies.items():
            new = change(who, tally)
            if new is not None:
                tally.spec = new[0]
                tally.details.update(new[1])

    def tallies(self) -> Iterable[tuple[str, Who, Tally]]:
        return ((class_id, who, tally) for (class_id, who), tally in self._tallies.items())

    def rebind(self, change: Callable[[str, Who, Tally], Who | None]) -> None:
        """Move tallies to the place `change` infers for them (None: leave it), merging where one is held."""
        moves = []
        for key, tally in self._tallies.items():
            new = change(key[0], key[1], tally)
            if new is not None and new != key[1]:
                moves.append((key, (key[0], new)))
        for old, new_key in moves:
            tally = self._tallies.pop(old)
            tally.inferred = True
            held = self._tallies.get(new_key)
            if held is None:
                self._tallies[new_key] = tally
            else:
                held.absorb(tally)

    def merged(self, place: Callable[[Who], Place]) -> Iterable[tuple[Where, Tally]]:
        """Tallies per resolved place, merged where several turned out to be the same."""
        out: dict[Where, Tally] = {}
        for (class_id, who), tally in self._tallies.items():
            where = place(who)
            key = (class_id, where.host, where.rank, where.local_rank if where.rank is None else None, where.gpu)
            copy = Tally(tally.spec, tally.first, tally.last, tally.count, dict(tally.details), list(tally.others))
            copy.aborted = tally.aborted
            copy.inferred = tally.inferred or where.inferred
            if where.rank is not None and where.local_rank is not None:
                copy.details.setdefault("local_rank", where.local_rank)
            into = out.get(key)
            if into is None:
                out[key] = copy
            else:
                into.absorb(copy)
        return _settled(out).items()


def _settled(out: dict[Where, Tally]) -> dict[Where, Tally]:
    """A tally that knows only the host joins the one tally of its class there that knows more: a
    launcher's bare `Killed` is the kill its exit report names."""
    for key in [k for k in out if k[1] is not None and k[2:] == (None, None, None)]:
        richer = [k for k in out if k[:2] == key[:2] and k != key]
        if len(richer) == 1:
            out[richer[0]].absorb(out.pop(key))
    return out


def build(where: Where, tally: Tally, label: Callable[[int], str | None], name: str | None = None) -> Ranked:
    """The finding for `tally` at `where`; its id is `<class>:<host>/rank<N>/<gpu>` (known parts)."""
    class_id, host, rank, local, gpu = where
    spec = tally.spec
    local_rank = local if local is not None else tally.details.get("local_rank")
    if name is None:
        local_part = f"local{local}" if local is not None else None
        parts = [host, None if rank is None else f"rank{rank}", local_part, gpu]
        name = "/".join(p for p in parts if p) or "-"
    first, last = tally.first, tally.last
    lines = [first, *sorted(tally.others, key=lambda s: (s.source, s.line))]
    if tally.count > 1 and (last.source, last.line) not in {(s.source, s.line) for s in lines}:
        lines.append(last)
    details = {k: v for k, v in tally.details.items() if k != "local_rank"}
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
        local_rank=local_rank if isinstance(local_rank, int) else None,
        place_inferred=tally.inferred,
        evidence=[Evidence(s.line, s.text, label(s.source)) for s in lines],
        count=tally.count,
        details=details,
        xid=spec.xid,
        sxid=spec.sxid,
        aborted=tally.aborted,
    )
    finding.steps = next_steps.fill(spec.steps, next_steps.values(finding))
    return Ranked(finding, spec.tier, Timing(first.stamp, first.source, first.line))
