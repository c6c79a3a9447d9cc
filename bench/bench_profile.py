"""Where a steady-state daemon's CPU and memory go, on 8 and 64 virtual GPUs: figures, not pass/fail.

    .venv/bin/python bench/bench_profile.py                      # 8 and 64 GPUs, 60 s of CPU profile each
    .venv/bin/python bench/bench_profile.py --gpus 8 --seconds 20

The daemon is `gpu-triage serve --backend nvml` on the virtual GPUs (`gpu-triage vgpu` driving
build/vgpu/libnvidia-ml.so.1 with h100-training scaled to N GPUs, as bench/bench_peers.py runs it),
collecting every second with no scraper, run in-process in a child so that every thread it starts is
profiled on its own CPU clock (cProfile with time.thread_time: waiting costs nothing, as it costs the
node nothing). A second child runs under tracemalloc from its first import and reports the Python heap
by package (charged to the newest frame outside the import machinery: the importer, for what an import
made), with the RSS; then the resident memory each of the daemon's imports adds, step by step. The
first lines printed name the top three costs, by own CPU time of a function, over all GPU counts; the
time inside the virtual NVML library is the ctypes call that enters it (`<built-in method ...>`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_peers import virtual_gpus
from tests.daemon_proc import state_args

REPO = Path(__file__).resolve().parent.parent

# The daemon as `gpu-triage serve` runs it, stopped by SIGTERM once the window has been measured.
_CHILD = r"""
import cProfile, json, os, signal, sys, threading, time
mode, seconds, out, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
profiles = []
if mode == "cpu":
    def start(*_):
        sys.setprofile(None)
        if threading.current_thread().name == "bench-measure":  # the bench's own thread: not the daemon's cost
            return
        p = cProfile.Profile(time.thread_time)
        profiles.append(p)
        p.enable()
    threading.setprofile(start)

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0

def measure():
    try:
        window()
    finally:
        os.kill(os.getpid(), signal.SIGTERM)

def serving(port):
    import socket
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the daemon did not start serving")

def window():
    serving(int(argv[-1].rsplit(":", 1)[1]))
    time.sleep(3)  # past start-up: the first full poll, the settling of the sources
    for p in profiles:
        p.clear()  # start-up is not steady state
    t0, w0 = os.times(), time.monotonic()
    time.sleep(seconds)
    t1, w1 = os.times(), time.monotonic()
    result = {"wall": w1 - w0, "cpu": (t1.user - t0.user) + (t1.system - t0.system), "rss_kib": rss_kib(),
              "threads": threading.active_count(), "modules": len(sys.modules)}
    if mode == "cpu":
        # Read without disabling: disabling another thread's profiler closes the calls it is still in (a poll(2)
        # on a quiet kernel log, the driver's event wait) on this thread's CPU clock, which charged them time they
        # never spent. Left open, a blocked call is simply not counted: it costs the node nothing.
        merged = {}
        for p in list(profiles):
            p.snapshot_stats()
            for key, (_, calls, tottime, cumtime, _) in p.stats.items():
                was = merged.get(key, (0, 0.0, 0.0))
                merged[key] = (was[0] + calls, was[1] + tottime, was[2] + cumtime)
        rows = []
        for (path, line, name), (calls, tottime, cumtime) in merged.items():
            where = name if path == "~" else f"{Path(path).name}:{line}({name})"
            rows.append((tottime, cumtime, calls, where))
        rows.sort(reverse=True)
        result["functions"] = rows[:80]
    else:
        import tracemalloc
        snapshot = tracemalloc.take_snapshot()
        by_module = {}
        for trace in snapshot.traces:
            # The newest frame that is not the import machinery: for what a module's import made, the importer.
            frames = [f.filename for f in reversed(trace.traceback) if not f.filename.startswith("<")]
            name = frames[0] if frames else "<import machinery>"
            by_module[name] = by_module.get(name, 0) + trace.size
        result["heap"] = sorted(by_module.items(), key=lambda kv: -kv[1])
        result["heap_total"] = sum(by_module.values())
    Path(out).write_text(json.dumps(result))

from pathlib import Path
threading.Thread(target=measure, name="bench-measure", daemon=True).start()
if mode == "cpu":
    main_profile = cProfile.Profile(time.thread_time)
    profiles.append(main_profile)
    main_profile.enable()
from gpu_triage.exporter.cli.main import main
sys.argv = ["gpu-triage", *argv]
try:
    main()
except SystemExit:
    pass
"""


def run_child(mode: str, seconds: float, env: dict[str, str], home: Path, port: int) -> dict[str, Any]:
    out = home / f"{mode}.json"
    serve = ["serve", "--backend", "nvml", "--collector.interval", "1s", "--log.level", "warn"]
    serve += [*state_args(home / mode), f"--web.listen-address=127.0.0.1:{port}"]
    cmd = [sys.executable, *(["-X", "tracemalloc=32"] if mode == "heap" else []), "-c", _CHILD]
    run = [*cmd, mode, str(seconds), str(out), *serve]
    subprocess.run(run, check=False, env=env, cwd=REPO, timeout=seconds + 400)  # it ends itself with SIGTERM
    if not out.exists():
        raise SystemExit(f"the {mode} run measured nothing (its output is above)")
    return dict(json.loads(out.read_text()))


# What the serving daemon imports, in steps, each on top of the ones before: the resident memory each adds.
# The framework's share is split out (asyncio with ssl, pydantic, starlette, then what fastapi adds: its
# OpenAPI models and opentelemetry), for weighing a lighter one against the RSS target.
_IMPORTS = (
    ("the interpreter", "pass"),
    ("asyncio (with ssl: OpenSSL's libraries)", "import asyncio"),
    ("pydantic (pydantic-core) and one model", "import pydantic\nclass M(pydantic.BaseModel): x: int"),
    ("starlette", "import starlette.applications, starlette.routing, starlette.responses"),
    ("fastapi over starlette (OpenAPI models, opentelemetry)", "import fastapi.applications"),
    ("uvicorn (click, multiprocessing)", "import uvicorn"),
    ("prometheus_client", "import prometheus_client"),
    ("yaml", "import yaml"),
    ("pynvml", "import pynvml"),
    ("sqlite3", "import sqlite3"),
    ("gpu-triage's serving modules", "import gpu_triage.exporter.http.server"),
    ("gpu-triage's NVML backend", "import gpu_triage.exporter.backends.nvml.backend"),
)


def import_steps() -> list[tuple[str, float]]:
    out, code, before = [], "", 0.0
    for name, statement in _IMPORTS:
        code += statement + "\n"
        probe = code + "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')))"
        kib = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
        out.append((name, kib / 1024 - before))
        before = kib / 1024
    return out


def package(path: str) -> str:
    """What a heap figure is charged to: the project's modules by sub-package, others by top-level package."""
    parts = Path(path).parts
    for root in ("gpu_triage", "exporter", "diagnosis"):
        if root in parts:
            i = parts.index(root)
            return "/".join(parts[i : i + 3]) if root == "gpu_triage" else "gpu_triage/" + "/".join(parts[i : i + 2])
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].split(".")[0]
    return "stdlib" if "python3" in "".join(parts) else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, action="append", help="GPU counts (default 8 and 64)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the CPU profile's window")
    parser.add_argument("--heap-seconds", type=float, default=10.0, help="the tracemalloc run's window")
    args = parser.parse_args()
    from tests.daemon_proc import free_port

    report: list[str] = []
    top: dict[str, float] = {}
    total_cpu = 0.0
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-triage-profile-")))
        for gpus in args.gpus or [8, 64]:
            home = work / str(gpus)
            home.mkdir()
            with virtual_gpus(home, gpus) as env:
                cpu = run_child("cpu", args.seconds, env, home, free_port())
                heap = run_child("heap", args.heap_seconds, env, home, free_port())
            wall, spent = float(cpu["wall"]), float(cpu["cpu"])
            total_cpu += spent / wall
            functions: list[list[Any]] = cpu["functions"]
            report.append(
                f"\n== {gpus} GPUs: {1000 * spent / wall:.2f} ms CPU per second ({100 * spent / wall:.2f}% of a core),"
                f" RSS {int(cpu['rss_kib']) / 1024:.1f} MiB, {cpu['threads']} threads,"
                f" {cpu['modules']} modules loaded"
            )
            report.append(f"{'own ms/s':>9}{'cum ms/s':>10}{'calls/s':>10}  function")
            for tottime, cumtime, calls, where in functions[:30]:
                own = 1000 * float(tottime) / wall
                top[str(where)] = top.get(str(where), 0.0) + own
                report.append(f"{own:>9.3f}{1000 * float(cumtime) / wall:>10.3f}{int(calls) / wall:>10.1f}  {where}")
            by_package: dict[str, int] = {}
            for path, size in heap["heap"]:
                by_package[package(path)] = by_package.get(package(path), 0) + int(size)
            heap_mib = int(heap["heap_total"]) / 2**20
            report.append(
                f"Python heap (tracemalloc) {heap_mib:.1f} MiB of RSS {int(heap['rss_kib']) / 1024:.1f} MiB"
                " (traced run), by package:"
            )
            for name, size in sorted(by_package.items(), key=lambda kv: -kv[1])[:15]:
                report.append(f"{size / 2**20:>9.2f} MiB  {name}")
    report.append("\nresident memory each import adds (MiB; cumulative, in the serving daemon's order):")
    report.extend(f"{mib:>9.1f}  {name}" for name, mib in import_steps())
    ranked = sorted(top.items(), key=lambda kv: -kv[1])[:3]
    print("top three costs by own CPU time (ms per second of steady state, summed over the GPU counts):")
    for i, (where, ms) in enumerate(ranked, 1):
        print(f"  {i}. {where}: {ms:.2f} ms/s")
    print("\n".join(report))


if __name__ == "__main__":
    main()
