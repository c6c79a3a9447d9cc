"""`gpu-triage release`: the NVML backend lets go of NVML for a GPU reset, and takes it back."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpu_triage.exporter.backends.nvml.release import ANSWER, REQUEST, write_json
from tests.daemon_proc import GPU_TRIAGE, wait_for
from tests.vgpu.conftest import Worker, vs
from tests.vgpu.test_vgpu_e2e import gauge, nvml_daemon, page, vgpu_driver

UNINITIALIZED = 1
OPEN = (
    "import pathlib\n"
    "from gpu_triage.exporter.backends.nvml.backend import NvmlBackend\n"
    "from gpu_triage.exporter.backends.base import BackendError\n"
    "from gpu_triage.exporter.backends.collectors import Collector\n"
    "b = H['b'] = NvmlBackend(release_dir=pathlib.Path({dir!r}))\n"
    "H['gpus'] = b.discover()\n"
)


def attempt(nvml: Worker, code: str) -> str:
    return nvml.run(
        "from gpu_triage.exporter.backends.base import BackendError\n"
        "from gpu_triage.exporter.backends.collectors import Collector\n"
        f"try:\n    {code}\n    result = 'ok'\nexcept BackendError as e:\n    result = str(e)"
    )


def test_the_backend_lets_go_of_nvml_and_takes_it_back(
    worker: Callable[..., Worker], state: vs.StateWriter, tmp_path: Path
) -> None:
    nvml = worker(state.path)
    nvml.run(OPEN.format(dir=str(tmp_path)))
    now = time.time()
    write_json(tmp_path / REQUEST, {"until": now + 60, "requested_at": now, "by": "test"})
    # The event thread lets go; reads refuse from the moment the request is there.
    assert "let go of for a GPU reset" in attempt(nvml, "H['b'].wait_xids(0.05)")
    assert "let go of" in attempt(nvml, "H['b'].read(H['gpus'][0], Collector.POWER)")
    assert (tmp_path / ANSWER).exists()
    # NVML itself is shut down: this process holds no GPU, which is what lets nvidia-smi -r work.
    assert nvml.error("nvmlDeviceGetCount") == UNINITIALIZED
    (tmp_path / REQUEST).unlink()  # gpu-triage release --resume
    # The request file is looked at once a second: until then the event thread keeps refusing.
    wait_for(lambda: attempt(nvml, "H['b'].wait_xids(0.05)") == "ok", timeout=10, interval=0.05, what="resumed")
    assert not (tmp_path / ANSWER).exists()
    assert attempt(nvml, "H['b'].read(H['gpus'][3], Collector.POWER)") == "ok"
    assert nvml.call("nvmlDeviceGetCount") == 8


def test_a_hold_ends_by_itself_and_cannot_be_asked_for_longer_than_the_bound(
    worker: Callable[..., Worker], state: vs.StateWriter, tmp_path: Path
) -> None:
    nvml = worker(state.path)
    nvml.run(OPEN.format(dir=str(tmp_path)))
    now = time.time()
    write_json(tmp_path / REQUEST, {"until": now + 10**9, "requested_at": now - 899, "by": "test"})
    assert "let go of" in attempt(nvml, "H['b'].wait_xids(0.05)")  # 900 s at most: one second of it left
    wait_for(lambda: attempt(nvml, "H['b'].wait_xids(0.05)") == "ok", timeout=10, interval=0.05, what="the hold over")
    assert attempt(nvml, "H['b'].read(H['gpus'][0], Collector.POWER)") == "ok"


def test_gpu_triage_release_with_the_daemon(tmp_path: Path, vgpu_lib: Path) -> None:
    home = tmp_path / "nvml"
    with (
        vgpu_driver(tmp_path / "vgpu"),
        nvml_daemon(home, vgpu_lib, tmp_path / "vgpu" / "vgpu.state") as daemon,
    ):
        wait_for(lambda: gauge(page(daemon), "gpu_triage_backend_up", backend="nvml") == 1.0, what="the daemon")
        asked = subprocess.run(
            [GPU_TRIAGE, "release", "--state.dir", str(home), "--seconds", "60"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert asked.returncode == 0, asked.stderr
        assert "nvidia-smi -r -i" in asked.stdout and "gpu-triage release --resume" in asked.stdout

        # A poll that read before the hold began may still publish after it (a reading true when it was taken);
        # from the next poll on, nothing read, nothing shown, on the same page as the backend going down.
        def held(text: str) -> bool:
            down = gauge(text, "gpu_triage_backend_up", backend="nvml") == 0.0
            return down and gauge(text, "nvidia_gpu_power_watts", gpu="0") is None

        wait_for(lambda: held(page(daemon)), what="the hold, with no readings shown")
        assert held(page(daemon))
        back = subprocess.run(
            [GPU_TRIAGE, "release", "--state.dir", str(home), "--resume"], capture_output=True, text=True, check=False
        )
        assert back.returncode == 0, back.stderr
        wait_for(lambda: gauge(page(daemon), "nvidia_gpu_power_watts", gpu="0") is not None, what="readings again")
        assert "NVML taken back" in daemon.output()


def test_release_says_so_when_no_daemon_answers(tmp_path: Path) -> None:
    asked = subprocess.run(
        [GPU_TRIAGE, "release", "--state.dir", str(tmp_path), "--wait", "0.5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert asked.returncode == 1 and "did not let go of NVML" in asked.stderr
    too_long = subprocess.run(
        [GPU_TRIAGE, "release", "--state.dir", str(tmp_path), "--seconds", "3600"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert too_long.returncode == 2 and "between 10 and 900" in too_long.stderr
