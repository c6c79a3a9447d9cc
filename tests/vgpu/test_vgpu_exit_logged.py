"""However the NVML-backend daemon ends, its log says why: here, the virtual GPU's state file truncated in
place under it, which makes a read of the library's mapping of it a SIGBUS in native code, where Python's own
error handling never runs."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.daemon_proc import stop, wait_for
from tests.vgpu.test_vgpu_e2e import nvml_daemon, vgpu_driver


def test_a_truncated_state_file_never_ends_the_daemon_without_a_word(tmp_path: Path, vgpu_lib: Path) -> None:
    state = tmp_path / "vgpu" / "vgpu.state"
    # One GPU: the fewer threads read the mapping when it goes, the fewer fault at once. When two do, the second
    # can kill the process under Python's faulthandler before it has written a word (it restores the default
    # handler first), which is the one end this test cannot tell from a silent one.
    scenario = tmp_path / "one-gpu.yaml"
    text = (REPO / "exporter/backends/sim/scenarios/perf-healthy.yaml").read_text()
    scenario.write_text(text.replace("count: 8", "count: 1").replace("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: [0]"))
    with (
        vgpu_driver(tmp_path / "vgpu", str(scenario)) as driver,
        nvml_daemon(tmp_path / "nvml", vgpu_lib, state) as daemon,
    ):
        stop(driver.process)  # nothing writes the file again
        os.truncate(state, 8192)  # the header's page is left, the GPUs' are gone
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.process.wait(timeout=10)  # the exit, if it comes, ends the wait at once
        if daemon.process.poll() is None:  # it held: it still answers, whatever it says about the GPUs
            assert wait_for(lambda: httpx.get(f"{daemon.url}/healthz", timeout=5).status_code, timeout=10)
            return
        output = daemon.output()
        tail = output[output.rfind("msg=listening") :]
        assert "Fatal Python error" in tail, f"exited with {daemon.process.returncode} and said nothing:\n{tail}"
        assert "File " in tail, "with the stacks of its threads, to see which call it was in"
