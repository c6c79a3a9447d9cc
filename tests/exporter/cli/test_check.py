"""`gpu-triage check` for scripts: --format reason, --gpus, --json with and without a verdict, and the pod
and Slurm job of a faulty GPU, against a real daemon given a real pod-resources server and a fake /proc."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.xid.health import Telemetry
from gpu_triage.diagnosis.xid.node_verdict import Blind, unknown_device_findings
from gpu_triage.exporter.cli.check import NoVerdictError, reason, select
from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE, Daemon, free_port, serve, wait_for
from tests.podresources_server import Container, Pod, PodResourcesServer, pod_resources_server
from tests.verdict_bodies import NOW, fatal_sxid, report, xid

# A node busy from its first second, so that every GPU has a process (and so a Slurm job) at once.
BUSY = """name: busy
seed: 7
node: {gpus: {count: 8}}
workload:
  - {duration_seconds: 3600, utilization: 0.9, memory_used_ratio: 0.8}
"""


def check(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [GPU_TRIAGE, "check", "--url", url, "--timeout", "5", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, PodResourcesServer, list[str]]]:
    """A daemon whose GPU 3 fell off the bus under pod ml/trainer-0 and Slurm job 4243."""
    home = tmp_path_factory.mktemp("check")
    scenario = home / "busy.yaml"
    scenario.write_text(BUSY)
    with pod_resources_server() as kubelet:
        args = [
            "--sim.scenario", str(scenario), "--collector.interval", "1s", "--collector.slow-interval", "1s",
            "--kubernetes.pod-resources-socket", str(kubelet.socket),
            "--path.procfs", str(REPO / "tests/fixtures/procfs/cgroup-v2"),
        ]  # fmt: skip
        with serve(home / "daemon", *args) as daemon:
            uuids = [g["uuid"] for g in httpx.get(f"{daemon.url}/api/v1/gpus", timeout=5).json()["gpus"]]
            kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": uuids[2:4]})])]
            wait_for(
                lambda: 'pod="trainer-0"' in httpx.get(f"{daemon.url}/metrics", timeout=5).text,
                what="the pod on /metrics",
            )
            fault = {"gpu": 3, "kind": "xid", "xid": 79}
            httpx.post(f"{daemon.url}/api/v1/sim/faults", json=fault, timeout=5).raise_for_status()
            wait_for(lambda: check(daemon.url).returncode == 2, what="CRITICAL")
            yield daemon, kubelet, uuids


@pytest.mark.e2e
def test_check_names_the_pod_and_job_of_the_faulty_gpu(node: tuple[Daemon, PodResourcesServer, list[str]]) -> None:
    daemon, _, _ = node
    text = check(daemon.url)
    assert text.returncode == 2
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("  GPU 3:")]  # its Xid 79, now lost too
    assert line.endswith("; used by pod ml/trainer-0 (container main), Slurm job 4243 step 0 (4711)")
    one = check(daemon.url, "--format", "reason")
    assert (one.returncode, one.stdout) == (2, "REBOOT_NODE: GPU 3 Xid 79 pod ml/trainer-0 +1\n")


@pytest.mark.e2e
def test_gpus_narrows_the_verdict(node: tuple[Daemon, PodResourcesServer, list[str]]) -> None:
    daemon, _, uuids = node
    fine = check(daemon.url, "--gpus", "0,1", "--format", "reason")
    assert (fine.returncode, fine.stdout) == (0, "OK\n")
    assert check(daemon.url, "--gpus", "0,1").stdout == "OK - GPUs 0, 1 of 8: healthy\n"
    sick = check(daemon.url, "--gpus", f"1,{uuids[3]}", "--json")
    out = json.loads(sick.stdout)
    assert sick.returncode == 2 == out["exit_code"] and out["status"] == "CRITICAL"
    assert out["selected"] == ["1", uuids[3]] and out["reason"] == "REBOOT_NODE: GPU 3 Xid 79 pod ml/trainer-0 +1"
    body = out["diagnosis"]
    assert [g["gpu"] for g in body["gpus"]] == [1, 3]
    assert (body["node"]["health"], body["node"]["action"]) == ("unhealthy", "REBOOT_NODE")
    assert body["node"]["summary"] == "GPUs 1, 3 of 8: unhealthy: REBOOT_NODE: GPU 3 Xid 79"
    assert [(p["gpu"], p["cause"]) for p in body["node"]["affected"]] == [(3, "Xid 79")]
    assert {f["class"] for f in body["findings"]} == {"xid_79"}
    missing = check(daemon.url, "--gpus", "3,9")
    assert missing.returncode == 3 and "no GPU 9 on this node (it has GPUs 0, 1, 2, 3, 4, 5, 6, 7)" in missing.stdout


def test_json_without_a_daemon_is_still_json() -> None:
    result = check(f"http://127.0.0.1:{free_port()}", "--json")
    assert result.returncode == 3
    out = json.loads(result.stdout)
    assert (out["version"], out["status"], out["exit_code"], out["health"]) == (1, "UNKNOWN", 3, "unknown")
    assert out["diagnosis"] is None and out["incomplete"] is False
    assert out["error"].startswith("cannot get a verdict from gpu-triage at http://127.0.0.1:")
    assert out["reason"] == "UNKNOWN - " + out["error"]
    assert check(f"http://127.0.0.1:{free_port()}", "--format", "json").stdout.startswith("{")
    reason_line = check(f"http://127.0.0.1:{free_port()}", "--format", "reason")
    assert reason_line.returncode == 3 and reason_line.stdout.startswith("UNKNOWN - cannot get a verdict")


def test_a_body_that_is_no_verdict_is_unknown() -> None:
    """A web server that answers something else on the port (200, but not the diagnosis)."""

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = check(f"http://127.0.0.1:{server.server_address[1]}", "--json")
    finally:
        server.shutdown()
        server.server_close()
    out = json.loads(result.stdout)
    assert result.returncode == 3 and out["status"] == "UNKNOWN" and out["diagnosis"] is None
    assert out["error"].endswith("answered no verdict: node: Field required (+5 more)"), out["error"]


def test_text_names_the_nvswitch_findings_no_gpu_holds() -> None:
    """A fatal SXid makes the node unhealthy with every GPU healthy: the text must say why."""
    fatal = fatal_sxid()
    answer = json.dumps(report(node_findings=[fatal]).body()).encode()

    class Daemon(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = check(url)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2
    line = f"  NVSwitch: {fatal.title} [critical] -> RESTART_FABRIC_MANAGER (runbook: {url}/runbooks/{fatal.playbook})"
    assert line in result.stdout.splitlines()


# --- the reason line, on the bodies the daemon's own report gives for real verdicts -------------------------


def test_reason_names_every_gpu_that_needs_an_action_worst_first() -> None:
    lost = Telemetry(status=GpuStatus.LOST, lost_since=NOW - 30, lost_answer="GPU 5: NVML_ERROR_GPU_IS_LOST")
    b = report({1: [xid(79)], 3: [xid(48)], 4: [xid(13)]}, {5: lost})
    assert reason(b) == "REBOOT_NODE: GPU 1 Xid 79, GPU 5 lost; RESET_GPU: GPU 3 Xid 48; CHECK_APP: GPU 4 Xid 13"
    assert b.node.summary.startswith("8 GPUs, 8 up; node unhealthy: REBOOT_NODE: GPU 1 Xid 79, GPU 5 lost;")


def test_reason_names_who_was_on_the_gpu() -> None:
    job = Workload("slurm_job", "77", step="0", user="ann")
    pod = Workload("pod", "trainer-0", namespace="ml", container="main")
    b = report({2: [xid(48)]}, workloads={2: (job, pod)})
    assert reason(b) == "RESET_GPU: GPU 2 Xid 48 job 77 +1"


def test_reason_of_an_nvswitch_fault_names_the_switch() -> None:
    fatal = fatal_sxid()
    assert reason(report(node_findings=[fatal])) == "RESTART_FABRIC_MANAGER: NVSwitch fatal SXid"


def test_an_xid_on_a_device_that_is_no_gpu_is_judged_by_its_code_not_as_a_lost_gpu() -> None:
    found = unknown_device_findings("0000:ee:00.0", [xid(13)], boot_id="b1", now=NOW)
    b = report(node_findings=found)
    assert reason(b) == "CHECK_APP: 0000:ee:00.0 Xid 13"
    assert b.node.health == "degraded" and b.node.action == "CHECK_APP"
    assert [f.class_id for f in b.findings] == ["unknown_device"]
    assert [e.text for e in b.findings[0].evidence] == [xid(13).text]


def test_reason_when_nothing_is_to_be_done() -> None:
    assert reason(report()) == "OK"


def test_a_blind_verdict_is_incomplete_never_ok() -> None:
    blind = (Blind("kmsg", "Permission denied (/dev/kmsg)"),)
    b = report(incomplete=blind)
    assert b.node.health == "unknown"
    assert reason(b) == "INCOMPLETE: kernel log unreadable (Permission denied (/dev/kmsg))"
    assert "CAP_SYSLOG" in b.node.summary
    sick = report({1: [xid(79)]}, incomplete=blind)
    assert sick.node.health == "unhealthy", "what it did see still counts"
    assert (
        reason(sick) == "REBOOT_NODE: GPU 1 Xid 79; INCOMPLETE: kernel log unreadable (Permission denied (/dev/kmsg))"
    )


def test_select_by_index_and_uuid() -> None:
    b = report({0: [xid(13)]})
    assert select(b, ["0"]).node.health == "degraded"
    narrowed = select(b, ["GPU-1"]).node
    assert (narrowed.health, narrowed.action, narrowed.summary) == ("healthy", "IGNORE", "GPU 1 of 8: healthy")
    with pytest.raises(NoVerdictError, match="no GPU 9"):
        select(b, ["9"])


def test_select_keeps_the_node_blind() -> None:
    b = report(incomplete=(Blind("kmsg", "Permission denied (/dev/kmsg)"),))
    narrowed = select(b, ["0", "1"])
    assert narrowed.node.health == "unknown" and "kernel log unreadable" in narrowed.node.summary
    assert reason(narrowed).startswith("INCOMPLETE: kernel log unreadable")


def _answering(answer: bytes) -> ThreadingHTTPServer:
    class Daemon(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_names_from_the_cluster_cannot_forge_lines_or_drive_the_terminal() -> None:
    """Pod, container and job names come from whoever made them: a newline must not forge a line of the
    verdict, and an escape sequence (OSC 0 sets the window title, CSI 2J clears the screen) must be printed,
    not obeyed. The same escapes as `gpu-triage diagnose` writes."""
    pod = Workload("pod", "trainer\n  GPU 0: all fine", namespace="ml", container="\x1b]0;PWN\x07\x1b[2J\x9b")
    job = Workload("slurm_job", "\x1b[31m4242")
    server = _answering(json.dumps(report({0: [xid(79)]}, workloads={0: (pod, job)}).body()).encode())
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        text, one = check(url), check(url, "--format", "reason")
    finally:
        server.shutdown()
        server.server_close()
    for result in (text, one):
        assert result.returncode == 2
        assert not set(result.stdout) & {"\x1b", "\x07", "\x9b", "\r"}, repr(result.stdout)
    assert len(text.stdout.splitlines()) == 2, text.stdout  # the verdict and one finding: nothing forged
    assert "pod ml/trainer\\x0a  GPU 0: all fine (container \\x1b]0;PWN\\x07\\x1b[2J\\x9b)" in text.stdout
    assert "Slurm job \\x1b[31m4242" in text.stdout
    assert one.stdout == "REBOOT_NODE: GPU 0 Xid 79 pod ml/trainer GPU 0: all fine +1\n"


@pytest.mark.parametrize("kind", ["endless", "trickle"])
def test_an_answer_without_end_is_no_verdict_within_the_timeout(kind: str) -> None:
    """Another server on the port that streams for ever, or one byte at a time: `check` gives up with UNKNOWN
    after its timeout instead of reading on (each read alone would be within httpx's timeout)."""
    stop = threading.Event()

    class Endless(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            chunk = b"x" * (1 << 20) if kind == "endless" else b" "
            while not stop.is_set():
                try:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                except OSError:
                    return
                if kind == "trickle":
                    stop.wait(0.05)  # the trickle is the behaviour under test: a byte well within each read's timeout

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = check(f"http://127.0.0.1:{server.server_address[1]}", "--json", "--timeout", "1")
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    out = json.loads(result.stdout)
    assert result.returncode == 3 and out["status"] == "UNKNOWN" and out["diagnosis"] is None
    assert ("over 16 MiB" if kind == "endless" else "took over 1 s") in out["error"], out["error"]
