"""The report of a diagnosis is pure: asking for it twice gives the same report, and the same as a fresh run.
Kernel events are values (listed with the input they came from) and findings carry what code decides on
as typed fields (the XID or SXid code, a SIGABRT), not in the class id or the details."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_triage.diagnosis.training.diagnose import _Diagnosis, diagnose
from gpu_triage.diagnosis.training.hang.report import HangInputs
from gpu_triage.diagnosis.training.rules.load import load_rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "training"
CASES = sorted((FIXTURES / "classes").glob("*.log")) + sorted(p for p in (FIXTURES / "scenarios").iterdir())

XID = "[Mon May  6 10:00:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python3, GPU has fallen off the bus.\n"
SXID = "[Mon May  6 10:00:01 2024] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Fatal, Link 31 egress\n"
RETRY = "node07:4242:4250 [3] NCCL INFO connect to 10.0.0.12<43321> returned Connection timed out, retrying (1/34)\n"


def _inputs(path: Path) -> list[tuple[str, bytes]]:
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return [(p.name, p.read_bytes()) for p in files]


def _twice(inputs: list[tuple[str, bytes]]) -> tuple[dict[str, Any], dict[str, Any]]:
    state = _Diagnosis(load_rules())
    hangs = HangInputs(None)
    lines = skipped = 0
    for name, data in inputs:
        text = hangs.take(name, [data])
        if text is not None:
            read, skip = state.read(name, text)
            lines, skipped = lines + read, skipped + skip
    return state.report(lines, skipped, hangs).to_json(), state.report(lines, skipped, hangs).to_json()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_report_twice_is_the_same_report(case: Path) -> None:
    # A second input with kernel lines, an unanswered connect retry and an uncaught traceback: every
    # part of the report that is settled at its end (XID verdicts, retries, deaths, events' file names).
    extra = ("extra.log", (XID + SXID + RETRY + "Traceback (most recent call last):\nValueError: boom\n").encode())
    inputs = [*_inputs(case), extra]
    first, second = _twice(inputs)
    assert first == second
    assert first == diagnose([(n, [d]) for n, d in inputs]).to_json()
    assert [e.get("file") for e in first["events"]][-2:] == ["extra.log", "extra.log"]


def test_kernel_findings_carry_their_code_typed() -> None:
    report = diagnose([(None, [(XID + SXID).encode()])])
    kinds = {f.class_id: (f.xid, f.sxid, f.from_kernel) for f in report.findings}
    assert kinds == {"xid_79": (79, None, True), "sxid_12028": (None, 12028, True)}
    assert all("file" not in e for e in report.to_json()["events"])  # one input: no file names


def test_a_sigabrt_is_typed_as_aborted() -> None:
    line = "[rank2]: *** SIGABRT received at time=1714989600 on cpu 3 ***\n"
    report = diagnose([(None, [line.encode()])])
    abort = [f for f in report.findings if f.class_id == "process_segfault"]
    assert abort and all(f.aborted for f in abort), [(f.class_id, f.details) for f in report.findings]
