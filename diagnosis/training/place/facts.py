"""What one diagnosis has learnt about where lines came from (diagnosis/training/place/identity.py collects it,
diagnosis/training/place/resolve.py places a finding by it): the tables, bounded, and the names of a place."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

MAX_ENTRIES = 200_000  # per table; a real job has a few entries per process


def short_host(host: str | None) -> str | None:
    """`node07.cluster.local` -> `node07`; addresses stay whole."""
    if not host:
        return None
    return host.split(".", 1)[0] if host[0].isalpha() else host


@dataclass(frozen=True, slots=True)
class Who:
    """What the lines of a finding said about where it happened; None where they were silent."""

    source: int
    host: str | None = None
    pid: int | None = None  # the process that printed the line
    rank: int | None = None  # global
    local_rank: int | None = None
    gpu: str | None = None
    subject_pid: int | None = None  # a worker pid named in the message (an exit report, the OOM killer)
    task: int | None = None  # the launcher's task (see the module docstring)


@dataclass(frozen=True, slots=True)
class Place:
    host: str | None
    rank: int | None  # global
    gpu: str | None
    local_rank: int | None = None
    inferred: bool = False  # something here came from other lines than the finding's own


@dataclass(slots=True)
class Proc:
    rank: int
    nranks: int
    gpu: str | None


@dataclass(slots=True)
class SourceFacts:
    # At most two of each are kept: all that matters is whether an input is a single host or rank.
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    tasks_are_ranks: bool = True  # until a line of the input says otherwise
    task_host: dict[int, str] = field(default_factory=dict)


# Where a local rank is known: (host, None, None, local rank), or for a line without a host (None, input,
# launcher task, local rank).
LocalKey = tuple[str | None, int | None, int | None, int]


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker as torchrun's failure table describes it."""

    host: str | None
    rank: int | None
    local_rank: int | None


@dataclass(slots=True)
class Facts:
    """The tables `IdentityBook` fills while the input streams by."""

    sources: list[SourceFacts] = field(default_factory=list)
    procs: dict[tuple[int, str, int], Proc] = field(default_factory=dict)
    rank_host: dict[int, str] = field(default_factory=dict)
    rank_local: dict[int, int] = field(default_factory=dict)
    workers: dict[int, list[Worker]] = field(default_factory=dict)  # by pid
    local: dict[LocalKey, int] = field(default_factory=dict)  # -> global rank
    alias: dict[str, str] = field(default_factory=dict)  # a pod's name -> the hostname its processes report
    layouts: dict[tuple[int, str, int], tuple[int, int, int]] = field(default_factory=dict)  # -> (rank, nranks, local)

    def canon(self, host: str | None) -> str | None:
        """One name per place: a pod's name becomes the hostname its processes report."""
        return self.alias.get(host, host) if host is not None else None

    def worker(self, pid: int, host: str | None) -> Worker | None:
        workers = [replace(w, host=self.canon(w.host)) for w in self.workers.get(pid, ())]
        found = [w for w in workers if host is None or w.host is None or w.host == host]
        return found[0] if len(found) == 1 else None
