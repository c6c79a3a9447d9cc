"""What 30,000 XIDs on distinct bus ids that are no GPU of the node cost the daemon: memory, page sizes, `check`.

    .venv/bin/python bench/bench_bus_ids.py                  # 30,000 lines
    .venv/bin/python bench/bench_bus_ids.py --lines 5000

Runs `gpu-triage serve` on the simulator (8 GPUs) following a kernel-log file, reads its RSS quiet, appends the
lines at once (each on a bus id of its own, a third of them bound to a GPU by an `NVRM: GPU at` line first, as a
corrupt or foreign log might hold them), waits until all are counted, and prints the RSS again, the sizes of
/metrics, the landing page and /api/v1/diagnosis, and how long `gpu-triage check` takes. Figures only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_proc import GPU_TRIAGE, serve, wait_for


def rss_mib(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def counted(url: str) -> int:
    total = 0
    for row in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if row.startswith("nvidia_gpu_xid_errors_total{"):
            total += int(float(row.rsplit(" ", 1)[1]))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=30_000)
    parser.add_argument(
        "--one-gpu", action="store_true", help="every line on GPU 0 instead: the cost of the lines alone"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp) / "d", "--collector.interval", "1s") as daemon:
        time.sleep(10)  # settled: the first polls, the workload sources, the allocator's first arenas
        quiet = rss_mib(daemon.process.pid)
        with daemon.kmsg.open("a") as f:
            for n in range(args.lines):
                bus = "0000:18:00" if args.one_gpu else f"{1 + n // 256:04x}:{n % 256:02x}:00"
                if n % 3 == 0 and not args.one_gpu:
                    f.write(f"NVRM: GPU at PCI:{bus}: GPU-{n:08x}-0000-4000-8000-000000000000\n")
                f.write(f"NVRM: Xid (PCI:{bus}): 43, pid={n}, name=x, Ch 00000010\n")
        t0 = time.perf_counter()
        wait_for(lambda: counted(daemon.url) >= args.lines, 600, 0.5, what="every line counted")
        took = time.perf_counter() - t0
        time.sleep(5)
        busy = rss_mib(daemon.process.pid)
        sizes = {path: len(httpx.get(f"{daemon.url}{path}", timeout=30).content) for path in ("/metrics", "/")}
        sizes["/api/v1/diagnosis"] = len(httpx.get(f"{daemon.url}/api/v1/diagnosis", timeout=30).content)
        t1 = time.perf_counter()
        check = subprocess.run([GPU_TRIAGE, "check", "--url", daemon.url], capture_output=True, text=True, check=False)
        check_s = time.perf_counter() - t1
    print(f"{args.lines} XID lines on distinct bus ids, counted in {took:.1f} s")
    print(f"RSS: quiet {quiet:.1f} MiB, after {busy:.1f} MiB ({busy - quiet:+.1f} MiB)")
    for path, size in sizes.items():
        print(f"{path}: {size / 1024:.0f} KiB")
    print(f"gpu-triage check: {check_s:.2f} s, exit {check.returncode}: {check.stdout.splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
