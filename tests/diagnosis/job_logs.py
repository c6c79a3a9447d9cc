"""Generated logs of a large job, written from the format strings (no megabytes checked in).

`write_job` writes one log per rank, as `torchrun --log-dir` or a Slurm `--output=%t` would, and the
kernel log of the node with the failing GPU: NCCL_DEBUG=INFO start-up (version, communicator init
tying host:pid to rank, CUDA device and bus id), some training output, then every rank but the
failed one reports PyTorch's collective timeout and its progress; the failed rank reports the
uncorrectable ECC error, and its node's kernel log holds Xid 48 and the row remap (Xid 63).

    python -m tests.diagnosis.job_logs DIR [RANKS]     # to look at the files
"""

from __future__ import annotations

import sys
from pathlib import Path

PER_NODE = 8
BUS_IDS = ("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")
SEQ = 4822


def host_of(rank: int) -> str:
    return f"node-c{rank // PER_NODE + 1:02d}"


def bus_id(rank: int) -> str:
    """The canonical PCI bus id of the rank's GPU, as findings name it."""
    packed = int(BUS_IDS[rank % PER_NODE], 16)
    return f"0000:{(packed >> 12) & 0xFF:02x}:00.0"


def rank_log(rank: int, ranks: int, failed: int) -> str:
    host, local, pid = host_of(rank), rank % PER_NODE, 40000 + rank
    lines = [
        f"{host}:{pid}:{pid} [{local}] NCCL INFO NCCL version 2.21.5+cuda12.4",
        f"{host}:{pid}:{pid + 100} [{local}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB ib0:10.1.0.{rank // PER_NODE + 1}<0>",
        f"{host}:{pid}:{pid + 100} [{local}] NCCL INFO ncclCommInitRank comm 0x55d4b0c0 rank {rank} nranks {ranks} "
        f"cudaDev {local} nvmlDev {local} busId {BUS_IDS[local]} commId 0x8e1c5a2f0b7d4c61 - Init COMPLETE",
        f"{host}:{pid}:{pid + 100} [{local}] NCCL INFO Channel 00/0 : {rank}[{local}] -> {(rank + 1) % ranks}[{(local + 1) % PER_NODE}] [send] via NET/IB/0/GDRDMA",
    ]
    lines += [f"[rank{rank}]:step {step} | loss {2.5 - step / 1000:.4f} | lr 1.9e-05" for step in range(1, 6)]
    if rank == failed:
        lines += [
            f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/workspace/train.py", line 211, in <module>',
            f"[rank{rank}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        ]
    else:
        prefix = f"[rank{rank}]:[E0501 12:10:41.{118252 + rank:06d} {pid} ProcessGroupNCCL.cpp:632] "
        lines += [
            prefix + f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={SEQ}, "
            "OpType=ALLREDUCE, NumelIn=33554432, NumelOut=33554432, Timeout(ms)=600000) ran for 600021 "
            "milliseconds before timing out.",
            prefix + f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Exception (either an error or timeout) detected "
            f"by watchdog at work: {SEQ}, last enqueued NCCL work: {SEQ}, last completed NCCL work: {SEQ - 1}.",
        ]
    return "\n".join(lines) + "\n"


def kernel_log(failed: int) -> str:
    host, bus, pid = host_of(failed), bus_id(failed)[5:10], 40000 + failed
    return (
        f"May  1 12:00:40 {host} kernel: NVRM: Xid (PCI:0000:{bus}): 48, pid={pid}, name=python3, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
        f"May  1 12:00:40 {host} kernel: NVRM: Xid (PCI:0000:{bus}): 63, pid={pid}, name=python3, Row Remapper: "
        "New row (0x0000000000a3f1b0) marked for remapping, reset gpu to activate.\n"
    )


def write_job(directory: Path, ranks: int = 64, failed: int = 27) -> list[Path]:
    """The job's files, sorted: one per rank, then the failed node's kernel log."""
    directory.mkdir(parents=True, exist_ok=True)
    width = len(str(ranks - 1))
    paths = []
    for rank in range(ranks):
        path = directory / f"rank{rank:0{width}d}.log"
        path.write_text(rank_log(rank, ranks, failed), encoding="utf-8")
        paths.append(path)
    kern = directory / f"{host_of(failed)}.kern.log"
    kern.write_text(kernel_log(failed), encoding="utf-8")
    return [*paths, kern]


if __name__ == "__main__":
    print(*write_job(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64), sep="\n")
