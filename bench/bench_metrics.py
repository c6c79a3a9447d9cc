"""What a scrape and a render cost: figures, not pass/fail.

    .venv/bin/python bench/bench_metrics.py            # render scale + /metrics latency with wrk
    .venv/bin/python bench/bench_metrics.py --no-http  # render only
    .venv/bin/python bench/bench_metrics.py --profile 64  # where a steady render of 64 GPUs spends its CPU

1. Rendering one snapshot (building the families and encoding both formats) for 1..64 simulated GPUs,
   in steady state (the fast collectors polled again before each page, as between two scrapes; the slow
   ones' readings unchanged) and right after a poll of every collector.
2. /metrics latency at 1 and 32 concurrent clients, against a route on the same server that returns
   the same bytes from memory (the floor for this server), both measured with wrk.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST
from gpu_triage.exporter.settings import load_settings
from tests.daemon_proc import free_port, running

SERVER = """
import sys
from pathlib import Path
from fastapi.responses import Response
import uvicorn
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST
from gpu_triage.exporter.settings import load_settings

state = sys.argv[2]  # a directory the parent made and removes
(Path(state) / "kmsg.log").touch()
settings = load_settings({"backend": "sim", "state_dir": state, "kmsg_path": f"{state}/kmsg.log"}, None)
daemon = Daemon(SimBackend(load_scenario("h100-training")), settings)
daemon.start()
app = create_app(daemon)

@app.get("/bench/memory")
async def memory() -> Response:
    # The floor: the same bytes, from memory, through the same server and framework.
    return Response(daemon.metrics.text, media_type="text/plain; version=0.0.4; charset=utf-8")

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def render_cost(
    gpus: int, repeats: int, collectors: tuple[Collector, ...] = FAST, profile: cProfile.Profile | None = None
) -> tuple[float, int, float]:
    """Median ms of a render when `collectors` were polled since the last page, the page's line count, and the
    median CPU ms of a render (the process's, every thread: on a shared machine it swings less than the wall
    time); `profile`, if given, records the renders but the first (which writes every line)."""
    scenario = load_scenario("h100-training").model_copy(deep=True)
    shape = scenario.node.gpus.model_copy(update={"count": gpus})
    scenario = scenario.model_copy(update={"node": scenario.node.model_copy(update={"gpus": shape})})
    clock = [1_000_000.0]
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state:
        (Path(state) / "kmsg.log").touch()
        settings = load_settings({"backend": "sim", "state_dir": state, "kmsg_path": f"{state}/kmsg.log"}, None)
        daemon = Daemon(SimBackend(scenario, clock=lambda: clock[0]), settings)
        daemon.poller.discover()
        clock[0] += 600  # mid-training: every series present
        daemon.poller.poll(Collector)
        times, cpu = [], []
        for i in range(repeats):
            clock[0] += settings.collector_interval
            daemon.poller.poll(collectors)  # new readings from these, the others' as they were (not timed)
            if profile is not None and i:
                profile.enable()
            t0, cpu0 = time.perf_counter(), time.process_time()
            daemon.refresh()
            daemon.metrics.get(None, None)  # encoded on first demand: both formats, as two scrapers would
            daemon.metrics.get("application/openmetrics-text; version=1.0.0", None)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - cpu0)
            if profile is not None:
                profile.disable()
        daemon.stop()
    return statistics.median(times) * 1000, daemon.metrics.text.count(b"\n"), statistics.median(cpu) * 1000


def wrk(url: str, connections: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", f"-c{connections}", "-t1" if connections == 1 else "-t2", f"-d{seconds}s", "--latency", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip

    def ms(text: str) -> float:
        value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    figures = {f"p{p}": ms(re.search(rf"^\s+{p}%\s+(\S+)", out, re.M).group(1)) for p in (50, 99)}  # type: ignore[union-attr]
    figures["rps"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return figures


def http_latency(seconds: int) -> None:
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk): skipping the latency figures")
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state,
        running([sys.executable, "-c", SERVER, str(port), state], url=url, ready=f"{url}/metrics", log=None),
    ):
        time.sleep(1)
        print(f"\n/metrics latency (wrk, {seconds}s per run, 8 simulated GPUs; ms)")
        print(f"{'clients':>8} {'route':>14} {'p50':>8} {'p99':>8} {'req/s':>9}")
        for connections in (1, 32):
            rows = {}
            for route in ("/metrics", "/bench/memory"):
                rows[route] = wrk(f"http://127.0.0.1:{port}{route}", connections, seconds)
                r = rows[route]
                print(f"{connections:>8} {route:>14} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['rps']:>9.0f}")
            ratio = rows["/metrics"]["p50"] / rows["/bench/memory"]["p50"]
            print(f"{connections:>8} {'ratio p50':>14} {ratio:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-http", action="store_true", help="only the render figures")
    parser.add_argument("--seconds", type=int, default=10, help="duration of each wrk run")
    parser.add_argument("--profile", type=int, metavar="GPUS", help="only a cProfile of 100 steady renders")
    args = parser.parse_args()
    if args.profile:
        profile = cProfile.Profile()
        render_cost(args.profile, 101, profile=profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    print("render one snapshot (families + text + OpenMetrics), median of 50 pages, ms (wall; cpu: the process's):")
    print("  steady: the fast collectors polled before each page; all new: every collector polled before each page")
    print(f"{'GPUs':>6} {'steady':>8} {'cpu':>8} {'all new':>8} {'cpu':>8} {'lines':>8}")
    for gpus in (1, 8, 16, 32, 64):
        ms, lines, cpu = render_cost(gpus, 50)
        all_new, _, all_new_cpu = render_cost(gpus, 50, tuple(Collector))
        print(f"{gpus:>6} {ms:>8.2f} {cpu:>8.2f} {all_new:>8.2f} {all_new_cpu:>8.2f} {lines:>8}")
    if not args.no_http:
        http_latency(args.seconds)


if __name__ == "__main__":
    main()
