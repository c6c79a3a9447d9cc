"""Shared fixtures: a controllable clock, the simulator, a started daemon and its HTTP client."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]
START = 1_790_000_000.0  # a fixed wall-clock start for deterministic tests


def pytest_configure(config: pytest.Config) -> None:
    """The knowledge cache and the compiled scan (exporter/cache_store.py) of this test run, not the user's:
    every in-process daemon and every `gpu-triage` child shares it, and it is gone after the run."""
    if "GPU_TRIAGE_CACHE_DIR" not in os.environ:
        import tempfile

        config.stash[_CACHE] = tempfile.mkdtemp(prefix="gpu-triage-test-cache-")
        os.environ["GPU_TRIAGE_CACHE_DIR"] = config.stash[_CACHE]


def pytest_unconfigure(config: pytest.Config) -> None:
    if (made := config.stash.get(_CACHE, None)) is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("GPU_TRIAGE_CACHE_DIR", None)


_CACHE = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite golden files instead of comparing against them"
    )
    parser.addoption(
        "--update-screenshots",
        action="store_true",
        help="write the browser test's screenshots into docs/images/ (the README's pictures)",
    )


class FakeClock:
    """Wall-clock and monotonic time that move only when a test says so: together as time passes
    (`advance`), or the wall clock alone when it is set (`step`: NTP, an operator's `date -s`)."""

    def __init__(self, start: float = START) -> None:
        self.now = start
        self.mono = 1000.0

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[SimBackend]:
    backend = SimBackend(load_scenario("h100-training"), clock=clock)
    yield backend
    backend.close()


def settings(state_dir: Path, **overrides: object) -> Settings:
    """Test settings: the simulator, an empty kernel log file, a journal under `state_dir`, and nothing of the
    host's: no kubelet socket, and an empty /proc (the simulator's PIDs are not this machine's). The name
    TestClient puts in Host, `testserver`, is one of the daemon's, as an operator would configure it."""
    kmsg = state_dir / "kmsg.log"
    kmsg.touch()
    values: dict[str, object] = {
        "backend": "sim",
        "collector_interval": 5.0,
        "collector_timeout": 0.5,
        "state_dir": state_dir,
        "kmsg_path": kmsg,
        "kubernetes_pod_resources_socket": "off",
        "path_procfs": state_dir / "no-proc",
        "web_allowed_hosts": ["testserver"],
    }
    values.update(overrides)
    return load_settings(values, None)


@pytest.fixture
def daemon(sim: SimBackend, clock: FakeClock, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on the simulator with its first snapshot taken, 2 minutes into the scenario."""
    clock.advance(120)
    d = Daemon(sim, settings(tmp_path), clock=clock, monotonic=clock.monotonic, boot_id="boot-1")
    d.start()
    yield d
    d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[TestClient]:
    with TestClient(create_app(daemon)) as c:
        yield c


def require_tool(name: str) -> str:
    """The path of an external tool; skipped when missing, unless CI says the tools must be there."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("GPU_TRIAGE_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required (GPU_TRIAGE_REQUIRE_TOOLS is set) but not installed")
        pytest.skip(f"{name} is not installed")
    return path
