"""Flight Recorder dumps and NCCL RAS output among `diagnose`'s inputs, and the hang findings they make.

`HangInputs.take` looks at each input's first bytes: a dump (pickle or JSON) or an `ncclras` report is
read here, whatever its name, and every other input goes on to the log reader. The logs are watched,
besides, for a rank whose traceback ends in torch.distributed's send or recv: Gloo records no
point-to-point op, so that is how a rank waiting for a partner is told from one that never came.

At the end the dumps are matched across ranks (diagnosis/training/hang/classify.py), RAS's outliers are folded
in, and each hang becomes one finding placed with what the logs learnt (host, GPU of the rank). It
ranks ahead of every training-log finding, since it names the rank the timeouts waited for, but behind
a hardware XID (on the culprit's GPU the XID is the cause and the hang its symptom) and behind a fault
the culprit's own log reports (its out-of-memory error explains why it never came).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from gpu_triage.diagnosis.core.findings import Evidence, Finding
from gpu_triage.diagnosis.training.findings.root_cause import Ranked, Timing
from gpu_triage.diagnosis.training.hang.flight_recorder import MAX_DUMP_BYTES, Dump, DumpError, dump_kind, parse
from gpu_triage.diagnosis.training.hang.nccl_ras import MAX_RAS_BYTES, RasReport, is_ras, parse_ras
from gpu_triage.diagnosis.training.place.identity import IdentityBook

if TYPE_CHECKING:  # the matching is imported when there are dumps: most logs come without
    from gpu_triage.diagnosis.training.hang.classify import Analysis, Hang

__all__ = ["MAX_DUMPS", "Decoder", "HangInputs", "InProcessDecoder", "Pending"]

MAX_DUMPS = 16384
_P2P_FRAME = re.compile(
    rb'\[rank(\d{1,7})\]:[^\n]{0,300}distributed_c10d\.py", line \d+, in (?:send|recv|isend|irecv)\b'
)
HANG_TIER = -0.5  # after hardware XIDs (-1), before every training-log class (0 and up)

Pending = Callable[[], Dump]  # a dump being decoded: call it for the Dump (or its DumpError)


class Decoder(Protocol):
    """Reads a pickle (or JSON) dump, now or in the background (exporter/fr_decode.py)."""

    def submit(self, name: str, data: bytes, kind: str) -> Pending: ...


class InProcessDecoder:
    """The dump read here, at once; pickles are scanned before they are unpickled (fr_unpickle.py)."""

    def submit(self, name: str, data: bytes, kind: str) -> Pending:
        try:
            dump = parse(name, data, kind)
        except DumpError as e:
            error = e

            def fail() -> Dump:
                raise error

            return fail
        return lambda: dump


def _read_all(first: bytes, rest: Iterator[bytes], limit: int) -> bytes | None:
    parts, size = [first], len(first)
    for chunk in rest:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


class HangInputs:
    """The dumps and RAS reports of one `diagnose` call. `decode` reads a pickle dump (the default reads
    it here, scanned first; exporter/fr_decode.py reads it in a memory-bounded process instead)."""

    def __init__(self, decode: Decoder | None = None) -> None:
        self.decode: Decoder = decode or InProcessDecoder()
        self.pending: list[Pending] = []
        self.dumps: dict[int, Dump] = {}
        self.ras: list[RasReport] = []
        self.errors: list[str] = []
        self.p2p_waiting: dict[int, str] = {}  # rank -> the traceback line showing it in send/recv
        self.analysis: Analysis | None = None

    def take(self, name: str | None, chunks: Iterable[bytes]) -> Iterator[bytes] | None:
        """None when the input was a dump or a RAS report (read here); else its chunks, for the log reader."""
        stream = iter(chunks)
        first = next((c for c in stream if c), b"")
        label = name or "an unnamed input"
        kind = dump_kind(first[:8192])
        if kind is not None:
            if name is None:  # a dump's rank is in its file name, and this one has none
                self.errors.append(
                    "a Flight Recorder dump without a file name: its name says its rank; send the dumps as "
                    "files (multipart/form-data, or a tar or zip of the folder)"
                )
                return None
            data = _read_all(first, stream, MAX_DUMP_BYTES)
            self._dump(label, data, kind)
            return None
        if is_ras(first[:8192]):
            data = _read_all(first, stream, MAX_RAS_BYTES)
            if data is None:
                self.errors.append(f"{label}: RAS output over {MAX_RAS_BYTES >> 20} MiB, skipped")
            else:
                self.ras.append(parse_ras(label, data))
            return None
        return self._watch(first, stream)

    def _dump(self, label: str, data: bytes | None, kind: str) -> None:
        if data is None:
            self.errors.append(f"{label}: a dump over the {MAX_DUMP_BYTES >> 20} MiB limit, skipped")
            return
        if len(self.pending) >= MAX_DUMPS:
            self.errors.append(f"{label}: more than {MAX_DUMPS} dumps, skipped")
            return
        self.pending.append(self.decode.submit(label, data, kind))

    def _collect(self) -> None:
        """The decoded dumps, in the order they came; a rank's second dump of the same form is an error."""
        for pending in self.pending:
            try:
                self._add(pending())
            except DumpError as e:
                self.errors.append(str(e))
        self.pending = []

    def _add(self, dump: Dump) -> None:
        label = dump.source
        if dump.rank in self.dumps:
            other = self.dumps[dump.rank]
            if (other.form, dump.form) == ("pickle", "json"):
                return  # the same rank's two dumps: the pickle, which has the frames, wins
            if other.form == dump.form:
                self.errors.append(f"{label}: a second dump of rank {dump.rank} (first: {other.source}), skipped")
                return
        self.dumps[dump.rank] = dump

    def _watch(self, first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
        tail = b""
        for chunk in _chain(first, rest):
            if b"distributed_c10d.py" in chunk:
                for m in _P2P_FRAME.finditer(tail + chunk):
                    rank = int(m.group(1))
                    if len(self.p2p_waiting) < MAX_DUMPS:
                        self.p2p_waiting.setdefault(rank, m.group(0).decode("utf-8", "replace")[:300])
            tail = chunk[-512:]
            yield chunk

    # -- the report ---------------------------------------------------------------------------

    def ranked(
        self, identity: IdentityBook, others: list[Ranked], is_symptom: Callable[[Finding], bool]
    ) -> list[Ranked]:
        """The hang findings, ranked among `others` (the logs' and the kernel's)."""
        self._collect()
        if not self.dumps and not self.ras:
            return []
        from gpu_triage.diagnosis.training.hang.classify import classify
        from gpu_triage.diagnosis.training.hang.ras import ras_findings, with_ras

        world = identity.world_size()
        self.analysis = classify(self.dumps.values(), world_hint=world, p2p_waiting=self.p2p_waiting)
        hangs = list(self.analysis.hangs)
        out = [with_ras(self._finding(h, identity), self.ras, self.analysis.world) for h in hangs]
        out += ras_findings(self.ras, identity, {r for h in hangs for r in h.culprits})
        ranked = []
        for i, f in enumerate(out):
            tier = HANG_TIER
            culprit = set(f.ranks)
            own = [
                r.tier
                for r in others
                if r.finding.rank in culprit and not r.finding.from_kernel and not is_symptom(r.finding)
            ]
            if own:
                tier = min(own) + 0.1  # the culprit's own error says why it never came
            ranked.append(Ranked(f, tier, Timing(None, -1, i)))
        return ranked

    def _finding(self, h: Hang, identity: IdentityBook) -> Finding:
        from gpu_triage.diagnosis.training.hang.specs import load_hang_specs

        spec = load_hang_specs()[h.kind]
        rank = h.culprits[0] if h.culprits else None
        op = h.op.name if h.op is not None else "a collective"
        fields = {
            "ranks": ",".join(map(str, h.culprits)) or "?",
            "waiting": ",".join(map(str, h.waiting)) or "?",
            "op": op,
            "group": h.group + (f" ({h.desc})" if h.desc and h.desc != "undefined" else ""),
            "seq": h.seq,
            "mismatch": {"op": "collective", "size": "tensor size", "dtype": "dtype"}.get(h.mismatch or "", "op"),
        }
        if h.kind == "p2p_unmatched" and rank is None:
            title = f"Rank {fields['waiting']} waits in a send/recv of process group {fields['group']} no rank answered"
        else:
            title = spec.title.format(**fields)
        details: dict[str, Any] = {
            "source": "flight_recorder",
            "process_group": h.group,
            "pg_desc": h.desc,
            "seq": h.seq,
            "op": h.op.name if h.op else None,
            "sizes": [list(s) for s in h.op.in_sizes] if h.op else [],
            "dtypes": list(h.op.dtypes) if h.op else [],
            "ranks": list(h.culprits),
            "waiting": list(h.waiting),
            "group_size": h.members,
            "frames": [f.text() for f in h.frames],
        }
        if h.mismatch:
            details["mismatch"] = h.mismatch
        if h.missing:
            details["missing"] = list(h.missing)
        details.update(h.extra)
        hosts = {r: host for r in h.culprits if (host := identity.host_of(r))}
        gpus = {r: gpu for r in h.culprits if (gpu := identity.gpu_of(r))}
        if len(h.culprits) > 1:
            details["hosts"] = {str(r): v for r, v in hosts.items()}
            details["gpus"] = {str(r): v for r, v in gpus.items()}
        evidence = [
            Evidence(fact.index or 1, fact.text, self.dumps[fact.rank].source if fact.rank in self.dumps else None)
            for fact in h.facts[:8]
        ]
        return Finding(
            id=f"{h.kind}:pg{h.group}/seq{h.seq}",
            class_id=h.kind,
            severity=spec.severity,
            action=spec.action,
            title=title,
            playbook=spec.playbook,
            gpu=gpus.get(rank) if rank is not None else None,
            rank=rank,
            host=hosts.get(rank) if rank is not None else None,
            evidence=evidence,
            steps=[s.format(**fields) for s in spec.steps],
            details=details,
            ranks=list(h.culprits),
        )

    def to_json(self) -> dict[str, Any] | None:
        self._collect()
        if not self.dumps and not self.ras and not self.errors:
            return None
        from gpu_triage.diagnosis.training.hang.ras import ras_json

        a = self.analysis
        return {
            "dumps": len(self.dumps),
            "world_size": a.world if a else None,
            "ranks": a.table if a else [],
            "skipped": list(self.errors),
            "notes": [f"{d.source}: {n}" for d in self.dumps.values() for n in d.notes][:64],
            "ras": [ras_json(r) for r in self.ras],
        }


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest
