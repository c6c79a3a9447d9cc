"""gpu-triage next to its peers on the same virtual GPUs: nvitop-exporter and `gpustat --json`.

    .venv/bin/python bench/bench_peers.py                          # 8 and 64 GPUs
    .venv/bin/python bench/bench_peers.py --gpus 8 --seconds 5     # quicker

The GPUs are the virtual ones (vgpu/): `gpu-triage vgpu` drives build/vgpu/libnvidia-ml.so.1 with
h100-training scaled to N GPUs, and every tool loads that library through its own NVML binding.
- gpu-triage (`serve --backend nvml`) and nvitop-exporter (PyPI) each collect every second. With no
  scraper: CPU per collection (the process's CPU over the window, per second of it) and RSS. Then
  /metrics latency p50/p99 under 1 and 32 concurrent clients (wrk). Below each table, what a render of one
  snapshot costs gpu-triage (the first scrape after a change pays it; bench/bench_metrics.py measures it).
- gpustat (PyPI) has no daemon: `gpustat --json` is run in a loop, and its CPU and peak RSS are per
  run, start-up included, as a cron job or a health check pays them.
Ratios are to gpu-triage (above 1: the peer costs more). The peers go into a throwaway virtual
environment made here (pip install nvitop-exporter gpustat), never into the project's. The driver
shares the machine's cores with what it measures: compare the rows, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_metrics import render_cost, wrk
from gpu_triage.exporter.backends.sim import load_scenario
from tests.daemon_proc import GPU_TRIAGE, free_port, running, state_args

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
PEERS = ("nvitop-exporter", "gpustat")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peers_venv(where: Path) -> Path:
    """A virtual environment holding the peers, made with this machine's pip settings."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEERS], check=True)
    return where / "bin"


@contextmanager
def virtual_gpus(home: Path, gpus: int) -> Iterator[dict[str, str]]:
    """`gpu-triage vgpu` on h100-training with `gpus` GPUs; yields the environment that reaches them."""
    subprocess.run(["make", "--no-print-directory", "-s", "vgpu"], cwd=REPO, check=True)  # the library they load
    scenario = load_scenario("h100-training")
    shape = scenario.node.gpus.model_copy(update={"count": gpus})
    scenario = scenario.model_copy(update={"node": scenario.node.model_copy(update={"gpus": shape})})
    path = home / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [GPU_TRIAGE, "vgpu", "--scenario", str(path), "--state", str(home / "state"), "--web.listen-address"]
    with running([*cmd, f"127.0.0.1:{port}"], url=url, ready=f"{url}/api/v1/sim/faults", log=home / "vgpu.log"):
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_TRIAGE_")}
        yield base | {"LD_LIBRARY_PATH": str(REPO / "build" / "vgpu"), "GPU_TRIAGE_VGPU_STATE": str(home / "state")}


def exporter(name: str, bin_dir: Path, home: Path, env: dict[str, str], seconds: int) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if name == "gpu-triage":
        cmd = [GPU_TRIAGE, "serve", "--backend", "nvml", "--collector.interval", "1s", *state_args(home / name)]
        cmd += [f"--web.listen-address=127.0.0.1:{port}"]
        ready = f"{url}/readyz"
    else:
        cmd = [str(bin_dir / "nvitop-exporter"), "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]
        ready = f"{url}/metrics"
    home.mkdir(parents=True, exist_ok=True)
    with running(cmd, url=url, ready=ready, log=home / f"{name}.log", env=env, timeout=120) as server:
        pid = server.process.pid
        time.sleep(3)  # past start-up
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        figures = {"cpu_ms": 1000 * (c1 - c0) / (t1 - t0), "rss": rss_mib(pid)}
        for clients in (1, 32):
            r = wrk(f"{url}/metrics", clients, seconds)
            figures[f"p50_{clients}"], figures[f"p99_{clients}"] = r["p50"], r["p99"]
    return figures


def gpustat(bin_dir: Path, env: dict[str, str], runs: int) -> dict[str, float]:
    cpu, peak = 0.0, 0
    for _ in range(runs):
        proc = subprocess.Popen([str(bin_dir / "gpustat"), "--json"], stdout=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"gpustat --json exited with {proc.returncode}")
        cpu += usage.ru_utime + usage.ru_stime
        peak = max(peak, usage.ru_maxrss)  # KiB on Linux
    nan = float("nan")
    return {"cpu_ms": 1000 * cpu / runs, "rss": peak / 1024, "p50_1": nan, "p99_1": nan, "p50_32": nan, "p99_32": nan}


COLUMNS = ("cpu_ms", "rss", "p50_1", "p99_1", "p50_32", "p99_32")


def table(gpus: int, rows: dict[str, dict[str, float]], render_ms: float) -> None:
    print(f"\n{gpus} virtual GPUs")
    head = ("CPU ms/collection", "RSS MiB", "p50 1c ms", "p99 1c ms", "p50 32c ms", "p99 32c ms")
    print(f"{'':>22}" + "".join(f"{h:>18}" for h in head))
    for name, r in rows.items():
        print(f"{name:>22}" + "".join(f"{r[c]:>18.2f}" for c in COLUMNS))
    ours = rows["gpu-triage"]
    for name, r in rows.items():
        if name != "gpu-triage":
            print(f"{name + ' / ours':>22}" + "".join(f"{r[c] / ours[c]:>18.2f}" for c in COLUMNS))
    print(
        f"gpu-triage render of one snapshot ({gpus} GPUs, families and both encodings, as bench_metrics.py): "
        f"{render_ms:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, action="append", help="GPU counts (default 8 and 64)")
    parser.add_argument("--seconds", type=int, default=15, help="idle window and each wrk run")
    parser.add_argument("--runs", type=int, default=20, help="gpustat --json runs")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-triage-peers-")))
        print("installing the peers into a throwaway environment:", ", ".join(PEERS))
        bin_dir = peers_venv(work / "venv")
        for gpus in args.gpus or [8, 64]:
            home = work / f"{gpus}"
            home.mkdir()
            with virtual_gpus(home, gpus) as env:
                rows = {
                    name: exporter(name, bin_dir, home, env, args.seconds) for name in ("gpu-triage", "nvitop-exporter")
                }
                rows["gpustat --json"] = gpustat(bin_dir, env, args.runs)
            table(gpus, rows, render_cost(gpus, 20)[0])


if __name__ == "__main__":
    main()
