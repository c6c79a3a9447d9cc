"""How a process's end is told: once, with the failure that caused it (diagnosis/training/findings/deaths.py)."""

from __future__ import annotations

from gpu_triage.diagnosis.training.diagnose import Report, diagnose


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


# PyTorch 2.1 with TORCH_NCCL_ASYNC_ERROR_HANDLING: the watchdog's timeout ends the process with SIGABRT.
TIMEOUT_THEN_ABORT = [
    "[rank1]:[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600321 milliseconds "
    "before timing out.",
    "[rank1]:[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to the asynchronous "
    "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
    "[rank1]:terminate called after throwing an instance of 'std::runtime_error'",
    "[2024-01-09 10:11:12,345] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) "
    "local_rank: 1 (pid: 4242) of binary: /usr/bin/python3",
    "  host      : node3",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -6 (pid: 4242)",
    "  traceback : Signal 6 (SIGABRT) received by PID 4242",
    "============================================================",
]


def test_an_abort_after_a_timeout_is_the_timeout_s_end_not_a_crash() -> None:
    report = _text(*TIMEOUT_THEN_ABORT)
    classes = [f.class_id for f in report.findings]
    assert "process_segfault" not in classes and "job_failed_unclassified" not in classes
    root = report.findings[0]
    assert (root.class_id, root.rank) == ("collective_timeout", 1)
    assert any("exitcode: -6" in e.text for e in root.evidence), "the abort is evidence of how the process ended"


def test_an_abort_nothing_explains_stays_a_crash() -> None:
    """glibc's abort on heap corruption: no error of the process's own before it."""
    report = _text(
        "free(): invalid pointer",
        "E0312 08:29:42.410000 1399 torch/distributed/elastic/multiprocessing/api.py:691] failed (exitcode: -6) "
        "local_rank: 6 (pid: 342651) of binary: /usr/bin/python3",
    )
    assert [f.class_id for f in report.findings] == ["process_segfault"]
    assert report.findings[0].local_rank == 6


def test_an_abort_on_another_rank_than_the_timeout_stays_a_crash() -> None:
    lines = [
        line.replace("local_rank: 1", "local_rank: 5").replace("pid: 4242", "pid: 4250")
        for line in TIMEOUT_THEN_ABORT[:4]
    ]
    report = _text(*lines)
    assert {f.class_id for f in report.findings} >= {"collective_timeout", "process_segfault"}


def test_a_node_wide_abort_is_explained_by_what_happened_on_that_node() -> None:
    """srun names the host and a task range: the timeouts of that host's ranks explain it."""
    report = _text(
        "gpu-n041:1001:1001 [0] NCCL INFO comm 0x55d4b0c0 rank 0 nranks 16 cudaDev 0 busId 18000 - Init COMPLETE",
        " 0: [E ProcessGroupNCCL.cpp:828] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4431, "
        "OpType=_ALLGATHER_BASE, Timeout(ms)=600000) ran for 600680 milliseconds before timing out.",
        "srun: error: gpu-n041: tasks 0-7: Aborted (core dumped)",
        "srun: error: gpu-n042: tasks 8-15: Aborted (core dumped)",
    )
    aborts = [f for f in report.findings if f.class_id == "process_segfault"]
    assert [f.host for f in aborts] == ["gpu-n042"], "gpu-n042 shows nothing that explains its abort"
    assert report.findings[0].class_id == "collective_timeout"


def test_a_generic_end_on_the_same_rank_as_a_crash_is_that_crash() -> None:
    report = _text(
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "train.py", line 9, in <module>',
        "[rank3]: ValueError: bad shard",
        "srun: error: gpu12: task 3: Segmentation fault (core dumped)",
    )
    assert [(f.class_id, f.rank) for f in report.findings] == [("process_segfault", 3)]


def test_slurm_s_step_cancelled_line_is_the_same_death_as_the_failed_task() -> None:
    """`*** STEP … ON host CANCELLED` names the step's node, not a failed worker."""
    report = _text(
        "5: ValueError: corrupt JPEG",
        "srun: error: gpu12: task 5: Exited with exit code 1",
        "slurmstepd: error: *** STEP 7781.0 ON gpu11 CANCELLED AT 2024-03-12T02:10:32 ***",
    )
    [death] = report.findings
    assert (death.class_id, death.host, death.rank) == ("job_failed_unclassified", "gpu12", 5)
    assert any("CANCELLED" in e.text for e in death.evidence)
