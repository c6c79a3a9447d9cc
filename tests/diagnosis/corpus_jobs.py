"""Generated members of the training-log corpus: hard wrapping, and the jobs too big to check in.

`wrap` is how the corpus's `*_wrapNN` cases were made from their unwrapped twins (a ticket system that
breaks every line at a fixed column, mid-word). `big_job_64` and `big_job_256` write whole jobs, line by
line from the NCCL and PyTorch format strings, deterministically: the same seed gives the same bytes.

    python -m tests.diagnosis.corpus_jobs wrap CASE.log 100 > CASE_wrap100.log
    python -m tests.diagnosis.corpus_jobs big_job_64 /tmp/big64      # then: gpu-triage diagnose /tmp/big64/*
"""

from __future__ import annotations

import datetime as dt
import random
import sys
from collections.abc import Callable
from pathlib import Path

H100_BUS = ["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]
START = dt.datetime(2025, 3, 12, 2, 10, 0)


def wrap(text: str, width: int) -> str:
    """Every line longer than `width` broken into `width`-column pieces; shorter lines untouched."""
    out = []
    for line in text.split("\n"):
        out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out)


class _Rank:
    def __init__(self, rank: int, host: str, local: int, pid: int, comm: str) -> None:
        self.rank, self.host, self.local, self.pid, self.comm = rank, host, local, pid, comm
        self.bus = H100_BUS[local]

    def nccl(self, tid: int) -> str:
        return f"{self.host}:{self.pid}:{tid} [{self.local}]"


def _ranks(rng: random.Random, hosts: list[str]) -> list[_Rank]:
    out = []
    for host in hosts:
        base = rng.randint(10_000, 3_000_000)
        for local in range(8):
            comm = f"0x{rng.randint(0x5500_0000_0000, 0x56FF_FFFF_FFFF):x}"
            out.append(_Rank(len(out), host, local, base + 1 + local * 3, comm))
    return out


def _cpp(rank: int, when: dt.datetime, sev: str, where: str, msg: str) -> str:
    """PyTorch 2.4+ C++ log prefix: [rankN]:[E<month*100+day> hh:mm:ss.nanoseconds file:line]."""
    ns = (when.microsecond * 1000 + rank * 7919) % 1_000_000_000
    return f"[rank{rank}]:[{sev}{when.month * 100 + when.day} {when:%H:%M:%S}.{ns:09d} {where}] {msg}"


def _init_lines(r: _Rank, world: int, nodes: int, commid: str, nccl: str) -> list[str]:
    """NCCL_DEBUG=INFO start-up of one rank (2.21-2.27 wording)."""
    t = r.pid + 47
    lines = [f"{r.nccl(r.pid)} NCCL INFO Bootstrap: Using eth0:10.8.{r.rank // 8}.{10 + r.rank % 8}<0>"]
    if r.rank == 0:
        lines.append(f"{r.nccl(r.pid)} NCCL INFO NCCL version {nccl}+cuda12.4")
    lines += [
        f"{r.nccl(r.pid)} NCCL INFO cudaDriverVersion 12040",
        f"{r.nccl(r.pid)} NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.",
        f"{r.nccl(r.pid)} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:10.8.{r.rank // 8}.{10 + r.rank % 8}<0>",
        f"{r.nccl(r.pid)} NCCL INFO Using network IB",
        f"{r.nccl(r.pid)} NCCL INFO ncclCommInitRank comm {r.comm} rank {r.rank} nranks {world} cudaDev {r.local} nvmlDev {r.local} busId {r.bus} commId {commid} - Init START",
        f"{r.nccl(t)} NCCL INFO comm {r.comm} rank {r.rank} nRanks {world} nNodes {nodes} localRanks 8 localRank {r.local} MNNVL 0",
        f"{r.nccl(t)} NCCL INFO P2P Chunksize set to 524288",
        f"{r.nccl(r.pid)} NCCL INFO ncclCommInitRank comm {r.comm} rank {r.rank} nranks {world} cudaDev {r.local} nvmlDev {r.local} busId {r.bus} commId {commid} - Init COMPLETE",
    ]
    return lines


def _timeout_lines(r: _Rank, when: dt.datetime, seq: int, pt27: bool) -> list[str]:
    """One rank's watchdog timeout, PyTorch 2.5 (pt27=False) or 2.7 (pt27=True) wording."""
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r.rank}] "
    work = f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=33554432, NumelOut=33554432, Timeout(ms)=600000)"
    lines = [
        _cpp(
            r.rank,
            when,
            "E",
            "ProcessGroupNCCL.cpp:632" if pt27 else "ProcessGroupNCCL.cpp:616",
            f"[Rank {r.rank}] Watchdog caught collective operation timeout: {work} ran for {600000 + r.rank % 97} milliseconds before timing out.",
        )
    ]
    if pt27:
        lines += [
            _cpp(
                r.rank,
                when,
                "E",
                "ProcessGroupNCCL.cpp:2299",
                f"{pg} failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}",
            ),
            _cpp(
                r.rank,
                when,
                "E",
                "ProcessGroupNCCL.cpp:670",
                "Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
            ),
            _cpp(r.rank, when, "E", "ProcessGroupNCCL.cpp:2168", f"{pg}First PG on this rank to signal dumping."),
        ]
    else:
        lines.append(
            _cpp(
                r.rank,
                when,
                "E",
                "ProcessGroupNCCL.cpp:1785",
                f"{pg}Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
            )
        )
    lines += [
        _cpp(
            r.rank,
            when,
            "E",
            "ProcessGroupNCCL.cpp:1609",
            f"{pg}Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
        ),
        _cpp(
            r.rank,
            when,
            "F",
            "ProcessGroupNCCL.cpp:1306",
            f"{pg}{pg}Terminating the process after attempting to dump debug info, due to collective timeout or exception.",
        ),
    ]
    return lines


def _progress(step: int) -> str:
    loss = 2.9 * 0.9995**step
    return f"step {step:6d} | loss {loss:.4f} | lr 3.00e-04 | tokens/s {1_840_000 + step * 37 % 9000}"


def big_job_64(out: Path, seed: int = 64) -> list[Path]:
    """8 nodes x 8 H100 (NCCL 2.21.5, PyTorch 2.5), one file per rank plus node-c04's kernel log.

    GPU 3 of node-c04 (rank 27) takes an uncorrectable ECC error (Xid 48, then Xid 63 for the row it
    remaps); rank 27 dies on the CUDA error, the other 63 ranks time out in the next all-reduce."""
    rng = random.Random(seed)
    hosts = [f"node-c{i:02d}" for i in range(1, 9)]
    ranks = _ranks(rng, hosts)
    commid = f"0x{rng.getrandbits(64):016x}"
    out.mkdir(parents=True, exist_ok=True)
    fault = START + dt.timedelta(minutes=21, seconds=7)
    seq = 4913
    paths = []
    for r in ranks:
        lines = _init_lines(r, 64, 8, commid, "2.21.5")
        if r.rank == 0:
            lines += [_progress(s) for s in range(4800, 4911, 10)]
        if r.rank == 27:
            tb = [
                "Traceback (most recent call last):",
                '  File "/workspace/pretrain.py", line 233, in <module>',
                "    main()",
                '  File "/workspace/pretrain.py", line 201, in main',
                "    loss.backward()",
                '  File "/usr/local/lib/python3.10/dist-packages/torch/_tensor.py", line 581, in backward',
                "    torch.autograd.backward(",
                "RuntimeError: CUDA error: uncorrectable ECC error encountered",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
                "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            ]
            lines += ["[rank27]: " + x for x in tb]
        else:
            lines += _timeout_lines(r, fault + dt.timedelta(seconds=600 + r.rank % 5), seq, pt27=False)
        path = out / f"rank-{r.rank:02d}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    victim = ranks[27]
    kern = [
        f"Mar 12 02:31:07 node-c04 kernel: NVRM: Xid (PCI:0000:5d:00): 48, pid={victim.pid}, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 5, subpartition 1.",
        f"Mar 12 02:31:07 node-c04 kernel: NVRM: Xid (PCI:0000:5d:00): 63, pid={victim.pid}, name=python3, Row Remapper: New row (0x00000002b41c88e0) marked for remapping, reset gpu to activate.",
        "Mar 12 02:31:09 node-c04 kernel: nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
    ]
    kpath = out / "node-c04-kernel.log"
    kpath.write_text("\n".join(kern) + "\n")
    return [*paths, kpath]


def big_job_256(out: Path, seed: int = 256) -> list[Path]:
    """32 nodes x 8 H100 under `srun -l` (NCCL 2.27.7 with WARN timestamps, PyTorch 2.7): one file.

    Rank 147's HCA on gpu-j019 loses its link: NCCL reports an IB completion with status 12 (transport
    retry counter exceeded) to its peer on gpu-j020; rank 147 dies with ncclRemoteError, the other 255
    ranks time out in the same all-reduce and the step is cancelled."""
    rng = random.Random(seed)
    hosts = [f"gpu-j{i:03d}" for i in range(1, 33)]
    ranks = _ranks(rng, hosts)
    commid = f"0x{rng.getrandbits(64):016x}"
    out.mkdir(parents=True, exist_ok=True)
    fault = START + dt.timedelta(hours=3, minutes=2, seconds=41)
    seq = 18822
    rows: list[tuple[float, int, str]] = []  # (seconds, rank, line); rank -1 = srun itself
    for r in ranks:
        for i, line in enumerate(_init_lines(r, 256, 32, commid, "2.27.7")):
            rows.append((2.0 + r.rank * 0.004 + i * 0.002, r.rank, line))
    rows += [(60.0 + s * 0.6, 0, _progress(s)) for s in range(18700, 18821, 20)]
    bad, peer = ranks[147], ranks[155]
    when = f"[{fault:%Y-%m-%d %H:%M:%S}]"
    ib = [
        "",
        f"{when} {bad.nccl(bad.pid + 61)} transport/net_ib.cc:2458 NCCL WARN NET/IB: Got completion from peer 10.8.19.{10 + peer.local}<51234> with status=12 opcode=0 len=0 vendor err 129 (Recv) hca mlx5_3",
        f"{bad.nccl(bad.pid + 61)} NCCL INFO transport/net.cc:1302 -> 6",
        f"{bad.nccl(bad.pid + 61)} NCCL INFO proxy.cc:698 -> 6",
        f"{bad.nccl(bad.pid + 61)} NCCL INFO proxy.cc:878 -> 6 [Progress Thread]",
    ]
    t_fault = (fault - START).total_seconds()
    rows += [(t_fault + i * 0.001, 147, x) for i, x in enumerate(ib)]
    exc = [
        "Traceback (most recent call last):",
        '  File "/workspace/train_llm.py", line 318, in <module>',
        "    train()",
        '  File "/workspace/train_llm.py", line 271, in train',
        "    dist.all_reduce(grad_norm)",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there was a network error, NCCL version 2.27.7",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "Last error:",
        "NET/IB: Got completion from peer 10.8.19.15<51234> with status=12 opcode=0 len=0 vendor err 129 (Recv) hca mlx5_3",
    ]
    rows += [(t_fault + 1.5 + i * 0.001, 147, "[rank147]: " + x) for i, x in enumerate(exc)]
    for r in ranks:
        if r.rank == 147:
            continue
        when_r = fault + dt.timedelta(seconds=600 + (r.rank * 13) % 7)
        for i, line in enumerate(_timeout_lines(r, when_r, seq, pt27=True)):
            rows.append(((when_r - START).total_seconds() + i * 0.001, r.rank, line))
    t_end = t_fault + 615
    srun = [
        "srun: error: gpu-j019: task 147: Exited with exit code 1",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        f"slurmstepd: error: *** STEP 88412.0 ON gpu-j001 CANCELLED AT {START + dt.timedelta(seconds=t_end):%Y-%m-%dT%H:%M:%S} ***",
    ]
    rows += [(t_end + i, -1, x) for i, x in enumerate(srun)]
    rows += [
        (t_end + 5, -1, f"srun: error: {h}: tasks {8 * i}-{8 * i + 7}: Aborted (core dumped)")
        for i, h in enumerate(hosts)
        if h != "gpu-j019"
    ]
    rows.sort(key=lambda row: row[0])
    text = "\n".join(x if rank < 0 else f"{rank:>3}: {x}" for _, rank, x in rows) + "\n"
    path = out / "slurm-88412.out"
    path.write_text(text)
    return [path]


GENERATORS: dict[str, Callable[[Path], list[Path]]] = {"big_job_64": big_job_64, "big_job_256": big_job_256}


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "wrap":
        sys.stdout.write(wrap(Path(argv[2]).read_text(), int(argv[3])))
        return 0
    if len(argv) == 3 and argv[1] in GENERATORS:
        for path in GENERATORS[argv[1]](Path(argv[2])):
            print(path)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
