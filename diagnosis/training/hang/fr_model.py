"""What is kept of a Flight Recorder dump (diagnosis/training/hang/flight_recorder.py reads them): per rank, per process
group, the latest ops, each reduced to what matching across ranks needs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["FRAMES_KEPT", "WINDOW", "Dump", "DumpError", "Frame", "Group", "Op"]

WINDOW = 32  # latest ops kept per process group and rank
FRAMES_KEPT = 2  # of those, the latest ones that keep their frames


class DumpError(ValueError):
    """A dump that cannot be read at all; the message says why, for the user."""


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int

    def text(self) -> str:
        return f"{self.name} at {self.filename}:{self.line}"


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation, reduced to what matching across ranks needs."""

    record_id: int
    index: int  # its position among the dump's entries, from 1
    seq: int  # collective_seq_id (p2p_seq_id for a point-to-point op)
    op_id: int
    name: str  # "all_reduce", "send", "coalesced"...
    backend: str  # "nccl", "gloo"...
    p2p: bool
    peer: int | None  # the other side of a send/recv, a rank of the group
    in_sizes: tuple[tuple[int, ...], ...]
    out_sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]  # input dtypes, then output dtypes
    state: str
    created_ns: int
    timeout_ms: int | None
    frames: tuple[Frame, ...] = ()


@dataclass(slots=True)
class Group:
    """One rank's view of one process group."""

    name: str
    desc: str
    pg_id: int
    ops: deque[Op] = field(default_factory=lambda: deque(maxlen=WINDOW))  # collectives, oldest first
    p2p: deque[Op] = field(default_factory=lambda: deque(maxlen=WINDOW))
    count: int = 0  # ops recorded in the dump, windowed or not
    last_op_id: int = 0


@dataclass(slots=True)
class Dump:
    rank: int
    source: str
    version: str
    form: str  # "pickle" or "json"
    groups: dict[str, Group] = field(default_factory=dict)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg_config's, where it is usable
    world_hint: int = 0  # the largest rank any pg_config names, plus one
    states_known: bool = False  # the recorder tracked state (NCCL): "scheduled" is then really not started
    wrapped: bool = False  # the ring buffer had dropped older entries
    comm_lib: str = ""
    skipped: int = 0  # malformed or over-the-limit entries
    notes: list[str] = field(default_factory=list)
    last: Op | None = None  # the latest op, every group counted
    last_group: str | None = None
