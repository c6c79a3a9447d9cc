"""`gpu-triage node-condition`, the sidecar of kubernetes/overlays/node-condition: the real command, the real
daemon on the simulator, and a small stand-in for the API server's /api/v1/nodes/<node>/status that records
what it is sent and merges conditions by type as a strategic merge patch does."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.exporter.cli.node_condition import Condition, condition_from
from tests.conftest import require_tool
from tests.daemon_proc import GPU_TRIAGE, Daemon, free_port, serve, wait_for
from tests.exporter.http.test_web_config import HASH
from tests.verdict_bodies import report, xid

SIDECAR = [GPU_TRIAGE, "node-condition"]
NODE = "gpu-node-07"
TOKEN = "token-abc"


class FakeNodeStatus:
    def __init__(self) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": NODE},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }
        self.requests: list[dict[str, Any]] = []
        self.refuse = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, body: Any) -> bool:
                fake.requests.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                if fake.refuse:
                    self._answer(403, {"kind": "Status", "reason": "Forbidden"})
                    return False
                if self.path != f"/api/v1/nodes/{NODE}/status":
                    self._answer(404, {"kind": "Status", "reason": "NotFound"})
                    return False
                return True

            def do_GET(self) -> None:
                if self._record(None):
                    self._answer(200, fake.node)

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._record(body):
                    return
                conditions = {c["type"]: c for c in fake.node["status"]["conditions"]}
                for c in body["status"]["conditions"]:
                    conditions[c["type"]] = {**conditions.get(c["type"], {}), **c}
                fake.node["status"]["conditions"] = list(conditions.values())
                self._answer(200, fake.node)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def condition(self) -> dict[str, Any]:
        (ours,) = [c for c in self.node["status"]["conditions"] if c["type"] == "GpuTriageUnhealthy"]
        return ours

    def patches(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "PATCH"]


@pytest.fixture
def api() -> Iterator[FakeNodeStatus]:
    fake = FakeNodeStatus()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with serve(tmp_path / "daemon") as d:
        yield d


def command(tmp_path: Path, api: FakeNodeStatus, url: str, *extra: str) -> list[str]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return [
        *SIDECAR, f"--url={url}", f"--node={NODE}", f"--api-server={api.url}", f"--token-file={token}",
        "--timeout=5", *extra,
    ]  # fmt: skip


def once(tmp_path: Path, api: FakeNodeStatus, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(tmp_path, api, url, "--once"), check=False, capture_output=True, text=True, timeout=60
    )


def inject_xid79(daemon: Daemon) -> None:
    httpx.post(
        f"{daemon.url}/api/v1/sim/faults", json={"gpu": 3, "kind": "xid", "xid": 79}, timeout=5
    ).raise_for_status()
    wait_for(
        lambda: httpx.get(f"{daemon.url}/api/v1/diagnosis", timeout=5).json()["node"]["health"] == "unhealthy",
        what="the node to turn unhealthy",
    )


def test_healthy_node_gets_false(tmp_path: Path, api: FakeNodeStatus, daemon: Daemon) -> None:
    result = once(tmp_path, api, daemon.url)
    assert result.returncode == 0, result.stderr
    condition = api.condition()
    assert (condition["status"], condition["reason"]) == ("False", "Healthy")
    assert "node healthy" in condition["message"]
    (patch,) = api.patches()
    assert patch["headers"]["Content-Type"] == "application/strategic-merge-patch+json"
    assert patch["headers"]["Authorization"] == f"Bearer {TOKEN}"
    # The kubelet's own condition is untouched: only ours is in the patch.
    assert [c["type"] for c in patch["body"]["status"]["conditions"]] == ["GpuTriageUnhealthy"]


def test_unhealthy_node_gets_true_with_the_action(tmp_path: Path, api: FakeNodeStatus, daemon: Daemon) -> None:
    inject_xid79(daemon)
    assert once(tmp_path, api, daemon.url).returncode == 0
    condition = api.condition()
    assert (condition["status"], condition["reason"]) == ("True", "RebootNode")
    assert condition["message"].startswith("REBOOT_NODE: ")
    assert "GPU 3" in condition["message"] and "runbook xid-79" in condition["message"]


def test_no_daemon_gives_unknown(tmp_path: Path, api: FakeNodeStatus) -> None:
    assert once(tmp_path, api, f"http://127.0.0.1:{free_port()}").returncode == 0
    condition = api.condition()
    assert (condition["status"], condition["reason"]) == ("Unknown", "NoVerdict")
    assert "does not answer" in condition["message"]


def test_transition_time_moves_only_with_the_status(tmp_path: Path, api: FakeNodeStatus, daemon: Daemon) -> None:
    once(tmp_path, api, daemon.url)
    api.condition()["lastTransitionTime"] = "2020-01-01T00:00:00Z"  # False since long ago, as the Node says
    once(tmp_path, api, daemon.url)
    assert api.condition()["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert api.condition()["lastHeartbeatTime"] != "2020-01-01T00:00:00Z"
    inject_xid79(daemon)
    once(tmp_path, api, daemon.url)
    assert api.condition()["status"] == "True"
    assert api.condition()["lastTransitionTime"] != "2020-01-01T00:00:00Z"


class CountingProxy:
    """Between the sidecar and the daemon: forwards its GETs and counts them, so a test can wait for looks."""

    def __init__(self, upstream: str) -> None:
        self.looks = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer = httpx.get(upstream + self.path, timeout=5)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)
                proxy.looks += 1  # counted once answered: the sidecar then decides whether to write

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def proxy(daemon: Daemon) -> Iterator[CountingProxy]:
    counting = CountingProxy(daemon.url)
    thread = threading.Thread(target=counting.server.serve_forever, daemon=True)
    thread.start()
    yield counting
    counting.server.shutdown()
    counting.server.server_close()


def test_it_writes_on_change_not_on_every_look_and_stops_on_sigterm(
    tmp_path: Path, api: FakeNodeStatus, daemon: Daemon, proxy: CountingProxy
) -> None:
    cmd = command(tmp_path, api, proxy.url, "--interval=0.2", "--heartbeat=3600")
    with subprocess.Popen(cmd, stderr=subprocess.DEVNULL) as sidecar:
        try:
            wait_for(api.patches, what="the first write")
            seen = proxy.looks
            # Seven more looks, nothing changed: no write. (The eighth look's answer is in hand only once the
            # seventh's decision is made, so each counted look but the last has had its say.)
            wait_for(lambda: proxy.looks >= seen + 8, timeout=30, interval=0.05, what="eight more looks")
            assert len(api.patches()) == 1
            inject_xid79(daemon)
            wait_for(lambda: len(api.patches()) == 2, what="the write for the change")
            assert api.condition()["status"] == "True"
        finally:
            sidecar.send_signal(signal.SIGTERM)
            assert sidecar.wait(timeout=10) == 0
    looks = [r for r in api.requests if r["method"] == "GET"]
    assert len(looks) == 1  # the Node is read once, at start


def test_a_refused_write_is_reported(tmp_path: Path, api: FakeNodeStatus, daemon: Daemon) -> None:
    api.refuse = True
    result = once(tmp_path, api, daemon.url)
    assert result.returncode == 1
    assert "cannot write the node condition" in result.stderr and "403" in result.stderr


def test_a_node_name_is_required(tmp_path: Path, api: FakeNodeStatus) -> None:
    cmd = [c for c in command(tmp_path, api, "http://127.0.0.1:1") if not c.startswith("--node=")]
    result = subprocess.run(
        [*cmd, "--once"], check=False, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert result.returncode == 2
    assert "NODE_NAME" in result.stderr


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    openssl = require_tool("openssl")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_it_reaches_a_daemon_behind_tls_and_basic_auth_as_check_does(
    tmp_path: Path, api: FakeNodeStatus, cert: tuple[Path, Path]
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {cert[0]}\n  key_file: {cert[1]}\n"
        f"basic_auth_users:\n  prometheus: '{HASH}'\n"
    )
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    with serve(
        tmp_path / "daemon", "--web.config.file", str(config), ca_file=cert[0], auth=("prometheus", "s3cret")
    ) as daemon:
        secured = ["--ca-file", str(cert[0]), "--user", "prometheus"]
        denied = subprocess.run(
            [*command(tmp_path, api, daemon.url, *secured), "--once"], check=False, capture_output=True, text=True
        )
        assert denied.returncode == 0 and api.condition()["reason"] == "NoVerdict"
        assert "401" in api.condition()["message"]
        cmd = command(tmp_path, api, daemon.url, *secured, "--password-file", str(password), "--once")
        assert subprocess.run(cmd, check=False, capture_output=True, text=True).returncode == 0
    assert (api.condition()["status"], api.condition()["reason"]) == ("False", "Healthy")


def test_the_message_names_who_was_on_the_gpu() -> None:
    pod = Workload("pod", "trainer-0", namespace="ml", container="main")
    job = Workload("slurm_job", "4242", step="0", user="ann")
    diagnosis = report({3: [xid(79)]}, workloads={3: (pod, job)})  # the daemon's own report of the verdict
    condition = condition_from(diagnosis)
    assert condition == Condition(
        "True",
        "RebootNode",
        "REBOOT_NODE: 8 GPUs, 8 up; node unhealthy: REBOOT_NODE: GPU 3 Xid 79. Root cause: The GPU fell off the "
        "PCIe bus and no longer answers (runbook xid-79), on pod ml/trainer-0, Slurm job 4242.",
    )
