"""kubernetes/examples/: the Flight Recorder Job validates, and its sidecar's script, run for real, reports the hang."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_triage.diagnosis.training.hang.flight_recorder import rank_of
from tests.conftest import REPO, require_tool
from tests.daemon_proc import wait_for
from tests.kubernetes.manifests import KUBERNETES_VERSIONS, validate

EXAMPLE = REPO / "kubernetes" / "examples" / "flight-recorder-job.yaml"
FR = REPO / "tests" / "fixtures" / "flight_recorder"


def _job() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


def test_the_job_validates_on_the_newest_kubernetes() -> None:
    validate(_job(), KUBERNETES_VERSIONS[-1])  # native sidecars (restartPolicy on an init container): 1.29+


def test_the_trainer_writes_where_the_sidecar_reads() -> None:
    spec = _job()["spec"]["template"]["spec"]
    (sidecar,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always"
    prefix = next(e["value"] for e in trainer["env"] if e["name"] == "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    assert prefix.startswith("/fr/dumps/") and rank_of(prefix + "5") == 5
    assert "mkdir -p /fr/dumps" in sidecar["args"][0]
    assert {m["mountPath"] for m in sidecar["volumeMounts"]} == {m["mountPath"] for m in trainer["volumeMounts"]}


def _children(pid: int, command: str) -> list[int]:
    """The processes running `command` whose parent is `pid` (from /proc/PID/stat: pid (comm) state ppid ...)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if comm == command and int(rest[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_the_sidecar_reports_the_hang_when_it_is_stopped(tmp_path: Path) -> None:
    (sidecar,) = _job()["spec"]["template"]["spec"]["initContainers"]
    script = sidecar["args"][0].replace("/fr", str(tmp_path / "fr")).replace("/tmp/report.txt", str(tmp_path / "r.txt"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    # Its `sleep` child runs once the folders are made and the trap is set: a TERM now is the kubelet's.
    wait_for(lambda: _children(proc.pid, "sleep"), timeout=10, interval=0.01, what="the sidecar waiting")
    for f in (FR / "never_joined" / "pickle").iterdir():  # what the trainer's ranks wrote on the timeout
        shutil.copy(f, tmp_path / "fr" / "dumps")
    shutil.copytree(FR / "never_joined" / "logs", tmp_path / "fr" / "logs", dirs_exist_ok=True)
    proc.send_signal(signal.SIGTERM)  # what the kubelet sends once the trainer has exited
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    first = out.splitlines()[0]
    assert first.startswith("gpu-triage: Root cause: Rank 2 never entered all_reduce #5"), out


def test_the_sidecar_script_passes_shellcheck(tmp_path: Path) -> None:
    (sidecar,) = _job()["spec"]["template"]["spec"]["initContainers"]
    script = tmp_path / "fr-diagnose.sh"
    script.write_text(sidecar["args"][0])
    beside = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(beside) if beside.exists() else shutil.which("shellcheck") or require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, "--shell=sh", "--severity=style", str(script)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
