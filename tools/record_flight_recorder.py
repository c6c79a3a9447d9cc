"""Record real PyTorch Flight Recorder dumps of hung jobs, for gpu-triage's tests.

Runs small N-rank jobs on the CPU with the Gloo backend (Flight Recorder is on by default there) through
the ways a job stops making progress, and writes, per scenario, what a user would collect:

    OUT/<scenario>/pickle/nccl_trace_rank_<r>   the pickle dump (`_dump_fr_trace`), one per rank still alive
    OUT/<scenario>/json/nccl_trace_rank_<r>.json the JSON dump (`_dump_fr_trace_json`)
    OUT/<scenario>/logs/rank<r>.log              what the rank printed (stderr and stdout)
    OUT/<scenario>/truth.json                    what the scenario did: the culprits, the kind of hang

Gloo does not dump on timeout by itself: as a job's own timeout handler would, each rank dumps when its
collective raises, and a watcher thread dumps for the ranks that are stuck elsewhere (the culprit that
never entered the collective) once the others have given up. A rank that is killed leaves no dump.

Needs PyTorch (`pip install torch`, CPU build); gpu-triage, its CI and its tests do not. Run it with the
interpreter that has torch:

    .venv-torch/bin/python tools/record_flight_recorder.py tests/fixtures/flight_recorder
    .venv-torch/bin/python tools/record_flight_recorder.py OUT --scenario op_mismatch --scenario healthy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

TIMEOUT_S = 4.0  # the process groups' timeout: how long a rank waits in a hung collective
STEPS = 6  # training steps per job; the faults happen at step FAULT_STEP
FAULT_STEP = 4


@dataclass(frozen=True)
class Scenario:
    name: str
    world: int
    truth: dict[str, Any]
    subgroups: tuple[tuple[int, ...], ...] = ()
    fault: dict[str, Any] = field(default_factory=dict)


SCENARIOS = [
    Scenario("healthy", 4, {"class": None, "culprits": [], "note": "every step completes; dumped at the end"}),
    Scenario(
        "never_joined",
        4,
        {"class": "collective_never_joined", "culprits": [2], "group": "default", "note": "rank 2 blocks"},
        fault={"kind": "block", "ranks": [2]},
    ),
    Scenario(
        "op_mismatch",
        4,
        {"class": "collective_mismatch", "culprits": [1], "group": "default", "mismatch": "op"},
        fault={"kind": "broadcast", "ranks": [1]},
    ),
    Scenario(
        "size_mismatch",
        4,
        {
            "class": "collective_mismatch",
            "culprits": [3],
            "group": "default",
            "mismatch": "size",
            "note": "rank 3 all_reduces 32 elements, the others 16; Gloo aborts a victim, which leaves no dump",
        },
        fault={"kind": "size", "ranks": [3]},
    ),
    Scenario(
        "straggler",
        4,
        {"class": "collective_straggler", "culprits": [1], "group": "default", "note": "joins after the timeout"},
        fault={"kind": "late", "ranks": [1]},
    ),
    Scenario(
        "rank_killed",
        4,
        {"class": "rank_missing", "culprits": [2], "group": "default", "note": "SIGKILL before the collective"},
        fault={"kind": "kill", "ranks": [2]},
    ),
    Scenario(
        "subgroup_hang",
        4,
        {"class": "collective_never_joined", "culprits": [3], "group": "subgroup", "note": "rank 3 blocks in [2, 3]"},
        subgroups=((0, 1), (2, 3)),
        fault={"kind": "block_subgroup", "ranks": [3]},
    ),
    Scenario(
        "p2p_unmatched",
        2,
        {"class": "p2p_unmatched", "culprits": [0], "waiting": [1], "note": "rank 1 receives from 0, 0 never sends"},
        fault={"kind": "recv_without_send", "ranks": [1], "peer": 0},
    ),
    Scenario(
        "p2p_unmatched_4",
        4,
        {
            "class": "p2p_unmatched",
            "culprits": [0],
            "waiting": [1],
            "partner_in_dumps": False,
            "note": "as p2p_unmatched in 4 ranks: Gloo records no send/recv, so which of 0, 2, 3 owes the send is "
            "in no dump or log",
        },
        fault={"kind": "recv_without_send", "ranks": [1], "peer": 0},
    ),
    Scenario(
        "two_culprits_8",
        8,
        {"class": "collective_never_joined", "culprits": [3, 6], "group": "default", "note": "ranks 3 and 6 block"},
        fault={"kind": "block", "ranks": [3, 6]},
    ),
]


def _dump(out: Path, rank: int) -> None:
    import torch

    c10d = torch._C._distributed_c10d
    (out / "pickle").mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(parents=True, exist_ok=True)
    (out / "pickle" / f"nccl_trace_rank_{rank}").write_bytes(c10d._dump_fr_trace())
    raw = c10d._dump_fr_trace_json()
    (out / "json" / f"nccl_trace_rank_{rank}.json").write_bytes(raw if isinstance(raw, bytes) else raw.encode())


def _worker(scenario: Scenario, rank: int, port: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    # The store waits for slow starters (eight processes importing torch on two cores); the group's own
    # timeout is the short one the hung collectives run into.
    store = dist.TCPStore("127.0.0.1", port, scenario.world, rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=scenario.world, timeout=timedelta(seconds=TIMEOUT_S)
    )
    groups = [dist.new_group(list(ranks)) for ranks in scenario.subgroups]
    mine = next((g for g, ranks in zip(groups, scenario.subgroups, strict=True) if rank in ranks), None)
    dumped = threading.Event()
    dumping = threading.Lock()  # the watcher and the timeout handler may both get here: one dump, written whole

    def dump_once() -> None:
        with dumping:
            if not dumped.is_set():
                _dump(out, rank)
                dumped.set()

    def watcher() -> None:  # a rank stuck outside a collective never raises: dump once the others gave up
        time.sleep(TIMEOUT_S * 4)
        dump_once()
        print(f"rank {rank}: watcher dumped the flight recorder and stops the process", flush=True)
        os._exit(3)

    threading.Thread(target=watcher, daemon=True).start()
    faulty = rank in scenario.fault.get("ranks", ())
    t = torch.ones(16)
    try:
        for step in range(STEPS):
            _step(scenario, rank, step, t, mine, scenario.fault.get("kind") if faulty and step == FAULT_STEP else None)
        dist.barrier()
        print(f"rank {rank}: all steps done", flush=True)
    except Exception:  # the job's timeout handler: dump, then give up with the traceback
        traceback.print_exc()
        sys.stderr.flush()
        dump_once()
        print(f"rank {rank}: dumped the flight recorder", flush=True)
        os._exit(1)
    dump_once()
    dist.destroy_process_group()


def _step(scenario: Scenario, rank: int, step: int, t: Any, mine: Any, kind: str | None) -> None:
    """One training step: the sub-group's all_reduce (where there are sub-groups), then the job's."""
    import torch
    import torch.distributed as dist

    if mine is not None:
        if kind == "block_subgroup":
            print(f"rank {rank}: step {step}: blocked before the sub-group all_reduce", flush=True)
            time.sleep(3600)
        dist.all_reduce(t, group=mine)
    if kind == "block":
        print(f"rank {rank}: step {step}: blocked (a data loader that never returns)", flush=True)
        time.sleep(3600)
    elif kind == "kill":
        print(f"rank {rank}: step {step}: killing myself with SIGKILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "late":
        print(f"rank {rank}: step {step}: sleeping {TIMEOUT_S * 2:g}s before the all_reduce", flush=True)
        time.sleep(TIMEOUT_S * 2)
    elif kind == "recv_without_send":
        peer = scenario.fault["peer"]
        print(f"rank {rank}: step {step}: receiving from rank {peer}", flush=True)
        dist.recv(t, src=peer)
    if kind == "broadcast":
        dist.broadcast(t, src=0)
    elif kind == "size":
        dist.all_reduce(torch.ones(32))
    else:
        dist.all_reduce(t)
    t.div_(scenario.world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prefix(proc: subprocess.Popen[bytes], log: Any, tag: bytes) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(tag + line)


def record(scenario: Scenario, root: Path) -> None:
    out = root / scenario.name
    if out.exists():
        shutil.rmtree(out)
    (out / "logs").mkdir(parents=True)
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for rank in range(scenario.world):
        log = (out / "logs" / f"rank{rank}.log").open("wb")
        cmd = [sys.executable, __file__, "--worker", scenario.name, str(rank), str(port), str(out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        # Each line tagged as torchrun's `--log-line-prefix-template '[rank${rank}]:'` tags it.
        tee = threading.Thread(target=_prefix, args=(proc, log, f"[rank{rank}]:".encode()), daemon=True)
        tee.start()
        procs.append((proc, log, tee))
    for proc, log, tee in procs:
        try:
            proc.wait(timeout=TIMEOUT_S * 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        tee.join()
        log.close()
    import torch

    truth = {
        "scenario": scenario.name,
        "world_size": scenario.world,
        "subgroups": [list(g) for g in scenario.subgroups],
        "torch": torch.__version__,
        "backend": "gloo",
        "exit_codes": [p.returncode for p, _, _ in procs],
        **scenario.truth,
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(
        f"{scenario.name}: exit codes {truth['exit_codes']}, dumps {sorted(p.name for p in (out / 'pickle').iterdir())}"
    )


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        name, rank, port, out = argv[1], int(argv[2]), int(argv[3]), Path(argv[4])
        _worker(next(s for s in SCENARIOS if s.name == name), rank, port, out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS])
    args = parser.parse_args(argv)
    chosen: list[Scenario] = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    run: Callable[[Scenario, Path], None] = record
    for scenario in chosen:
        run(scenario, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
