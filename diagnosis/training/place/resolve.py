"""Placing a finding: host, rank and GPU filled in from what the lines of every input said (see
diagnosis/training/place/identity.py for the tiers and why no guess crosses a host or an input)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_triage.diagnosis.training.place.facts import Facts, LocalKey, Place, Proc, Who, short_host


@dataclass(slots=True)
class Maps:
    rank_host: dict[int, str]
    rank_gpu: dict[int, str] = field(default_factory=dict)
    rank_local: dict[int, int] = field(default_factory=dict)
    host_gpu_rank: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_places: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    by_pid: dict[int, list[tuple[int, str, int]]] = field(default_factory=dict)
    local: dict[LocalKey, int] = field(default_factory=dict)
    input_ranks: list[set[int]] = field(default_factory=list)  # per input, at most two: tags and comm inits
    job_host: str | None = None  # the one host of a job whose communicator init lines all name it
    gpus_complete: bool = False  # every rank of the largest communicator has its host and bus id known


@dataclass(slots=True)
class Draft:
    host: str | None
    rank: int | None
    gpu: str | None
    local: int | None

    def fields(self) -> tuple[str | None, int | None, str | None, int | None]:
        return self.host, self.rank, self.gpu, self.local


def build(facts: Facts) -> Maps:
    """The job-wide maps from everything learnt so far."""
    rank_host = {rank: facts.canon(host) or host for rank, host in facts.rank_host.items()}
    maps = Maps(rank_host=rank_host, rank_local=dict(facts.rank_local))
    maps.local = {(facts.canon(h), source, task, local): rank for (h, source, task, local), rank in facts.local.items()}
    for known in facts.sources:
        if known.tasks_are_ranks:  # srun's `gpu07: task 3` or `3: node07:…` place rank 3
            for task, host in known.task_host.items():
                maps.rank_host.setdefault(task, facts.canon(host) or host)
    for (source, host, pid), proc in facts.procs.items():
        maps.rank_host.setdefault(proc.rank, host)
        layout = facts.layouts.get((source, host, pid))
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
    _job_wide(facts, maps)
    return maps


def _job_wide(facts: Facts, maps: Maps) -> None:
    """What the communicator init lines say about the whole job and about each input's ranks."""
    maps.input_ranks = [set(known.ranks) for known in facts.sources]
    for (source, _, _), proc in facts.procs.items():
        if len(ranks := maps.input_ranks[source]) < 2:
            ranks.add(proc.rank)
    nranks = max((proc.nranks for proc in facts.procs.values()), default=0)
    # The largest communicator numbers the job's ranks; only once every one of them is known is a
    # bus id (which every node has) or a single host the whole job's.
    members = {(host, proc.rank) for (_, host, _), proc in facts.procs.items() if proc.nranks == nranks}
    hosts = {host for host, _ in members}
    if nranks and len(hosts) == 1 and len({rank for _, rank in members}) == nranks:
        maps.job_host = facts.canon(next(iter(hosts)))
    placed = {proc.rank for proc in facts.procs.values() if proc.nranks == nranks and proc.gpu is not None}
    maps.gpus_complete = bool(nranks) and len(placed) == nranks


def _owner(facts: Facts, maps: Maps, pid: int, host: str | None) -> tuple[str, Proc] | None:
    owners = [o for o in maps.by_pid.get(pid, []) if host is None or o[1] == host]
    return (owners[0][1], facts.procs[owners[0]]) if len(owners) == 1 else None


def place(facts: Facts, maps: Maps, who: Who) -> Place:
    """Fill in host, rank and GPU of `who` from everything learnt so far.

    In two tiers, so that no guess crosses a host or an input: first what the line's own input
    says about its printer or the process it names (`_from_input`), then the job-wide maps, only
    by a global rank or a host (`_from_job`). Whatever the line did not say itself is inferred.
    """
    mine = facts.sources[who.source]
    draft = Draft(facts.canon(short_host(who.host)), who.rank, who.gpu, who.local_rank)
    if draft.rank is None and who.task is not None and mine.tasks_are_ranks:
        draft.rank = who.task  # the launcher's label, where a task is a rank
    given = draft.fields()
    _from_input(facts, maps, who, draft)
    _from_job(maps, draft)
    found = draft.fields()
    inferred = any(g is None and f is not None for g, f in zip(given, found, strict=True))
    return Place(draft.host, draft.rank, draft.gpu, draft.local, inferred)


def _from_input(facts: Facts, maps: Maps, who: Who, d: Draft) -> None:
    """Tier 1: the line's printer (comm init, the launchers' reports on its pid), the process it
    names, its tags as its own input maps them, and what the input holds only one of."""
    mine = facts.sources[who.source]
    if d.host is None and who.task is not None and not mine.tasks_are_ranks:
        d.host = facts.canon(mine.task_host.get(who.task))  # the node that task ran on
    proc = facts.procs.get((who.source, d.host, who.pid)) if d.host is not None and who.pid is not None else None
    if d.rank is None and proc is not None:
        d.rank = proc.rank
    subject = who.subject_pid
    if subject is not None and (worker := facts.worker(subject, d.host)) is not None:
        d.host, d.rank = d.host or worker.host, d.rank if d.rank is not None else worker.rank
        d.local = d.local if d.local is not None else worker.local_rank
    if d.rank is None and subject is not None and (owned := _owner(facts, maps, subject, d.host)) is not None:
        d.host, proc = d.host or owned[0], owned[1]
        d.rank = proc.rank
    if d.gpu is None and proc is not None:
        d.gpu = proc.gpu
    if d.rank is None and who.pid is not None and (worker := facts.worker(who.pid, d.host)) is not None:
        d.host, d.rank = d.host or worker.host, worker.rank
    hosts = {facts.canon(h) or h for h in mine.hosts}
    if d.rank is None and d.local is not None:
        d.rank = maps.local.get((d.host, None, None, d.local)) if d.host is not None else None
        if d.rank is None and (who.host is None or len(hosts) <= 1):
            # What this input's own lines said; never another input's `[default3]:`.
            d.rank = maps.local.get((None, who.source, who.task, d.local))
    if d.rank is None and d.local is None and who.pid is None and len(mine.ranks) == 1 and len(hosts) <= 1:
        # One rank's output (a per-rank file, its lines tagged): its lines are that rank's. Not a line
        # whose printer is known, which nothing ties to that rank, nor when several hosts write to it.
        only = next(iter(mine.ranks))
        if d.host is None or maps.rank_host.get(only) in (None, d.host):
            d.rank = only
    if d.host is None and len(hosts) == 1:
        # The input's one host is the host of every line only where the input is one rank's, or the
        # job one node's: a node's console also carries the ranks of other nodes.
        here = next(iter(hosts))
        ours = d.rank is None or maps.rank_host.get(d.rank, here) == here
        if (len(maps.input_ranks[who.source]) <= 1 and ours) or maps.job_host == here:
            d.host = here


def _from_job(maps: Maps, d: Draft) -> None:
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
