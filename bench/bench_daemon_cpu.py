"""The daemon's own CPU at a 1 s poll interval on 8 GPUs, split into backend reads and everything else.

    .venv/bin/python bench/bench_daemon_cpu.py              # sim and NVML-on-vGPU, 60 s per row
    .venv/bin/python bench/bench_daemon_cpu.py --seconds 20 --profile   # and where the rest goes

The whole daemon runs (poller, renders, event pipeline, kernel-log follower, verdicts), with no
scraper, in a child process so that the NVML one can load build/vgpu/libnvidia-ml.so.1. Backend reads
and the XID event waits are timed on their threads' own CPU clocks; on a real node most of that is
the driver's (the virtual GPU's event wait sleeps on a futex that each write of the state file wakes, once a
second here; the real driver sleeps in the kernel). Then the CPU of each of the daemon's threads, on its
own clock, by thread name: where an idle daemon still spends its time. The aim (issue #24): the whole
daemon at most 0.5% of a core on the simulator. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, threading, time
from pathlib import Path
from gpu_triage.exporter.backends.select import open_backend
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.settings import load_settings

backend_name, state, seconds, kmsg = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "file"
(Path(state) / "kmsg.log").touch()
settings = load_settings(
    {"backend": backend_name, "state_dir": state, "kmsg_path": f"{state}/kmsg.log", "collector_interval": 1.0,
     "source_kmsg": kmsg},
    None,
)
backend = open_backend(backend_name)
in_reads = [0.0]
lock = threading.Lock()
read = backend.read

def timed(gpu, collector):
    t0 = time.thread_time()
    try:
        return read(gpu, collector)
    finally:
        spent = time.thread_time() - t0
        with lock:
            in_reads[0] += spent

backend.read = timed
in_events = [0.0]
if hasattr(backend, "wait_xids"):
    wait = backend.wait_xids

    def timed_wait(timeout):
        t0 = time.thread_time()
        try:
            return wait(timeout)
        finally:
            in_events[0] += time.thread_time() - t0

    backend.wait_xids = timed_wait
def by_thread():  # CPU seconds of each live thread on its own clock, by name (a pool's threads summed)
    out = {}
    for t in threading.enumerate():
        try:
            spent = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):
            continue
        name = t.name.rstrip("0123456789").rstrip("-_") or t.name
        out[name] = out.get(name, 0.0) + spent
    return out

daemon = Daemon(backend, settings)
daemon.start()
time.sleep(3)  # past start-up: imports, discovery, the first full poll
t0, r0, e0, w0, h0 = os.times(), in_reads[0], in_events[0], time.monotonic(), by_thread()
time.sleep(seconds)
t1, r1, e1, w1, h1 = os.times(), in_reads[0], in_events[0], time.monotonic(), by_thread()
daemon.stop()
cpu = (t1.user - t0.user) + (t1.system - t0.system)
threads = {name: spent - h0.get(name, 0.0) for name, spent in h1.items()}
print(json.dumps({"wall": w1 - w0, "cpu": cpu, "reads": r1 - r0, "events": e1 - e0, "threads": threads}))
"""


def measure(backend: str, seconds: float, env: dict[str, str], kmsg: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, backend, state, str(seconds), kmsg],
            capture_output=True, text=True, check=True, env=env, cwd=REPO,
        ).stdout  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def profile(backend: str, seconds: float, env: dict[str, str]) -> None:
    """Where the daemon's CPU goes: cProfile on every thread the daemon starts (its polls and renders
    run on scheduler and worker threads), merged, by own time."""
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as state:
        script = Path(state) / "child.py"
        script.write_text(
            "import cProfile, pstats, sys, threading\n"
            "profiles = []\n"
            "def start(*_):\n"
            "    sys.setprofile(None)\n"
            "    p = cProfile.Profile(); profiles.append(p); p.enable()\n"
            "threading.setprofile(start)\n"
            f"sys.argv = ['child', {backend!r}, {state!r}, {str(seconds)!r}, 'off']\n"
            f"exec(compile({CHILD!r}, 'child', 'exec'))\n"
            "stats = pstats.Stats(profiles[0])\n"
            "for p in profiles[1:]:\n"
            "    stats.add(p)\n"
            "stats.sort_stats('tottime').print_stats(30)\n"
        )
        subprocess.run([sys.executable, str(script)], check=True, env=env, cwd=REPO)


def print_threads(threads: dict[str, dict[str, float]]) -> None:
    """ms of CPU per second by thread (rows, costliest first) and run (columns)."""
    names = {t for row in threads.values() for t in row}
    print(f"{'thread':>22}" + "".join(f"{run:>12}" for run in threads))
    for t in sorted(names, key=lambda t: -max(row.get(t, 0.0) for row in threads.values())):
        print(f"{t:>22}" + "".join(f"{row.get(t, 0.0):>12.2f}" for row in threads.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per backend")
    parser.add_argument("--profile", action="store_true", help="also print a profile of the daemon's threads")
    args = parser.parse_args()
    subprocess.run(["make", "--no-print-directory", "-s", "vgpu"], cwd=REPO, check=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_TRIAGE_")}
    with tempfile.TemporaryDirectory(prefix="gpu-triage-vgpu-") as vgpu:
        state = Path(vgpu) / "state"
        driver = subprocess.Popen(
            [str(Path(sys.executable).with_name("gpu-triage")), "vgpu", "--state", str(state),
             "--web.listen-address", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=base,
        )  # fmt: skip
        try:
            while not state.exists():
                if driver.poll() is not None:
                    raise SystemExit("gpu-triage vgpu exited")
                os.sched_yield()
            nvml_env = base | {"LD_LIBRARY_PATH": str(REPO / "build" / "vgpu"), "GPU_TRIAGE_VGPU_STATE": str(state)}
            runs = {"sim": base, "nvml": nvml_env}
            print(f"daemon CPU at a 1 s interval, 8 GPUs, no scraper, {args.seconds:.0f} s window (% of one core)")
            print("kernel log: off (a node's /dev/kmsg read blocks: no cost while quiet), or a followed file")
            header = ("backend", "kmsg", "total", "reads", "events", "rest", "rest ms/cycle")
            print("".join(f"{h:>{w}}" for h, w in zip(header, (8, 6, 9, 9, 9, 9, 15), strict=True)))
            threads: dict[str, dict[str, float]] = {}
            for name, env in runs.items():
                for kmsg in ("off", "file"):
                    r = measure(name, args.seconds, env, kmsg)
                    total, reads, events = (100 * r[k] / r["wall"] for k in ("cpu", "reads", "events"))
                    rest = total - reads - events
                    figures = "".join(f"{x:>9.2f}" for x in (total, reads, events, rest))
                    print(f"{name:>8}{kmsg:>6}{figures}{10 * rest:>15.2f}")
                    threads[f"{name}/{kmsg}"] = {t: 1000 * s / r["wall"] for t, s in r["threads"].items()}
            print("\nCPU by thread, ms per second (each thread's own CPU clock)")
            print_threads(threads)
            if args.profile:
                for name, env in runs.items():
                    print(f"\n== profile, {name} backend (all daemon threads, by own time)")
                    profile(name, args.seconds, env)
        finally:
            driver.terminate()
            driver.wait(timeout=10)


if __name__ == "__main__":
    main()
