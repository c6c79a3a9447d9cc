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
"""

from __future__ import annotations

import logging
import pwd
import queue
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

_JOB = re.compile(r"job_(\d+)")
_SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}", re.IGNORECASE)
_STEP = re.compile(r"step_(\d+(?:\+\d+)?|batch|extern|interactive|TBD)")
_UID = re.compile(r"uid_(\d+)")
MAX_FILE_BYTES = 64 * 1024  # a cgroup or status file is a few hundred bytes; anything longer is not one


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
    for i, part in enumerate(parts):
        parent = parts[i - 1] if i else ""
        scope = parent.endswith("slurmstepd.scope")
        if m := _JOB.fullmatch(part):
            job = m[1]
        elif scope and _SLUID.fullmatch(part):
            job = part
        else:
            continue
        step = _STEP.fullmatch(parts[i + 1]) if i + 1 < len(parts) else None
        uid = _UID.fullmatch(parent)
        # A bare job_<n> anywhere is too common a name to trust; Slurm's have a uid_, a scope or a step_ beside.
        if step or uid or scope:
            return SlurmStep(job, step[1] if step else "", int(uid[1]) if uid else None)
    return None


def _read(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
    except OSError:  # the process ended, or is not ours to read: no job to name
        return None


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
    only for processes it has not seen before.
    """

    def __init__(self, procfs: Path) -> None:
        self.procfs = procfs
        self._known: dict[int, SlurmStep | None] = {}

    def jobs(self, pids: set[int]) -> dict[int, SlurmStep]:
        """The Slurm job of each of `pids` that runs in one; forgets processes no longer listed."""
        for gone in self._known.keys() - pids:
            del self._known[gone]
        out = {}
        for pid in pids:
            if pid not in self._known:
                found = self._look(pid)
                if found is not None or self._exists(pid):
                    self._known[pid] = found  # else: gone between NVML's answer and now; ask again next time
                else:
                    continue
            if (job := self._known[pid]) is not None:
                out[pid] = job
        return out

    def _exists(self, pid: int) -> bool:
        return (self.procfs / str(pid)).is_dir()

    def _look(self, pid: int) -> SlurmStep | None:
        text = _read(self.procfs / str(pid) / "cgroup")
        step = step_of(text) if text is not None else None
        if step is None:
            return None
        uid = step.uid
        if uid is None and (status := _read(self.procfs / str(pid) / "status")) is not None:
            uid = real_uid(status)
        return replace(step, uid=uid)

    def status(self) -> dict[str, object]:
        return {
            "procfs": str(self.procfs),
            "processes": len(self._known),
            "in_slurm_jobs": sum(job is not None for job in self._known.values()),
        }


class UserNames:
    """uid -> user name, looked up off the poll thread: with LDAP behind NSS, a lookup can hang for minutes.

    A new uid's lookup is waited for briefly (`wait` seconds: local files and a working NSS cache answer in
    far less); one that takes longer answers the uid itself until the name is known.
    """

    def __init__(self, limit: int = 1024, wait: float = 0.05) -> None:
        self._names: dict[int, str] = {}
        self._asked: set[int] = set()
        self._queue: queue.SimpleQueue[tuple[int, threading.Event]] = queue.SimpleQueue()
        self._limit = limit  # distinct users asked about: bounded, as every input
        self._wait = wait
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def name(self, uid: int) -> str:
        with self._lock:
            known = self._names.get(uid)
            if known is not None:
                return known
            if uid in self._asked or len(self._asked) >= self._limit:
                return str(uid)
            self._asked.add(uid)
            done = threading.Event()
            self._queue.put((uid, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._resolve, name="user-names", daemon=True)
                self._thread.start()
        done.wait(self._wait)
        with self._lock:
            return self._names.get(uid, str(uid))

    def _resolve(self) -> None:
        while True:
            uid, done = self._queue.get()
            try:
                name = pwd.getpwuid(uid).pw_name
            except (KeyError, OSError):  # no such user here (a container without the cluster's NSS): keep the uid
                name = str(uid)
            with self._lock:
                self._names[uid] = name
            done.set()
