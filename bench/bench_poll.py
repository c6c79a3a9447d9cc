"""CPU of one fast poll of the NVML backend on the virtual GPUs, in-process, with nothing else running.

    .venv/bin/python bench/bench_poll.py                 # 8 and 64 GPUs
    .venv/bin/python bench/bench_poll.py --gpus 8 --polls 50

The GPUs are the virtual ones (`gpu-triage vgpu` driving build/vgpu/libnvidia-ml.so.1 with h100-training
scaled to N GPUs, as bench/bench_peers.py runs them). A child process opens the NVML backend through the
real pynvml and times, on the process's CPU clock (every thread, the library's time included):
- the backend's reads of every fast collector of every GPU, called one after another on one thread;
- `Poller.poll` of the same collectors: the reads plus what the poller adds (its tasks, threads, deadline
  and merge). The difference is what polling adds to the reads. With it, the context switches a poll
  costs the process (voluntary and not): threads handing work and the GIL to each other. On a machine
  whose other cores are busy, threads that would trade the GIL on an idle one take turns instead, so CPU
  figures of two builds compare best back to back; the switches show the difference either way.
Each CPU figure is the least of three runs (with that run's switches): the machine's other load only ever
adds. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_peers import virtual_gpus

_CHILD = r"""
import logging, resource, sys, time
# The first full poll of many GPUs overruns its deadline (each GPU's first GPM sample waits), and says so per GPU.
logging.getLogger("gpu_triage").setLevel(logging.ERROR)
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.polling.poller import FAST, Poller
polls = int(sys.argv[1])
backend = NvmlBackend()
poller = Poller(backend, interval=1, slow_interval=60, timeout=0.8)
poller.discover()
poller.poll(Collector)
for _ in range(10):
    poller.poll(FAST)  # past the first reads: rates, link counts, thresholds known

def switches():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw

def least(turn):
    runs = []
    for _ in range(3):
        start, switched = time.process_time(), switches()
        for _ in range(polls):
            turn()
        runs.append(((time.process_time() - start) / polls * 1000, (switches() - switched) / polls))
    return min(runs)

def reads():
    for gpu in poller.gpus:
        for collector in FAST:
            backend.read(gpu, collector)

(direct, _), (polled, switched) = least(reads), least(lambda: poller.poll(FAST))
print(
    f"{len(poller.gpus)} GPUs: reads {direct:.2f} ms, poll {polled:.2f} ms (polling adds {polled - direct:.2f}),"
    f" {switched:.0f} context switches a poll"
)
poller.stop()
backend.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, action="append", help="GPU counts (default 8 and 64)")
    parser.add_argument("--polls", type=int, default=0, help="polls per run (default 100 on 8 GPUs, fewer above)")
    args = parser.parse_args()
    print("CPU per fast poll of every GPU (ms), least of three runs:")
    for gpus in args.gpus or [8, 64]:
        with tempfile.TemporaryDirectory(prefix="gpu-triage-poll-") as work, virtual_gpus(Path(work), gpus) as env:
            polls = args.polls or max(10, 800 // gpus)
            subprocess.run([sys.executable, "-c", _CHILD, str(polls)], env=env, check=True, timeout=600)


if __name__ == "__main__":
    main()
