"""How long the slowest hostile lines take: every training-log signature, the kernel-log parser, and a
whole crafted log next to a normal one.

    .venv/bin/python bench/bench_regex_worst.py                  # 16 MiB of crafted input
    .venv/bin/python bench/bench_regex_worst.py --crafted-mb 64

Prints figures only; there is no pass/fail (tests/diagnosis/test_training_redos.py asserts the
structure that bounds the work). The lines are built to make a backtracking engine work hard: long
runs of each character the patterns use, the start of every example (and the whole example)
repeated up to the line limit, and a few lines crafted against one signature. Printed: the slowest
signatures on their worst line, and the worst whole-line classification.

Then the worst case for a whole log (the recipe of the adversarial review, D10): lines of 64 KiB that
hold every signature's literal with `000` between, each line starting further into the sequence so
that no two are alike, none matching anything (the literals that would make a signature match with
their neighbours are left out, checked before the run). `diagnose` reads it, and a normal training log
of the same size (bench/bench_training_log.py's), with each block scan: MB/s of each, in this process,
the compiled scan taken from a warm cache.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_training_log import ensure_log

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.scan.block_scan import engine_name
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser
from gpu_triage.exporter.cache_store import FileStore

CHUNK = 1 << 20  # what the command reads at a time

LINE = 8192
KERNEL_LINES = [
    "NVRM: Xid (" + "(" * 8000,
    "NVRM: Xid (PCI:0000:3b:00): 13, " + "GPC 1, TPC " * 700,
    "NVRM: Xid (PCI:0000:3b:00): 45, " + "caused by previous Xid " * 300,
    "NVRM: Xid (PCI:0000:3b:00): 154, " + "recovery action changed from 0x0 (" * 200,
    "[" * 8000 + "NVRM: Xid (PCI:0000:3b:00): 79",
    "NVRM: " + "GPU " * 1900 + "fallen off the bus",
    "SXid (" * 1300,
]


# Lines that once took seconds: what one signature looks for, repeated so that its wildcards overlap.
CRAFTED = [
    "exits with return code = x died with <Signals.SIGKILL: 9 returned non-zero exit status x "
    + "CalledProcessError: Command --local_rank=1 " * 40,
]


def _skeleton(pattern: str) -> str:
    return re.sub(r"\\[a-zA-Z]|[\\\[\](){}?*+|^$]|\?P<\w+>|\?:", "", pattern)


def hostile_lines() -> list[str]:
    rules = load_rules()
    sigs = rules.signatures()
    alphabet = sorted({c for s in sigs for c in _skeleton(s.pattern)} | set("0123456789 _.:-<>()[]/="))
    fragments = {normalise(ex.line).text[:k] for r in rules.rules for ex in r.examples for k in (12, 60, LINE)}
    fragments |= {_skeleton(s.pattern)[:k] for s in sigs for k in (8, 200)}
    lines = [c * LINE for c in alphabet] + [(line * (LINE // len(line) + 1))[:LINE] for line in CRAFTED]
    lines += [(f * (LINE // len(f) + 1))[:LINE] for f in sorted(fragments - {""})]
    return lines


def crafted_log(size: int) -> bytes:
    """`size` bytes of distinct 64 KiB lines holding the signatures' literals and matching nothing."""
    rules = load_rules()
    sigs = rules.signatures()
    keep = sorted({lit for sig in sigs for lit in sig.literals})
    while True:
        unit = "000".join(keep) + "000"
        probe = unit + unit  # every literal beside both its neighbours, as in the repeated lines
        hits = [sig for sig in sigs if sig.search(probe) or sig.search(normalise(probe).text)]
        if not hits:
            break
        drop = {lit for sig in hits for lit in sig.literals}
        keep = [lit for lit in keep if not any(d in lit for d in drop)]
    width = 64 * 1024 - 1
    count = size // (width + 1)
    step = max(1, len(unit) // max(count, 1))
    lines = ((unit[i * step :] + unit * (width // len(unit) + 2))[:width] for i in range(count))
    return "".join(line + "\n" for line in lines).encode()


def _rate(data: bytes, engine: str, store: FileStore) -> tuple[float, int]:
    blocks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    diagnose([(None, blocks[:1])], engine=engine, store=store)  # the compiled scan, from the cache
    start = time.perf_counter()
    report = diagnose([(None, blocks)], engine=engine, store=store)
    return len(data) / (time.perf_counter() - start) / 1e6, len(report.findings)


def whole_logs(size_mb: int) -> None:
    crafted = crafted_log(size_mb << 20)
    normal = ensure_log(size_mb).read_bytes()
    engines = ["hyperscan", "python"] if engine_name() == "hyperscan" else ["python"]
    with tempfile.TemporaryDirectory(prefix="gpu-triage-bench-") as scratch:
        store = FileStore(Path(scratch))
        for engine in engines:
            worst, found = _rate(crafted, engine, store)
            usual, _ = _rate(normal, engine, store)
            print(
                f"{engine} scan: crafted {len(crafted) / 1e6:.0f} MB at {worst:.1f} MB/s ({found} findings), "
                f"normal {len(normal) / 1e6:.0f} MB at {usual:.0f} MB/s"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crafted-mb", type=int, default=16, help="size of the crafted and the normal log")
    args = parser.parse_args()
    rules = load_rules()
    lines = hostile_lines()
    worst: dict[str, tuple[float, str]] = {}
    line_worst = (0.0, "")
    for line in lines:
        for sig in rules.signatures():
            start = time.perf_counter()
            sig.search(line)
            took = time.perf_counter() - start
            if took > worst.get(sig.pattern, (0.0, ""))[0]:
                worst[sig.pattern] = (took, line[:40])
        start = time.perf_counter()
        text = normalise(line).text
        rules.match(text)
        rules.match_context(text)
        line_worst = max(line_worst, (time.perf_counter() - start, line[:40]))
    print(f"{len(lines)} hostile lines of {LINE} characters, {len(rules.signatures())} signatures")
    for pattern, (took, line) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"  {took * 1000:8.2f} ms  {pattern[:70]!r} on {line!r}")
    print(f"worst whole-line classification: {line_worst[0] * 1000:.2f} ms on {line_worst[1]!r}")
    kernel = 0.0
    for text in KERNEL_LINES:
        start = time.perf_counter()
        KernelLogParser().feed(text, 1)
        kernel = max(kernel, time.perf_counter() - start)
    print(f"worst kernel-log line: {kernel * 1000:.2f} ms")
    whole_logs(args.crafted_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
