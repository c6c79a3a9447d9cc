"""How long the slowest hostile lines take: every training-log signature and the kernel-log parser.

    .venv/bin/python bench/bench_regex_worst.py

Prints figures only; there is no pass/fail (tests/diagnosis/test_training_redos.py asserts the
structure that bounds the work). The lines are built to make a backtracking engine work hard: long
runs of each character the patterns use, the start of every example (and the whole example)
repeated up to the line limit, and a few lines crafted against one signature. Printed: the slowest
signatures on their worst line, and the worst whole-line classification.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.kernel_log_parser import KernelLogParser
from gpu_triage.diagnosis.log_lines import normalise
from gpu_triage.diagnosis.training_rules import load_rules

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


def main() -> int:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
