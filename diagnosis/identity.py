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

from dataclasses import dataclass, field, replace

from gpu_triage.diagnosis.log_lines import LogLine

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
class _Proc:
    rank: int
    nranks: int
    gpu: str | None


@dataclass(slots=True)
class _SourceFacts:
    # At most two of each are kept: all that matters is whether an input is a single host or rank.
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    tasks_are_ranks: bool = True  # until a line of the input says otherwise
    task_host: dict[int, str] = field(default_factory=dict)


# Where a local rank is known: (host, None, None, local rank), or for a line without a host (None, input,
# launcher task, local rank).
_LocalKey = tuple[str | None, int | None, int | None, int]


@dataclass(slots=True)
class _Maps:
    rank_host: dict[int, str]
    rank_gpu: dict[int, str] = field(default_factory=dict)
    rank_local: dict[int, int] = field(default_factory=dict)
    host_gpu_rank: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_places: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    by_pid: dict[int, list[tuple[int, str, int]]] = field(default_factory=dict)
    local: dict[_LocalKey, int] = field(default_factory=dict)
    input_ranks: list[set[int]] = field(default_factory=list)  # per input, at most two: tags and comm inits
    job_host: str | None = None  # the one host of a job whose communicator init lines all name it
    gpus_complete: bool = False  # every rank of the largest communicator has its host and bus id known


@dataclass(slots=True)
class _Draft:
    host: str | None
    rank: int | None
    gpu: str | None
    local: int | None

    def fields(self) -> tuple[str | None, int | None, str | None, int | None]:
        return self.host, self.rank, self.gpu, self.local


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker as torchrun's failure table describes it."""

    host: str | None
    rank: int | None
    local_rank: int | None


class IdentityBook:
    def __init__(self) -> None:
        self._sources: list[_SourceFacts] = []
        self._procs: dict[tuple[int, str, int], _Proc] = {}
        self._rank_host: dict[int, str] = {}
        self._rank_local: dict[int, int] = {}
        self._workers: dict[int, list[Worker]] = {}  # by pid
        self._local: dict[_LocalKey, int] = {}  # -> global rank
        self._alias: dict[str, str] = {}  # a pod's name -> the hostname its processes report
        self._layouts: dict[tuple[int, str, int], tuple[int, int, int]] = {}  # -> (rank, nranks, local rank)
        self._maps: _Maps | None = None

    def add_source(self) -> int:
        self._sources.append(_SourceFacts())
        return len(self._sources) - 1

    def learn(self, source: int, line: LogLine) -> None:
        facts = self._sources[source]
        host = short_host(line.host)
        pod = short_host(line.pod)
        if pod is not None and host is not None and pod != host and len(self._alias) < MAX_ENTRIES:
            self._alias.setdefault(pod, host)
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
        self._sources[source].tasks_are_ranks = False
        self._maps = None

    def task_on(self, source: int, task: int, host: str) -> None:
        """The launcher's task `task` of input `source` ran on `host`."""
        known = self._sources[source].task_host
        if len(known) < MAX_ENTRIES:
            known.setdefault(task, short_host(host) or host)
            self._maps = None

    def local(self, source: int, host: str | None, local_rank: int, rank: int, task: int | None = None) -> None:
        """Local rank `local_rank` is global rank `rank` on `host`; without a host, in input `source` (and
        the launcher's `task` there)."""
        host = short_host(host)
        if len(self._local) < MAX_ENTRIES:
            key = (host, None, None, local_rank) if host else (None, source, task, local_rank)
            self._local.setdefault(key, rank)
            self._rank_local.setdefault(rank, local_rank)
        self._maps = None

    def pair(self, rank: int, host: str, local_rank: int | None = None) -> None:
        """`rank` ran on `host` (the first statement wins)."""
        if len(self._rank_host) < MAX_ENTRIES:
            self._rank_host.setdefault(rank, short_host(host) or host)
            if local_rank is not None:
                self._rank_local.setdefault(rank, local_rank)
        self._maps = None

    def bind_pid(self, pid: int, host: str | None, rank: int | None, local_rank: int | None) -> None:
        """torchrun's failure table: worker `pid` was `rank` (local `local_rank`) on `host`."""
        known = self._workers.setdefault(pid, [])
        worker = Worker(short_host(host), rank, local_rank)
        if worker not in known and len(known) < 8 and len(self._workers) < MAX_ENTRIES:
            known.append(worker)
        if host is not None and rank is not None:
            self.pair(rank, host, local_rank)

    def comm_init(self, source: int, host: str, pid: int, *, rank: int, nranks: int, gpu: str | None) -> None:
        key = (source, short_host(host) or host, pid)
        old = self._procs.get(key)
        # A process joins several communicators; the largest one numbers it by its global rank.
        if (old is None and len(self._procs) < MAX_ENTRIES) or (old is not None and nranks > old.nranks):
            self._procs[key] = _Proc(rank, nranks, gpu)
            self._maps = None

    def layout(self, source: int, host: str, pid: int, *, rank: int, nranks: int, local_rank: int) -> None:
        """NCCL's node layout line: in a communicator of `nranks`, `rank` is local rank `local_rank` on its node."""
        key = (source, short_host(host) or host, pid)
        old = self._layouts.get(key)
        if (old is None and len(self._layouts) < MAX_ENTRIES) or (old is not None and nranks > old[1]):
            self._layouts[key] = (rank, nranks, local_rank)
            self._maps = None

    def _canon(self, host: str | None) -> str | None:
        """One name per place: a pod's name becomes the hostname its processes report."""
        return self._alias.get(host, host) if host is not None else None

    def _build(self) -> _Maps:
        if self._maps is not None:
            return self._maps
        rank_host = {rank: self._canon(host) or host for rank, host in self._rank_host.items()}
        maps = _Maps(rank_host=rank_host, rank_local=dict(self._rank_local))
        maps.local = {
            (self._canon(h), source, task, local): rank for (h, source, task, local), rank in self._local.items()
        }
        for facts in self._sources:
            if facts.tasks_are_ranks:  # srun's `gpu07: task 3` or `3: node07:…` place rank 3
                for task, host in facts.task_host.items():
                    maps.rank_host.setdefault(task, self._canon(host) or host)
        for (source, host, pid), proc in self._procs.items():
            maps.rank_host.setdefault(proc.rank, host)
            layout = self._layouts.get((source, host, pid))
            if layout is not None and layout[:2] == (proc.rank, proc.nranks):  # the same communicator
                maps.rank_local.setdefault(proc.rank, layout[2])
            if proc.gpu is not None:
                maps.rank_gpu.setdefault(proc.rank, proc.gpu)
            maps.by_pid.setdefault(pid, []).append((source, host, pid))
        for rank, gpu in maps.rank_gpu.items():
            where = maps.rank_host.get(rank)
            if where is not None:
                maps.host_gpu_rank.setdefault((where, gpu), rank)
                maps.gpu_places.setdefault(gpu, set()).add((where, rank))
        self._job_wide(maps)
        self._maps = maps
        return maps

    def _job_wide(self, maps: _Maps) -> None:
        """What the communicator init lines say about the whole job and about each input's ranks."""
        maps.input_ranks = [set(facts.ranks) for facts in self._sources]
        for (source, _, _), proc in self._procs.items():
            if len(ranks := maps.input_ranks[source]) < 2:
                ranks.add(proc.rank)
        nranks = max((proc.nranks for proc in self._procs.values()), default=0)
        # The largest communicator numbers the job's ranks; only once every one of them is known is a
        # bus id (which every node has) or a single host the whole job's.
        members = {(host, proc.rank) for (_, host, _), proc in self._procs.items() if proc.nranks == nranks}
        hosts = {host for host, _ in members}
        if nranks and len(hosts) == 1 and len({rank for _, rank in members}) == nranks:
            maps.job_host = self._canon(next(iter(hosts)))
        placed = {proc.rank for proc in self._procs.values() if proc.nranks == nranks and proc.gpu is not None}
        maps.gpus_complete = bool(nranks) and len(placed) == nranks

    def world_size(self) -> int:
        """The largest communicator NCCL's init lines reported (0: none)."""
        return max((p.nranks for p in self._procs.values()), default=0)

    def host_of(self, rank: int) -> str | None:
        return self._build().rank_host.get(rank)

    def gpu_of(self, rank: int) -> str | None:
        return self._build().rank_gpu.get(rank)

    def worker(self, pid: int) -> Worker | None:
        """The one worker the launchers' reports say `pid` was, with its host in canonical form."""
        return self._worker(pid, None)

    def workers_on(self, host: str) -> dict[int, Worker]:
        """The workers the launchers' reports place on `host`, by pid."""
        out = {}
        for pid in self._workers:
            w = self._worker(pid, host)
            if w is not None and w.host == host:
                out[pid] = w
        return out

    def _worker(self, pid: int, host: str | None) -> Worker | None:
        workers = [replace(w, host=self._canon(w.host)) for w in self._workers.get(pid, ())]
        found = [w for w in workers if host is None or w.host is None or w.host == host]
        return found[0] if len(found) == 1 else None

    def _owner(self, pid: int, host: str | None) -> tuple[str, _Proc] | None:
        owners = [o for o in self._build().by_pid.get(pid, []) if host is None or o[1] == host]
        return (owners[0][1], self._procs[owners[0]]) if len(owners) == 1 else None

    def place(self, who: Who) -> Place:
        """Fill in host, rank and GPU of `who` from everything learnt so far.

        In two tiers, so that no guess crosses a host or an input: first what the line's own input
        says about its printer or the process it names (`_from_input`), then the job-wide maps, only
        by a global rank or a host (`_from_job`). Whatever the line did not say itself is inferred.
        """
        maps = self._build()
        facts = self._sources[who.source]
        draft = _Draft(self._canon(short_host(who.host)), who.rank, who.gpu, who.local_rank)
        if draft.rank is None and who.task is not None and facts.tasks_are_ranks:
            draft.rank = who.task  # the launcher's label, where a task is a rank
        given = draft.fields()
        self._from_input(who, maps, draft)
        self._from_job(maps, draft)
        found = draft.fields()
        inferred = any(g is None and f is not None for g, f in zip(given, found, strict=True))
        return Place(draft.host, draft.rank, draft.gpu, draft.local, inferred)

    def _from_input(self, who: Who, maps: _Maps, d: _Draft) -> None:
        """Tier 1: the line's printer (comm init, the launchers' reports on its pid), the process it
        names, its tags as its own input maps them, and what the input holds only one of."""
        facts = self._sources[who.source]
        if d.host is None and who.task is not None and not facts.tasks_are_ranks:
            d.host = self._canon(facts.task_host.get(who.task))  # the node that task ran on
        proc = self._procs.get((who.source, d.host, who.pid)) if d.host is not None and who.pid is not None else None
        if d.rank is None and proc is not None:
            d.rank = proc.rank
        subject = who.subject_pid
        if subject is not None and (worker := self._worker(subject, d.host)) is not None:
            d.host, d.rank = d.host or worker.host, d.rank if d.rank is not None else worker.rank
            d.local = d.local if d.local is not None else worker.local_rank
        if d.rank is None and subject is not None and (owned := self._owner(subject, d.host)) is not None:
            d.host, proc = d.host or owned[0], owned[1]
            d.rank = proc.rank
        if d.gpu is None and proc is not None:
            d.gpu = proc.gpu
        if d.rank is None and who.pid is not None and (worker := self._worker(who.pid, d.host)) is not None:
            d.host, d.rank = d.host or worker.host, worker.rank
        hosts = {self._canon(h) or h for h in facts.hosts}
        if d.rank is None and d.local is not None:
            d.rank = maps.local.get((d.host, None, None, d.local)) if d.host is not None else None
            if d.rank is None and (who.host is None or len(hosts) <= 1):
                # What this input's own lines said; never another input's `[default3]:`.
                d.rank = maps.local.get((None, who.source, who.task, d.local))
        if d.rank is None and d.local is None and who.pid is None and len(facts.ranks) == 1 and len(hosts) <= 1:
            # One rank's output (a per-rank file, its lines tagged): its lines are that rank's. Not a line
            # whose printer is known, which nothing ties to that rank, nor when several hosts write to it.
            only = next(iter(facts.ranks))
            if d.host is None or maps.rank_host.get(only) in (None, d.host):
                d.rank = only
        if d.host is None and len(hosts) == 1:
            # The input's one host is the host of every line only where the input is one rank's, or the
            # job one node's: a node's console also carries the ranks of other nodes.
            here = next(iter(hosts))
            mine = d.rank is None or maps.rank_host.get(d.rank, here) == here
            if (len(maps.input_ranks[who.source]) <= 1 and mine) or maps.job_host == here:
                d.host = here

    def _from_job(self, maps: _Maps, d: _Draft) -> None:
        """Tier 2: the job-wide maps, keyed by the global rank, or by host and bus id."""
        if d.rank is not None:
            d.host = d.host or maps.rank_host.get(d.rank)
            d.gpu = d.gpu or maps.rank_gpu.get(d.rank)
        elif d.gpu is not None:
            if d.host is not None:
                d.rank = maps.host_gpu_rank.get((d.host, d.gpu))
            elif maps.gpus_complete and len(places := maps.gpu_places.get(d.gpu, set())) == 1:
                # Every rank's GPU is known and one sat on that bus id: a kernel line with no host is
                # about it. With ranks unknown, the line may come from a node whose GPUs nothing named.
                d.host, d.rank = next(iter(places))
        if d.rank is not None and d.local is None:
            d.local = maps.rank_local.get(d.rank)
