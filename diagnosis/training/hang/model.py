"""What hang/classify.py finds: hangs (kind, culprits, the collective, the facts that show it) and the
per-rank table, and the small helpers that read a rank's ops of a group."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_triage.diagnosis.training.hang.fr_model import Dump, Frame, Op

__all__ = ["Analysis", "Fact", "Hang", "describe", "frontier", "op_at", "ranges", "rank_table", "who"]


@dataclass(frozen=True, slots=True)
class Fact:
    """One evidence line: what rank `rank`'s dump says at entry `index` (from 1; 0: the dump as a whole)."""

    rank: int | None
    index: int
    text: str


@dataclass(slots=True)
class Hang:
    kind: str
    culprits: tuple[int, ...]
    group: str
    desc: str
    seq: int
    op: Op | None  # the collective as a rank that entered it recorded it (None: dropped from the buffers)
    members: int
    waiting: tuple[int, ...] = ()  # ranks that entered and waited
    missing: tuple[int, ...] = ()  # members with no dump
    mismatch: str | None = None  # "op", "size" or "dtype"
    frames: tuple[Frame, ...] = ()
    facts: list[Fact] = field(default_factory=list)  # what shows it, for evidence
    position: int = 1 << 62  # program order: the lowest record_id a rank recorded the collective at
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Analysis:
    hangs: list[Hang]
    table: list[dict[str, Any]]  # per rank: what it was last doing
    world: int
    notes: list[str]


def op_at(dump: Dump, group: str, seq: int) -> Op | None:
    g = dump.groups.get(group)
    return next((o for o in reversed(g.ops) if o.seq == seq), None) if g else None


def frontier(dump: Dump, group: str) -> int:
    g = dump.groups.get(group)
    return g.ops[-1].seq if g and g.ops else 0


def describe(op: Op | None) -> str:
    if op is None:
        return "(not in the buffers)"
    sizes = ",".join("x".join(map(str, s)) for s in op.in_sizes[:4])
    return f"{op.name}[{sizes}]" + (f" {'/'.join(sorted(set(op.dtypes)))}" if op.dtypes else "")


def who(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"


def ranges(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def rank_table(dumps: dict[int, Dump], world: int) -> list[dict[str, Any]]:
    """Per rank: which dump, how far it got in each group, what it was last doing."""
    rows: list[dict[str, Any]] = []
    for r in range(world):
        d = dumps.get(r)
        if d is None:
            rows.append({"rank": r, "dump": None})
            continue
        last = d.last
        rows.append(
            {
                "rank": r,
                "dump": d.source,
                "version": d.version,
                "groups": {n: frontier(d, n) for n in sorted(d.groups)},
                "last_op": None if last is None else f"{last.backend}:{last.name}",
                "last_group": d.last_group,
                "last_seq": None if last is None else last.seq,
                "state": None if last is None else (last.state if d.states_known else "unknown"),
            }
        )
    return rows
