"""Hard-wrapped logs (a terminal, a ticket system) are joined back before the signatures see them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_triage.diagnosis.block_scan import finder_for
from gpu_triage.diagnosis.input_lines import InputLines, wrap_width
from gpu_triage.diagnosis.training import diagnose
from gpu_triage.diagnosis.training_rules import load_rules

TRAINING = Path(__file__).resolve().parents[1] / "fixtures" / "training"
EXPECTED = yaml.safe_load((TRAINING / "expected.yaml").read_text())
CLASS_FILES = sorted(k for k in EXPECTED if k.startswith("classes/"))
RULES = load_rules()


def hard_wrap(text: str, width: int) -> str:
    """`text` as a terminal of `width` columns shows it, copied and pasted."""
    out: list[str] = []
    for line in text.splitlines():
        out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out) + "\n"


def test_the_width_of_a_wrapped_log_is_found() -> None:
    text = (TRAINING / "scenarios" / "xid79_with_nccl.log").read_text()
    for width in (80, 100, 132):
        assert wrap_width(hard_wrap(text, width).encode()) == width


@pytest.mark.parametrize("path", [*sorted(TRAINING.glob("healthy_*.log")), TRAINING / "classes" / "cuda_oom.log"])
def test_a_log_as_written_is_not_taken_for_wrapped(path: Path) -> None:
    assert wrap_width(path.read_bytes()) is None


def test_identical_long_lines_are_no_wrap() -> None:
    line = b"node1:9:10 [0] misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by remote peer 10.0.0.4<1>\n"
    assert wrap_width(b"short\n" + line * 50 + b"other\n") is None


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", CLASS_FILES)
def test_every_class_fixture_hard_wrapped_keeps_its_root_cause(name: str, width: int) -> None:
    text = (TRAINING / name).read_text()
    want = EXPECTED[name]
    report = diagnose([(None, [hard_wrap(text, width).encode()])])
    assert report.findings, "nothing found in the wrapped log"
    root = report.findings[0]
    assert (root.class_id, root.rank) == (want["root"], want["rank"])


def test_evidence_keeps_the_line_numbers_of_the_wrapped_input() -> None:
    timeout = (
        "[rank7]:[E1003 18:37:01.832146912 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
        "1800017 milliseconds before timing out."
    )
    lines = [
        f"[rank7]:step {i} | loss 0.{i:04d} | lr 0.0001 | tokens/s 123456 | mem 61.2GB | grad_norm 0.81"
        for i in range(6)
    ]
    text = hard_wrap("\n".join([*lines, timeout, "[rank7]:done"]), 80)
    report = diagnose([(None, [text.encode()])])
    [finding] = report.findings
    assert finding.class_id == "collective_timeout" and finding.rank == 7
    assert finding.details["seq"] == 6463 and finding.details["timeout_ms"] == 1800000
    start = text.splitlines().index(timeout[:80]) + 1
    assert finding.evidence[0].line == start
    assert report.lines_read == len(text.splitlines())


def test_a_line_of_its_own_is_not_joined() -> None:
    """After a piece of full width, a line with a prefix or an indented one starts afresh."""
    pieces = ["x" * 60 + "\n" + "y" * 60, "a" * 60, "[rank1]: RuntimeError: CUDA error: out of memory", "  File x"]
    data = ("\n".join(pieces) + "\n" + "z" * 60 + "\n").encode()
    literals = [lit for s in RULES.signatures() for lit in s.literals]
    reader = InputLines(finder_for([s.scan for s in RULES.signatures()], literals, "python"))
    got = list(reader.read([data]))
    assert reader.width == 60
    assert [(c.line, c.data) for c in got] == [(4, b"[rank1]: RuntimeError: CUDA error: out of memory")]
