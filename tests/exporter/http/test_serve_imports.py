"""What the serving daemon holds after its routine requests (a scrape, the landing page, the Slurm check's
/api/v1/diagnosis, /openapi.json): not the modules that only other requests or other setups need.

The daemon runs in a child interpreter (`gpu-triage serve --backend sim` as the command runs it), which
asks itself over HTTP and then reports its own sys.modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.daemon_proc import free_port, state_args

_CHILD = r"""
import json, os, signal, sys, threading, time
import httpx
out, url, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

def ask():
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        answers = {p: httpx.get(url + p, timeout=10) for p in ("/metrics", "/", "/api/v1/diagnosis", "/openapi.json")}
        result = {
            "status": {p: r.status_code for p, r in answers.items()},
            "schemas": sorted(answers["/openapi.json"].json().get("components", {}).get("schemas", {})),
            "loaded": [m for m, module in sys.modules.items() if module is not None],
        }
        with open(out, "w") as f:
            json.dump(result, f)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=ask, daemon=True).start()
from gpu_triage.exporter.cli.main import main
sys.exit(main(argv))
"""

# Loaded for other requests or setups only: settings layering by a library, basic auth's hashing, FastAPI's
# check for pydantic 1 models, the training-log rules (a runbook page's "Used for", POST /api/v1/diagnose),
# the DCGM backend (a daemon on DCGM), Markdown (a runbook page), the block scan's hyperscan (diagnose).
NOT_ROUTINE = (
    "pydantic_settings",
    "bcrypt",
    "pydantic.v1",
    "gpu_triage.diagnosis.training.rules.load",
    "gpu_triage.exporter.backends.dcgm.backend",
    "markdown_it",
    "hyperscan",
)


def test_routine_requests_load_none_of_what_only_others_need(tmp_path: Path) -> None:
    """With the knowledge cache warm, as every start after the first is: a cold one checks all the data, the
    training-log rules with it."""
    env = {"GPU_TRIAGE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    for run_number in range(2):  # the first run fills the cache
        out, port = tmp_path / f"modules-{run_number}.json", free_port()
        argv = ["serve", "--backend", "sim", "--log.level", "warn", *state_args(tmp_path / f"state-{run_number}")]
        argv.append(f"--web.listen-address=127.0.0.1:{port}")
        run = subprocess.run(
            [sys.executable, "-c", _CHILD, str(out), f"http://127.0.0.1:{port}", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
            cwd=Path(__file__).resolve().parents[3],
        )
        assert out.exists(), run.stderr[-3000:]
    assert any((tmp_path / "cache").iterdir()), "the knowledge cache was not written"
    result = json.loads(out.read_text())
    assert result["status"] == {"/metrics": 200, "/": 200, "/api/v1/diagnosis": 200, "/openapi.json": 200}
    assert {"Diagnosis", "FindingOut", "Gpus", "GpuVerdictOut"} <= set(result["schemas"])  # the answers' schemas
    loaded = set(result["loaded"])
    assert "fastapi" in loaded and "gpu_triage.exporter.backends.sim.backend" in loaded  # it did serve, on sim
    assert [m for m in NOT_ROUTINE if m in loaded] == []
