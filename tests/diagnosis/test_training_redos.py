"""No signature can backtrack catastrophically, and the reason is asserted from each regex's structure.

Bounded work needs no clock to check: with every repetition bounded, no look-around or
back-reference, and no repeat inside a repeat beyond `MAX_NESTED`, a search tries each start
position of a (length-capped) line and explores a bounded number of paths from each. And a line
without any of a signature's required literals is not searched by it at all. How long the worst
lines actually take is printed by bench/bench_regex_worst.py, on the machine it runs on.
"""

from __future__ import annotations

import re

import pytest

from gpu_triage.diagnosis.rule_regex import MAX_NESTED, required_literals, unbounded_repeats, unsupported
from gpu_triage.diagnosis.training_rules import load_rules

RULES = load_rules()
SIGNATURES = list(RULES.signatures())
IDS = [s.pattern[:40] for s in SIGNATURES]


@pytest.mark.parametrize("sig", SIGNATURES, ids=IDS)
def test_every_signature_is_bounded_and_plain(sig: object) -> None:
    pattern = sig.pattern  # type: ignore[attr-defined]
    assert unbounded_repeats(pattern) == []
    assert unsupported(pattern) == []


@pytest.mark.parametrize("sig", SIGNATURES, ids=IDS)
def test_a_line_without_the_required_literal_is_not_searched(sig: object) -> None:
    literals = sig.literals  # type: ignore[attr-defined]
    assert literals == required_literals(sig.pattern)  # type: ignore[attr-defined]
    # A long line of everything the pattern uses but its literal text: no search at all.
    hostile = re.sub(r"[A-Za-z]", "", sig.pattern) * 200  # type: ignore[attr-defined]
    if not any(lit in hostile for lit in literals):
        assert sig.search(hostile) is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        (r"(?:a{1,30}){1,30} error", True),  # 900 paths per start position
        (r"(?:a{1,16}){1,16} error", False),  # 256
        (r"(?:x|y{1,600}) error", False),  # no repeat inside a repeat
        (r"error (?:\w{1,40}\.){0,8}end", False),  # 320
        (r"error (?:(?:\w{1,9}){1,9}\.){1,9}end", True),  # 729 nested twice
    ],
)
def test_the_nesting_bound_is_a_product(pattern: str, refused: bool) -> None:
    assert any("around a repeat" in p for p in unsupported(pattern)) is refused
    assert MAX_NESTED == 512
