"""PyTorch's Flight Recorder analyzer (torchfrtrace) and gpu-triage, side by side, on the recorded dumps.

    .venv/bin/python bench/bench_torchfrtrace.py
    GPU_TRIAGE_TORCH_PYTHON=/opt/torch/bin/python .venv/bin/python bench/bench_torchfrtrace.py

Needs an interpreter with PyTorch (GPU_TRIAGE_TORCH_PYTHON, else .venv-torch/bin/python, else python3
when it imports torch); without one it says so and stops. Per scenario of tests/fixtures/flight_recorder
it prints what the scenario did (truth.json), what `python -m torch.distributed.flight_recorder.fr_trace`
named on the dumps as written and on copies whose pg_config is rebuilt from the truth (Gloo writes a
broken one; --allow-incomplete-ranks is added when it refuses for a missing dump), and what gpu-triage
named from the dumps alone and from the dumps with the ranks' logs. Figures only, no pass/fail.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.fr_unpickle import loads

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "flight_recorder"
HANGS = ("collective_", "rank_missing", "p2p_unmatched")


def torch_python() -> str | None:
    candidates = [os.environ.get("GPU_TRIAGE_TORCH_PYTHON"), str(REPO / ".venv-torch" / "bin" / "python")]
    for candidate in [*candidates, shutil.which("python3")]:
        if candidate and Path(candidate).is_file():
            probe = subprocess.run([candidate, "-c", "import torch"], capture_output=True, check=False)
            if probe.returncode == 0:
                return candidate
    return None


def fr_trace(python: str, folder: Path, *extra: str) -> str:
    run = subprocess.run(
        [python, "-m", "torch.distributed.flight_recorder.fr_trace", *extra, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = run.stdout + run.stderr
    if m := re.search(r"AssertionError: Missing dump files from ranks (\{[\d, ]+\})", out):
        return f"refuses: no dump from {m.group(1)}"
    if run.returncode != 0:
        last = [line for line in out.splitlines() if line.strip()][-1]
        return f"crash: {last.strip()[:60]}"
    culprits = sorted({int(r) for r in re.findall(r"Culprit rank (\d+)", out)})
    kinds = sorted(set(re.findall(r"Error type: (\w+)", out)))
    missing = list(dict.fromkeys(re.findall(r"missing ranks: (\{[\d, ]+\})", out)))  # in the order reported
    if culprits:
        return f"culprit {culprits} ({', '.join(kinds)})"
    if missing:
        return "missing ranks " + ", then ".join(missing)
    if "cannot decide" in out:
        return "cannot decide"
    return "nothing found"


def rebuilt(scenario: Path, into: Path) -> Path:
    """Copies of the pickles with the pg_config the Gloo recorder should have written."""
    truth = json.loads((scenario / "truth.json").read_text())
    out = into / scenario.name
    out.mkdir()
    subgroups = truth["subgroups"]
    for f in sorted((scenario / "pickle").iterdir()):
        raw = loads(f.read_bytes())
        rank = int(f.name.rsplit("_", 1)[1])
        config = {}
        for name, desc in {tuple(e["process_group"]) for e in raw["entries"]}:
            ranks = list(range(truth["world_size"])) if name == "0" else subgroups[(int(name) - 1) % len(subgroups)]
            if rank in ranks:
                config[name] = {"name": name, "desc": desc, "ranks": str(ranks)}
        raw["pg_config"] = config
        (out / f.name).write_bytes(pickle.dumps(raw, protocol=2))
    return out


def ours(scenario: Path, logs: bool) -> str:
    files = sorted((scenario / "pickle").iterdir()) + (sorted((scenario / "logs").iterdir()) if logs else [])
    report = diagnose([(str(f), [f.read_bytes()]) for f in files]).to_json()
    hangs = [f for f in report["findings"] if f["class"].startswith(HANGS)]
    if not hangs:
        return "nothing found"
    h = hangs[0]
    who = h["details"]["ranks"] or f"waiting {h['details']['waiting']}, partner not in the dumps"
    return f"{h['class']} {who}"


def truth_text(t: dict[str, Any]) -> str:
    return "healthy" if t["class"] is None else f"{t['class']} {t['culprits']}"


def main() -> int:
    python = torch_python()
    if python is None:
        print("bench_torchfrtrace: skipped: no Python with PyTorch (set GPU_TRIAGE_TORCH_PYTHON, or make .venv-torch)")
        return 0
    version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    )
    print(f"torchfrtrace of PyTorch {version.stdout.strip()} ({python}) and gpu-triage on {FIXTURES.relative_to(REPO)}")
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in sorted(p for p in FIXTURES.iterdir() if (p / "truth.json").is_file()):
            t = json.loads((scenario / "truth.json").read_text())
            as_written = fr_trace(python, scenario / "pickle")
            fixed = rebuilt(scenario, Path(tmp))
            again = fr_trace(python, fixed)
            if again.startswith("refuses"):
                again = fr_trace(python, fixed, "--allow-incomplete-ranks") + " (--allow-incomplete-ranks)"
            print(f"\n{scenario.name}: {truth_text(t)}")
            print(f"  torchfrtrace, dumps as written:    {as_written}")
            print(f"  torchfrtrace, pg_config rebuilt:   {again}")
            print(f"  gpu-triage, dumps:                 {ours(scenario, logs=False)}")
            print(f"  gpu-triage, dumps and rank logs:   {ours(scenario, logs=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
