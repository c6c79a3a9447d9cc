"""The command line as a user runs it: `gpu-triage serve` in a real process, good and bad."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port

GPU_TRIAGE = str(Path(sys.executable).with_name("gpu-triage"))


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPU_TRIAGE, *args], capture_output=True, text=True, timeout=timeout, check=False)


def wait_ready(url: str, proc: subprocess.Popen[str], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gpu-triage exited with {proc.returncode}: {proc.stderr and proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("gpu-triage did not become ready")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [GPU_TRIAGE, "serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{port}",
         "--collector.interval", "1s", "--state.dir", str(tmp_path)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, f"SIGTERM should be a clean stop: {stderr}"
    assert "stopping" in stderr


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("gpu-triage ")


def test_serve_on_the_simulator(served: str) -> None:
    lines = httpx.get(f"{served}/metrics").text.splitlines()
    assert sum(line.startswith("nvidia_gpu_up{") for line in lines) == 8
    assert httpx.post(f"{served}/api/v1/sim/faults", json={"gpu": 5, "kind": "gpu_lost"}).status_code == 201
    deadline = time.monotonic() + 10
    while not any(line.startswith('nvidia_gpu_up{gpu="5"') and line.endswith(" 0.0") for line in lines):
        assert time.monotonic() < deadline, "the lost GPU never showed as down"
        time.sleep(0.2)
        lines = httpx.get(f"{served}/metrics").text.splitlines()
    assert sum(line.startswith("nvidia_gpu_power_watts{") for line in lines) == 7


def test_bad_flags_are_all_reported_at_once() -> None:
    result = run(
        "serve",
        "--backend",
        "cuda",
        "--collector.interval",
        "soon",
        "--no-such-flag",
        "--web.listen-address",
        "x",
    )
    assert result.returncode == 2
    for expected in (
        "unknown flag '--no-such-flag'",
        "--backend",
        "--collector.interval",
        "--web.listen-address",
    ):
        assert expected in result.stderr
    assert result.stderr.count("  - ") == 4


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "already in use" in result.stderr


def test_unreadable_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkload: nope\n")
    result = run(
        "serve",
        "--backend",
        "sim",
        "--sim.scenario",
        str(bad),
        f"--web.listen-address=127.0.0.1:{free_port()}",
    )
    assert result.returncode == 1
    assert f"scenario file {bad} is invalid: workload" in result.stderr


def test_auto_without_a_gpu_says_how_to_run_on_the_simulator() -> None:
    result = run("serve", f"--web.listen-address=127.0.0.1:{free_port()}")
    if result.returncode == 0:
        pytest.skip("this machine has a working NVIDIA driver")
    assert result.returncode == 1
    assert "NVML was not found" in result.stderr and "--backend sim" in result.stderr


def test_no_command_prints_help() -> None:
    result = run()
    assert result.returncode == 2 and "serve" in result.stderr


def test_xid_explains_a_code() -> None:
    result = run("xid", "79")
    assert result.returncode == 0
    assert result.stdout.startswith("Xid 79  ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS\n")
    assert "action: REBOOT_NODE" in result.stdout and "/runbooks/xid-79" in result.stdout
    as_json = json.loads(run("xid", "48", "--json").stdout)
    assert as_json["xid"] == 48 and as_json["playbook"] == "xid-48"
    unknown = run("xid", "999")
    assert unknown.returncode == 1 and "not in NVIDIA's catalog" in unknown.stderr
    assert run("xid", "seventy-nine").returncode == 2


def test_check_exit_codes_follow_the_node_verdict(served: str) -> None:
    healthy = run("check", "--url", served)
    assert (healthy.returncode, healthy.stdout) == (0, "OK - 8 GPUs, 8 up; node healthy\n")
    assert httpx.post(f"{served}/api/v1/sim/faults", json={"gpu": 2, "kind": "xid", "xid": 79}).status_code == 201
    deadline = time.monotonic() + 10
    while (sick := run("check", "--url", served)).returncode != 2:
        assert time.monotonic() < deadline, sick.stdout
        time.sleep(0.2)
    assert sick.stdout.startswith("CRITICAL - 8 GPUs, 8 up; node unhealthy: REBOOT_NODE on GPU 2\n")
    assert "GPU 2: The GPU fell off the PCIe bus" in sick.stdout and f"{served}/runbooks/xid-79" in sick.stdout
    assert json.loads(run("check", "--url", served, "--json").stdout)["node"]["action"] == "REBOOT_NODE"


def test_check_without_a_daemon_is_unknown() -> None:
    result = run("check", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "1")
    assert result.returncode == 3 and result.stdout.startswith("UNKNOWN - cannot get a verdict")


def test_alerts_render_points_runbooks_at_a_published_copy(tmp_path: Path) -> None:
    rules = REPO / "alerts" / "gpu-triage.rules.yml"
    result = run("alerts", "render", "--runbook-base", "https://wiki.example.com/gpu/", str(rules))
    assert result.returncode == 0
    urls = [
        line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.strip().startswith("runbook_url:")
    ]
    assert urls and all(url.startswith('"https://wiki.example.com/gpu/') for url in urls)
    assert result.stdout.count("runbook_url:") == rules.read_text().count("runbook_url:")
    missing = run("alerts", "render", "--runbook-base", "https://x", str(tmp_path / "nope.yml"))
    assert missing.returncode == 2 and "gpu-triage alerts render:" in missing.stderr


def test_an_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run(
        "serve",
        "--backend",
        "sim",
        f"--web.listen-address=127.0.0.1:{free_port()}",
        "--state.dir",
        str(blocker / "state"),
    )
    assert result.returncode == 1
    assert "--state.dir must name a directory the daemon can write" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_address_means_ipv6_and_ipv4() -> None:
    from exporter.server import bind

    sock = bind(":0")
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        if sock.family == socket.AF_INET6:
            with socket.create_connection(("::1", port), timeout=2):
                pass
    finally:
        sock.close()
