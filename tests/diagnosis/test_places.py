"""Where a finding happened when its line does not say it all (diagnosis/identity.py): launcher tasks,
torchrun's local ranks, and the fallbacks that must not carry a place across hosts or inputs."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.findings import Finding
from gpu_triage.diagnosis.training import Report, diagnose

TIMEOUT = (
    "[E0501 12:10:41.118252 3104 ProcessGroupNCCL.cpp:632] [Rank {0}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=4822, OpType=ALLREDUCE, NumelIn=33554432, NumelOut=33554432, Timeout(ms)=600000) ran for "
    "600021 milliseconds before timing out."
)
CUDA = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


def _inputs(*inputs: tuple[str, list[str]]) -> Report:
    return diagnose([(name, ["\n".join(lines).encode() + b"\n"]) for name, lines in inputs])


def _one(report: Report, class_id: str) -> Finding:
    [found] = [f for f in report.findings if f.class_id == class_id]
    return found


def test_an_srun_task_running_torchrun_is_a_node_not_a_rank() -> None:
    """`srun --ntasks-per-node=1 torchrun …`: `1: [default3]:` is local rank 3 of node 1, not rank 1."""
    report = _text(
        "0: [default0]:epoch 1 step 10 loss 2.3",
        "1: [default0]:epoch 1 step 10 loss 2.3",
        f"1: [default3]:{CUDA}",
        f"0: [default5]:[rank5]:{TIMEOUT.format(5)}",
    )
    cuda = _one(report, "cuda_illegal_address")
    assert (cuda.rank, cuda.local_rank) == (None, 3)
    assert _one(report, "collective_timeout").rank == 5


def test_srun_names_the_node_of_a_task_not_the_host_of_the_rank_with_that_number() -> None:
    report = _text(f"0: [default3]:[rank3]:{TIMEOUT.format(3)}", "srun: error: gpu07: task 3: Exited with exit code 1")
    timeout = _one(report, "collective_timeout")
    assert (timeout.rank, timeout.host) == (3, None)


def test_an_srun_task_that_is_one_rank_is_that_rank() -> None:
    report = _text(f"3: {CUDA}", "srun: error: gpu07: task 3: Exited with exit code 1")
    cuda = _one(report, "cuda_illegal_address")
    assert (cuda.host, cuda.rank) == ("gpu07", 3)


def test_an_open_mpi_rank_running_torchrun_is_not_a_global_rank() -> None:
    report = _text(f"[1,1]<stderr>:[default2]:{CUDA}", f"[1,0]<stderr>:[default2]:[rank2]:{TIMEOUT.format(2)}")
    cuda = _one(report, "cuda_illegal_address")
    assert (cuda.rank, cuda.local_rank) == (None, 2)


@pytest.mark.parametrize("order", [1, -1])
def test_a_local_rank_is_mapped_with_its_own_inputs_lines_whatever_the_file_order(order: int) -> None:
    node1 = ("n1.log", [f"[default3]:[rank3]:{TIMEOUT.format(3)}"])
    node2 = ("n2.log", [f"[default3]:[rank11]:{TIMEOUT.format(11)}", f"[default3]:{CUDA}"])
    report = _inputs(*[node1, node2][::order])
    assert _one(report, "cuda_illegal_address").rank == 11
    only_node1 = _inputs(node1, ("n2.log", [f"[default3]:{CUDA}"]))
    assert _one(only_node1, "cuda_illegal_address").rank is None  # node 1's local rank 3 is another rank
