"""Resident memory of the daemon over time: figures, not pass/fail.

    .venv/bin/python bench/bench_memory.py               # 10 minutes at a 1 s interval, 8 GPUs
    .venv/bin/python bench/bench_memory.py --minutes 2

Runs `gpu-triage serve` on the simulator at --collector.interval 1s, scrapes /metrics every second
as Prometheus would, and prints the daemon's RSS every 30 s, then the growth after warm-up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_proc import serve


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--scenario", default="h100-training")
    args = parser.parse_args()
    daemon_args = ["--sim.scenario", args.scenario, "--collector.interval", "1s", "--log.level", "warn"]
    with (
        tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state,
        serve(Path(state), *daemon_args, capture=False) as daemon,
    ):
        url, proc = daemon.url, daemon.process
        start = time.monotonic()
        samples: list[tuple[float, float]] = []
        next_sample = 0.0
        scrapes = 0
        print(f"{'minute':>7} {'RSS MiB':>8}")
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            httpx.get(f"{url}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=5)
            scrapes += 1
            if elapsed >= next_sample:
                samples.append((elapsed / 60, rss_mib(proc.pid)))
                print(f"{elapsed / 60:>7.1f} {samples[-1][1]:>8.1f}", flush=True)
                next_sample += 30
            time.sleep(1.0)
        samples.append((args.minutes, rss_mib(proc.pid)))
        warm = [rss for minute, rss in samples if minute >= min(2.0, args.minutes / 2)]
        peak = max(rss for _, rss in samples)
        print(f"\nscrapes: {scrapes}; RSS at the end: {samples[-1][1]:.1f} MiB; peak: {peak:.1f} MiB")
        print(f"after warm-up: min {min(warm):.1f}, max {max(warm):.1f}, growth {warm[-1] - warm[0]:+.1f} MiB")


if __name__ == "__main__":
    main()
