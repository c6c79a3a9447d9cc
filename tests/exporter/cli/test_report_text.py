"""The readable report (exporter/cli/report_text.py): what reaches the terminal is what the log said."""

from __future__ import annotations

import re

from gpu_triage.diagnosis.training import diagnose
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
