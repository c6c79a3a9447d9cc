"""Where a finding happened when its line does not say it all (diagnosis/training/place/identity.py): launcher tasks,
torchrun's local ranks, and the fallbacks that must not carry a place across hosts or inputs."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.training.diagnose import Report, diagnose

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


IB = "NCCL WARN NET/IB : Got completion from peer 10.3.1.12<39811> with error 12, opcode 0, len 0, vendor err 129"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 5 has a total capacity of "
    "79.15 GiB of which 3.25 MiB is free."
)
XID_3B = "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off the bus."


def _comm(host: str, pid: int, rank: int, nranks: int, bus: str) -> str:
    dev = rank % 8
    return f"{host}:{pid}:{pid + 60} [{dev}] NCCL INFO comm 0x55d4b0c{rank} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - Init COMPLETE"


def test_an_inputs_one_host_is_not_given_to_ranks_nothing_places_there() -> None:
    """A node's console names one host, but carries other nodes' ranks: rank 9 on cudaDev 1 means node2
    holds ranks 8-15, so nothing puts ranks 3 and 5 there."""
    report = _text(
        _comm("node2", 7731, 9, 16, "3b000"),
        f"node2:7731:7800 [1] {IB}",
        f"[rank3]:{TIMEOUT.format(3)}",
        f"[rank5]: {OOM}",
    )
    assert (_one(report, "cuda_oom").host, _one(report, "collective_timeout").host) == (None, None)
    assert (_one(report, "ib_completion_timeout").host, _one(report, "ib_completion_timeout").rank) == ("node2", 9)


def test_the_one_host_of_a_single_node_job_is_every_lines_host() -> None:
    report = _text(
        _comm("node2", 7000, 0, 2, "18000"),
        _comm("node2", 7001, 1, 2, "3b000"),
        f"[rank0]:{TIMEOUT.format(0)}",
        f"[rank1]:{TIMEOUT.format(1)}",
        CUDA,
    )
    cuda = _one(report, "cuda_illegal_address")
    assert (cuda.host, cuda.rank, cuda.place_inferred) == ("node2", None, True)


def test_one_ranks_output_does_not_claim_a_line_another_process_printed() -> None:
    """pid 4444 on cudaDev 5 printed the IB error; nothing ties it to rank 3, the input's one tag."""
    report = _text(f"node1:4444:4500 [5] {IB}", f"[rank3]:{TIMEOUT.format(3)}")
    assert _one(report, "ib_completion_timeout").rank is None
    assert _one(report, "collective_timeout").rank == 3


def test_one_ranks_output_places_its_untagged_lines() -> None:
    report = _text(f"[rank3]:{TIMEOUT.format(3)}", CUDA)
    cuda = _one(report, "cuda_illegal_address")
    assert (cuda.rank, cuda.place_inferred) == (3, True)


def test_a_bus_id_names_no_rank_while_the_jobs_gpus_are_partly_known() -> None:
    """Every node has a GPU at 3b:00: with 2 of 16 ranks known, node2's dmesg is not node1's rank 1."""
    node1 = ("node1.log", [_comm("node1", 100, 0, 16, "18000"), _comm("node1", 101, 1, 16, "3b000")])
    xid = _one(_inputs(node1, ("dmesg-node2.log", [XID_3B])), "xid_79")
    assert (xid.host, xid.rank) == (None, None)


def test_a_bus_id_names_the_one_rank_on_it_once_every_ranks_gpu_is_known() -> None:
    node1 = ("node1.log", [_comm("node1", 100, 0, 2, "18000"), _comm("node1", 101, 1, 2, "3b000")])
    xid = _one(_inputs(node1, ("dmesg.log", [XID_3B])), "xid_79")
    assert (xid.host, xid.rank, xid.place_inferred) == ("node1", 1, True)
