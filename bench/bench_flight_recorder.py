"""Reading a big job's Flight Recorder dumps: 512 ranks x 1,000 entries, time and memory.

    .venv/bin/python bench/bench_flight_recorder.py                 # 64, 128, 256, 512 ranks
    .venv/bin/python bench/bench_flight_recorder.py --ranks 1024 --entries 2000

Prints figures only; there is no pass/fail. The dumps are built from a real one (PyTorch 2.13's, under
tests/fixtures/flight_recorder) with every entry's fields and frames, pickled as PyTorch's writer does
(protocol 2), one rank behind at the last all_reduce; they are read as `gpu-triage diagnose` reads them:
the pickles in the memory-capped decoding process (exporter/fr_decode.py), matched here. Each job size
runs in a fresh process; memory is that process's peak resident size less what the dumps themselves
take in it (they are handed over in memory), which holds each rank's latest WINDOW ops per group, and
the decoding processes' peak (one dump at a time): flat means it does not grow with the number of
entries per rank, nor, for the decoder, with the number of ranks. The in-process path with the
pre-scan (diagnosis/training/hang/fr_unpickle.py) is timed on the smallest job for comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.fr_unpickle import loads
from gpu_triage.exporter.fr_decode import SandboxDecoder

REAL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "flight_recorder" / "healthy" / "pickle"


def dumps(ranks: int, entries: int) -> list[tuple[str, bytes]]:
    """`ranks` dumps of `entries` all_reduces each; rank 1 stopped one collective short."""
    real = loads((REAL / "nccl_trace_rank_0").read_bytes())
    template = real["entries"][-2]
    frames = template.get("frames", []) * 3  # a training script's stack is deeper than the recorder's
    base = []
    for i in range(entries):
        e = copy.copy(template)
        e.update(record_id=i, collective_seq_id=i + 1, op_id=i + 1, time_created_ns=template["time_created_ns"] + i)
        e["frames"] = frames
        base.append(e)
    out = []
    for r in range(ranks):
        d = dict(real, entries=base[:-1] if r == 1 else base)
        out.append((f"nccl_trace_rank_{r}", pickle.dumps(d, protocol=2)))
    return out


def _hwm_mib(pid: int) -> float:
    """A process's peak resident size (VmHWM: its own, where getrusage's would carry its parent's over exec)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _rss_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def one(ranks: int, entries: int, sandbox: bool) -> dict[str, Any]:
    blobs = dumps(ranks, entries)
    size = sum(len(b) for _, b in blobs)
    before = _rss_mib(resource.RUSAGE_SELF)
    start = time.perf_counter()
    decoder = 0.0
    if sandbox:
        with SandboxDecoder() as decode:
            report = diagnose(((n, [b]) for n, b in blobs), decode=decode).to_json()
            decoder = max(_hwm_mib(w.proc.pid) for w in decode.slots if w is not None)
    else:
        report = diagnose((n, [b]) for n, b in blobs).to_json()
    elapsed = time.perf_counter() - start
    root = report["findings"][0] if report["findings"] else {}
    return {
        "ranks": ranks,
        "mib": size / 2**20,
        "seconds": elapsed,
        "reader_mib": _rss_mib(resource.RUSAGE_SELF) - before,
        "decoder_mib": decoder,
        "root": f"{root.get('class')} rank {root.get('rank')}" if root else "none",
    }


def _fresh(ranks: int, entries: int, sandbox: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", str(ranks), "--entries", str(entries)] + (
        [] if sandbox else ["--in-process"]
    )
    return dict(json.loads(subprocess.run(cmd, capture_output=True, check=True, text=True).stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="*", default=[64, 128, 256, 512])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.entries, not args.in_process)))
        return
    print(f"{args.entries} entries per rank, frames included")
    print(f"{'ranks':>6} {'MiB of dumps':>13} {'read+match s':>13} {'reader +MiB':>12} {'decoder MiB':>12}  root cause")
    for ranks in args.ranks:
        r = _fresh(ranks, args.entries, sandbox=True)
        figures = f"{r['mib']:>13.1f} {r['seconds']:>13.2f} {r['reader_mib']:>12.0f} {r['decoder_mib']:>12.0f}"
        print(f"{ranks:>6} {figures}  {r['root']}")
    print(f"{args.ranks[-1]} ranks, entries per rank:")
    for entries in (args.entries // 4, args.entries * 4):
        r = _fresh(args.ranks[-1], entries, sandbox=True)
        memory = f"reader +{r['reader_mib']:.0f} MiB, decoder {r['decoder_mib']:.0f} MiB"
        print(f"  {entries:>6} entries: {r['seconds']:.2f} s, {memory}")
    r = _fresh(args.ranks[0], args.entries, sandbox=False)
    print(f"in-process with the pre-scan, {args.ranks[0]} ranks: {r['seconds']:.2f} s, {r['reader_mib']:.0f} MiB more")


if __name__ == "__main__":
    main()
