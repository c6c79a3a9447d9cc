"""NCCL RAS reports, as NCCL's documentation prints them (tests/fixtures/nccl_ras/README.md)."""

from __future__ import annotations

from pathlib import Path

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.nccl_ras import is_ras, parse_ras

RAS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_ras"
FR = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def test_every_report_is_told_by_its_content() -> None:
    for f in RAS.iterdir():
        if f.suffix in (".txt", ".json"):
            assert is_ras(f.read_bytes()[:4096]), f.name
    assert not is_ras(b"NCCL version 2.21.5+cuda12.4\n[rank0]: step 5\n")


def test_missing_rank_2_24() -> None:
    report = parse_ras("r", (RAS / "incomplete-2.24.txt").read_bytes())
    assert [(r.rank, r.why, r.comm) for r in report.ranks] == [(21, "missing", "#0-0 (cf264af53edbe986)")]


def test_dead_process_and_missing_rank_2_26() -> None:
    report = parse_ras("r", (RAS / "dead-2.26.txt").read_bytes())
    assert [(d.pid, d.host, d.gpu) for d in report.dead] == [(3487984, "172.16.64.213", 5)]
    assert [(r.rank, r.host, r.pid, r.gpu, r.why) for r in report.ranks] == [
        (21, "172.16.64.213", 3487984, 5, "missing")
    ]


def test_operation_count_mismatch_names_the_ranks_behind() -> None:
    report = parse_ras("r", (RAS / "mismatch-2.26.txt").read_bytes())
    assert sorted((r.rank, r.count) for r in report.ranks) == [(r, 6649) for r in (0, 2, 3, 4, 5, 7)]
    assert report.ahead["#0-0 (27a079b828ff1a75)"] == 6650


def test_2_24_wording_of_the_count_mismatch_and_single_outliers() -> None:
    text = b"""Warnings
========

#0-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different collective operation counts
  31 ranks have launched up to operation 6650
  Rank 9 has launched up to operation 6649 -- GPU 1 managed by process 77 on node gpu-n012
"""
    report = parse_ras("r", text)
    assert [(r.rank, r.count, r.host, r.gpu) for r in report.ranks] == [(9, 6649, "gpu-n012", 1)]


def test_json_report_missing_rank() -> None:
    report = parse_ras("r", (RAS / "missing-2.29.json").read_bytes())
    assert [(r.rank, r.host, r.pid, r.gpu, r.why) for r in report.ranks] == [
        (1, "172.16.64.245", 1524345, 1, "missing")
    ]


def test_ras_alone_is_a_diagnosis() -> None:
    report = diagnose([("ras.txt", [(RAS / "dead-2.26.txt").read_bytes()])]).to_json()
    root = report["findings"][0]
    assert root["class"] == "rank_missing" and root["rank"] == 21 and root["host"] == "172.16.64.213"
    assert root["details"]["source"] == "nccl_ras"
    assert report["hang"]["ras"][0]["dead_processes"][0]["pid"] == 3487984


def test_ras_behind_is_said_to_need_a_second_query() -> None:
    report = diagnose([("ras.txt", [(RAS / "mismatch-2.26.txt").read_bytes()])]).to_json()
    root = report["findings"][0]
    assert root["class"] == "collective_never_joined" and root["details"]["ranks"] == [0, 2, 3, 4, 5, 7]
    assert "query again" in root["title"]


def test_ras_and_dumps_naming_the_same_rank_make_one_finding() -> None:
    dumps = [(str(f), [f.read_bytes()]) for f in sorted((FR / "rank_killed" / "pickle").iterdir())]
    ras = (RAS / "dead-2.26.txt").read_bytes().replace(b"Rank 21 -- GPU 5", b"Rank 2 -- GPU 2")
    # RAS numbers ranks per communicator: the 32-rank one of the sample is not this 4-rank job's world.
    other = diagnose([*dumps, ("ras.txt", [ras])]).to_json()
    assert next(f["host"] for f in other["findings"] if f["class"] == "rank_missing") is None
    ras = ras.replace(b"        32        32   RUNNING", b"         4         4   RUNNING")
    report = diagnose([*dumps, ("ras.txt", [ras])]).to_json()
    hang = [f for f in report["findings"] if f["class"] == "rank_missing"]
    assert len(hang) == 1 and hang[0]["rank"] == 2 and hang[0]["details"]["source"] == "flight_recorder"
    # What RAS adds: where the rank ran, and its own line as evidence.
    assert hang[0]["host"] == "172.16.64.213" and hang[0]["details"]["ras"] == "missing"
    assert any(e.get("file") == "ras.txt" for e in hang[0]["evidence"])
