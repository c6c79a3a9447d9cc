"""Slurm job steps from process cgroups: the path shapes of Slurm's cgroup/v1 and cgroup/v2 plugins, read from
fake /proc trees (tests/fixtures/procfs)."""

from __future__ import annotations

import os
import pwd
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest

from gpu_triage.exporter.workloads import slurm
from gpu_triage.exporter.workloads.slurm import ABSENT_RETRY_SECONDS, ProcessJobs, SlurmStep, real_uid, step_of
from gpu_triage.exporter.workloads.user_names import UserNames
from tests.conftest import REPO, FakeClock
from tests.daemon_proc import wait_for

PROCFS = REPO / "tests/fixtures/procfs"
T = TypeVar("T")


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        # cgroup/v2, the default slice and scope
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", SlurmStep("4242", "0", None)),
        ("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0", SlurmStep("7", "batch", None)),
        ("0::/system.slice/slurmstepd.scope/job_7/step_extern/user/task_special", SlurmStep("7", "extern", None)),
        ("0::/system.slice/slurmstepd.scope/job_7/step_interactive/user/task_0", SlurmStep("7", "interactive", None)),
        ("0::/system.slice/slurmstepd.scope/job_7/step_2+1/user/task_0", SlurmStep("7", "2+1", None)),  # het job
        # slurmstepd itself, in the step's slurm/ leaf
        ("0::/system.slice/slurmstepd.scope/job_7/step_0/slurm", SlurmStep("7", "0", None)),
        # several slurmd on one host, and another CgroupSlice
        ("0::/gpu.slice/node3_slurmstepd.scope/job_99/step_1/user/task_3", SlurmStep("99", "1", None)),
        # Slurm 26.05: the job's directory is its SLUID unless CgroupJobIdPaths=yes
        ("0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0", SlurmStep("sEKNKTV3WPV500", "0", None)),
        # read from inside a cgroup namespace: the path is relative to the reader's root
        ("0::/../../system.slice/slurmstepd.scope/job_5/step_0/user/task_0", SlurmStep("5", "0", None)),
        # cgroup/v1: the uid is in the path; the default CgroupPrepend, and one per node
        ("4:memory:/slurm/uid_1001/job_12/step_0/task_0", SlurmStep("12", "0", 1001)),
        ("4:memory:/slurm_node3/uid_1001/job_12/step_batch", SlurmStep("12", "batch", 1001)),
        ("7:devices:/slurm/uid_1001/job_12", SlurmStep("12", "", 1001)),  # job level only
    ],
)
def test_slurm_cgroup_shapes(cgroup: str, expected: SlurmStep) -> None:
    assert step_of(cgroup + "\n") == expected


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope",
        "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope",
        "0::/system.slice/my-app.service/job_12",  # a job_ directory of someone else's
        "0::/system.slice/other.scope/sEKNKTV3WPV500/step_0",  # a SLUID-like name outside slurmstepd's scope
        "0::/",
        "",
        "garbage without colons",
        # A user's own delegated subtree: theirs to name as they like, so no job of Slurm's, whatever it says.
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242/step_0",
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_4242/step_0",
        "0::/user.slice/user-1000.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
        "0::/../../user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_4242/step_0",
        "0::/system.slice/slurmd.service/slurmstepd.scope/job_7/step_0",  # a scope inside a service
        "0::/slurmstepd.scope/job_7/step_0",  # no slice above it
        "0::/system.slice/slurmstepd.scope/job_7/other/step_0",  # not a step below the job
        "0::/system.slice/slurmstepd.scope/scratch/step_0",  # neither a job id nor a SLUID
        # cgroup/v1: only under the prepend, with the uid level
        "4:memory:/home/uid_1000/job_12/step_0",
        "4:memory:/user/slurm/uid_1000/job_12/step_0",
        "4:memory:/slurm/job_12/step_0",
        "4:memory:/slurm/uid_1000/other/job_12/step_0",
    ],
)
def test_other_cgroups_are_no_job(cgroup: str) -> None:
    assert step_of(cgroup) is None


def test_a_v1_job_s_process_is_its_owner_s(tmp_path: Path) -> None:
    """In v1 the path names the job's owner: a process of another user in that tree is not the job's."""
    procfs = tmp_path / "proc"
    for pid, uid in ((1, 1000), (2, 2000)):
        (procfs / str(pid)).mkdir(parents=True)
        (procfs / f"{pid}/cgroup").write_text("4:memory:/slurm/uid_1000/job_12/step_0/task_0\n")
        (procfs / f"{pid}/status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    assert ProcessJobs(procfs).jobs({1, 2}) == {1: SlurmStep("12", "0", 1000)}


def test_real_uid_from_status() -> None:
    assert real_uid("Name:\tpython3\nUid:\t1001\t0\t0\t0\nGid:\t100\n") == 1001
    assert real_uid("Name:\tx\n") is None


def test_v2_tree() -> None:
    jobs = ProcessJobs(PROCFS / "cgroup-v2").jobs({41000, 41034, 41068, 41085, 41102, 41119, 99999})
    assert jobs == {
        41000: SlurmStep("4242", "0", 0),  # uid from /proc/<pid>/status
        41034: SlurmStep("4242", "batch", 0),
        41068: SlurmStep("4244", "extern", 4711),
        41085: SlurmStep("4245", "interactive", 4711),
        41119: SlurmStep("sEKNKTV3WPV500", "0", 4711),
    }  # 41102 is not in a job; 99999 is no process


def test_v1_tree() -> None:
    jobs = ProcessJobs(PROCFS / "cgroup-v1").jobs({41000, 41051, 41085})
    assert jobs == {41000: SlurmStep("4242", "0", 0), 41051: SlurmStep("4243", "0", 4711)}


def test_each_process_is_read_once_while_it_lives(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS / "cgroup-v2", procfs)
    jobs = ProcessJobs(procfs)
    assert jobs.jobs({41000})[41000].job_id == "4242"
    (procfs / "41000/cgroup").write_text("0::/system.slice/slurmstepd.scope/job_1/step_0/user/task_0\n")
    assert jobs.jobs({41000})[41000].job_id == "4242", "a running process's cgroup is not read again"
    assert jobs.jobs(set()) == {}  # it ended: forgotten
    assert jobs.jobs({41000})[41000].job_id == "1", "a new process under the same pid is read afresh"


def test_a_process_that_vanished_before_it_was_read_is_asked_about_again(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    procfs.mkdir()
    now = [0.0]
    jobs = ProcessJobs(procfs, monotonic=lambda: now[0])
    assert jobs.jobs({41000}) == {}
    shutil.copytree(PROCFS / "cgroup-v2/41000", procfs / "41000")
    now[0] += ABSENT_RETRY_SECONDS
    assert jobs.jobs({41000})[41000].job_id == "4242"


def test_a_listed_process_that_is_not_here_is_not_looked_for_on_every_poll(tmp_path: Path) -> None:
    """NVML lists a process our /proc does not have (a daemon in a container without the host's PID namespace):
    looked for once, then again only now and then, not a file read per process per poll."""
    procfs = tmp_path / "proc"
    procfs.mkdir()
    now = [0.0]
    jobs = ProcessJobs(procfs, monotonic=lambda: now[0])
    looked: list[int] = []
    look = jobs._look
    jobs._look = lambda pid: looked.append(pid) or look(pid)  # type: ignore[method-assign]
    for _ in range(5):
        assert jobs.jobs({41000, 41034}) == {}
        now[0] += 1.0
    assert sorted(looked) == [41000, 41034]
    now[0] += ABSENT_RETRY_SECONDS
    shutil.copytree(PROCFS / "cgroup-v2/41000", procfs / "41000")
    assert jobs.jobs({41000, 41034})[41000].job_id == "4242"
    assert sorted(looked) == [41000, 41000, 41034, 41034]
    assert jobs.jobs(set()) == {}  # no longer listed: forgotten, so a new process under the pid is read at once
    assert jobs.jobs({41034}) == {} and looked.count(41034) == 3
    jobs.close()


def test_an_unreadable_or_huge_cgroup_file_is_no_job(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    (procfs / "1").mkdir(parents=True)
    (procfs / "1/cgroup").write_bytes(b"\xff\xfe" * 40_000 + b"\n0::/system.slice/slurmstepd.scope/job_1/step_0\n")
    (procfs / "2").mkdir()
    (procfs / "2/cgroup").mkdir()  # not a file
    assert ProcessJobs(procfs).jobs({1, 2}) == {}


def in_thread(fn: Callable[[], T], seconds: float) -> T:
    """fn(), which must return within `seconds` (a blocked read would hold the poll and the render)."""
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds:g}s"
    return result[0]


def test_a_fifo_where_the_cgroup_file_should_be_blocks_nothing(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS / "cgroup-v2/41000", procfs / "41000")
    (procfs / "41017").mkdir()
    os.mkfifo(procfs / "41017/cgroup")
    try:
        jobs = in_thread(lambda: ProcessJobs(procfs).jobs({41000, 41017}), 5)
        assert jobs == {41000: SlurmStep("4242", "0", 0)}
    finally:
        # Whatever happened, nothing may stay blocked on the FIFO: a writer lets a reader go.
        fd = os.open(procfs / "41017/cgroup", os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)


def test_a_slow_read_is_waited_for_briefly_and_shown_when_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS / "cgroup-v2", procfs)
    release = threading.Event()
    real_read = slurm._read

    def slow_for_41017(path: Path) -> str | None:
        if path.parent.name == "41017":
            release.wait(30)
        return real_read(path)

    monkeypatch.setattr(slurm, "_read", slow_for_41017)
    changed = threading.Event()
    jobs = ProcessJobs(procfs, wait=0.05, deadline=30, on_change=changed.set)
    assert in_thread(lambda: jobs.jobs({41000, 41017}), 5) == {41000: SlurmStep("4242", "0", 0)}
    assert jobs.status()["slow_reads"] == 1 and not changed.is_set()
    release.set()
    assert changed.wait(10), "the render is asked again once the slow read returns"
    assert jobs.jobs({41000, 41017})[41017].job_id == "4242"


def test_a_read_past_the_deadline_is_written_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS / "cgroup-v2", procfs)
    release = threading.Event()
    real_read = slurm._read

    def hangs_for_41017(path: Path) -> str | None:
        if path.parent.name == "41017":
            release.wait(30)  # a /proc that stops answering
        return real_read(path)

    monkeypatch.setattr(slurm, "_read", hangs_for_41017)
    changed = threading.Event()
    clock = FakeClock()
    jobs = ProcessJobs(procfs, wait=0.05, deadline=0.3, on_change=changed.set, monotonic=clock.monotonic)
    back: list[object] = []  # the reads that returned, once what a read's return does is done
    real_returned = jobs._returned

    def returned(future: Future[tuple[SlurmStep | None, bool]]) -> None:
        real_returned(future)
        back.append(future)

    monkeypatch.setattr(jobs, "_returned", returned)
    try:
        assert jobs.jobs({41017}) == {}
        clock.advance(0.4)  # past the deadline
        assert in_thread(lambda: jobs.jobs({41017, 41034}), 5) == {41034: SlurmStep("4242", "batch", 0)}
        assert jobs.status()["hung_reads"] == 1
        release.set()
        wait_for(lambda: len(back) == 2, timeout=5, interval=0.01, what="the hung read back")  # 41034's, 41017's
        assert jobs.jobs({41017, 41034}) == {41034: SlurmStep("4242", "batch", 0)}, "written off: no job"
        assert not changed.is_set(), "a written-off read changes nothing when it returns"
    finally:
        release.set()
        jobs.close()


def test_user_names_resolve_at_once_when_nss_answers() -> None:
    me = os.getuid()
    assert UserNames(wait=10).name(me) == pwd.getpwuid(me).pw_name


def test_a_hung_user_lookup_answers_the_uid_until_the_name_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def slow(uid: int) -> pwd.struct_passwd:
        release.wait(30)  # an LDAP server that does not answer
        return pwd.struct_passwd(("ldap-user", "x", uid, uid, "", "/home/x", "/bin/sh"))

    monkeypatch.setattr(pwd, "getpwuid", slow)
    names = UserNames(wait=0.01)
    assert names.name(5000) == "5000"
    assert names.name(5000) == "5000"  # asked once, not queued again
    release.set()
    wait_for(lambda: names.name(5000) == "ldap-user", what="the name, once the lookup returns")


def test_an_unknown_uid_stays_a_number() -> None:
    known = {p.pw_uid for p in pwd.getpwall()}
    uid = next(u for u in range(4711, 100_000) if u not in known)
    names = UserNames()
    names.name(uid)
    wait_for(lambda: uid in names._names, what="the lookup")
    assert names.name(uid) == str(uid)


def test_a_lookup_that_fails_unexpectedly_leaves_the_next_ones_working(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NSS module that raises what pwd never documents: that uid stays a number, the thread goes on."""

    def lookup(uid: int) -> pwd.struct_passwd:
        if uid == 5001:
            raise RuntimeError("an NSS module's bug")
        return pwd.struct_passwd(("ldap-user", "x", uid, uid, "", "/home/x", "/bin/sh"))

    monkeypatch.setattr(pwd, "getpwuid", lookup)
    names = UserNames(wait=0.01)
    names._worker._retry = 0.0  # the helper's retry wait is not what this is about
    assert names.name(5001) == "5001"
    wait_for(lambda: names._worker.failures == 1, timeout=5, interval=0.01, what="the failure counted")
    wait_for(lambda: names.name(5002) == "ldap-user", timeout=5, interval=0.01, what="the next lookup")
    assert names.name(5001) == "5001" and names._worker.alive
