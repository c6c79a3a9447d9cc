"""CPU of one NVML backend read per collector and GPU, on the virtual GPUs, in-process: where a poll's reads go.

    .venv/bin/python bench/bench_reads.py                # 8 GPUs
    .venv/bin/python bench/bench_reads.py --gpus 64 --rounds 50

The GPUs are the virtual ones (bench/bench_poll.py's: `gpu-triage vgpu` with h100-training scaled to N GPUs,
through the real pynvml and build/vgpu/libnvidia-ml.so.1). A child process reads each fast collector of every
GPU `rounds` times on one thread, past the first reads (rates, link counts, kept limits known), and prints the
process CPU clock per read in microseconds, the least of three runs: the machine's other load only ever adds.
Figures, not pass/fail. The virtual library answers a getter in a microsecond or two; a real driver's calls
cost more, so what is kept between reads saves more there than here.
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
import logging, sys, time
logging.getLogger("gpu_triage").setLevel(logging.ERROR)
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.polling.poller import FAST, Poller
rounds = int(sys.argv[1])
backend = NvmlBackend()
poller = Poller(backend, interval=1, slow_interval=60, timeout=0.8)
poller.discover()
poller.poll(Collector)
for _ in range(5):
    poller.poll(FAST)
figures = []
for collector in FAST:
    runs = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(rounds):
            for gpu in poller.gpus:
                backend.read(gpu, collector)
        runs.append((time.process_time() - start) / rounds / len(poller.gpus) * 1e6)
    figures.append((collector.value, min(runs)))
print(f"{len(poller.gpus)} GPUs, us of CPU per read of one GPU, least of three runs:")
for name, us in figures:
    print(f"  {name:<12} {us:6.1f}")
print(f"  {'all fast':<12} {sum(us for _, us in figures):6.1f}")
poller.stop()
backend.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8, help="virtual GPUs (default 8)")
    parser.add_argument("--rounds", type=int, default=0, help="reads of each GPU per run (default 3200 / GPUs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-triage-reads-") as work, virtual_gpus(Path(work), args.gpus) as env:
        rounds = args.rounds or max(10, 3200 // args.gpus)
        subprocess.run([sys.executable, "-c", _CHILD, str(rounds)], env=env, check=True, timeout=600)


if __name__ == "__main__":
    main()
