"""Throughput and memory of `diagnosis.training.diagnose` on a big multi-rank training log, next to grep.

    .venv/bin/python bench/bench_training_log.py              # 1 GB, generated once under bench/out/
    .venv/bin/python bench/bench_training_log.py --size-mb 64

Prints figures only; there is no pass/fail. The log imitates 16 ranks on 2 nodes writing to one
stream: each "job attempt" starts with the real start-up output of the healthy fixtures
(tests/fixtures/training/healthy_*.log: torchrun banner, NCCL_DEBUG=INFO init, env echo), then runs
for a while: NCCL INFO collective traces (NCCL_DEBUG_SUBSYS=COLL), per-step training lines and
progress bars, with rank prefixes. Every 64 MB one failure fixture of tests/fixtures/training/classes
is spliced in, so the diagnosis has real work to do.

Figures printed:
* `diagnose`: MB/s over the file read in 1 MiB chunks (what the CLI does), in a child process whose
  peak RSS (resource.getrusage) is reported too;
* `grep -c -E` with the same trigger words as the prefilter (LC_ALL=C, best of two runs so both see a
  warm page cache), and the ratio of the two;
* prefilter strategies on the first 256 MB: one `bytes.find` pass per trigger word, the scanner's
  rare-byte hopping (diagnosis.line_scan.trigger_lines), and one compiled alternation per chunk.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.line_scan import trigger_lines
from gpu_triage.diagnosis.training_rules import load_rules

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


def _child(path: str) -> None:
    """Run in a fresh interpreter: diagnose the file, print figures as JSON."""
    from gpu_triage.diagnosis.training import diagnose

    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as f:  # noqa: PTH123 - the child only gets a string path
            while chunk := f.read(CHUNK):
                yield chunk

    diagnose([(None, [b"warm-up\n"])])  # load rules and catalog outside the timed part
    start = time.perf_counter()
    report = diagnose([(path, chunks())])
    took = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": took,
                "lines": report.lines_read,
                "skipped": report.lines_skipped,
                "findings": len(report.findings),
                "classes": sorted({f.class_id for f in report.findings}),
                "peak_rss_mib": peak_kib / 1024,
            }
        )
    )


def _grep(path: Path, triggers: tuple[str, ...]) -> tuple[float, int]:
    grep = shutil.which("grep")
    if grep is None:
        return float("nan"), -1
    pattern = "|".join(re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", t) for t in triggers)
    best, count = float("inf"), -1
    for _ in range(2):
        start = time.perf_counter()
        done = subprocess.run(
            [grep, "-c", "-E", pattern, str(path)], capture_output=True, text=True, env={"LC_ALL": "C"}, check=False
        )
        best = min(best, time.perf_counter() - start)
        count = int(done.stdout.strip() or -1)
    return best, count


def _strategies(path: Path, triggers: tuple[str, ...], limit: int = 256 << 20) -> dict[str, float]:
    """MB/s of finding the lines holding a trigger word, three ways, over the first `limit` bytes."""
    needles = [t.encode() for t in triggers]
    alternation = re.compile(b"|".join(re.escape(n) for n in needles))

    def plain(chunk: bytes, end: int) -> None:
        for needle in needles:
            pos = chunk.find(needle, 0, end)
            while pos >= 0:
                pos = chunk.find(needle, chunk.find(b"\n", pos, end) + 1, end)

    def regex(chunk: bytes, end: int) -> None:
        for _ in alternation.finditer(chunk, 0, end):
            pass

    def hopping(chunk: bytes, end: int) -> None:
        trigger_lines(chunk, 0, end, needles)

    ways = {"bytes.find per word": plain, "rare-byte hops (the scanner)": hopping, "one compiled alternation": regex}
    seconds = dict.fromkeys(ways, 0.0)
    done = 0
    with path.open("rb") as f:
        while done < limit and (chunk := f.read(4 << 20)):
            end = chunk.rfind(b"\n") + 1
            for name, way in ways.items():
                start = time.perf_counter()
                way(chunk, end)
                seconds[name] += time.perf_counter() - start
            done += len(chunk)
    return {name: done / 1e6 / s for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (default 1024)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0

    path = ensure_log(args.size_mb)
    size_mb = path.stat().st_size / 1e6
    triggers = load_rules().triggers
    print(f"log: {path} ({size_mb:.0f} MB)")
    print(f"trigger words: {', '.join(repr(t) for t in triggers)}")

    grep_s, grep_lines = _grep(path, triggers)
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    ours = figures["seconds"]
    print(
        f"diagnose: {ours:.2f} s, {size_mb / ours:.0f} MB/s, {figures['lines']:,} lines "
        f"({figures['skipped']} skipped), {figures['findings']} findings in {len(figures['classes'])} classes"
    )
    print(f"peak RSS of the diagnosing process: {figures['peak_rss_mib']:.1f} MiB")
    print(f"grep -c -E (same trigger words): {grep_s:.2f} s, {size_mb / grep_s:.0f} MB/s, {grep_lines:,} lines")
    print(f"ratio diagnose / grep: {ours / grep_s:.2f}x")
    rates = _strategies(path, triggers)
    print("prefilter strategies (first 256 MB): " + ", ".join(f"{k} {v:.0f} MB/s" for k, v in rates.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
