"""How fast an XID line reaches /metrics and the verdict, and whether a burst is journaled whole.

    .venv/bin/python bench/bench_xid_latency.py              # 1,000 events, then a 10,000-line burst
    .venv/bin/python bench/bench_xid_latency.py --events 200 --burst 2000

Runs `gpu-triage serve` on the simulator following a kernel-log file (--kmsg.path). For each event it
appends one `NVRM: Xid` line to the file and times how long until the GPU's counter on /metrics, and
its finding in /api/v1/diagnosis, show it. Then it appends a burst of lines at once and times how long
until all are journaled, while another thread keeps scraping /metrics and records how long scrapes take.
Figures only; no pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_proc import serve, wait_for

BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]  # the simulated node's GPUs, in index order
EVENT_TIMEOUT = 30.0  # seconds for one XID line to reach /metrics or the verdict before the bench gives up
BURST_TIMEOUT = 600.0


def line(seq: int, gpu: int, code: int) -> str:
    # A syslog-style line: the daemon numbers it by line and stamps it when read, as it would a real
    # kernel log file (a /dev/kmsg record would carry its own time since boot).
    return f"Nov 30 01:00:00 node kernel: NVRM: Xid (PCI:0000:{BUSES[gpu]}:00): {code}, pid={seq}, name=python3\n"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def latency(client: httpx.Client, url: str, kmsg: Path, events: int) -> None:
    uuids = [g["uuid"] for g in client.get(f"{url}/api/v1/gpus").json()["gpus"]]
    to_metrics, to_verdict = [], []
    counts = [0] * 8
    with kmsg.open("a") as log:
        for seq in range(1, events + 1):
            gpu = seq % 8
            counts[gpu] += 1
            labels = f'gpu="{gpu}",uuid="{uuids[gpu]}",xid="31"'
            series = f"nvidia_gpu_xid_errors_total{{{labels}}} {counts[gpu]}.0\n".encode()
            t0 = time.perf_counter()
            log.write(line(seq, gpu, 31))
            log.flush()
            # Polled back to back, as fast as the daemon answers: a sleep would add to every figure.
            wait_for(partial(on_metrics, client, url, series), EVENT_TIMEOUT, 0, what=f"XID line {seq} on /metrics")
            to_metrics.append(time.perf_counter() - t0)
            found = partial(in_verdict, client, url, gpu, counts[gpu])
            wait_for(found, EVENT_TIMEOUT, 0, what=f"XID line {seq} in the verdict")
            to_verdict.append(time.perf_counter() - t0)
    print(f"event latency over {events} XID lines (ms): kernel-log line -> ...")
    for name, values in (("/metrics", to_metrics), ("/api/v1/diagnosis", to_verdict)):
        ms = [v * 1000 for v in values]
        print(f"  {name:<18} p50 {statistics.median(ms):6.1f}  p99 {pct(ms, 99):6.1f}  max {max(ms):6.1f}")


def on_metrics(client: httpx.Client, url: str, series: bytes) -> bool:
    return series in client.get(f"{url}/metrics").content


def in_verdict(client: httpx.Client, url: str, gpu: int, count: int) -> bool:
    """Whether GPU `gpu`'s xid_31 finding in the verdict has counted `count` XIDs."""
    body = client.get(f"{url}/api/v1/diagnosis").json()
    found = [f for f in body["gpus"][gpu]["findings"] if f["class"] == "xid_31"]
    return bool(found) and found[0]["count"] == count


def burst(client: httpx.Client, url: str, kmsg: Path, first_seq: int, size: int) -> None:
    scrapes: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.get(f"{url}/metrics")
                scrapes.append(time.perf_counter() - t)
                time.sleep(0.05)

    def counted() -> bool:
        rows = client.get(f"{url}/metrics").text.splitlines()
        xid_13 = (r for r in rows if r.startswith("nvidia_gpu_xid_errors_total{") and 'xid="13"' in r)
        return sum(float(r.rsplit(" ", 1)[1]) for r in xid_13) >= size

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        time.sleep(0.5)
        t0 = time.perf_counter()
        with kmsg.open("a") as log:
            log.write("".join(line(seq, seq % 8, 13) for seq in range(first_seq, first_seq + size)))
        wait_for(counted, BURST_TIMEOUT, interval=0.01, what=f"all {size} lines of the burst on /metrics")
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        scraper.join()
    journaled = len(client.get(f"{url}/api/v1/events", params={"xid": 13, "limit": 10_000}).json()["events"])
    ms = [s * 1000 for s in scrapes]
    print(f"\nburst of {size} XID lines written at once:")
    print(f"  journaled: {journaled} of {size}; all counted on /metrics after {elapsed:.2f} s")
    print(f"  /metrics meanwhile: {len(ms)} scrapes, p50 {statistics.median(ms):.1f} ms, p99 {pct(ms, 99):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=10_000)
    args = parser.parse_args()
    daemon_args = ["--no-source.events", "--log.level", "warn"]
    with (
        tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state,
        serve(Path(state), *daemon_args, capture=False) as daemon,
        httpx.Client(timeout=10) as client,
    ):
        latency(client, daemon.url, daemon.kmsg, args.events)
        burst(client, daemon.url, daemon.kmsg, args.events + 1, args.burst)


if __name__ == "__main__":
    main()
