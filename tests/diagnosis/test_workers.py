"""Which worker a line is about when the line does not say (diagnosis/training/findings/workers.py, diagnosis/training/place/identity.py)."""

from __future__ import annotations

from gpu_triage.diagnosis.training.diagnose import Report, diagnose


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


AGENT = "E1105 04:04:39.410000 1962569 torch/distributed/elastic/multiprocessing/api.py:869] "
STOP = "W1105 04:04:39.408000 1962569 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {} closing signal SIGTERM"


def _table(host: str, rank: int, local: int, pid: int, code: int = 1) -> list[str]:
    return [
        "[0]:",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: {local})",
        f"  exitcode  : {code} (pid: {pid})",
        "  error_file: <N/A>",
        "============================================================",
    ]


def test_an_unprefixed_fault_is_the_one_failed_worker_s() -> None:
    """One node's console without --tee: the traceback names no rank, the agent's report right after does."""
    report = _text(
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 412, in <module>',
        "RuntimeError: CUDA error: out of memory",
        f"{STOP.format(2274577)}",
        f"{AGENT}failed (exitcode: 1) local_rank: 2 (pid: 2274582) of binary: /usr/bin/python3",
        *_table("v100-dev", 2, 2, 2274582),
    )
    root = report.findings[0]
    assert (root.class_id, root.host, root.rank, root.local_rank) == ("cuda_oom", "v100-dev", 2, 2)
    assert root.place_inferred


def test_a_symptom_outside_the_worker_s_traceback_keeps_no_place() -> None:
    """A stopped worker may print a closed connection of its own: only the failed one's exception is bound."""
    report = _text(
        "bare-4:4001:4090 [0] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer 10.0.0.2<4242>",
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 412, in <module>',
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL version 2.10.3",
        f"{AGENT}failed (exitcode: 1) local_rank: 3 (pid: 573243) of binary: /usr/bin/python3",
        *_table("bare-4", 3, 3, 573243),
    )
    by_class = {f.class_id: f for f in report.findings}
    assert (by_class["nccl_generic_error"].rank, by_class["nccl_generic_error"].place_inferred) == (3, True)
    assert by_class["remote_peer_closed"].rank is None
    assert "job_failed_unclassified" not in by_class, "the NCCL error explains the worker's end"


def test_two_failed_workers_leave_an_unprefixed_fault_unplaced() -> None:
    report = _text(
        "RuntimeError: CUDA error: out of memory",
        f"{AGENT}failed (exitcode: 1) local_rank: 2 (pid: 100) of binary: /usr/bin/python3",
        *_table("n1", 2, 2, 100),
        *_table("n1", 5, 5, 105),
    )
    [oom] = [f for f in report.findings if f.class_id == "cuda_oom"]
    assert (oom.rank, oom.local_rank) == (None, None)


ROLL = [STOP.format(pid) for pid in (664845, 664846, 664847, 664848, 664851, 664855)]
XID = "Nov 05 03:54:35 gsp-node kernel: NVRM: Xid (PCI:0000:ab:00): 119, pid={}, name=python3, Timeout after 6s of waiting for RPC response from GPU5 GSP!"


def test_the_agent_s_roll_call_gives_a_stopped_pid_its_rank() -> None:
    """Local ranks 0 and 1 had failed; the six stopped pids are local ranks 2-7 in order."""
    report = _text(
        *ROLL,
        f"{AGENT}failed (exitcode: -6) local_rank: 0 (pid: 664842) of binary: /usr/bin/python3",
        *_table("gsp-node", 8, 0, 664842, -6),
        *_table("gsp-node", 9, 1, 664844, -6),
        XID.format(664848),
    )
    xid = report.findings[0]
    assert (xid.class_id, xid.host, xid.rank, xid.local_rank, xid.place_inferred) == (
        "xid_119",
        "gsp-node",
        13,
        5,
        True,
    )


def test_a_roll_call_that_does_not_fit_is_not_used() -> None:
    """The table puts a stopped pid at another local rank than its place in the roll: no guessing."""
    report = _text(
        *ROLL,
        f"{AGENT}failed (exitcode: -6) local_rank: 0 (pid: 664842) of binary: /usr/bin/python3",
        *_table("gsp-node", 0, 0, 664842, -6),
        *_table("gsp-node", 7, 7, 664846, -6),
        XID.format(664848),
    )
    assert report.findings[0].class_id == "xid_119" and report.findings[0].rank is None


def test_a_launcher_report_binds_a_rank_to_its_host() -> None:
    report = _text(
        "5: ValueError: corrupt JPEG",
        "srun: error: gpu12: task 5: Exited with exit code 1",
    )
    assert [(f.host, f.rank) for f in report.findings] == [("gpu12", 5)]


def test_a_pod_and_the_hostname_nccl_prints_are_one_place() -> None:
    """kubectl logs --prefix names the pod; NCCL's header the hostname; the node's kernel log the node."""
    report = _text(
        "[pod/trainer-master-0/pytorch] gpu-w7:1281481:1281481 [2] NCCL INFO ncclCommInitRank comm 0x56712a10e1e8 "
        "rank 2 nranks 16 cudaDev 2 nvmlDev 2 busId 3a000 commId 0x6c9366ac628b9dc2 - Init COMPLETE",
        "[pod/trainer-master-0/pytorch] [rank2]: RuntimeError: CUDA error: unspecified launch failure",
        "Aug 21 05:09:11 gpu-w7 kernel: NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    )
    assert [(f.class_id, f.host, f.rank) for f in report.findings] == [
        ("xid_79", "gpu-w7", 2),
        ("cuda_kernel_fault", "gpu-w7", 2),
    ]


def test_nccl_s_node_layout_line_gives_the_local_rank() -> None:
    """cudaDev is not the local rank (CUDA_VISIBLE_DEVICES): NCCL 2.20+ prints the local rank itself."""
    report = _text(
        "node-c04:5001:5048 [0] NCCL INFO comm 0x55aa rank 27 nRanks 64 nNodes 8 localRanks 8 localRank 3 MNNVL 0",
        "node-c04:5001:5001 [0] NCCL INFO ncclCommInitRank comm 0x55aa rank 27 nranks 64 cudaDev 0 nvmlDev 3 "
        "busId 5d000 commId 0x1 - Init COMPLETE",
        "Mar 12 02:31:07 node-c04 kernel: NVRM: Xid (PCI:0000:5d:00): 48, pid=5001, name=python3, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 5, subpartition 1.",
    )
    xid = report.findings[0]
    assert (xid.class_id, xid.rank, xid.local_rank, xid.gpu) == ("xid_48", 27, 3, "0000:5d:00.0")
