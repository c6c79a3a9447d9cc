"""A daemon that cannot see says so: with its kernel log unreadable, no interface calls the node healthy.

The real daemon, as a user runs it (`gpu-triage serve`, `gpu-triage check`), with --kmsg.path naming a file that
is not there (as root, the only way to make a file unreadable is to have none): the verdict is unknown and names
the kernel log, on every surface that reports it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_proc import GPU_TRIAGE, free_port, running, serve, wait_for


def check(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [GPU_TRIAGE, "check", "--url", url, "--timeout", "5", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def incomplete_diagnosis(url: str) -> dict[str, Any] | None:
    """The diagnosis once it says what it cannot see (not ready: /readyz says no, so the port is asked directly)."""
    try:
        body: dict[str, Any] = httpx.get(f"{url}/api/v1/diagnosis", timeout=5).json()
    except httpx.HTTPError:
        return None  # not listening yet
    return body if body["node"]["incomplete"] else None


@pytest.mark.e2e
def test_an_unreadable_kernel_log_makes_the_verdict_incomplete_everywhere(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "kmsg.log"
    with serve(tmp_path / "daemon", "--kmsg.path", str(missing), wait_ready=False) as daemon:
        body = wait_for(
            lambda: incomplete_diagnosis(daemon.url), what="the verdict to say the kernel log cannot be read"
        )
        node = body["node"]
        assert node["health"] == "unknown" and all(g["health"] == "healthy" for g in body["gpus"])
        [blind] = node["incomplete"]
        assert blind["source"] == "kmsg" and str(missing) in blind["problem"] and "--kmsg.path" in blind["fix"]
        assert [f["class"] for f in body["findings"]] == ["kernel_log_unreadable"]

        text = check(daemon.url)
        assert text.returncode == 3
        first = text.stdout.splitlines()[0]
        assert first.startswith("UNKNOWN - 8 GPUs, 8 up; node unknown; incomplete: kernel log unreadable")
        assert "CAP_SYSLOG" in first and "--kmsg.path" in first
        reason = check(daemon.url, "--format", "reason")
        assert reason.returncode == 3 and reason.stdout.startswith("INCOMPLETE: kernel log unreadable")
        assert check(daemon.url, "--gpus", "0").returncode == 3, "a GPU's verdict is as blind as the node's"

        ready = httpx.get(f"{daemon.url}/readyz", timeout=5)
        assert ready.status_code == 503 and "the verdict is incomplete: kmsg" in ready.json()["error"]
        page = httpx.get(f"{daemon.url}/", timeout=5).text
        assert page.index("The verdict is incomplete") < page.index('<table id="gpus">')
        assert "No action needed" not in page and "verdict-unknown" in page

        # An XID still counts for what it is: the node is unhealthy, and still says what it cannot see.
        httpx.post(f"{daemon.url}/api/v1/sim/faults", json={"gpu": 2, "kind": "xid", "xid": 48}, timeout=5)
        sick = wait_for(lambda: (r := check(daemon.url)).returncode == 2 and r, what="the XID to count")
        first = sick.stdout.splitlines()[0]
        assert first.startswith(
            "CRITICAL - 8 GPUs, 8 up; node unhealthy: RESET_GPU: GPU 2 Xid 48; incomplete: kernel log"
        )
        metrics = httpx.get(f"{daemon.url}/metrics", timeout=5).text
        assert 'gpu_triage_event_source_up{source="kmsg"} 0.0' in metrics


@pytest.mark.e2e
def test_a_simulated_node_reads_its_own_kernel_log(tmp_path: Path) -> None:
    """Without --kmsg.path the simulator follows kmsg.log in its state directory, not this machine's /dev/kmsg."""
    home = tmp_path / "daemon"
    home.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        GPU_TRIAGE, "serve", "--backend", "sim", "--state.dir", str(home), f"--web.listen-address=127.0.0.1:{port}",
        "--kubernetes.pod-resources-socket", "off", "--path.procfs", str(home / "no-proc"),
    ]  # fmt: skip
    with running(cmd, url=url, ready=f"{url}/readyz", log=home / "log"):
        body = httpx.get(f"{url}/api/v1/diagnosis", timeout=5).json()
        assert body["node"]["health"] == "healthy" and body["node"]["incomplete"] == []
        with (home / "kmsg.log").open("a") as f:
            f.write("NVRM: Xid (PCI:0000:5d:00): 48, pid=1, name=x, An uncorrectable double bit error\n")
        wait_for(lambda: check(url).returncode == 2, what="the line in the simulator's kernel log to count")
