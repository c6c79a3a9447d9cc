"""slurm/epilog-hang.sh run for real: a hung job's dumps, kernel log and output gathered and diagnosed.

Fakes on PATH: `scontrol show job -o` prints the job line in scontrol's one-line layout, `journalctl -k`
prints the node's kernel log (with an Xid when the test says so), `logger` records what it was told. The
dumps are the recorded ones of tests/fixtures/flight_recorder; `gpu-triage` is the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, require_tool
from tests.daemon_proc import GPU_TRIAGE

EPILOG = REPO / "slurm" / "epilog-hang.sh"
FR = REPO / "tests" / "fixtures" / "flight_recorder"
JOB = "4242"

FAKE_SCONTROL = """#!/bin/sh
[ "$1 $2 $3 $4" = "show job -o {job}" ] || exit 2
echo "JobId={job} JobName=train UserId=alice(1000) JobState=FAILED StartTime=2026-11-30T02:00:00 EndTime=2026-11-30T03:00:00 NodeList=gpu[01-02] StdOut={out} StdErr={out}"
"""
FAKE_JOURNALCTL = """#!/bin/sh
echo "$@" > "{log}.args"
[ -f "{log}" ] && cat "{log}"
exit 0
"""
FAKE_LOGGER = """#!/bin/sh
shift 3
echo "$*" >> "{log}"
"""


def _setup(tmp: Path, scenario: str, node: str, ranks: list[int], kernel: str = "") -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    out = tmp / "slurm-4242.out"
    out.write_bytes(b"".join((FR / scenario / "logs" / f"rank{r}.log").read_bytes() for r in range(4)))
    kernel_log = tmp / f"kernel-{node}.log"
    kernel_log.write_text(kernel)
    for name, text in (
        ("scontrol", FAKE_SCONTROL.format(job=JOB, out=out)),
        ("journalctl", FAKE_JOURNALCTL.format(log=kernel_log)),
        ("logger", FAKE_LOGGER.format(log=tmp / "syslog")),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    spool = tmp / "spool" / JOB
    spool.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        shutil.copy(FR / scenario / "pickle" / f"nccl_trace_rank_{r}", spool)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_ID": JOB,
        "SLURMD_NODENAME": node,
        "GPU_TRIAGE_FR_SPOOL": str(tmp / "spool"),
        "GPU_TRIAGE_FR_DIR": str(tmp / "jobs"),
        "GPU_TRIAGE_BIN": GPU_TRIAGE,
    }


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EPILOG)], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_two_nodes_gather_one_report(tmp_path: Path) -> None:
    first = _run(_setup(tmp_path, "never_joined", "gpu01", [0, 1]))
    assert first.returncode == 0
    second = _run(_setup(tmp_path, "never_joined", "gpu02", [2, 3]))
    assert second.returncode == 0
    job = tmp_path / "jobs" / JOB
    assert sorted(p.name for p in (job / "files" / "gpu02").iterdir()) == [
        "kernel.log",
        "nccl_trace_rank_2",
        "nccl_trace_rank_3",
    ]
    assert (job / "files" / "job-StdOut.log").stat().st_size > 0
    report = json.loads((job / "report.json").read_text())
    assert report["hang"]["dumps"] == 4
    root = report["findings"][0]
    assert root["class"] == "collective_never_joined" and root["details"]["ranks"] == [2]
    title = (job / "report.txt").read_text().splitlines()[0]
    assert title.startswith("Root cause: Rank 2 never entered all_reduce #5")
    assert (tmp_path / "syslog").read_text().splitlines()[-1] == f"job {JOB}: {title}"
    assert not (tmp_path / "spool" / JOB).exists()  # the node's /tmp is left clean
    # The kernel log is asked for since the job started, as scontrol said.
    assert (tmp_path / "kernel-gpu02.log.args").read_text().split() == [
        "-k",
        "--no-pager",
        "-o",
        "short",
        "--since",
        "2026-11-30",
        "02:00:00",
    ]


def test_an_xid_in_the_kernel_log_comes_first(tmp_path: Path) -> None:
    xid = "Nov 30 02:41:07 gpu01 kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    _run(_setup(tmp_path, "never_joined", "gpu01", [0, 1, 2, 3], kernel=xid))
    report = json.loads((tmp_path / "jobs" / JOB / "report.json").read_text())
    assert report["findings"][0]["class"] == "xid_79"
    assert any(f["class"] == "collective_never_joined" for f in report["findings"])


def test_a_job_without_dumps_is_left_alone(tmp_path: Path) -> None:
    env = _setup(tmp_path, "never_joined", "gpu01", [])
    assert _run(env).returncode == 0
    assert not (tmp_path / "jobs").exists() and not (tmp_path / "syslog").exists()
    env["SLURM_JOB_ID"] = "../../etc"
    assert _run(env).returncode == 0 and not (tmp_path / "jobs").exists()


def test_it_never_fails_the_epilog(tmp_path: Path) -> None:
    env = _setup(tmp_path, "never_joined", "gpu01", [0])
    env["GPU_TRIAGE_BIN"] = str(tmp_path / "no-such-gpu-triage")
    env["GPU_TRIAGE_FR_DIR"] = "/proc/no-such-dir"
    assert _run(env).returncode == 0


def test_passes_shellcheck() -> None:
    beside = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(beside) if beside.exists() else shutil.which("shellcheck") or require_tool("shellcheck")
    result = subprocess.run([shellcheck, "--severity=style", str(EPILOG)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
