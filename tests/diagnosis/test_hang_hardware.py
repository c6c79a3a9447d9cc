"""The hang with the kernel: the culprit's GPU logged an XID, so the XID is the root cause and the hang its symptom."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.training.diagnose import diagnose

FR = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
BUS = {0: "18000", 1: "2a000", 2: "5d000", 3: "9a000"}


def _init_lines() -> bytes:
    # NCCL's init line (init.cc: "%s:%d:%d [%d] NCCL INFO ncclCommInitRank comm %p rank %d nranks %d cudaDev %d
    # nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE"), one per rank of the job, as rank 0's log shows them.
    return b"".join(
        f"gpu-n007:{4100 + r}:{4100 + r} [{r}] NCCL INFO ncclCommInitRank comm 0x55d4b0c0{r} rank {r} nranks 4 "
        f"cudaDev {r} nvmlDev {r} busId {BUS[r]} commId 0x8e1c5a2f0b7d4c61 - Init COMPLETE\n".encode()
        for r in range(4)
    )


def _dumps(scenario: str) -> list[tuple[str, list[bytes]]]:
    return [(str(f), [f.read_bytes()]) for f in sorted((FR / scenario / "pickle").iterdir())]


def _xid(bus: str) -> bytes:
    # The driver's Xid line (real capture, tests/fixtures/training), on the culprit's node.
    return f"Mar 12 03:54:55 gpu-n007 kernel: NVRM: Xid (PCI:0000:{bus[:2]}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n".encode()


def _hang(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["class"] == "collective_never_joined")


def test_xid_79_on_the_culprits_gpu_is_the_root_cause() -> None:
    report = diagnose([*_dumps("never_joined"), ("job.log", [_init_lines()]), ("kern.log", [_xid(BUS[2])])]).to_json()
    root, hang = report["findings"][0], _hang(report)
    assert root["class"] == "xid_79" and root["gpu"] == "0000:5d:00.0"
    assert hang["rank"] == 2 and hang["gpu"] == "0000:5d:00.0" and hang["host"] == "gpu-n007"
    assert hang["details"]["likely_caused_by"] == root["id"]


def test_without_the_kernel_log_the_hang_is_the_root_cause_on_the_rank_s_gpu() -> None:
    report = diagnose([*_dumps("never_joined"), ("job.log", [_init_lines()])]).to_json()
    root = report["findings"][0]
    assert root["class"] == "collective_never_joined" and root["gpu"] == "0000:5d:00.0"
    assert "likely_caused_by" not in root["details"]


def test_an_xid_on_another_gpu_does_not_make_the_hang_its_symptom() -> None:
    report = diagnose([*_dumps("never_joined"), ("job.log", [_init_lines()]), ("kern.log", [_xid(BUS[0])])]).to_json()
    hang = _hang(report)
    assert hang["rank"] == 2 and "likely_caused_by" not in hang["details"]


def test_two_culprits_each_get_their_gpu() -> None:
    lines = b"".join(
        f"gpu-n{8 + r // 4:03d}:{4100 + r}:{4100 + r} [{r % 4}] NCCL INFO ncclCommInitRank comm 0x55d4b0c0{r} rank {r} "
        f"nranks 8 cudaDev {r % 4} nvmlDev {r % 4} busId {BUS[r % 4]} commId 0x8e1c5a2f0b7d4c61 - Init COMPLETE\n".encode()
        for r in range(8)
    )
    report = diagnose([*_dumps("two_culprits_8"), ("job.log", [lines])]).to_json()
    hang = _hang(report)
    assert hang["details"]["ranks"] == [3, 6]
    assert hang["details"]["gpus"] == {"3": "0000:9a:00.0", "6": "0000:5d:00.0"}
    assert hang["details"]["hosts"] == {"3": "gpu-n008", "6": "gpu-n009"}
