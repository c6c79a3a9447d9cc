"""slurm/: the health check, prolog and epilog, run for real against a fake `scontrol` and a stand-in daemon.

The fakes are small scripts written into tmp_path/bin (first on PATH). The fake scontrol keeps the node's
state in a JSON file, answers `show node` in scontrol's own layout and applies `update state=drain|resume`
to it, so a test can run the health check several times and see what Slurm would. `gpu-triage` on PATH
records its argv and runs the real `gpu-triage check`, which asks a stand-in daemon for the verdict the test
sets (a /api/v1/diagnosis body); for what no daemon can answer (a check that hangs, fails to run, or says
nothing) it prints what the test says and exits as told instead. Every call of either fake is recorded with
its exact argv, which is what catches quoting mistakes. Two tests use a real daemon on the simulator.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.xid.health import Telemetry
from gpu_triage.diagnosis.xid.node_verdict import Blind
from gpu_triage.exporter.cli.check import DaemonClient
from gpu_triage.exporter.cli.check import check as check_command
from gpu_triage.exporter.http.api_models import Diagnosis
from tests.conftest import REPO, require_tool
from tests.daemon_proc import GPU_TRIAGE, free_port, serve, wait_for
from tests.verdict_bodies import NOW, fatal_sxid, report, xid

SLURM = REPO / "slurm"
HEALTHCHECK = SLURM / "gpu-triage-healthcheck"
PROLOG = SLURM / "prolog.sh"
EPILOG = SLURM / "epilog.sh"
NODE = "gpu01"
ADMIN_REASON = "PSU swap, ticket OPS-42"

FAKE_SCONTROL = """#!{python}
import json, os, sys
from pathlib import Path

Path(os.environ["FAKE_LOG"]).open("a").write(json.dumps(["scontrol", *sys.argv[1:]]) + "\\n")
state_file = Path(os.environ["FAKE_NODE"])
if os.environ.get("FAKE_SCONTROL_DOWN"):
    print("slurm_load_node error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
    sys.exit(1)
node = json.loads(state_file.read_text())
args = sys.argv[1:]
if args[:2] == ["show", "node"]:
    print(f"NodeName={{args[2]}} Arch=x86_64 CoresPerSocket=32")
    print("   CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.52")
    print("   Gres=gpu:h100:8")
    print(f"   State={{node['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A")
    print("   Partitions=gpu")
    if node.get("reason"):
        print(f"   Reason={{node['reason']}} [root@2026-11-30T03:12:44]")
    sys.exit(0)
if args[:1] == ["update"]:
    fields = dict(a.split("=", 1) for a in args[1:])
    base = node["state"].split("+")[0]
    if fields.get("state") == "drain":
        node = {{"state": base + "+DRAIN", "reason": fields["reason"]}}
    elif fields.get("state") == "resume":
        node = {{"state": base, "reason": None}}
    state_file.write_text(json.dumps(node))
    sys.exit(0)
sys.exit(2)
"""

FAKE_GPU_TRIAGE = """#!/bin/sh
printf '%s\\n' "$(printf '"%s",' gpu-triage "$@" | sed 's/,$//; s/^/[/; s/$/]/')" >> "$FAKE_LOG"
if [ -n "${FAKE_CHECK_SLEEP:-}" ]; then sleep "$FAKE_CHECK_SLEEP"; fi
if [ -n "${FAKE_CHECK_RC:-}" ]; then
    cat "$FAKE_CHECK_OUT"
    exit "$FAKE_CHECK_RC"
fi
exec "$REAL_GPU_TRIAGE" "$@"
"""


class StandIn:
    """GET /api/v1/diagnosis answers `body`, as the daemon would."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = json.dumps(stand_in.body).encode()
                self.send_response(200 if self.path == "/api/v1/diagnosis" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


HEALTHY = report()
# What the health check writes for XID79_ON_3: every place that needs an action, the most urgent first (its
# ";" between actions is written ",", as no shell metacharacter reaches scontrol).
DRAINED = "gpu-triage: REBOOT_NODE: GPU 3 Xid 79, CHECK_APP: GPU 1 Xid 13"
XID79_ON_3 = report({1: [xid(13)], 3: [xid(79)]})  # GPU 1 only degraded: an application's fault


class Slurm:
    """A tmp_path with the fakes on PATH, the node's state and the calls log."""

    def __init__(self, tmp_path: Path, daemon: StandIn) -> None:
        self.daemon = daemon
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "calls.log"
        self.node = tmp_path / "node.json"
        self.check_out = tmp_path / "check.out"
        self.rc: int | None = None
        (self.bin / "scontrol").write_text(FAKE_SCONTROL.format(python=sys.executable))
        (self.bin / "gpu-triage").write_text(FAKE_GPU_TRIAGE)
        for fake in self.bin.iterdir():
            fake.chmod(0o755)
        self.set_node("IDLE")
        self.answer(HEALTHY)
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_LOG": str(self.log),
            "FAKE_NODE": str(self.node),
            "FAKE_CHECK_OUT": str(self.check_out),
            "REAL_GPU_TRIAGE": GPU_TRIAGE,
            "GPU_TRIAGE_URL": daemon.url,
            "SLURMD_NODENAME": NODE,
            "HOME": str(tmp_path),
        }

    def set_node(self, state: str, reason: str | None = None) -> None:
        self.node.write_text(json.dumps({"state": state, "reason": reason}))

    def node_state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.node.read_text())
        return result

    def answer(self, body: Diagnosis | str, rc: int | None = None) -> None:
        """A diagnosis body for the real `gpu-triage check` to get from the stand-in daemon; or the text
        `gpu-triage` prints instead, and its exit status `rc`."""
        if isinstance(body, Diagnosis):
            self.daemon.body = body.body()
            self.rc = None
        else:
            self.check_out.write_text(body)
            self.rc = rc

    def calls(self, tool: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        every = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c for c in every if tool is None or c[0] == tool]

    def updates(self) -> list[list[str]]:
        return [c[1:] for c in self.calls("scontrol") if c[1] == "update"]

    def run(self, script: Path = HEALTHCHECK, **env: str) -> subprocess.CompletedProcess[str]:
        fixed = {"FAKE_CHECK_RC": str(self.rc)} if self.rc is not None else {}
        environment = {**self.env, **fixed, **env}
        return subprocess.run([str(script)], check=False, env=environment, capture_output=True, text=True, timeout=60)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Slurm]:
    daemon = StandIn()
    try:
        yield Slurm(tmp_path, daemon)
    finally:
        daemon.close()


# --- the health check ------------------------------------------------------------------------------------


def test_critical_drains_the_node_with_the_verdict_as_one_reason_argument(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run()
    assert result.returncode == 0, result.stderr
    assert slurm.updates() == [["update", f"nodename={NODE}", "state=drain", f"reason={DRAINED}"]]
    assert slurm.node_state() == {"state": "IDLE+DRAIN", "reason": DRAINED}
    # It asked for check's versioned JSON, with a bounded HTTP wait.
    (check,) = slurm.calls("gpu-triage")
    assert check[1:4] == ["check", "--format", "json"] and "--timeout" in check


def test_the_node_name_is_the_one_slurmd_gives(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    slurm.run(SLURMD_NODENAME="dgx-b200-017")
    assert slurm.calls("scontrol")[0] == ["scontrol", "show", "node", "dgx-b200-017"]
    assert slurm.updates()[0][1] == "nodename=dgx-b200-017"


def test_a_gpu_lost_without_an_xid_names_the_condition(slurm: Slurm) -> None:
    lost = Telemetry(status=GpuStatus.LOST, lost_since=NOW - 30, lost_answer="GPU 5: NVML_ERROR_GPU_IS_LOST")
    slurm.answer(report(telemetry={5: lost}))
    slurm.run()
    assert slurm.node_state()["reason"] == "gpu-triage: REBOOT_NODE: GPU 5 lost"


def test_an_nvswitch_fault_drains_with_the_node_level_finding(slurm: Slurm) -> None:
    slurm.answer(report(node_findings=[fatal_sxid()]))
    slurm.run()
    assert slurm.node_state()["reason"] == "gpu-triage: RESTART_FABRIC_MANAGER: NVSwitch fatal SXid"


def test_warning_does_not_drain(slurm: Slurm) -> None:
    slurm.answer(report(telemetry={2: Telemetry(thermal_slowdown=True)}))
    result = slurm.run()
    assert result.returncode == 0
    assert slurm.updates() == []
    assert slurm.node_state() == {"state": "IDLE", "reason": None}


def test_healthy_resumes_a_node_gpu_triage_drained(slurm: Slurm) -> None:
    slurm.set_node("IDLE+DRAIN", "gpu-triage: REBOOT_NODE GPU 3 Xid 79")
    result = slurm.run()
    assert result.returncode == 0, result.stderr
    assert slurm.updates() == [["update", f"nodename={NODE}", "state=resume"]]
    assert "resumed" in result.stderr


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN"])
def test_healthy_never_resumes_a_node_someone_else_drained(slurm: Slurm, state: str) -> None:
    slurm.set_node(state, ADMIN_REASON)
    slurm.run()
    assert slurm.updates() == []
    assert slurm.node_state() == {"state": state, "reason": ADMIN_REASON}


def test_a_reason_that_only_mentions_gpu_triage_is_not_ours(slurm: Slurm) -> None:
    slurm.set_node("IDLE+DRAIN", "waiting for gpu-triage: see OPS-7")
    slurm.run()
    assert slurm.updates() == []


def test_critical_leaves_an_admins_drain_and_its_reason_alone(slurm: Slurm) -> None:
    slurm.set_node("ALLOCATED+DRAIN", ADMIN_REASON)
    slurm.answer(XID79_ON_3)
    result = slurm.run()
    assert slurm.updates() == []
    assert slurm.node_state()["reason"] == ADMIN_REASON
    assert "already drained" in result.stderr


def test_warning_keeps_its_own_drain_unless_told_to_resume_on_warning(slurm: Slurm) -> None:
    slurm.set_node("IDLE+DRAIN", "gpu-triage: REBOOT_NODE GPU 3 Xid 79")
    slurm.answer(report({1: [xid(13)]}))
    slurm.run()
    assert slurm.updates() == []
    slurm.run(GPU_TRIAGE_RESUME_ON="warning")
    assert slurm.updates() == [["update", f"nodename={NODE}", "state=resume"]]


def test_drain_then_resume_across_runs(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    slurm.run()
    slurm.run()  # still critical: already drained by us, nothing more
    slurm.answer(HEALTHY)  # after the reboot
    slurm.run()
    slurm.run()  # healthy and not drained: nothing
    assert [u[2] for u in slurm.updates()] == ["state=drain", "state=resume"]
    assert slurm.node_state() == {"state": "IDLE", "reason": None}


@pytest.mark.parametrize("rc", [3, 4, 127])
def test_no_verdict_touches_nothing(slurm: Slurm, rc: int) -> None:
    slurm.answer("UNKNOWN - cannot get a verdict from gpu-triage at http://127.0.0.1:9481: connection refused\n", rc)
    slurm.set_node("IDLE+DRAIN", "gpu-triage: REBOOT_NODE GPU 3 Xid 79")
    result = slurm.run()
    assert result.returncode == 0
    assert slurm.calls("scontrol") == []  # not even a look: neither drain nor resume
    assert "no verdict" in result.stderr


def test_a_hung_check_is_cut_short_and_counts_as_no_verdict(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    started = time.monotonic()
    result = slurm.run(FAKE_CHECK_SLEEP="30", GPU_TRIAGE_CHECK_TIMEOUT="1")
    assert time.monotonic() - started < 15
    assert result.returncode == 0
    assert slurm.calls("scontrol") == []
    assert "took more than 1s" in result.stderr


def test_a_critical_verdict_without_a_reason_still_drains(slurm: Slurm) -> None:
    slurm.answer(check_json(status="CRITICAL", exit_code=2, reason=""), 2)
    slurm.run()
    assert slurm.node_state() == {"state": "IDLE+DRAIN", "reason": "gpu-triage: CRITICAL"}


@pytest.mark.parametrize(
    ("version", "rc"),
    [(2, 2), (1, 0)],  # a version the script does not know; an exit status that disagrees with the JSON
)
def test_json_the_script_cannot_trust_is_no_verdict(slurm: Slurm, version: int, rc: int) -> None:
    slurm.answer(check_json(version=version, status="CRITICAL", exit_code=2, reason="REBOOT_NODE: GPU 3 Xid 79"), rc)
    result = slurm.run()
    assert result.returncode == 0 and slurm.calls("scontrol") == []
    assert "no verdict" in result.stderr
    assert slurm.run(PROLOG, SLURM_JOB_GPUS="3").returncode == 0


def check_json(**values: object) -> str:
    """What `gpu-triage check --format json` prints, with `values` in place of the real ones."""
    buf = io.StringIO()
    check_command(DaemonClient(f"http://127.0.0.1:{free_port()}", timeout=0.5), "json", out=buf)
    return json.dumps({**json.loads(buf.getvalue()), **values}, indent=2) + "\n"


def test_the_reason_names_the_job_that_was_on_the_gpu(slurm: Slurm) -> None:
    slurm.answer(report({3: [xid(79)]}, workloads={3: (Workload("slurm_job", "4242", step="0", user="ann"),)}))
    slurm.run()
    assert slurm.node_state()["reason"] == "gpu-triage: REBOOT_NODE: GPU 3 Xid 79 job 4242"


def test_reason_is_sanitised_and_short(slurm: Slurm) -> None:
    hostile = Workload("pod", 'x"; scontrol delete partition=gpu; echo "\n' + "x" * 200, namespace="ml`$(id)")
    slurm.answer(report({3: [xid(79)]}, workloads={3: (hostile,)}))
    slurm.run()
    ((*_, reason),) = slurm.updates()
    text = reason.removeprefix("reason=")
    assert text.startswith("gpu-triage: REBOOT_NODE: GPU 3 Xid 79 pod ml")
    assert len(text) <= 64
    assert not set(text) & set("\"';$`\\\n")
    assert [c[1] for c in slurm.calls("scontrol")] == ["show", "update"]  # the text ran nothing


def test_slurmctld_unreachable_is_an_error_not_an_action(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run(FAKE_SCONTROL_DOWN="1")
    assert result.returncode == 1
    assert slurm.updates() == []
    assert "cannot read node" in result.stderr


def test_bad_setting_is_refused(slurm: Slurm) -> None:
    result = slurm.run(GPU_TRIAGE_RESUME_ON="always")
    assert result.returncode == 2
    assert slurm.calls() == []


# --- with the real gpu-triage check and daemon ----------------------------------------------------------


@pytest.fixture
def real_check(slurm: Slurm) -> Slurm:
    """The fake gpu-triage replaced by the real one (same interpreter as the tests)."""
    (slurm.bin / "gpu-triage").unlink()
    (slurm.bin / "gpu-triage").symlink_to(GPU_TRIAGE)
    slurm.rc = None
    return slurm


@pytest.mark.e2e
def test_real_daemon_xid79_drains_with_its_verdict(real_check: Slurm, tmp_path: Path) -> None:
    with serve(tmp_path / "daemon") as daemon:
        fault = {"gpu": 3, "kind": "xid", "xid": 79}
        httpx.post(f"{daemon.url}/api/v1/sim/faults", json=fault, timeout=5).raise_for_status()
        wait_for(
            lambda: httpx.get(f"{daemon.url}/api/v1/diagnosis", timeout=5).json()["node"]["health"] == "unhealthy",
            what="the XID to make the node unhealthy",
        )
        result = real_check.run(GPU_TRIAGE_URL=daemon.url)
    assert result.returncode == 0, result.stderr
    assert real_check.node_state() == {"state": "IDLE+DRAIN", "reason": "gpu-triage: REBOOT_NODE: GPU 3 Xid 79"}


@pytest.mark.e2e
def test_real_check_with_no_daemon_touches_nothing(real_check: Slurm) -> None:
    real_check.set_node("IDLE+DRAIN", "gpu-triage: REBOOT_NODE GPU 3 Xid 79")
    result = real_check.run(GPU_TRIAGE_URL=f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 0
    assert real_check.calls("scontrol") == []
    assert "UNKNOWN" in result.stderr


# --- prolog and epilog -----------------------------------------------------------------------------------


def test_prolog_refuses_a_job_given_an_unhealthy_gpu(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run(PROLOG, SLURM_JOB_GPUS="2,3", SLURM_JOB_ID="1234")
    assert result.returncode == 1
    assert (
        f"gpu-triage: job 1234 refused on {socket.gethostname().split('.')[0]}: REBOOT_NODE: GPU 3 Xid 79"
        in result.stderr
    )
    (check,) = slurm.calls("gpu-triage")
    assert check[1:6] == ["check", "--gpus", "2,3", "--format", "json"]
    assert slurm.calls("scontrol") == []  # Slurm itself drains on a failed prolog


def test_prolog_lets_a_job_run_on_the_healthy_gpus_of_an_unhealthy_node(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    assert slurm.run(PROLOG, SLURM_JOB_GPUS="0,1").returncode == 0  # GPU 1 is only degraded


def test_prolog_matches_cuda_visible_devices_by_uuid(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run(PROLOG, CUDA_VISIBLE_DEVICES="GPU-3")
    assert result.returncode == 1
    assert "REBOOT_NODE: GPU 3 Xid 79" in result.stderr


def test_prolog_leaves_mig_devices_out(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    assert slurm.run(PROLOG, CUDA_VISIBLE_DEVICES="MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f").returncode == 0
    assert slurm.calls() == []
    assert slurm.run(PROLOG, CUDA_VISIBLE_DEVICES="MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f,3").returncode == 1
    assert slurm.calls("gpu-triage")[0][1:3] == ["check", "--gpus"] and slurm.calls("gpu-triage")[0][3] == "3"


def test_prolog_of_a_job_without_gpus_asks_nothing(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    assert slurm.run(PROLOG).returncode == 0
    assert slurm.run(PROLOG, SLURM_JOB_GPUS="NoDevFiles").returncode == 0
    assert slurm.calls() == []


@pytest.mark.parametrize("rc", [3, 127])
def test_prolog_without_a_verdict_lets_the_job_run(slurm: Slurm, rc: int) -> None:
    slurm.answer("UNKNOWN - cannot get a verdict\n", rc)
    assert slurm.run(PROLOG, SLURM_JOB_GPUS="3").returncode == 0


def test_prolog_with_a_gpu_id_the_node_does_not_have_lets_the_job_run(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run(PROLOG, SLURM_JOB_GPUS="3,9")  # the real check: "no GPU 9 on this node", UNKNOWN
    assert result.returncode == 0


def test_epilog_runs_the_health_check_and_never_fails(slurm: Slurm) -> None:
    slurm.answer(XID79_ON_3)
    result = slurm.run(EPILOG, GPU_TRIAGE_HEALTHCHECK=str(HEALTHCHECK))
    assert result.returncode == 0
    assert slurm.node_state()["state"] == "IDLE+DRAIN"
    # A health check that fails (slurmctld unreachable) does not fail the epilog.
    assert slurm.run(EPILOG, GPU_TRIAGE_HEALTHCHECK=str(HEALTHCHECK), FAKE_SCONTROL_DOWN="1").returncode == 0


def test_scripts_pass_shellcheck() -> None:
    beside = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(beside) if beside.exists() else shutil.which("shellcheck") or require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, "--severity=style", str(HEALTHCHECK), str(PROLOG), str(EPILOG)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


BLIND = report(incomplete=(Blind("kmsg", "Permission denied (/dev/kmsg)"),))


def test_prolog_refuses_a_job_on_a_node_whose_daemon_cannot_read_the_kernel_log(slurm: Slurm) -> None:
    """A daemon that cannot see the kernel log would not see the XID that kills the job: no GPU is healthy to it."""
    slurm.answer(BLIND)
    result = slurm.run(PROLOG, SLURM_JOB_GPUS="2,3", SLURM_JOB_ID="77")
    assert result.returncode == 1
    assert (
        "job 77 refused" in result.stderr and "kernel log unreadable (Permission denied (/dev/kmsg))" in result.stderr
    )
    assert slurm.run(PROLOG, SLURM_JOB_GPUS="2,3", GPU_TRIAGE_ADMIT_INCOMPLETE="1").returncode == 0


def test_an_incomplete_verdict_neither_drains_nor_resumes(slurm: Slurm) -> None:
    slurm.set_node("IDLE+DRAIN", "gpu-triage: REBOOT_NODE: GPU 3 Xid 79")
    slurm.answer(BLIND)
    result = slurm.run()
    assert result.returncode == 0
    assert slurm.updates() == [] and slurm.node_state()["reason"] == "gpu-triage: REBOOT_NODE: GPU 3 Xid 79"
    assert "INCOMPLETE: kernel log unreadable" in result.stderr
