"""Hard-wrapped logs (a terminal, a ticket system) are joined back before the signatures see them."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.input.wrapped import SAMPLE, InputLines, wrap_width
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.scan.block_scan import finder_for

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


NVIDIA_SMI = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
| N/A   31C    P0             70W /  700W |       1MiB /  81559MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
"""


def test_an_nvidia_smi_table_is_no_wrap_and_swallows_nothing() -> None:
    """Its lines share one width and the next one starts with `|`: that is a table, not cut text."""
    data = (NVIDIA_SMI + "Segmentation fault (core dumped)\nKilled\n").encode()
    assert wrap_width(data) is None
    report = diagnose([(None, [data])])
    assert {f.class_id for f in report.findings} == {"process_segfault", "host_oom_killed"}


def test_a_table_inside_a_wrapped_log_is_not_joined() -> None:
    text = (TRAINING / "scenarios" / "xid79_with_nccl.log").read_text()
    width = len(NVIDIA_SMI.splitlines()[0])  # the table's own width: its lines are full-width pieces
    wrapped = hard_wrap(text, width) + NVIDIA_SMI + "Segmentation fault (core dumped)\n"
    assert wrap_width(wrapped.encode()) == width
    report = diagnose([(None, [wrapped.encode()])])
    assert "process_segfault" in {f.class_id for f in report.findings}


def test_lines_padded_to_one_width_are_no_wrap() -> None:
    """Most cuts fall inside a word or a number; lines that all end in blanks were padded, not cut."""
    rows = [f"epoch {i} | loss 0.{i}1 | lr 1e-4".ljust(80) + f"\nval loss 0.{i}2" for i in range(6)]
    data = ("\n".join(rows) + "\n" + "epoch 6 done".ljust(80) + "\nSegmentation fault (core dumped)\n").encode()
    assert wrap_width(data) is None
    assert [f.class_id for f in diagnose([(None, [data])]).findings] == ["process_segfault"]


def test_a_joined_line_is_bounded() -> None:
    """A wrapped head, then a long run of full-width unprefixed lines (a pasted base64 blob): the
    logical line they make is never held whole, only up to the line limit, and counts as skipped."""
    message = "[rank1]: RuntimeError: " + " ".join(f"word{i}" for i in range(150))
    head = hard_wrap("\n".join([message] * 3), 400).encode()
    blob = (b"QUJD" * 100 + b"\n") * (20 << 10)  # 8 MiB of 400 columns, no prefix: each goes on the line before
    tail = b"[rank1]: RuntimeError: CUDA error: out of memory\n"
    literals = [lit for s in RULES.signatures() for lit in s.literals]
    finder = finder_for([s.scan for s in RULES.signatures()], literals, "python")

    def chunks() -> Iterator[bytes]:
        yield head
        for i in range(0, len(blob), 1 << 16):
            yield blob[i : i + (1 << 16)]
        yield b"and the end of the blob: out of memory\n" + tail

    tracemalloc.start()
    try:
        reader = InputLines(finder, max_line=4096)
        got = [(c.line, c.data) for c in reader.read(chunks())]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.width == 400
    assert got[-1] == (reader.lines, tail.rstrip())
    assert reader.skipped == 1  # the blob and the line after it: one logical line, over the limit
    # What is held is a block of the scan and a line's worth, whatever the length of the blob.
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB held for an 8 MiB blob"


def _mixwrap() -> bytes:
    """Over SAMPLE bytes of plain lines, then text wrapped at 80 whose OOM line is cut in two."""
    plain = b"".join(b"[rank5]:step %d | loss 0.5 | lr 0.0001 | tokens/s 123456\n" % i for i in range(18_000))
    assert len(plain) > SAMPLE + 2000
    oom = (
        "[rank5]:[2024-05-01 12:00:00,123] [ERROR] torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.10 GiB of which 1.02 GiB is free."
    )
    assert "CUDA out of m" in oom[:80] and "memory" not in oom[:80]  # the cut falls inside what the signature needs
    return plain + hard_wrap(oom + "\n" + "[rank5]: " + "x" * 100, 80).encode()


def test_the_wrap_decision_does_not_depend_on_how_the_input_is_cut() -> None:
    data = _mixwrap()
    reports = {}
    for size in (13, 64 << 10, 100_000, 1 << 20, len(data)):
        doc = diagnose([(None, [data[i : i + size] for i in range(0, len(data), size)])]).to_json()
        reports[size] = (doc["findings"], doc["summary"])
    assert len({repr(r) for r in reports.values()}) == 1, {k: [f["class"] for f in v[0]] for k, v in reports.items()}
