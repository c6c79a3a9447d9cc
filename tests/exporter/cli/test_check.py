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

from gpu_triage.exporter.cli.check import NoVerdictError, reason, select
from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE, Daemon, free_port, serve, wait_for
from tests.podresources_server import Container, Pod, PodResourcesServer, pod_resources_server

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
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("  GPU 3:")]
    assert line.endswith("; used by pod ml/trainer-0 (container main), Slurm job 4243 step 0 (4711)")
    one = check(daemon.url, "--format", "reason")
    assert (one.returncode, one.stdout) == (2, "REBOOT_NODE GPU 3 Xid 79 pod ml/trainer-0 +1\n")


@pytest.mark.e2e
def test_gpus_narrows_the_verdict(node: tuple[Daemon, PodResourcesServer, list[str]]) -> None:
    daemon, _, uuids = node
    fine = check(daemon.url, "--gpus", "0,1", "--format", "reason")
    assert (fine.returncode, fine.stdout) == (0, "OK\n")
    assert check(daemon.url, "--gpus", "0,1").stdout == "OK - GPUs 0, 1 of 8: healthy\n"
    sick = check(daemon.url, "--gpus", f"1,{uuids[3]}", "--json")
    body = json.loads(sick.stdout)
    assert sick.returncode == 2
    assert [g["gpu"] for g in body["gpus"]] == [1, 3] and body["selected"] == ["1", uuids[3]]
    assert body["node"] == {
        "health": "unhealthy",
        "action": "REBOOT_NODE",
        "summary": "GPUs 1, 3 of 8: unhealthy: REBOOT_NODE on GPU 3",
    }
    assert {f["class"] for f in body["findings"]} == {"xid_79"}
    missing = check(daemon.url, "--gpus", "3,9")
    assert missing.returncode == 3 and "no GPU 9 on this node (it has GPUs 0, 1, 2, 3, 4, 5, 6, 7)" in missing.stdout


def test_json_without_a_daemon_is_still_json() -> None:
    result = check(f"http://127.0.0.1:{free_port()}", "--json")
    assert result.returncode == 3
    body = json.loads(result.stdout)
    assert body["node"]["health"] == "unknown" and body["gpus"] == [] and body["findings"] == []
    assert body["error"].startswith("cannot get a verdict from gpu-triage at http://127.0.0.1:")
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
    assert result.returncode == 3 and json.loads(result.stdout)["node"]["health"] == "unknown"


def test_text_names_the_nvswitch_findings_no_gpu_holds() -> None:
    """A fatal SXid makes the node unhealthy with every GPU healthy: the text must say why."""
    sxid = {
        "id": "sxid_fatal", "class": "sxid_fatal", "severity": "critical", "action": "REBOOT_NODE",
        "title": "Fatal NVSwitch error", "playbook": "sxid-fatal", "gpu": None, "workloads": [],
    }  # fmt: skip
    answer = json.dumps(body("unhealthy", "REBOOT_NODE", [gpu(0, "0000:18:00.0", findings=[])], [sxid])).encode()

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
    assert f"  NVSwitch: Fatal NVSwitch error [critical] -> REBOOT_NODE (runbook: {url}/runbooks/sxid-fatal)" in (
        result.stdout.splitlines()
    )


# --- the reason line, on diagnosis bodies of the shapes the daemon gives -----------------------------------


def gpu(index: int | None, bus: str, health: str = "healthy", action: str = "IGNORE", **more: Any) -> dict[str, Any]:
    return {"gpu": index, "uuid": f"GPU-{index}", "pci_bus_id": bus, "health": health, "action": action, **more}


def body(health: str, action: str, gpus: list[dict[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"node": {"health": health, "action": action, "summary": "..."}, "gpus": gpus, "findings": findings}


def test_reason_of_a_lost_gpu_names_the_condition() -> None:
    lost = {"class": "gpu_lost", "action": "REBOOT_NODE", "gpu": "0000:ba:00.0", "workloads": []}
    b = body(
        "unhealthy", "REBOOT_NODE", [gpu(4, "0000:9a:00.0"), gpu(5, "0000:ba:00.0", "unhealthy", "REBOOT_NODE")], [lost]
    )
    assert reason(b) == "REBOOT_NODE GPU 5 gpu_lost"


def test_reason_of_an_nvswitch_fault_has_no_gpu() -> None:
    switch = {"class": "sxid_fatal", "action": "REBOOT_NODE", "gpu": None}
    assert reason(body("unhealthy", "REBOOT_NODE", [gpu(0, "0000:18:00.0")], [switch])) == "REBOOT_NODE sxid_fatal"


def test_reason_of_a_gpu_the_driver_no_longer_lists_gives_its_bus_id() -> None:
    xid = {"class": "xid_79", "action": "REBOOT_NODE", "gpu": "0000:e1:00.0"}
    orphan = gpu(None, "0000:e1:00.0", "unhealthy", "REBOOT_NODE")
    assert reason(body("unhealthy", "REBOOT_NODE", [orphan], [xid])) == "REBOOT_NODE 0000:e1:00.0 Xid 79"


def test_reason_takes_the_most_urgent_finding_and_the_gpu_s_current_workload_when_the_finding_has_none() -> None:
    findings = [
        {"class": "xid_48", "action": "DRAIN_AND_RESET", "gpu": "0000:bb:00.0"},
        {"class": "xid_13", "action": "CHECK_APP", "gpu": "0000:2a:00.0"},
    ]
    job = {"kind": "slurm_job", "job_id": "77", "step": "0", "user": "ann"}
    gpus = [
        gpu(1, "0000:2a:00.0", "degraded", "CHECK_APP"),
        gpu(6, "0000:bb:00.0", "unhealthy", "DRAIN_AND_RESET", workloads=[job]),
    ]
    assert reason(body("unhealthy", "DRAIN_AND_RESET", gpus, findings)) == "DRAIN_AND_RESET GPU 6 Xid 48 job 77"


def test_reason_when_nothing_is_to_be_done() -> None:
    assert reason(body("healthy", "IGNORE", [gpu(0, "0000:18:00.0")], [])) == "OK"


def test_select_by_index_and_uuid() -> None:
    b = body("unhealthy", "REBOOT_NODE", [gpu(0, "a", "degraded", "CHECK_COOLING"), gpu(1, "b")], [])
    assert select(b, ["0"])["node"]["health"] == "degraded"
    assert select(b, ["GPU-1"])["node"] == {"health": "healthy", "action": "IGNORE", "summary": "GPU 1 of 2: healthy"}
    with pytest.raises(NoVerdictError, match="no GPU 7"):
        select(b, ["7"])


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
    hostile = {
        "kind": "pod", "namespace": "ml", "pod": "trainer\n  GPU 0: all fine",
        "container": "\x1b]0;PWN\x07\x1b[2J\x9b", "job_id": "\x1b[31m4242",
    }  # fmt: skip
    xid = {
        "id": "f1", "class": "xid_79", "severity": "critical", "action": "REBOOT_NODE", "title": "GPU fallen off the bus",
        "playbook": "xid-79", "gpu": "0000:18:00.0", "workloads": [hostile, {**hostile, "kind": "slurm_job"}],
    }  # fmt: skip
    bad_gpu = gpu(0, "0000:18:00.0", "unhealthy", "REBOOT_NODE", findings=[xid])
    server = _answering(json.dumps(body("unhealthy", "REBOOT_NODE", [bad_gpu], [xid])).encode())
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
    assert one.stdout == "REBOOT_NODE GPU 0 Xid 79 pod ml/trainer GPU 0: all fine +1\n"
