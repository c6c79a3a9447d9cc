"""Throughput and memory of `diagnosis.training.diagnose` on a big multi-rank training log, next to grep.

    .venv/bin/python bench/bench_training_log.py                   # 1 GB, generated once under bench/out/
    .venv/bin/python bench/bench_training_log.py --size-mb 64 --fallback-mb 64

Prints figures only; there is no pass/fail. The log imitates 16 ranks on 2 nodes writing to one
stream: each "job attempt" starts with the real start-up output of the healthy fixtures
(tests/fixtures/training/healthy_*.log: torchrun banner, NCCL_DEBUG=INFO init, env echo), then runs
for a while: NCCL INFO collective traces (NCCL_DEBUG_SUBSYS=COLL), per-step training lines and
progress bars, with rank prefixes. Every 64 MB one failure fixture of tests/fixtures/training/classes
is spliced in, so the diagnosis has real work to do.

Figures printed, each `diagnose` in a fresh child process reading the file in 1 MiB chunks (what
the CLI does), with every signature over every line:
* `grep -c -F 'NVRM: Xid'` on the same file (LC_ALL=C, best of three, warm page cache): the yardstick;
* `diagnose` with the Hyperscan block scan over the whole file: MB/s, the ratio to grep, the child's
  peak RSS, and the same for a 64 MB prefix (memory stays flat: the two peaks are close);
* `diagnose` with the pure-Python scan (the fallback where no Hyperscan wheel exists) over the first
  `--fallback-mb` MB: MB/s and the ratio to grep.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.exporter.log_input import scan_in_parallel

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "out"
FIXTURES = ROOT / "tests" / "fixtures" / "training"
CHUNK = 1 << 20
ATTEMPT = 256 << 20  # a job restart, with its start-up output, every this many bytes
FAILURE_EVERY = 64 << 20

_STEADY = (
    "node{h}:{pid}:{tid} [{d}] NCCL INFO AllReduce: opCount {op:x} sendbuff 0x7f{a:08x} recvbuff 0x7f{a:08x} "
    "count {n} datatype 7 op 0 root 0 comm 0x55d4b0c0 [nranks=16] stream 0x55d4c1a0",
    "node{h}:{pid}:{tid} [{d}] NCCL INFO AllGather: opCount {op:x} sendbuff 0x7f{a:08x} recvbuff 0x7f{a:08x} "
    "count {n} datatype 1 op 0 root 0 comm 0x55d4b0c0 [nranks=16] stream 0x55d4c1a0",
    "node{h}:{pid}:{tid} [{d}] NCCL INFO ReduceScatter: opCount {op:x} sendbuff 0x7f{a:08x} recvbuff "
    "0x7f{a:08x} count {n} datatype 7 op 0 root 0 comm 0x55d4b0c0 [nranks=16] stream 0x55d4c1a0",
    "[default{d}]:2024-05-01 12:{m:02d}:{s:02d},{ms:03d} - INFO - train.py:212 - step {op} | loss {loss:.4f} | "
    "lr 1.9e-05 | tokens/s {n} | mem 61.2GB",
    "[default{d}]:{{'loss': {loss:.4f}, 'grad_norm': 0.8123, 'learning_rate': 1.9e-05, 'epoch': 0.{m:02d}}}",
    "[default{d}]: {s:3d}%|#####     | {op}/100000 [{m:02d}:{s:02d}<11:20:01,  1.01s/it]",
    "[default{d}]:[2024-05-01 12:{m:02d}:{s:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] [Rank {r}] step={op}, "
    "skipped=0, lr=[1.9e-05], mom=[(0.9, 0.95)]",
    "[default{d}]:[2024-05-01 12:{m:02d}:{s:02d},{ms:03d}] [INFO] [timer.py:260:stop] epoch=0/micro_step={op}/"
    "global_step={op}, RunningAvgSamplesPerSec={loss:.3f}, CurrSamplesPerSec={loss:.3f}, MemAllocated=61.2GB, "
    "MaxMemAllocated=70.1GB",
)


def _steady(rng: random.Random, size: int) -> bytes:
    out: list[str] = []
    total = 0
    op = rng.randrange(1 << 20)
    while total < size:
        op += 1
        d, h = rng.randrange(8), rng.randrange(1, 3)
        fields = {
            "d": d,
            "h": h,
            "r": (h - 1) * 8 + d,
            "pid": 40200 + (h - 1) * 1000 + d * 11,
            "tid": 40328 + (h - 1) * 1000 + d * 11,
            "op": op,
            "a": rng.getrandbits(32),
            "n": rng.randrange(1, 1 << 24),
            "m": rng.randrange(60),
            "s": rng.randrange(60),
            "ms": rng.randrange(1000),
            "loss": rng.random() * 3,
        }
        line = rng.choice(_STEADY).format(**fields) + "\n"
        out.append(line)
        total += len(line)
    return "".join(out).encode()


def _blocks(size: int) -> Iterator[bytes]:
    rng = random.Random(2024)
    startup = b"".join(p.read_bytes() for p in sorted(FIXTURES.glob("healthy_*.log")))
    failures = [p.read_bytes() for p in sorted((FIXTURES / "classes").glob("*.log"))]
    steady = [_steady(rng, 4 << 20) for _ in range(4)]
    written, next_attempt, next_failure, failure = 0, 0, FAILURE_EVERY // 2, 0
    while written < size:
        if written >= next_attempt:
            block = startup
            next_attempt += ATTEMPT
        elif written >= next_failure:
            block = failures[failure % len(failures)]
            failure += 1
            next_failure += FAILURE_EVERY
        else:
            block = steady[rng.randrange(len(steady))]
        yield block
        written += len(block)


def ensure_log(size_mb: int) -> Path:
    path = OUT / f"training-{size_mb}mb.log"
    if path.exists() and path.stat().st_size >= size_mb << 20:
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for block in _blocks(size_mb << 20):
            f.write(block)
    tmp.replace(path)
    return path


def _child(path: str, engine: str, limit_mb: int, parallel: bool) -> None:
    """Run in a fresh interpreter: diagnose (up to `limit_mb` MB of) the file, print figures as JSON."""
    from gpu_triage.diagnosis.training.diagnose import diagnose

    limit = limit_mb << 20

    def chunks() -> Iterator[bytes]:
        done = 0
        with open(path, "rb") as f:  # noqa: PTH123 - the child only gets a string path
            while done < limit and (chunk := f.read(min(CHUNK, limit - done))):
                done += len(chunk)
                yield chunk

    diagnose([(None, [b"warm-up\n"])], engine=engine)  # load rules, catalog and scan database untimed
    start = time.perf_counter()
    report = diagnose([(path, chunks())], engine=engine, parallel=parallel)
    took = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": took,
                "bytes": min(limit, Path(path).stat().st_size),
                "engine": report.engine,
                "lines": report.lines_read,
                "findings": len(report.findings),
                "classes": sorted({f.class_id for f in report.findings}),
                "peak_rss_mib": peak_kib / 1024,
            }
        )
    )


def _grep(path: Path) -> float:
    """Seconds of `grep -c -F 'NVRM: Xid'` over the file, best of three."""
    grep = shutil.which("grep")
    if grep is None:
        return float("nan")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(
            [grep, "-c", "-F", "NVRM: Xid", str(path)], capture_output=True, env={"LC_ALL": "C"}, check=False
        )
        best = min(best, time.perf_counter() - start)
    return best


def _run(path: Path, engine: str, limit_mb: int, parallel: bool = False) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", str(path), "--engine", engine, "--limit-mb", str(limit_mb)]
    child = subprocess.run(
        [*argv, *(["--parallel"] if parallel else [])],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    figures: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (default 1024)")
    parser.add_argument("--fallback-mb", type=int, default=256, help="MB the pure-Python scan reads (default 256)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="hyperscan", help=argparse.SUPPRESS)
    parser.add_argument("--limit-mb", type=int, default=1 << 20, help=argparse.SUPPRESS)
    parser.add_argument("--parallel", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.engine, args.limit_mb, args.parallel)
        return 0

    path = ensure_log(args.size_mb)
    size_mb = path.stat().st_size / 1e6
    print(f"log: {path} ({size_mb:.0f} MB), {len(load_rules().signatures())} signatures on every line")
    grep_s = _grep(path)
    grep_rate = size_mb / grep_s
    print(f"grep -c -F 'NVRM: Xid': {grep_s:.2f} s, {grep_rate:.0f} MB/s")
    # The command's own way (the scan in a second thread where two CPUs may be used), one thread, a prefix.
    runs = [
        ("hyperscan", 1 << 20, scan_in_parallel()),
        ("hyperscan", 1 << 20, False),
        ("hyperscan", 64, scan_in_parallel()),
        ("python", args.fallback_mb, False),
    ]
    for engine, limit, parallel in runs:
        figures = _run(path, engine, limit, parallel)
        mb = figures["bytes"] / 1e6
        rate = mb / figures["seconds"]
        how = f"{figures['engine']} scan{', 2 threads' if parallel and figures['engine'] == 'hyperscan' else ''}"
        print(
            f"diagnose [{how}] {mb:.0f} MB: {figures['seconds']:.2f} s, {rate:.0f} MB/s, "
            f"{rate / grep_rate:.2f}x grep; {figures['lines']:,} lines, {figures['findings']} findings in "
            f"{len(figures['classes'])} classes; peak RSS {figures['peak_rss_mib']:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
