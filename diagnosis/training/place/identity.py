"""Who printed a line: host, rank and GPU, pieced together across the lines and inputs of one diagnosis.

No single line says everything. NCCL's header gives host, pid and the process's CUDA device; the
`[rankN]:` and `[PG … Rank N]` tags give the global rank but no host; NCCL's communicator-init line
(`comm … rank R nranks N cudaDev D busId B - Init COMPLETE`) ties a host:pid to a rank and a GPU bus
id; torchrun's failure table ties a worker's pid to its host, global rank and local rank; an input may
hold a single host or rank; a pod's name (`kubectl logs --prefix`) and the hostname NCCL prints on one line
are two names of one place. `IdentityBook` collects these facts while the input streams by (bounded, a
few entries per process) and `place` fills in what a finding's own lines did not say, once everything
is known, and says when it did (`Place.inferred`).

`rank` is always the global rank; torchrun's local rank is kept apart, and so is a launcher's task
(`srun --label`'s `3: `, srun's `task 3: Exited`, Open MPI's `[1,3]<stdout>:` and `process rank 3`).
A task is a rank when each task runs one rank (`srun python train.py`), but the node's index when
each task runs a torchrun (`srun --ntasks-per-node=1 torchrun …`): then its lines carry torchrun's
local-rank tags too (`0: [default3]:`), or a global rank or communicator rank that is not the task.
So an input's tasks count as ranks only when none of its lines says otherwise; otherwise a task
names its node, and srun's report (`gpu07: task 3`) gives the node's host.

Facts that need a host to be job-wide stay with their input when the line gives none: torchrun's
`[default3]:` is local rank 3 on every node, so `[default3]:[rank11]:` maps local rank 3 to rank 11 only
for the lines of that input (and of that host where it is known), never for another input's.

`place` resolves in two tiers. First the line's own input: its printer's comm init, the launchers'
reports on its pid, its tags, and what the input holds only one of. An input's one host is every line's
only where the input shows at most one rank (a node's console also carries other nodes' ranks) or the
comm inits put the whole job on that host; its one rank is a line's only where the line's printer is
unknown. Then the job-wide maps, by global rank, or by host and bus id: every node has a GPU at 3b:00,
so a bus id alone names a rank only once every rank's host and bus id are known.

Host names are compared and shown in their short form (`node07`, not `node07.cluster.local`), as
NCCL prints them.
"""

from __future__ import annotations

from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.place.facts import (
    MAX_ENTRIES,
    Facts,
    Place,
    Proc,
    SourceFacts,
    Who,
    Worker,
    short_host,
)
from gpu_triage.diagnosis.training.place.resolve import Maps, build, place


class IdentityBook:
    def __init__(self) -> None:
        self.facts = Facts()
        self._maps: Maps | None = None

    def add_source(self) -> int:
        self.facts.sources.append(SourceFacts())
        return len(self.facts.sources) - 1

    def learn(self, source: int, line: LogLine) -> None:
        facts = self.facts.sources[source]
        host = short_host(line.host)
        pod = short_host(line.pod)
        if pod is not None and host is not None and pod != host and len(self.facts.alias) < MAX_ENTRIES:
            self.facts.alias.setdefault(pod, host)
            self._maps = None
        if host is not None and len(facts.hosts) < 2:
            facts.hosts.add(host)
        if line.rank is not None and len(facts.ranks) < 2:
            facts.ranks.add(line.rank)
        if host is not None and line.rank is not None:
            self.pair(line.rank, host)
        if line.rank is not None and line.local_rank is not None:  # `[default3]:[rank11]:`
            self.local(source, host, line.local_rank, line.rank, line.task)
        if line.task is not None:
            if line.local_rank is not None or line.rank not in (None, line.task):
                self.tasks_not_ranks(source)
            if host is not None:
                self.task_on(source, line.task, host)

    def tasks_not_ranks(self, source: int) -> None:
        """A line of input `source` shows its launcher's tasks are not ranks (each runs several)."""
        self.facts.sources[source].tasks_are_ranks = False
        self._maps = None

    def task_on(self, source: int, task: int, host: str) -> None:
        """The launcher's task `task` of input `source` ran on `host`."""
        known = self.facts.sources[source].task_host
        if len(known) < MAX_ENTRIES:
            known.setdefault(task, short_host(host) or host)
            self._maps = None

    def local(self, source: int, host: str | None, local_rank: int, rank: int, task: int | None = None) -> None:
        """Local rank `local_rank` is global rank `rank` on `host`; without a host, in input `source` (and
        the launcher's `task` there)."""
        host = short_host(host)
        if len(self.facts.local) < MAX_ENTRIES:
            key = (host, None, None, local_rank) if host else (None, source, task, local_rank)
            self.facts.local.setdefault(key, rank)
            self.facts.rank_local.setdefault(rank, local_rank)
        self._maps = None

    def pair(self, rank: int, host: str, local_rank: int | None = None) -> None:
        """`rank` ran on `host` (the first statement wins)."""
        if len(self.facts.rank_host) < MAX_ENTRIES:
            self.facts.rank_host.setdefault(rank, short_host(host) or host)
            if local_rank is not None:
                self.facts.rank_local.setdefault(rank, local_rank)
        self._maps = None

    def bind_pid(self, pid: int, host: str | None, rank: int | None, local_rank: int | None) -> None:
        """torchrun's failure table: worker `pid` was `rank` (local `local_rank`) on `host`."""
        known = self.facts.workers.setdefault(pid, [])
        worker = Worker(short_host(host), rank, local_rank)
        if worker not in known and len(known) < 8 and len(self.facts.workers) < MAX_ENTRIES:
            known.append(worker)
        if host is not None and rank is not None:
            self.pair(rank, host, local_rank)

    def comm_init(self, source: int, host: str, pid: int, *, rank: int, nranks: int, gpu: str | None) -> None:
        key = (source, short_host(host) or host, pid)
        old = self.facts.procs.get(key)
        # A process joins several communicators; the largest one numbers it by its global rank.
        if (old is None and len(self.facts.procs) < MAX_ENTRIES) or (old is not None and nranks > old.nranks):
            self.facts.procs[key] = Proc(rank, nranks, gpu)
            self._maps = None

    def layout(self, source: int, host: str, pid: int, *, rank: int, nranks: int, local_rank: int) -> None:
        """NCCL's node layout line: in a communicator of `nranks`, `rank` is local rank `local_rank` on its node."""
        key = (source, short_host(host) or host, pid)
        old = self.facts.layouts.get(key)
        if (old is None and len(self.facts.layouts) < MAX_ENTRIES) or (old is not None and nranks > old[1]):
            self.facts.layouts[key] = (rank, nranks, local_rank)
            self._maps = None

    def _resolved(self) -> Maps:
        if self._maps is None:
            self._maps = build(self.facts)
        return self._maps

    def world_size(self) -> int:
        """The largest communicator NCCL's init lines reported (0: none)."""
        return max((p.nranks for p in self.facts.procs.values()), default=0)

    def host_of(self, rank: int) -> str | None:
        return self._resolved().rank_host.get(rank)

    def gpu_of(self, rank: int) -> str | None:
        return self._resolved().rank_gpu.get(rank)

    def worker(self, pid: int) -> Worker | None:
        """The one worker the launchers' reports say `pid` was, with its host in canonical form."""
        return self.facts.worker(pid, None)

    def workers_on(self, host: str) -> dict[int, Worker]:
        """The workers the launchers' reports place on `host`, by pid."""
        out = {}
        for pid in self.facts.workers:
            w = self.facts.worker(pid, host)
            if w is not None and w.host == host:
                out[pid] = w
        return out

    def place(self, who: Who) -> Place:
        """Fill in host, rank and GPU of `who` from everything learnt so far (diagnosis/training/place/resolve.py)."""
        return place(self.facts, self._resolved(), who)
