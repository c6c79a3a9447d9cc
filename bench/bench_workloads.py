"""What naming each GPU's pod and Slurm job costs: figures, not pass/fail.

    .venv/bin/python bench/bench_workloads.py

1. What the mapping adds to every render of /metrics: `Workloads.current` for 8 GPUs (pods placed on GPUs and
   MIG devices, each GPU process's Slurm job from a fake /proc, known after its first read), and the same on
   the first render, when every process's cgroup and status files are read.
2. One read of the kubelet's pod-resources API (List and GetAllocatableResources, gRPC on a Unix socket,
   a fresh channel each time, as the daemon reads it every slow interval) against the tests' server, by the
   number of pods on the node (each holding one of 8 GPUs, or none), with the answer's size.
3. A kubelet that answers far more than a node holds (each pod on a time-sliced replica of one of 8 GPUs):
   how long the source takes to give up, what it says, and how many pods a render names.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.polling.poller import Poller
from gpu_triage.exporter.settings import load_settings
from gpu_triage.exporter.workloads.placement import DeviceIndex
from gpu_triage.exporter.workloads.podresources import read
from gpu_triage.exporter.workloads.pods import PodSource, assign
from gpu_triage.exporter.workloads.tracker import Workloads
from tests.podresources_server import Container, Pod, encode_list, pod_resources_server

REPO = Path(__file__).resolve().parent.parent
PROCFS = REPO / "tests/fixtures/procfs/cgroup-v2"
REPEATS = 50


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:7.2f} ms (p90 {sorted(samples)[int(len(samples) * 0.9)] * 1000:.2f})"


def pods(n: int, uuids: list[str]) -> list[Pod]:
    out = []
    for i in range(n):
        devices = {"nvidia.com/gpu": [uuids[i]]} if i < len(uuids) else {}
        out.append(Pod(f"ns-{i % 20}", f"pod-{i:05d}-abcdef", [Container("main", devices), Container("sidecar", {})]))
    return out


def bench_reads(uuids: list[str]) -> None:
    print("2. pod-resources read (List + GetAllocatableResources), fresh channel each time")
    with pod_resources_server() as kubelet:
        kubelet.allocatable = {"nvidia.com/gpu": uuids}
        for n in (10, 110, 500):
            kubelet.pods = pods(n, uuids)
            size = len(encode_list(kubelet.pods))
            read(str(kubelet.socket), 5.0)  # warm: the first channel loads grpc's machinery
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                read(str(kubelet.socket), 5.0)
                times.append(time.perf_counter() - t0)
            print(f"   {n:4d} pods ({size / 1024:6.1f} KiB answer): {median_ms(times)}")


def bench_render(scenario: str) -> list[str]:
    clock_now = [1_790_000_000.0]
    sim = SimBackend(load_scenario(scenario), clock=lambda: clock_now[0])
    clock_now[0] += 120
    poller = Poller(sim, interval=5, slow_interval=60, timeout=5, clock=lambda: clock_now[0])
    poller.discover()
    snapshot = poller.poll(Collector)
    uuids = [g.identity.uuid for g in snapshot.gpus]
    with tempfile.TemporaryDirectory() as home, pod_resources_server() as kubelet:
        settings = load_settings(
            {
                "state_dir": Path(home),
                "kubernetes_pod_resources_socket": str(kubelet.socket),
                "path_procfs": PROCFS,
            },
            None,
        )
        kubelet.pods = pods(110, uuids)
        first, steady = [], []
        for _ in range(REPEATS):
            workloads = Workloads(settings)
            assert workloads.pods is not None
            workloads.pods.read_once()
            t0 = time.perf_counter()
            workloads.current(snapshot)
            first.append(time.perf_counter() - t0)
            for _ in range(10):
                t0 = time.perf_counter()
                found = workloads.current(snapshot)
                steady.append(time.perf_counter() - t0)
            workloads.stop()
        named = sum(len(v) for v in found.values())
        print(f"   {scenario}: {named} workloads on {len(found)} GPUs")
        print(f"     every render:  {median_ms(steady)}")
        print(f"     first render:  {median_ms(first)}  (reads each process's cgroup and status once)")
    sim.close()
    return uuids


def bench_flood(uuids: list[str], snapshot_of: SimBackend) -> None:
    print("3. a kubelet answering far more pods than a node holds (deadline 0.8 s, as at a 1 s interval)")
    logging.getLogger("gpu_triage").setLevel(logging.ERROR)  # the source's state changes are printed below
    with pod_resources_server() as kubelet:
        for n in (20_000, 100_000):
            kubelet.pods = [
                Pod(f"ns-{i % 50}", f"pod-{i:06d}", [Container("main", {"nvidia.com/gpu": [f"{uuids[i % 8]}::{i}"]})])
                for i in range(n)
            ]
            size = len(encode_list(kubelet.pods))
            source = PodSource(str(kubelet.socket), interval=3600, deadline=0.8)
            t0 = time.perf_counter()
            source.read_once()
            took = time.perf_counter() - t0
            named = "-"
            if source.answer is not None:
                poller = Poller(snapshot_of, interval=5, slow_interval=60, timeout=5)
                poller.discover()
                placed = assign(source.answer, DeviceIndex(poller.poll(Collector)))
                named = f"{sum(len(a) for a in placed.assignments.values())} named, {placed.not_shown} not shown"
            print(f"   {n:6d} pods ({size / 2**20:5.1f} MiB): {took:5.2f} s, {source.state}: {source.error or named}")


def main() -> None:
    print("1. per render, 8 GPUs, 110 pods on the node (8 holding a GPU), Slurm jobs from a fake /proc")
    uuids = bench_render("h100-training")
    bench_render("h100-mig")
    bench_reads(uuids)
    sim = SimBackend(load_scenario("h100-training"))
    bench_flood(uuids, sim)
    sim.close()


if __name__ == "__main__":
    main()
