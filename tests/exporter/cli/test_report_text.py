"""The readable report (exporter/cli/report_text.py): what reaches the terminal is what the log said."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.exporter.cli.report_text import render, safe

# A hyperlink (OSC 8) ended by BEL, a C1 CSI (U+009B) setting red, backspaces over the real text.
EVIL = "\x1b]8;;http://evil\x07click\x1b]8;;\x07 \u009b31m RuntimeError: CUDA error: out of memory\x08\x08\x08XXX"


def test_control_characters_in_the_evidence_are_written_out() -> None:
    report = diagnose([("rank\x1b[2J0.log", [EVIL.encode() + b"\n"]), ("rank1.log", [b"epoch 1\n"])]).to_json()
    assert report["findings"], "the line is still a finding"
    text = render(report)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)
    assert "\\x07click" in text and "\\x9b31m" in text and "\\x08\\x08\\x08XXX" in text
    assert "rank\\x1b[2J0.log:1" in text


def test_safe_keeps_tabs_and_printable_text() -> None:
    assert safe("a\tb é 日本") == "a\tb é 日本"
    assert safe("x\x1b[31my\u202ez\x7f") == "x\\x1b[31my\\u202ez\\x7f"


SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "training" / "scenarios"


def _files(*paths: Path) -> dict[str, Any]:
    return diagnose([(p.name, [p.read_bytes()]) for p in paths]).to_json()


def test_a_per_rank_oom_reads_as_the_oom_then_one_line_per_shared_symptom() -> None:
    """Rank 3 ran out of memory; ranks 0-2 each timed out and lost their peer: three findings, not seven."""
    report = _files(*sorted((SCENARIOS / "oom_rank3").glob("rank*.log")))
    assert [(f["class"], f["rank"], f["ranks"]) for f in report["findings"]] == [
        ("cuda_oom", 3, []),
        ("collective_timeout", None, [0, 1, 2]),
        ("remote_peer_closed", None, [0, 1, 2]),
    ]
    text = render(report)
    assert text.startswith("Root cause: GPU memory exhausted")
    assert "rank 3" in text.splitlines()[1]
    assert "on ranks 0\u20132 (3)" in text and text.count("collective_timeout;") == 1


def test_the_straggler_s_proof_is_in_the_text_report() -> None:
    """What named the straggler (its SeqNums against the others') is on the screen, not only in --json."""
    text = render(_files(SCENARIOS / "timeout_straggler.log"))
    head = text.splitlines()[0]
    assert "straggler: rank 5, last enqueued SeqNum 4821, the others 4822" in head
    # The first next step starts from the straggler the tool found, with its host and GPU.
    assert "1. Start at the straggler, rank 5 on node1 (GPU 0000:ab:00.0)" in text
    # ... and the line that proves it is the evidence shown: rank 5's own report of its progress.
    assert "line 40  [rank5]:" in text
