"""Which Slurm job a process belongs to, from its cgroup (`/proc/<pid>/cgroup`).

Slurm's cgroup plugins put every process of a job step into a cgroup of its own, named after the job and the
step. The shapes, as Slurm's src/plugins/cgroup builds them:

    cgroup v1 (cgroup/v1)   <prepend>/uid_<uid>/job_<job id>/step_<step>[/task_<n>]     on every controller
                            <prepend> is CgroupPrepend, /slurm by default (/slurm_<node> with several slurmd)
    cgroup v2 (cgroup/v2)   /<slice>/[<node>_]slurmstepd.scope/job_<job id>/step_<step>/user/task_<n>
                            /<slice>/[<node>_]slurmstepd.scope/job_<job id>/step_<step>/slurm  (slurmstepd)
                            <slice> is CgroupSlice, system.slice by default

where <step> is a number, `batch`, `extern` (processes adopted by pam_slurm_adopt), `interactive`, `TBD`, or
`<n>+<component>` for a step of a heterogeneous job. From Slurm 26.05 cgroup/v2 names the job's directory by
the job's SLUID (`s` and 13 Crockford base32 digits, e.g. sEKNKTV3WPV500) unless CgroupJobIdPaths=yes; the
job id is then that SLUID, which scontrol and squeue accept in place of the number.

v1 paths carry the uid; for v2 it is the process's real uid (`/proc/<pid>/status`).

Only those places count, because anyone may name a directory `job_4242`: a user's own delegated subtree
(`/user.slice/user-1000.slice/user@1000.service/app.slice/...`) is theirs to fill with cgroups of any name,
and a process there must not pose as job 4242 in the findings and the drain reason. So, v2: the scope sits
in slices only, outside user.slice (only root makes cgroups there); v1: the tree starts at the prepend, and
the uid in the path is the process's own. Paths read from inside a cgroup namespace start with `..`.

The files are read on a thread of their own with a deadline, as driver calls are: the render that needs
them waits `wait` seconds at most, a read that is slower shows its job when it returns, and one that hangs
(a FIFO where a file should be is refused at once; a /proc that stops answering is not) is written off after
the deadline: that process has no job, and the status says so.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, replace
from pathlib import Path

from gpu_triage.exporter.polling.readpool import ReadPool

log = logging.getLogger(__name__)

_JOB = re.compile(r"job_(\d+)")
_SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}", re.IGNORECASE)
_STEP = re.compile(r"step_(\d+(?:\+\d+)?|batch|extern|interactive|TBD)")
_UID = re.compile(r"uid_(\d+)")
_SCOPE = re.compile(r"(?:[^/]+_)?slurmstepd\.scope")  # <node>_ with several slurmd on one host
_PREPEND = re.compile(r"slurm(?:_[^/]+)?")  # CgroupPrepend: /slurm, or /slurm_<node> with several slurmd
MAX_FILE_BYTES = 64 * 1024  # a cgroup or status file is a few hundred bytes; anything longer is not one
MAX_WRITTEN_OFF = 4  # hung reads left to finish on their own threads; beyond, no new process is looked at
# A listed process not in our /proc (gone since NVML's answer, or in another PID namespace: a daemon in a
# container without the host's) is looked for again after this long, not on every poll.
ABSENT_RETRY_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class SlurmStep:
    job_id: str
    step: str  # "" when the cgroup names the job but no step
    uid: int | None  # from the v1 path, else the process's real uid; None when neither says


def step_of(cgroup_text: str) -> SlurmStep | None:
    """The job step a `/proc/<pid>/cgroup` file puts the process in, or None when it is not a Slurm job's."""
    for line in cgroup_text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        if found := _step_in(path.split("/")):
            return found
    return None


def _step_in(parts: list[str]) -> SlurmStep | None:
    parts = [p for p in parts if p]
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return _v2_step(parts[up:], up > 0) or _v1_step(parts[up:])


def _user_tree(slice_name: str) -> bool:
    # systemd names a slice after its place: user-1000.slice is user.slice/user-1000.slice.
    return slice_name == "user.slice" or slice_name.startswith("user-")


def _v2_step(parts: list[str], relative: bool) -> SlurmStep | None:
    """/<slice>/[<node>_]slurmstepd.scope/job_<id>|<SLUID>[/step_<step>/...]."""
    scope = next((i for i, part in enumerate(parts) if _SCOPE.fullmatch(part)), None)
    if scope is None or scope + 1 >= len(parts):
        return None
    above = parts[:scope]
    if not (above or relative) or not all(p.endswith(".slice") and not _user_tree(p) for p in above):
        return None
    job = m[1] if (m := _JOB.fullmatch(parts[scope + 1])) else parts[scope + 1]
    if m is None and not _SLUID.fullmatch(job):
        return None
    step = _step_below(parts, scope + 2)
    return None if step is None else SlurmStep(job, step, None)


def _v1_step(parts: list[str]) -> SlurmStep | None:
    """/<prepend>/uid_<uid>/job_<id>[/step_<step>/...]."""
    if len(parts) < 3 or not _PREPEND.fullmatch(parts[0]):
        return None
    uid, job = _UID.fullmatch(parts[1]), _JOB.fullmatch(parts[2])
    step = _step_below(parts, 3)
    return None if uid is None or job is None or step is None else SlurmStep(job[1], step, int(uid[1]))


def _step_below(parts: list[str], i: int) -> str | None:
    """The step named at parts[i]: "" when the path ends at the job, None when something else is there."""
    if i >= len(parts):
        return ""
    m = _STEP.fullmatch(parts[i])
    return m[1] if m else None


def _read(path: Path) -> str | None:
    """A small regular file's text; None when it is not one (gone, not ours to read, a FIFO or a device,
    which would block the reader). Non-blocking: a FIFO's open returns at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # the process ended, or is not ours to read: no job to name
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) < MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES - len(data))):
            data += chunk
        return data.decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def real_uid(status_text: str) -> int | None:
    """The real uid from a `/proc/<pid>/status` file ("Uid:\\t<real>\\t<effective>\\t<saved>\\t<fs>")."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


class ProcessJobs:
    """pid -> Slurm job step, read from `<procfs>/<pid>/cgroup` once per process and kept while it lives.

    Only the processes NVML lists on a GPU are looked at, so a poll reads a few small files at most, and
    only for processes it has not seen before. `on_change` is called when a read that outlived the render's
    wait returns, so that its job is shown then.
    """

    def __init__(
        self,
        procfs: Path,
        *,
        wait: float = 0.25,
        deadline: float = 5.0,
        on_change: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.procfs = procfs
        self.wait = min(wait, deadline)
        self.deadline = deadline
        self._monotonic = monotonic  # what the deadline is measured on
        self._on_change = on_change
        self._known: dict[int, SlurmStep | None] = {}
        self._absent: dict[int, float] = {}  # pid -> when it was last found missing
        self._reading: dict[int, tuple[Future[tuple[SlurmStep | None, bool]], float]] = {}  # pid -> (read, since)
        self._pool: ReadPool | None = None
        self._lock = threading.Lock()
        self._late: set[Future[tuple[SlurmStep | None, bool]]] = set()  # the render stopped waiting for these
        self._late_lock = threading.Lock()  # alone: a read's callback may run while _lock is held
        self.slow_reads = 0  # outlived the render's wait
        self.hung_reads = 0  # outlived the deadline, written off
        self._written_off: set[Future[tuple[SlurmStep | None, bool]]] = set()

    def jobs(self, pids: set[int]) -> dict[int, SlurmStep]:
        """The Slurm job of each of `pids` that runs in one; forgets processes no longer listed."""
        with self._lock:
            for gone in self._known.keys() - pids:
                del self._known[gone]
            for gone in self._reading.keys() - pids:
                del self._reading[gone]  # the read, if it hangs, stays written off
            for gone in self._absent.keys() - pids:
                del self._absent[gone]
            now = self._monotonic()
            started = [
                self._start(pid)
                for pid in pids
                if pid not in self._known
                and pid not in self._reading
                and now - self._absent.get(pid, -ABSENT_RETRY_SECONDS) >= ABSENT_RETRY_SECONDS
            ]
        fresh = [f for f in started if f is not None]
        if fresh:
            _, late = wait_all(fresh, timeout=self.wait)
            with self._late_lock:
                self._late |= late
                self.slow_reads += len(late)
        with self._lock:
            self._collect()
            return {pid: job for pid in pids if (job := self._known.get(pid)) is not None}

    def _start(self, pid: int) -> Future[tuple[SlurmStep | None, bool]] | None:
        if len(self._written_off - {f for f in self._written_off if f.done()}) >= MAX_WRITTEN_OFF:
            return None  # reads hang: asking about more processes would only add hung threads
        if self._pool is None:
            self._pool = ReadPool(2, name="cgroup-read")
        future = self._pool.submit(self._look, pid, lane=pid)
        self._reading[pid] = (future, self._monotonic())
        future.add_done_callback(self._returned)
        return future

    def _returned(self, future: Future[tuple[SlurmStep | None, bool]]) -> None:
        """A read that the render stopped waiting for has returned (in time): show what it found."""
        with self._late_lock:
            late = future in self._late
            self._late.discard(future)
        if late and future not in self._written_off:
            self._on_change()

    def _collect(self) -> None:
        """Take in the reads that returned; write off those past the deadline (their process has no job)."""
        now = self._monotonic()
        for pid, (future, since) in list(self._reading.items()):
            if future.done():
                del self._reading[pid]
                job, exists = future.result() if future.exception() is None else (None, True)
                if job is not None or exists:
                    self._known[pid] = job
                    self._absent.pop(pid, None)
                else:
                    self._absent[pid] = now  # not here: asked about again later, should NVML still list it
            elif now - since > self.deadline and future not in self._written_off:
                assert self._pool is not None
                self._pool.write_off(future)
                self._written_off.add(future)
                self.hung_reads += 1
                self._known[pid] = None
                del self._reading[pid]
                log.warning(
                    "a process's cgroup could not be read in time; it is named in no Slurm job",
                    extra={"pid": pid, "path": str(self.procfs / str(pid) / "cgroup"), "deadline": self.deadline},
                )
        self._written_off = {f for f in self._written_off if not f.done()}

    def _look(self, pid: int) -> tuple[SlurmStep | None, bool]:
        """(its job step, whether the process is there), from its files."""
        text = _read(self.procfs / str(pid) / "cgroup")
        step = step_of(text) if text is not None else None
        if step is None:
            return None, (self.procfs / str(pid)).is_dir()
        status = _read(self.procfs / str(pid) / "status")
        uid = real_uid(status) if status is not None else None
        if step.uid is not None and uid is not None and uid != step.uid:
            # A v1 job's tree is its owner's: a process of another user in it is not the job's.
            return None, True
        return replace(step, uid=step.uid if step.uid is not None else uid), True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def status(self) -> dict[str, object]:
        with self._lock:
            return {
                "procfs": str(self.procfs),
                "processes": len(self._known),
                "in_slurm_jobs": sum(job is not None for job in self._known.values()),
                "slow_reads": self.slow_reads,
                "hung_reads": self.hung_reads,
            }
