"""Which rank hung the job, and how: Flight Recorder dumps matched across ranks.

Collectives are matched by process group and sequence number: every member of a group runs the
group's collectives in the same order, so its `collective_seq_id`s line up across ranks whatever the
group (the default one, a tensor- or pipeline-parallel sub-group). Per group, each rank's frontier is
the last collective it entered; the job hung at the group's highest frontier. Then, group by group:

- the same sequence number with a different op, size or dtype on some ranks: `collective_mismatch`,
  the culprits the ranks in the minority (not "the first file read", so the answer does not depend on
  the order the dumps came in);
- a member behind the others: it never entered the collective after its frontier
  (`collective_never_joined`) unless it is busy elsewhere: waiting in another group's incomplete
  collective (then that group's culprit explains both), or in a send/recv (`p2p_unmatched`), or, where
  the recorder tracks state (NCCL), still running its own last collective while its peers completed
  it (`collective_stuck`);
- a member with no dump at all (killed, or its node gone): `rank_missing`;
- everyone entered, but one rank only after the others' timeout had run out: `collective_straggler`.

A rank missing several collectives is reported at the first one in program order (the lowest
`record_id` a peer recorded it at). Where the entries needed were already dropped from the ring
buffers the finding says so instead of guessing the op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gpu_triage.diagnosis.training.hang.flight_recorder import Dump, Op
from gpu_triage.diagnosis.training.hang.model import Analysis, Fact, Hang, describe, frontier, op_at, rank_table, who

__all__ = ["Analysis", "Fact", "Hang", "classify"]

_FREE_SIZES = {"all_to_all", "all_to_all_single", "all_to_all_v_single", "scatter", "gather", "coalesced"}
_FREE_SIZES |= {"all_gather_v", "reduce_scatter_v", "barrier"}
MAX_HANGS = 16


def _is_default(name: str, desc: str) -> bool:
    return desc == "default_pg" or name == "0"


def _signature(op: Op) -> tuple[Any, ...]:
    return op.name, None if op.name in _FREE_SIZES else (op.in_sizes, op.out_sizes), op.dtypes


class _Job:
    def __init__(self, dumps: Iterable[Dump], world_hint: int, p2p_waiting: frozenset[int]) -> None:
        self.dumps = {d.rank: d for d in dumps}
        self.p2p_waiting = p2p_waiting
        self.world = max([world_hint, max(self.dumps) + 1, *(d.world_hint for d in self.dumps.values())])
        self.groups: dict[str, tuple[str, set[int]]] = {}
        for d in self.dumps.values():
            for name, g in d.groups.items():
                desc, seen = self.groups.setdefault(name, (g.desc, set()))
                seen.add(d.rank)
        self.members: dict[str, tuple[int, ...]] = {}
        for name, (desc, seen) in self.groups.items():
            configured = next((d.members[name] for d in self.dumps.values() if name in d.members), None)
            if configured is not None:
                self.members[name] = configured
            elif _is_default(name, desc):
                self.members[name] = tuple(range(self.world))
            else:
                self.members[name] = tuple(sorted(seen))
        self.notes: list[str] = []
        self._incomplete: dict[tuple[str, int], bool] = {}

    def incomplete(self, group: str, seq: int) -> bool:
        """Whether some member of `group` has not entered (or, where known, not completed) collective `seq`."""
        key = (group, seq)
        if key not in self._incomplete:
            self._incomplete[key] = any(self._short(r, group, seq) for r in self.members[group])
        return self._incomplete[key]

    def _short(self, rank: int, group: str, seq: int) -> bool:
        d = self.dumps.get(rank)
        if d is None or frontier(d, group) < seq:
            return True
        op = op_at(d, group, seq)
        return d.states_known and op is not None and op.state != "completed"

    def stalled(self, ranks: tuple[int, ...], group: str, seq: int) -> bool:
        """Whether the ranks that entered `seq` may still be in it: a collective NCCL saw complete on one of
        them had every member, dumped or not, so nobody was missing from it."""
        for r in ranks:
            d = self.dumps[r]
            op = op_at(d, group, seq)
            if d.states_known and op is not None and op.state == "completed":
                return False
        return True

    def busy(self, rank: int, group: str) -> tuple[str, int] | None:
        """The other group's collective `rank` is waiting in, if its latest op is one that is not complete."""
        d = self.dumps[rank]
        last = d.last
        if last is None or d.last_group in (None, group) or last.p2p:
            return None
        assert d.last_group is not None
        return (d.last_group, last.seq) if self.incomplete(d.last_group, last.seq) else None

    def analyse(self) -> list[Hang]:
        hangs: list[Hang] = []
        for name in sorted(self.groups, key=lambda n: (not _is_default(n, self.groups[n][0]), n)):
            hangs.extend(self._group(name))
        return _first_per_culprit(hangs)[:MAX_HANGS]

    def _group(self, name: str) -> list[Hang]:
        desc = self.groups[name][0]
        members = self.members[name]
        present = [r for r in members if r in self.dumps]
        missing = tuple(r for r in members if r not in self.dumps)
        fronts = {r: frontier(self.dumps[r], name) for r in present}
        top = max(fronts.values(), default=0)
        mismatch = self._mismatch(name, desc, present, missing)
        if mismatch is not None:
            return [mismatch]
        out: list[Hang] = []
        behind = sorted((r for r in present if fronts[r] < top), key=lambda r: (fronts[r], r))
        waiting = tuple(r for r in present if fronts[r] == top)
        never, stuck, p2p = [], [], []
        for r in behind:
            d = self.dumps[r]
            own = op_at(d, name, fronts[r])
            if d.states_known and own is not None and own.state != "completed":
                stuck.append(r)
            elif r in self.p2p_waiting or (d.last is not None and d.last.p2p and d.last_group == name):
                p2p.append(r)
            elif self.busy(r, name) is None:
                never.append(r)
        if never:
            seq = fronts[never[0]] + 1
            out.append(self._hang("collective_never_joined", tuple(never), name, desc, seq, waiting, missing))
        if stuck:
            seq = fronts[stuck[0]]
            out.append(self._hang("collective_stuck", tuple(stuck), name, desc, seq, waiting, missing))
        for r in p2p:
            out.append(self._p2p(r, name, desc, fronts[r] + 1, members, waiting))
        if missing and waiting and self.stalled(waiting, name, top):
            out.append(self._hang("rank_missing", missing, name, desc, top, waiting, missing))
        if not out and present and not missing:
            late = self._straggler(name, desc, present, top)
            if late is not None:
                out.append(late)
        return out

    def _hang(
        self,
        kind: str,
        culprits: tuple[int, ...],
        group: str,
        desc: str,
        seq: int,
        waiting: tuple[int, ...],
        missing: tuple[int, ...],
    ) -> Hang:
        entered = [(r, op) for r in waiting if (op := op_at(self.dumps[r], group, seq)) is not None]
        op = entered[0][1] if entered else None
        hang = Hang(kind, culprits, group, desc, seq, op, len(self.members[group]), waiting, missing)
        hang.position = min((o.record_id for _, o in entered), default=1 << 62)
        hang.frames = op.frames if op else ()
        if op is None and kind != "collective_stuck":
            text = f"collective #{seq} of group {group} is no longer in the ring buffers of the ranks that entered it"
            hang.facts.append(Fact(waiting[0] if waiting else None, 0, text))
            hang.extra["dropped"] = True
        for r in culprits:
            d = self.dumps.get(r)
            if d is None:
                hang.facts.append(Fact(None, 0, f"rank {r}: no dump (killed, or its node gone)"))
                continue
            own = op_at(d, group, seq) if kind == "collective_stuck" else None
            if own is not None:
                hang.frames = own.frames or hang.frames
                hang.facts.append(
                    Fact(r, own.index, f"rank {r}: in {describe(own)} #{seq} of group {group}, {own.state}")
                )
                continue
            front = frontier(d, group)
            mine = op_at(d, group, front)
            text = f"rank {r}: {describe(mine)} #{front} is the last it entered in group {group}"
            hang.facts.append(Fact(r, mine.index if mine else 0, text))
        if waiting and op is not None:
            text = f"{who(waiting)}: entered {describe(op)} #{seq} of group {group} and waited"
            hang.facts.append(Fact(entered[0][0], op.index, text))
        return hang

    def _p2p(
        self, rank: int, group: str, desc: str, seq: int, members: tuple[int, ...], waiting: tuple[int, ...]
    ) -> Hang:
        d = self.dumps[rank]
        last = d.last if d.last is not None and d.last.p2p else None
        partner: int | None = None
        if last is not None and last.peer is not None and last.peer < len(members):
            partner = sorted(members)[last.peer]
        elif len(members) == 2:
            partner = next(r for r in members if r != rank)
        hang = Hang("p2p_unmatched", (partner,) if partner is not None else (), group, desc, seq, last, len(members))
        hang.waiting = (rank,)
        hang.frames = last.frames if last else ()
        what = f"a {last.name} with rank {partner}" if last is not None else "a send/recv (Gloo records none)"
        text = f"rank {rank}: waits in {what} instead of entering #{seq} of group {group}"
        hang.facts.append(Fact(rank, last.index if last else 0, text))
        if partner is None:
            hang.extra["candidates"] = [r for r in waiting if r != rank]
            hang.facts.append(Fact(None, 0, "no dump names the partner: the recorder kept no send/recv"))
        return hang

    def _mismatch(self, group: str, desc: str, present: list[int], missing: tuple[int, ...]) -> Hang | None:
        seqs = sorted({o.seq for r in present if (g := self.dumps[r].groups.get(group)) for o in g.ops})
        for seq in seqs:
            ops = {r: op for r in present if (op := op_at(self.dumps[r], group, seq)) is not None}
            if len(ops) < 2:
                continue
            counts = Counter(_signature(op) for op in ops.values())
            if len(counts) == 1:
                continue
            common = counts.most_common(1)[0][0]
            odd = tuple(sorted(r for r, op in ops.items() if _signature(op) != common))
            ref = next(op for op in ops.values() if _signature(op) == common)
            bad = ops[odd[0]]
            what = "op" if bad.name != ref.name else "dtype" if bad.dtypes != ref.dtypes else "size"
            hang = Hang("collective_mismatch", odd, group, desc, seq, ref, len(self.members[group]))
            hang.mismatch, hang.missing = what, missing
            hang.waiting = tuple(sorted(r for r in ops if r not in odd))
            hang.frames = bad.frames or ref.frames
            hang.position = min(op.record_id for op in ops.values())
            for r in odd[:4]:
                hang.facts.append(Fact(r, ops[r].index, f"rank {r}: {describe(ops[r])} #{seq} of group {group}"))
            first = hang.waiting[0]
            text = f"{who(hang.waiting)}: {describe(ref)} #{seq} of group {group}"
            hang.facts.append(Fact(first, ops[first].index, text))
            if tie := (len(counts) > 1 and counts.most_common(2)[1][1] == counts[common]):
                hang.extra["tie"] = tie
            return hang
        return None

    def _straggler(self, group: str, desc: str, present: list[int], seq: int) -> Hang | None:
        ops = {r: op for r in present if (op := op_at(self.dumps[r], group, seq)) is not None}
        if len(ops) < 2:
            return None
        first = min(op.created_ns for op in ops.values())
        timeouts = [op.timeout_ms for op in ops.values() if op.timeout_ms]
        if not timeouts or not first:
            return None
        limit = min(timeouts) * 1_000_000
        late = tuple(sorted(r for r, op in ops.items() if op.created_ns - first > limit))
        if not late:
            return None
        ontime = tuple(r for r in ops if r not in late)
        hang = self._hang("collective_straggler", late, group, desc, seq, ontime, ())
        hang.frames = ops[late[0]].frames or hang.frames
        lag = (ops[late[0]].created_ns - first) / 1e9
        text = (
            f"rank {late[0]}: entered #{seq} of group {group} {lag:.1f} s after the first rank, "
            f"past the {min(timeouts) / 1000:g} s timeout"
        )
        hang.facts.insert(0, Fact(late[0], ops[late[0]].index, text))
        hang.extra["late_seconds"] = round(lag, 3)
        return hang


def _first_per_culprit(hangs: list[Hang]) -> list[Hang]:
    """A culprit that missed several collectives is reported at the first in program order."""
    hangs = sorted(hangs, key=lambda h: (h.kind != "collective_mismatch", h.position))
    seen: set[int] = set()
    out = []
    for h in hangs:
        if h.culprits and set(h.culprits) <= seen:
            continue
        seen.update(h.culprits)
        out.append(h)
    return out


def classify(dumps: Iterable[Dump], *, world_hint: int = 0, p2p_waiting: Iterable[int] = ()) -> Analysis:
    """What stopped the job the dumps are of. `world_hint`: the job's size where the logs say it;
    `p2p_waiting`: ranks whose own logs show them waiting in a send or recv."""
    dumps = list(dumps)
    if not dumps:
        return Analysis([], [], world_hint, [])
    job = _Job(dumps, world_hint, frozenset(p2p_waiting))
    hangs = job.analyse()
    return Analysis(hangs, rank_table(job.dumps, job.world), job.world, job.notes)
