"""The vGPU library, built once per session, and pynvml workers that load it, one per test."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The project modules these tests use, named in this one place: the package layout is moving.
# Test files take `vs` from here; the worker imports the backend by these names.
from gpu_triage.exporter.vgpu import state as vs

NVML_BACKEND_MODULE = "gpu_triage.exporter.backends.nvml.backend"
COLLECTORS_MODULE = "gpu_triage.exporter.backends.collectors"

__all__ = ["COLLECTORS_MODULE", "NVML_BACKEND_MODULE", "H", "Worker", "vs"]

REPO = Path(__file__).resolve().parents[2]
LIB_DIR = REPO / "build" / "vgpu"
ANSWER_TIMEOUT = 30.0  # generous: a worker answers in milliseconds unless a test makes it wait


@pytest.fixture(scope="session")
def vgpu_lib() -> Path:
    """`make vgpu`, once. Without a C compiler the tests skip, unless CI says the tools must be there."""
    missing = [tool for tool in ("make", os.environ.get("CC", "cc")) if shutil.which(tool) is None]
    if missing:
        if os.environ.get("GPU_TRIAGE_REQUIRE_TOOLS"):
            pytest.fail(f"{', '.join(missing)} required (GPU_TRIAGE_REQUIRE_TOOLS is set) but not installed")
        pytest.skip(f"{', '.join(missing)} not installed: the vGPU library cannot be built")
    build = subprocess.run(
        ["make", "--no-print-directory", "vgpu"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if build.returncode != 0:
        pytest.fail(f"make vgpu failed:\n{build.stdout}{build.stderr}")
    return LIB_DIR


class NvmlError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"NVML error {code}")
        self.code = code


class Worker:
    """A subprocess running pynvml against the library (tests/vgpu/nvml_worker.py)."""

    def __init__(self, lib_dir: Path, state: Path | None, extra_env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "GPU_TRIAGE_VGPU_STATE"}
        env["LD_LIBRARY_PATH"] = str(lib_dir)
        if state is not None:
            env["GPU_TRIAGE_VGPU_STATE"] = str(state)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.vgpu.nvml_worker"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._answers.put(json.loads(line))

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
        """The next answer; queue.Empty if none comes within `timeout`."""
        reply = self._answers.get(timeout=timeout)
        if "error" in reply:
            raise AssertionError(f"worker raised:\n{reply['error']}")
        return reply

    def value(self, reply: dict[str, Any]) -> Any:
        if "nvml" in reply:
            raise NvmlError(reply["nvml"])
        return reply["ok"]

    def run(self, code: str) -> Any:
        """Runs statements in the worker; returns what they put in `result`."""
        self.send({"code": code})
        return self.value(self.answer())

    def call(self, fn: str, *args: Any, save: str | None = None) -> Any:
        """A pynvml function; H("name") in args is an object saved earlier under that name."""
        self.send({"call": fn, "args": list(args), "save": save})
        return self.value(self.answer())

    def error(self, fn: str, *args: Any) -> int:
        """The NVML error a call raises (fails the test when it succeeds)."""
        with pytest.raises(NvmlError) as info:
            self.call(fn, *args)
        return info.value.code

    def init(self) -> None:
        """nvmlInit, and every GPU's handle saved under its index."""
        self.run("n.nvmlInit()\nfor i in range(n.nvmlDeviceGetCount()): H[str(i)] = n.nvmlDeviceGetHandleByIndex(i)")

    def close(self) -> str:
        """Ends the worker; returns what it wrote to stderr."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        if self.proc.stdin.closed:
            return self._stderr
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        self.proc.stdout.close()
        with self.proc.stderr:
            self._stderr = self.proc.stderr.read()
        return self._stderr


def H(name: str | int) -> dict[str, str]:
    """Names an object the worker saved (its handles are saved under their GPU index)."""
    return {"h": str(name)}


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "vgpu.state"


@pytest.fixture
def writer(state_file: Path) -> Iterator[Callable[..., vs.StateWriter]]:
    """Opens a StateWriter on the test's state file (closed at the end)."""
    opened: list[vs.StateWriter] = []

    def open_writer(gpus: list[vs.Gpu] | None = None, **kwargs: Any) -> vs.StateWriter:
        w = vs.StateWriter(state_file, vs.h100_node() if gpus is None else gpus, **kwargs)
        opened.append(w)
        return w

    yield open_writer
    for w in opened:
        w.close()


@pytest.fixture
def worker(vgpu_lib: Path) -> Iterator[Callable[..., Worker]]:
    """Starts workers: worker(state_file) reads that file, worker(None) the library's default node."""
    started: list[Worker] = []

    def start(state: Path | None, extra_env: dict[str, str] | None = None) -> Worker:
        w = Worker(vgpu_lib, state, extra_env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


@pytest.fixture
def state(writer: Callable[..., vs.StateWriter]) -> vs.StateWriter:
    """The test's state file, holding the default node until the test writes its own."""
    return writer()


@pytest.fixture
def nvml(worker: Callable[..., Worker], state: vs.StateWriter) -> Worker:
    """An initialised worker on the test's state file, every GPU's handle saved under its index."""
    w = worker(state.path)
    w.init()
    return w
