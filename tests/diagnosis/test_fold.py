"""Folding: what many ranks share is one finding, with the ranks numerically and the odd ones named."""

from __future__ import annotations

from gpu_triage.diagnosis.core.findings import rank_ranges
from gpu_triage.diagnosis.training.diagnose import diagnose

TIMEOUT = (
    "[rank{r}]:[E0501 12:10:41.{r:06d} 4{r:03d} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for "
    "600021 milliseconds before timing out."
)
PROGRESS = (
    "[rank{r}]:[E0501 12:10:41.{r:06d} 4{r:03d} ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
    "Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, "
    "last completed NCCL work: {done}."
)


def _report(lines: list[str]) -> list[dict[str, object]]:
    findings = diagnose([(None, ["\n".join(lines).encode() + b"\n"])]).to_json()["findings"]
    assert isinstance(findings, list)
    return findings


def test_rank_ranges_are_numeric() -> None:
    assert rank_ranges([10, 2, 1, 0, 3, 11, 7]) == "0\u20133, 7, 10\u201311"
    assert rank_ranges([5]) == "5"


def test_timeouts_of_many_ranks_are_one_finding_naming_the_straggler_and_the_outliers() -> None:
    lines = []
    for r in range(16):
        seq = 7 if r == 12 else 9  # rank 12 is two collectives behind
        lines += [TIMEOUT.format(r=r, seq=seq), PROGRESS.format(r=r, seq=seq, done=seq - 1)]
    [group] = _report(lines)
    assert group["ranks"] == list(range(16)) and group["rank"] is None
    assert "(straggler: rank 12, last completed SeqNum 6, the others 8)" in str(group["title"])
    details = group["details"]
    assert isinstance(details, dict)
    assert (details["straggler_rank"], details["outliers"]) == (12, "12")
    members = group["members"]
    assert isinstance(members, list) and [m["rank"] for m in members] == list(range(16))


def test_a_fault_many_ranks_share_keeps_the_place_where_it_happened_first() -> None:
    oom = "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r} has a total capacity of 79.15 GiB"
    [group] = _report([oom.format(r=r) for r in (5, 1, 3, 7, 2)])
    assert (group["class"], group["rank"], group["ranks"]) == ("cuda_oom", 5, [1, 2, 3, 5, 7])
    assert "on ranks 1\u20133, 5, 7 (5)" in str(group["title"])


def test_even_two_places_are_one_finding_with_their_ranks() -> None:
    """The README's promise, one finding per shared symptom, holds for a 3-rank job as for a 64-rank one."""
    [group] = _report([TIMEOUT.format(r=r, seq=9) for r in range(3)])
    assert (group["ranks"], group["rank"], group["count"]) == ([0, 1, 2], None, 3)
    members = group["members"]
    assert isinstance(members, list) and [m["rank"] for m in members] == [0, 1, 2]
    [single] = _report([TIMEOUT.format(r=5, seq=9)])
    assert (single["rank"], single["ranks"]) == (5, [])


def test_deaths_of_different_exceptions_stay_apart_and_the_same_one_folds() -> None:
    def death(rank: int, exc: str) -> list[str]:
        return [
            f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "t.py", line 1',
            f"[rank{rank}]: {exc}",
        ]

    apart = _report([*death(0, "KeyError: 'input_ids'"), *death(1, "ValueError: bad shape")])
    assert sorted((f["rank"], f["details"]["cause"]) for f in apart) == [(0, "KeyError"), (1, "ValueError")]
    [same] = _report([*death(0, "KeyError: 'input_ids'"), *death(1, "KeyError: 'labels'")])
    assert (same["ranks"], same["details"]["cause"]) == ([0, 1], "KeyError")
