"""Offline diagnosis as users run it: `gpu-triage diagnose` and POST /api/v1/diagnose agree, bad input is safe."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.training import diagnose as training
from gpu_triage.exporter.cli.commands import diagnose_files
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.log_input import CHUNK_BYTES, SCAN_ENV, InputTooLargeError, decoded, scan_in_parallel
from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE

FIXTURES = REPO / "tests" / "fixtures" / "training"
XID79 = FIXTURES / "scenarios" / "xid79_with_nccl.log"
HEALTHY = FIXTURES / "healthy_nccl_info.log"


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([GPU_TRIAGE, "diagnose", *args], input=stdin, capture_output=True, timeout=60, check=False)


def test_the_cli_and_the_api_agree(client: TestClient) -> None:
    text = XID79.read_bytes()
    from_cli = json.loads(cli("--json", "-", stdin=text).stdout)
    from_api = client.post("/api/v1/diagnose", content=text, headers={"content-type": "text/plain"}).json()
    assert from_cli == from_api
    assert from_api["findings"][0]["class"] == "xid_79" and from_api["findings"][0]["action"] == "REBOOT_NODE"
    assert from_api["events"][0]["xid"] == 79 and from_api["events"][0]["pci_bus_id"] == "0000:ab:00.0"


def test_readable_report_and_exit_codes(tmp_path: Path) -> None:
    sick = cli(str(XID79))
    assert sick.returncode == 1
    out = sick.stdout.decode()
    assert out.startswith("Root cause: XID 79") and "do now: REBOOT_NODE" in out and "\x1b[" not in out
    assert "runbook: /runbooks/xid-79" in out and "line 14" in out
    healthy = cli(str(HEALTHY))
    assert (healthy.returncode, healthy.stdout.decode().splitlines()[0]) == (0, "No problem found.")
    missing = cli(str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and b"cannot read" in missing.stderr


def test_empty_input_is_an_error_not_a_healthy_job(tmp_path: Path, client: TestClient) -> None:
    """`kubectl logs … | gpu-triage diagnose -` after kubectl failed reads nothing: that is exit 2."""
    for args, stdin in ((["-"], b""), (["--json", "-"], b"")):
        result = cli(*args, stdin=stdin)
        assert result.returncode == 2 and b"no log lines read" in result.stderr, args
    (tmp_path / "empty.log.gz").write_bytes(gzip.compress(b""))
    assert cli(str(tmp_path / "empty.log.gz")).returncode == 2
    answer = client.post("/api/v1/diagnose", content=gzip.compress(b""))
    assert answer.status_code == 422 and "no log lines read" in answer.json()["error"]


def test_gzip_and_many_files(tmp_path: Path) -> None:
    ranks = sorted((FIXTURES / "scenarios" / "oom_rank3").iterdir())
    zipped = tmp_path / "rank3.log.gz"
    zipped.write_bytes(gzip.compress(ranks[3].read_bytes()))
    result = json.loads(cli("--json", *map(str, ranks[:3]), str(zipped)).stdout)
    root = result["findings"][0]
    assert (root["class"], root["rank"]) == ("cuda_oom", 3)
    assert root["evidence"][0]["file"] == str(zipped)


def test_api_takes_gzip_encoded_bodies(client: TestClient) -> None:
    body = gzip.compress(XID79.read_bytes())
    answer = client.post("/api/v1/diagnose", content=body, headers={"content-encoding": "gzip"})
    assert answer.status_code == 200 and answer.json()["findings"][0]["class"] == "xid_79"


def test_api_limits_and_bad_bodies(client: TestClient) -> None:
    empty = client.post("/api/v1/diagnose", content=b"")
    assert empty.status_code == 422 and "empty body" in empty.json()["error"]
    over = client.post("/api/v1/diagnose", content=b"x" * (64 * 2**20 + 1))
    assert over.status_code == 413 and "64 MiB limit" in over.json()["error"]
    bomb = gzip.compress(b"A" * (80 * 2**20))  # 80 MiB of As in ~80 KiB
    assert len(bomb) < 2**20
    exploded = client.post("/api/v1/diagnose", content=bomb)
    assert exploded.status_code == 413 and "decompresses to more than" in exploded.json()["error"]
    broken = client.post("/api/v1/diagnose", content=b"\x1f\x8b\x08\x00garbage that is not deflate")
    assert broken.status_code == 422 and "does not decompress" in broken.json()["error"]
    binary = client.post("/api/v1/diagnose", content=bytes(range(256)) * 4096)
    assert binary.status_code == 200 and binary.json()["findings"] == []
    long_line = client.post("/api/v1/diagnose", content=b"NCCL WARN " + b"x" * (10 * 2**20) + b"\n")
    assert long_line.status_code == 200


def test_decoded_streams_and_bounds() -> None:
    data = b"".join(f"line {i}\n".encode() for i in range(100_000))
    members = gzip.compress(data[:300_000]) + gzip.compress(data[300_000:])  # `cat a.gz b.gz`
    pieces = [members[i : i + 777] for i in range(0, len(members), 777)]
    out = list(decoded(pieces))
    assert b"".join(out) == data and max(map(len, out)) <= CHUNK_BYTES
    assert b"".join(decoded([b"", b"plain ", b"text"])) == b"plain text"
    with pytest.raises(InputTooLargeError):
        list(decoded([gzip.compress(b"A" * 10_000)], limit=1000))
    with pytest.raises(zlib.error):
        list(decoded([b"\x1f\x8b\x08\x00not deflate at all"]))


def test_gzip_members_split_anywhere_between_chunks() -> None:
    a, b, c = (gzip.compress(f"member {n}\n".encode() * 1000) for n in "abc")
    want = b"".join(f"member {n}\n".encode() * 1000 for n in "abc")
    for split in ([a, b, c], [a, b[:1], b[1:], c], [a + b[:2], b[2:] + c]):  # on, inside, after the magic
        assert b"".join(decoded(split)) == want, [len(s) for s in split]
    assert b"".join(decoded([a, b"trailing garbage"])) == b"member a\n" * 1000
    with pytest.raises(EOFError):
        list(decoded([a, b[: len(b) // 2]]))


def test_broken_and_truncated_gzip_inputs_are_errors(tmp_path: Path) -> None:
    whole = gzip.compress(XID79.read_bytes())
    (tmp_path / "cut.log.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "bad.log.gz").write_bytes(b"\x1f\x8b\x08\x00this is not deflate data")
    for name in ("cut.log.gz", "bad.log.gz"):
        result = cli(str(tmp_path / name))
        assert result.returncode == 2, name
        assert b"does not decompress" in result.stderr and b"Traceback" not in result.stderr


def test_only_a_few_diagnoses_run_at_once(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from gpu_triage.diagnosis.training import diagnose as training

    release, started = threading.Event(), threading.Semaphore(0)
    real = training.diagnose

    def slow(sources, engine=None, store=None, decode=None):  # type: ignore[no-untyped-def]
        started.release()
        release.wait(10)
        return real(sources, engine=engine, store=store, decode=decode)

    monkeypatch.setattr(training, "diagnose", slow)
    answers: list[int] = []

    def post() -> None:
        answers.append(client.post("/api/v1/diagnose", content=b"x\n").status_code)

    running = [threading.Thread(target=post) for _ in range(2)]
    for t in running:
        t.start()
    assert started.acquire(timeout=5) and started.acquire(timeout=5), "two diagnoses should be running"
    third = client.post("/api/v1/diagnose", content=b"x\n")
    assert third.status_code == 429 and "running already" in third.json()["error"]
    release.set()
    for t in running:
        t.join(10)
    assert answers == [200, 200]
    assert client.post("/api/v1/diagnose", content=b"x\n").status_code == 200


@pytest.mark.parametrize("asked", ["python", "hyperscan", None])
def test_gpu_triage_scan_chooses_the_engine_for_the_cli_and_the_api(
    asked: str | None, monkeypatch: pytest.MonkeyPatch, daemon: Daemon
) -> None:
    """diagnosis/ reads no environment: the command and the daemon read GPU_TRIAGE_SCAN and pass it on."""
    engines: list[str | None] = []
    real = training.diagnose

    def spy(
        sources: Any, *, engine: str | None = None, store: Any = None, parallel: bool = False, decode: Any = None
    ) -> Any:
        engines.append(engine)
        return real(sources, engine="python", store=store, decode=decode)  # whichever wheel this machine has

    monkeypatch.setattr(training, "diagnose", spy)
    if asked is None:
        monkeypatch.delenv(SCAN_ENV, raising=False)
    else:
        monkeypatch.setenv(SCAN_ENV, asked)
    assert diagnose_files([str(XID79)], as_json=True, out=io.StringIO(), err=io.StringIO()) == 1
    with TestClient(create_app(daemon)) as api:
        assert api.post("/api/v1/diagnose", content=XID79.read_bytes()).status_code == 200
    assert engines == [asked, asked]


def test_a_thousand_per_rank_files_fit_under_the_default_descriptor_limit(tmp_path: Path) -> None:
    """One file per rank is a normal layout; each is opened when the diagnosis reaches it, not all at once."""
    logs = tmp_path / "many"
    logs.mkdir()
    names = []
    for rank in range(1100):
        line = "epoch 1 step 10 loss 2.3" if rank != 926 else "[rank926]: RuntimeError: CUDA error: out of memory"
        (logs / f"r{rank}.log").write_text(line + "\n")
        names.append(str(logs / f"r{rank}.log"))
    limit = "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))"
    run = f"{limit}; from gpu_triage.exporter.cli.main import main; sys.exit(main())"
    result = subprocess.run(
        [sys.executable, "-c", run, "diagnose", "--json", *names],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr.decode()[-500:]
    root = json.loads(result.stdout)["findings"][0]
    assert (root["class"], root["rank"]) == ("cuda_oom", 926)


def test_only_ignorable_events_is_a_healthy_job(client: TestClient) -> None:
    """A lone Xid 43 (the driver recovered a channel after an application fault) is listed, not a root
    cause: exit 0 and "No problem found"; the JSON the API answers keeps listing it, the same as --json."""
    xid43 = b"[ 100.1] NVRM: Xid (PCI:0000:3b:00): 43, pid=555, name=python3, Ch 00000010\n"
    text = cli("-", stdin=xid43)
    assert text.returncode == 0
    assert text.stdout.decode().splitlines()[0] == "No problem found (1 ignorable event)."
    assert "Root cause" not in text.stdout.decode()
    as_json = cli("--json", "-", stdin=xid43)
    from_api = client.post("/api/v1/diagnose", content=xid43).json()
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == from_api
    assert [f["action"] for f in from_api["findings"]] == ["IGNORE"] and from_api["root_cause"] is not None
    sick = cli("-", stdin=xid43 + b"[rank0]: RuntimeError: CUDA error: out of memory\n")
    assert sick.returncode == 1 and sick.stdout.decode().startswith("Root cause: GPU memory exhausted")


@pytest.mark.parametrize(
    ("cpus", "load", "parallel"), [(1, 0.0, False), (2, 0.3, True), (2, 1.5, False), (16, 9.0, True), (16, 15.5, False)]
)
def test_the_scan_takes_a_second_thread_only_where_a_cpu_is_idle(
    monkeypatch: pytest.MonkeyPatch, cpus: int, load: float, parallel: bool
) -> None:
    """On a node whose CPUs are all busy, a second thread waits for its turn: the scan stays on one."""
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(cpus)), raising=False)
    monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
    assert scan_in_parallel() is parallel
