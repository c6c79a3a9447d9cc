"""A hung job's folder as users hand it over: `gpu-triage diagnose DIR` (or a tar/zip of it), and the same
folder POSTed to /api/v1/diagnose as an archive or as multipart/form-data."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.training.hang.flight_recorder import DumpError
from gpu_triage.exporter.fr_decode import SandboxDecoder
from tests.conftest import REPO
from tests.exporter.cli.test_diagnose import cli

FR = REPO / "tests" / "fixtures" / "flight_recorder"
JOB = FR / "subgroup_hang"  # rank 3 never entered its sub-group's all_reduce


def _files() -> list[Path]:
    return sorted(p for p in JOB.rglob("*") if p.is_file() and p.name != "truth.json")


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for f in _files():
            t.add(f, arcname=str(f.relative_to(JOB)))
    return out.getvalue()


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for f in _files():
            z.write(f, str(f.relative_to(JOB)))
    return out.getvalue()


def _culprit(report: dict[str, object]) -> tuple[object, object]:
    root = report["findings"][0]  # type: ignore[index]
    return root["class"], root["details"]["ranks"]  # type: ignore[index]


def test_a_folder_an_archive_and_the_api_agree(tmp_path: Path, client: TestClient) -> None:
    folder = tmp_path / "job"
    shutil.copytree(JOB, folder)
    from_dir = json.loads(cli("--json", str(folder)).stdout)
    assert _culprit(from_dir) == ("collective_never_joined", [3])
    assert from_dir["hang"]["dumps"] == 4 and from_dir["summary"]["lines_read"] > 0
    (tmp_path / "job.tar.gz").write_bytes(_tar())
    (tmp_path / "job.zip").write_bytes(_zip())
    for archive in ("job.tar.gz", "job.zip"):
        assert _culprit(json.loads(cli("--json", str(tmp_path / archive)).stdout)) == ("collective_never_joined", [3])
    for body, kind in ((_tar(), "application/gzip"), (_zip(), "application/zip")):
        answer = client.post("/api/v1/diagnose", content=body, headers={"content-type": kind})
        assert answer.status_code == 200, answer.text
        assert _culprit(answer.json()) == ("collective_never_joined", [3])
    parts = [("files", (str(f.relative_to(JOB)), f.read_bytes(), "application/octet-stream")) for f in _files()]
    answer = client.post("/api/v1/diagnose", files=parts)
    assert answer.status_code == 200, answer.text
    assert _culprit(answer.json()) == ("collective_never_joined", [3])


def test_readable_report_names_the_rank_and_exits_1() -> None:
    result = cli(str(JOB))
    out = result.stdout.decode()
    assert result.returncode == 1
    assert out.startswith("Root cause: Rank 3 never entered all_reduce #5 of process group 2")
    assert "4 Flight Recorder dumps of 4 ranks read" in out
    healthy = cli(str(FR / "healthy"))
    assert healthy.returncode == 0 and healthy.stdout.decode().startswith("No problem found.")


def test_dumps_alone_are_enough_and_a_bad_one_is_named(tmp_path: Path, client: TestClient) -> None:
    for f in (FR / "rank_killed" / "json").iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "nccl_trace_rank_9").write_bytes(b"\x80\x02(K\x01")  # truncated
    result = cli("--json", str(tmp_path))
    report = json.loads(result.stdout)
    assert result.returncode == 1 and _culprit(report) == ("rank_missing", [2])
    assert b"nccl_trace_rank_9" in result.stderr and len(report["hang"]["skipped"]) == 1
    only_bad = client.post("/api/v1/diagnose", content=b"\x80\x02(K\x01")
    assert only_bad.status_code == 422 and "without a file name" in only_bad.json()["error"]


def test_the_api_bounds_archives(client: TestClient) -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("nccl_trace_rank_0", b"\0" * (80 << 20))  # a small zip that unpacks past the body limit
    answer = client.post("/api/v1/diagnose", content=out.getvalue(), headers={"content-type": "application/zip"})
    assert answer.status_code == 422 and "unpacks to more than" in answer.json()["error"]
    broken = client.post("/api/v1/diagnose", content=b"PK\x03\x04" + b"\0" * 100)
    assert broken.status_code == 422 and "zip archive cannot be read" in broken.json()["error"]


def test_the_decoding_process_refuses_a_memo_bomb_and_lives_on() -> None:
    bomb = b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 27) + b"."  # asks CPython for a 2 GiB memo
    real = (JOB / "pickle" / "nccl_trace_rank_2").read_bytes()
    with SandboxDecoder(memory=1 << 30, workers=1) as decode:
        pending = decode.submit("nccl_trace_rank_0", bomb, "pickle")
        with pytest.raises(DumpError, match="more memory than a dump may use"):
            pending()
        process = decode.slots[0]
        dump = decode.submit("nccl_trace_rank_2", real, "pickle")()
        assert decode.slots[0] is process  # the same process went on
        assert dump.rank == 2 and dump.groups["2"].ops[-1].seq == 5 and dump.groups["2"].ops[-1].frames


def test_a_decoding_process_that_dies_costs_only_its_dumps() -> None:
    real = (JOB / "pickle" / "nccl_trace_rank_2").read_bytes()
    with SandboxDecoder(workers=1) as decode:
        first = decode.submit("nccl_trace_rank_2", real, "pickle")
        assert first().rank == 2
        worker = decode.slots[0]
        assert worker is not None
        worker.proc.stdin.close()  # type: ignore[union-attr]  # the child sees the end of its input ...
        worker.proc.wait()
        lost = decode.submit("nccl_trace_rank_1", real, "pickle")  # ... and has ended: a fresh child reads this one
        assert lost().rank == 1 and decode.slots[0] is not worker
        worker = decode.slots[0]
        assert worker is not None
        os.kill(worker.proc.pid, signal.SIGSTOP)  # stopped before it reads the next dump ...
        held = decode.submit("nccl_trace_rank_0", real, "pickle")
        worker.proc.kill()  # ... and dies holding it
        with pytest.raises(DumpError, match="nccl_trace_rank_0: could not be decoded"):
            held()
        again = decode.submit("nccl_trace_rank_3", real, "pickle")()  # a fresh process
        assert again.rank == 3


def test_where_the_memory_cannot_be_capped_the_decoder_scans_instead(tmp_path: Path) -> None:
    """Under the systemd unit setrlimit is forbidden; a hard limit below the cap makes it fail the same way."""
    bomb = b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 27) + b"."
    script = tmp_path / "decode.py"
    script.write_text(
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from gpu_triage.diagnosis.training.hang.flight_recorder import DumpError\n"
        "from gpu_triage.exporter.fr_decode import SandboxDecoder\n"
        "with SandboxDecoder(memory=3 << 30, workers=1) as decode:\n"
        "    try:\n"
        "        decode.submit('nccl_trace_rank_0', sys.stdin.buffer.read(), 'pickle')()\n"
        "    except DumpError as e:\n"
        "        print(e)\n"
    )
    result = subprocess.run([sys.executable, str(script)], input=bomb, capture_output=True, timeout=60, check=False)
    assert b"memo index out of range" in result.stdout, result.stderr


class _Plant:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (f"with open({str(self.marker)!r}, 'w') as f: f.write('ran')",))


def test_a_hostile_dump_among_real_ones_runs_nothing(tmp_path: Path, client: TestClient) -> None:
    import pickle

    marker = tmp_path / "marker"
    folder = tmp_path / "job"
    shutil.copytree(JOB / "pickle", folder)
    (folder / "nccl_trace_rank_9").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Plant(marker)]}, 2))
    result = cli("--json", str(folder))
    assert not marker.exists()
    assert b"nccl_trace_rank_9" in result.stderr and b"plain values" in result.stderr
    assert _culprit(json.loads(result.stdout)) == ("collective_never_joined", [3])
    parts = [("f", (p.name, p.read_bytes(), "application/octet-stream")) for p in sorted(folder.iterdir())]
    answer = client.post("/api/v1/diagnose", files=parts)
    assert answer.status_code == 200 and not marker.exists()
    assert any("plain values" in s for s in answer.json()["hang"]["skipped"])
