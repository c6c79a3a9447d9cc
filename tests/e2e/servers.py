"""Real servers for end-to-end tests: gpu-triage, Prometheus and Alertmanager as subprocesses.

Everything binds to 127.0.0.1 on a free port, writes under the test's tmp_path, and is stopped
when the context exits, pass or fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import require_tool
from tests.daemon_proc import Server, free_port, running, serve, wait_for

__all__ = ["Server", "alertmanager", "gpu_triage", "prometheus", "query", "wait_for"]


@contextlib.contextmanager
def gpu_triage(tmp_path: Path, *args: str, scenario: str = "h100-training") -> Iterator[Server]:
    """`gpu-triage serve` on the simulator, polling every second, with its own state and kernel log."""
    sim = ["--sim.scenario", scenario, "--collector.interval", "1s", "--collector.slow-interval", "2s"]
    with serve(tmp_path / "gpu-triage", *sim, *args) as daemon:
        yield daemon


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
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    with running(cmd, url=url, ready=f"{url}/-/ready", log=home / "prometheus.log") as server:
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
    with running(cmd, url=url, ready=f"{url}/-/ready", log=home / "alertmanager.log") as server:
        yield server


def query(prom: Server, expr: str) -> list[dict[str, Any]]:
    """An instant PromQL query's result vector."""
    answer = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result
