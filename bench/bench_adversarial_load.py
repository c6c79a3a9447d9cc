"""The daemon under a hostile load at once: figures, not pass/fail; not run in CI.

    .venv/bin/python bench/bench_adversarial_load.py [--seconds 60] [--scrapers 32] [--xids 100000] [--uploads 3]

Starts `gpu-triage serve` on the simulator with its own state directory and kernel-log file, then for
`--seconds`: `--scrapers` connections scraping /metrics as fast as they are answered (wrk), a burst of
`--xids` XID lines appended to the kernel log at once (each a distinct fault: its own pid, spread over the
GPUs), and `--uploads` training logs of a few MiB POSTed to /api/v1/diagnose together. Prints the scrapes,
their errors and latency (p50, p90, p99, max), what the uploads were answered, and whether every XID was
counted exactly once (the sum of nvidia_gpu_xid_errors_total), and how long that took.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_proc import serve, wait_for

REPO = Path(__file__).resolve().parent.parent
LOG = REPO / "tests/fixtures/training/scenarios/xid79_with_nccl.log"


def xid_total(url: str) -> int:
    page = httpx.get(f"{url}/metrics", timeout=30).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in page.splitlines()
            if line.startswith("nvidia_gpu_xid_errors_total{")
        )
    )


def burst(kmsg: Path, buses: list[str], count: int) -> float:
    """`count` XID 13 lines (an application fault: no GPU is lost), one write; seconds it took."""
    lines = [
        f"NVRM: Xid (PCI:{buses[i % len(buses)][:-2]}): 13, pid={100000 + i}, name=train, Graphics Exception\n"
        for i in range(count)
    ]
    t0 = time.perf_counter()
    with kmsg.open("a") as f:
        f.write("".join(lines))
    return time.perf_counter() - t0


def wrk(url: str, connections: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", f"-c{connections}", "-t2", f"-d{seconds}s", "--timeout", "10s", "--latency", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip

    def ms(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    figures = {f"p{p}": ms(re.search(rf"^\s+{p}%\s+(\S+)", out, re.M).group(1)) for p in (50, 90, 99)}  # type: ignore[union-attr]
    figures["max"] = ms(re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    figures["requests"] = float(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    figures["socket_errors"] = float(sum(int(n) for n in errors.groups())) if errors else 0.0
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    figures["non_2xx"] = float(non_2xx.group(1)) if non_2xx else 0.0
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--scrapers", type=int, default=32)
    parser.add_argument("--xids", type=int, default=100_000)
    parser.add_argument("--uploads", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    upload = LOG.read_bytes() * max(1, (4 << 20) // LOG.stat().st_size)  # about 4 MiB
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp)) as d:
        buses = [g["pci_bus_id"] for g in httpx.get(f"{d.url}/api/v1/gpus", timeout=10).json()["gpus"]]
        before = xid_total(d.url)
        figures: dict[str, float] = {}
        scraping = threading.Thread(target=lambda: figures.update(wrk(f"{d.url}/metrics", args.scrapers, args.seconds)))
        scraping.start()
        time.sleep(2)  # the scrapers are under way
        answers: list[str] = []

        def diagnose() -> None:
            try:
                answers.append(str(httpx.post(f"{d.url}/api/v1/diagnose", content=upload, timeout=120,
                                              headers={"content-type": "text/plain"}).status_code))  # fmt: skip
            except httpx.HTTPError as e:
                answers.append(type(e).__name__)

        uploads = [threading.Thread(target=diagnose) for _ in range(args.uploads)]
        for t in uploads:
            t.start()
        t0 = time.monotonic()
        wrote = burst(d.kmsg, buses, args.xids)
        wait_for(
            lambda: xid_total(d.url) - before >= args.xids or None, timeout=args.seconds + 120, interval=0.5,
            what=f"{args.xids} XIDs on /metrics",
        )  # fmt: skip
        took = time.monotonic() - t0
        for t in uploads:
            t.join()
        scraping.join()
        total = xid_total(d.url) - before
        time.sleep(2)
        settled = xid_total(d.url) - before
    print(f"{args.scrapers} scrapers on /metrics for {args.seconds}s, a burst of {args.xids:,} XID lines "
          f"(written in {wrote:.2f}s), {args.uploads} diagnose uploads of {len(upload) / 2**20:.1f} MiB")  # fmt: skip
    print(f"scrapes: {figures['requests']:,.0f}, errors: {figures['socket_errors']:.0f} socket, "
          f"{figures['non_2xx']:.0f} non-2xx")  # fmt: skip
    print(f"scrape latency ms: p50 {figures['p50']:.1f}, p90 {figures['p90']:.1f}, p99 {figures['p99']:.1f}, "
          f"max {figures['max']:.1f}")  # fmt: skip
    print(f"uploads answered: {', '.join(sorted(answers))}")
    exact = "exact" if total == settled == args.xids else "NOT EXACT"
    print(f"XIDs counted: {total:,} of {args.xids:,} ({exact}; {settled:,} two seconds later), "
          f"all on /metrics {took:.1f}s after the burst began")  # fmt: skip


if __name__ == "__main__":
    main()
