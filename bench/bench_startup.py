"""How long the one-shot commands take to start, next to the interpreter's own start.

    .venv/bin/python bench/bench_startup.py            # 15 runs of each
    .venv/bin/python bench/bench_startup.py --runs 30

Prints figures only; there is no pass/fail. Each command runs as a fresh child process, as a Slurm
health check, a prolog or `kubectl logs … | gpu-triage diagnose -` runs it: `python -c pass` (the
yardstick), `gpu-triage xid 79`, `gpu-triage diagnose` on a 20-line log, `check` with no daemon to ask, and
`--version`, `alerts render`, `export`. For each: the wall time and the CPU time (user + system) of the child, best and
median, and their ratio to the interpreter's. CPU time is the steadier figure on a busy machine.

The children share one knowledge cache (exporter/cache_store.py) in a temporary directory: the first
run of each command fills it (`cold`, printed on its own: what the first command after an upgrade
pays), the others read it. Bytecode is written and used (PYTHONDONTWRITEBYTECODE unset), as for an
installed package.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_TRIAGE = Path(sys.executable).parent / "gpu-triage"
LOG = ROOT / "tests" / "fixtures" / "training" / "scenarios" / "timeout_straggler.log"


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as scratch:
        log = Path(scratch) / "job-20-lines.log"
        log.write_text("".join(LOG.read_text().splitlines(keepends=True)[:20]))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["GPU_TRIAGE_CACHE_DIR"] = str(Path(scratch) / "cache")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "gpu-triage xid 79": [str(GPU_TRIAGE), "xid", "79"],
            "gpu-triage diagnose (20 lines)": [str(GPU_TRIAGE), "diagnose", str(log)],
            "gpu-triage --version": [str(GPU_TRIAGE), "--version"],
            # A Slurm health check's start-up and its model of the verdict, on a port nothing answers.
            "gpu-triage check (no daemon)": [str(GPU_TRIAGE), "check", "--url", "http://127.0.0.1:9", "--timeout", "1"],
            "gpu-triage alerts render": [str(GPU_TRIAGE), "alerts", "render"],
            "gpu-triage export systemd": [str(GPU_TRIAGE), "export", "systemd", str(Path(scratch) / "unit"), "--force"],
        }
        _run(commands["python -c pass"], env)  # the interpreter's own bytecode, warm
        cold = {name: _run(argv, env) for name, argv in commands.items()}
        runs = {name: [_run(argv, env) for _ in range(args.runs)] for name, argv in commands.items()}
    base_wall = min(w for w, _ in runs["python -c pass"])
    base_cpu = min(c for _, c in runs["python -c pass"])
    print(f"{args.runs} runs each; best and median; ratio = best / best of `python -c pass`")
    print(f"{'':32} {'wall ms':>16} {'cpu ms':>16} {'wall x':>7} {'cpu x':>7}   cold (empty cache) wall/cpu ms")
    for name, samples in runs.items():
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        print(
            f"{name:32} {min(walls) * 1000:7.1f} {statistics.median(walls) * 1000:7.1f}  "
            f"{min(cpus) * 1000:7.1f} {statistics.median(cpus) * 1000:7.1f}  "
            f"{min(walls) / base_wall:6.1f} {min(cpus) / base_cpu:7.1f}   "
            f"{cold[name][0] * 1000:7.0f} {cold[name][1] * 1000:7.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
