"""Real servers for end-to-end tests: gpu-triage, Prometheus and Alertmanager as subprocesses.

Everything binds to 127.0.0.1 on a free port, writes under the test's tmp_path, and is stopped
when the context exits, pass or fail.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import free_port, require_tool

GPU_TRIAGE = str(Path(sys.executable).with_name("gpu-triage"))


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


def _wait(url: str, server: subprocess.Popen[bytes], log: Path, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"{server.args!r} exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become ready:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def _run(args: list[str], ready_url: str, log: Path, base_url: str) -> Iterator[Server]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(ready_url, process, log)
            yield Server(base_url, process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def gpu_triage(tmp_path: Path, *args: str, scenario: str = "h100-training") -> Iterator[Server]:
    """`gpu-triage serve` on the simulator, polling every second, with its own state and kernel log."""
    port = free_port()
    state = tmp_path / "gpu-triage"
    state.mkdir(exist_ok=True)
    kmsg = state / "kmsg.log"
    kmsg.touch()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        GPU_TRIAGE, "serve", "--backend", "sim", "--sim.scenario", scenario,
        f"--web.listen-address=127.0.0.1:{port}", "--collector.interval", "1s", "--collector.slow-interval", "2s",
        "--state.dir", str(state), "--kmsg.path", str(kmsg), *args,
    ]  # fmt: skip
    with _run(cmd, f"{url}/readyz", state / "daemon.log", url) as server:
        yield server


@contextlib.contextmanager
def prometheus(
    tmp_path: Path,
    targets: list[str],
    *,
    rule_files: list[Path] = (),  # type: ignore[assignment]
    alertmanager: str | None = None,
    interval: str = "1s",
) -> Iterator[Server]:
    """Prometheus scraping `targets` (host:port), evaluating `rule_files`, alerting `alertmanager`."""
    binary = require_tool("prometheus")
    port = free_port()
    home = tmp_path / "prometheus"
    home.mkdir(exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [{"job_name": "gpu-triage", "static_configs": [{"targets": targets}]}],
        "rule_files": [str(p) for p in rule_files],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
    ]  # fmt: skip
    with _run(cmd, f"{url}/-/ready", home / "prometheus.log", url) as server:
        yield server


@contextlib.contextmanager
def alertmanager(tmp_path: Path, config: dict[str, Any]) -> Iterator[Server]:
    """Alertmanager with `config` (a parsed alertmanager.yml)."""
    binary = require_tool("prometheus-alertmanager")
    port, cluster = free_port(), free_port()
    home = tmp_path / "alertmanager"
    home.mkdir(exist_ok=True)
    (home / "alertmanager.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    cmd = [
        binary, f"--config.file={home / 'alertmanager.yml'}", f"--storage.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster}",
    ]  # fmt: skip
    with _run(cmd, f"{url}/-/ready", home / "alertmanager.log", url) as server:
        yield server


def query(prom: Server, expr: str) -> list[dict[str, Any]]:
    """An instant PromQL query's result vector."""
    answer = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.25, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; that value is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
